#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "stoker/status.h"
#include "transform/decoded_region.h"

namespace stoker {

/// True if `data` starts with the PNG signature.
bool LooksLikePng(std::span<const std::byte> data);

/// Decodes PNG images with libpng to 8-bit RGB: palette and grayscale are
/// expanded, 16-bit samples keep their high byte, alpha is dropped (as
/// Pillow's convert("RGB") does; palette indices past the PLTE are the grey
/// of their value, as Pillow pads its palette). Damage gets Pillow's verdict:
/// a bad CRC in any chunk before the image data is an error, the image
/// data's CRCs go unchecked. Rows below the region are never decoded
/// (for interlaced images the whole image must be); a file cut short is
/// still an error whatever the region, since ReadHeader checks from the bytes
/// that its chunks reach IEND.
///
/// One decoder belongs to one thread. Usage per image: ReadHeader, then at
/// most one DecodeRegion.
class PngDecoder {
 public:
  PngDecoder();
  ~PngDecoder();
  PngDecoder(const PngDecoder&) = delete;
  PngDecoder& operator=(const PngDecoder&) = delete;

  /// Parses the chunks before the image data and checks that the chunks
  /// reach IEND (bytes after it are ignored). `data` must stay alive and
  /// unchanged until DecodeRegion returns.
  /// Errors: DataError (bad signature, corrupt chunks or their CRCs,
  /// truncated anywhere: "premature end of PNG data").
  Status ReadHeader(std::span<const std::byte> data);

  /// REQUIRES: the last ReadHeader succeeded.
  int width() const;
  int height() const;

  /// Decodes columns [x0, x1) and rows [y0, y1) into `buffer` (grown as
  /// needed), described by `*region`.
  /// REQUIRES: the last ReadHeader succeeded; 0 <= x0 < x1 <= width(),
  /// 0 <= y0 < y1 <= height().
  /// Errors: DataError for corrupt or truncated image data.
  Status DecodeRegion(int x0, int y0, int x1, int y1, std::vector<uint8_t>* buffer,
                      DecodedRegion* region);

  /// ReadHeader and DecodeRegion of the whole image.
  Status DecodeFull(std::span<const std::byte> data, std::vector<uint8_t>* buffer,
                    DecodedRegion* region);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace stoker
