#pragma once

#include <cstdint>
#include <vector>

#include "stoker/status.h"

namespace stoker {

/// How EncodeJpeg writes a file.
struct JpegEncodeOptions {
  /// libjpeg quality, 1..100.
  int quality = 90;
  bool progressive = false;
  /// Arithmetic instead of Huffman entropy coding.
  bool arithmetic = false;
  /// 4-component input only: store it as YCCK instead of plain CMYK.
  bool ycck = false;
};

/// Encodes `width` x `height` pixels of `components` interleaved 8-bit
/// channels (1 grayscale, 3 RGB, 4 CMYK written as given with an Adobe
/// marker) with libjpeg-turbo into `*out` (replaced), 4:2:0 chroma for RGB.
/// Deterministic: the same pixels and options give the same bytes.
/// Errors: InvalidArgument for bad sizes or options, Unsupported when the
/// library refuses an option (e.g. arithmetic coding not built in).
Status EncodeJpeg(const uint8_t* pixels, int width, int height, int components,
                  const JpegEncodeOptions& options, std::vector<uint8_t>* out);

}  // namespace stoker
