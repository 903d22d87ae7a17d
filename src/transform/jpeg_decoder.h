#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "stoker/status.h"
#include "transform/decoded_region.h"

namespace stoker {

/// True if `data` starts like a JPEG file (SOI marker then another marker).
bool LooksLikeJpeg(std::span<const std::byte> data);

/// Decodes JPEG images with libjpeg-turbo, reading only the region asked for:
/// the columns through jpeg_crop_scanline, the rows below the first through
/// jpeg_skip_scanlines, stopping after the last, optionally at a DCT scale of
/// 1/2, 1/4 or 1/8. Output is always 8-bit RGB: grayscale is expanded, CMYK
/// and YCCK are converted, read as stored inverted (as Photoshop writes it)
/// with an Adobe marker or without, as Pillow reads them.
///
/// libjpeg errors become Status values. Damaged entropy-coded data in a file
/// that reaches its EOI (a marker inside the scan, bad Huffman or arithmetic
/// codes, lost resync) only makes libjpeg warn and fill what it cannot read;
/// its pixels are returned as Pillow returns them, so every path gives
/// torchvision's sample (a progressive image that lost scans, whose blocks
/// libjpeg smooths from their neighbours, is decoded at full width for it).
/// A file cut short is an error, never grey pixels, whatever region is
/// decoded: ReadHeader checks from the bytes that the markers reach EOI, so
/// the verdict does not depend on the crop.
///
/// One decoder belongs to one thread; it keeps its libjpeg state and buffers
/// between images. Usage per image: ReadHeader, then at most one
/// DecodeRegion (or none: the next ReadHeader starts over).
class JpegDecoder {
 public:
  JpegDecoder();
  ~JpegDecoder();
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;

  /// Parses the headers of `data`, which must stay alive and unchanged until
  /// DecodeRegion returns, and checks that the data reaches its EOI marker
  /// (its last two bytes, or a memchr pass when bytes follow EOI: they are
  /// ignored). Allocates nothing for pixels.
  /// Errors: DataError (not a JPEG, truncated anywhere: "Premature end of
  /// JPEG file"), Unsupported (12-bit).
  Status ReadHeader(std::span<const std::byte> data);

  /// Full-size dimensions. REQUIRES: the last ReadHeader succeeded.
  int width() const;
  int height() const;

  /// The size of a dimension `size` at DCT scale 1/denom (what libjpeg makes).
  static int ScaledSize(int size, int denom) { return (size + denom - 1) / denom; }

  /// Decodes at scale 1/`denom` (1, 2, 4 or 8) at least the columns [x0, x1)
  /// and exactly the rows [y0, y1) of the scaled image into `buffer` (grown
  /// as needed), described by `*region`. The region may start left of x0
  /// (libjpeg crops at iMCU boundaries).
  /// REQUIRES: the last ReadHeader succeeded; 0 <= x0 < x1 <= scaled width,
  /// 0 <= y0 < y1 <= scaled height.
  /// Errors: DataError where libjpeg gives up (an error, not a warning) within
  /// the rows read.
  Status DecodeRegion(int denom, int x0, int y0, int x1, int y1, std::vector<uint8_t>* buffer,
                      DecodedRegion* region);

  /// Decodes the whole image at scale 1/`denom` (ReadHeader included).
  Status DecodeFull(std::span<const std::byte> data, int denom, std::vector<uint8_t>* buffer,
                    DecodedRegion* region);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace stoker
