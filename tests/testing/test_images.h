#pragma once

// Test-only helpers: synthetic photographs and their JPEG/PNG files, and a
// plain reference decoder built directly on libjpeg.

#include <png.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

// jpeglib.h needs FILE and size_t declared first.
#include <jpeglib.h>

#include "transform/jpeg_encoder.h"

namespace stoker::testing {

/// A deterministic RGB picture with smooth areas, edges and texture, so that
/// crops and resampling errors show.
inline std::vector<uint8_t> MakePicture(int width, int height, int seed = 0) {
  std::vector<uint8_t> rgb(static_cast<size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      uint8_t* p = &rgb[(static_cast<size_t>(y) * width + x) * 3];
      double u = static_cast<double>(x) / width, v = static_cast<double>(y) / height;
      double wave = std::sin(x * 0.07 + seed) * std::cos(y * 0.05 - seed);
      bool disc = (u - 0.6) * (u - 0.6) + (v - 0.4) * (v - 0.4) < 0.04;
      p[0] = static_cast<uint8_t>(std::lround(40 + 180 * u + 25 * wave));
      p[1] = static_cast<uint8_t>(std::lround(disc ? 230 : 60 + 120 * v));
      p[2] = static_cast<uint8_t>(std::lround(128 + 100 * wave * (1 - u)));
    }
  }
  return rgb;
}

inline std::span<const std::byte> AsBytes(const std::vector<uint8_t>& v) {
  return std::as_bytes(std::span<const uint8_t>(v));
}

/// Encodes `pixels` (components 1, 3 or 4) or fails the test.
inline std::vector<uint8_t> Jpeg(const std::vector<uint8_t>& pixels, int width, int height,
                                 int components = 3, JpegEncodeOptions options = {}) {
  std::vector<uint8_t> out;
  Status s = EncodeJpeg(pixels.data(), width, height, components, options, &out);
  if (!s.ok()) {
    std::fprintf(stderr, "EncodeJpeg: %s\n", s.ToString().c_str());
    std::abort();
  }
  return out;
}

/// An 8-bit RGB image held in memory.
struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;
  const uint8_t* at(int x, int y) const { return &rgb[(static_cast<size_t>(y) * width + x) * 3]; }
};

/// The reference: a whole-image decode with libjpeg's defaults for RGB
/// output, nothing skipped or cropped. libjpeg's warnings (damaged scan data)
/// are ignored, as Pillow ignores them; an error exits the test.
inline Image ReferenceDecodeJpeg(const std::vector<uint8_t>& file, int denom = 1) {
  jpeg_decompress_struct cinfo;
  jpeg_error_mgr err;
  cinfo.err = jpeg_std_error(&err);
  err.emit_message = [](j_common_ptr, int) {};
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, file.data(), static_cast<unsigned long>(file.size()));
  jpeg_read_header(&cinfo, TRUE);
  cinfo.out_color_space = JCS_RGB;
  cinfo.scale_num = 1;
  cinfo.scale_denom = static_cast<unsigned>(denom);
  cinfo.dct_method = JDCT_ISLOW;
  jpeg_start_decompress(&cinfo);
  Image img;
  img.width = static_cast<int>(cinfo.output_width);
  img.height = static_cast<int>(cinfo.output_height);
  img.rgb.resize(static_cast<size_t>(img.width) * img.height * 3);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = &img.rgb[static_cast<size_t>(cinfo.output_scanline) * img.width * 3];
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return img;
}

/// Writes a PNG with libpng from rows of `channels` samples of `bit_depth`
/// bits (8 or 16; 16-bit samples big-endian as PNG stores them).
inline std::vector<uint8_t> Png(const std::vector<uint8_t>& samples, int width, int height,
                                int color_type, int bit_depth, bool interlaced = false,
                                const std::vector<png_color>& palette = {},
                                const std::vector<png_byte>& palette_alpha = {}) {
  std::vector<uint8_t> out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  png_set_write_fn(
      png, &out,
      [](png_structp p, png_bytep data, size_t n) {
        auto* o = static_cast<std::vector<uint8_t>*>(png_get_io_ptr(p));
        o->insert(o->end(), data, data + n);
      },
      nullptr);
  png_set_IHDR(png, info, static_cast<png_uint_32>(width), static_cast<png_uint_32>(height),
               bit_depth, color_type, interlaced ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (!palette.empty()) {
    png_set_PLTE(png, info, palette.data(), static_cast<int>(palette.size()));
  }
  if (!palette_alpha.empty()) {  // a tRNS chunk: each palette entry's alpha
    png_set_tRNS(png, info, palette_alpha.data(), static_cast<int>(palette_alpha.size()), nullptr);
  }
  png_write_info(png, info);
  const size_t row_bytes = samples.size() / static_cast<size_t>(height);
  std::vector<png_bytep> rows(static_cast<size_t>(height));
  for (int y = 0; y < height; ++y) {
    rows[static_cast<size_t>(y)] =
        const_cast<png_bytep>(&samples[static_cast<size_t>(y) * row_bytes]);
  }
  png_write_image(png, rows.data());
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

/// Triangle-filter weights of one axis, computed directly in double: the
/// plain reference for the resampler (Pillow's BILINEAR with antialias).
/// Output i of `out_size` samples the input at in0 + (i + 0.5) * scale,
/// using inputs in [lo, hi).
struct RefAxis {
  std::vector<int> first;
  std::vector<std::vector<double>> weights;
};
inline RefAxis ReferenceAxis(double in0, double scale, int out_size, int lo, int hi) {
  RefAxis a;
  double fs = scale > 1 ? scale : 1;
  for (int i = 0; i < out_size; ++i) {
    double c = in0 + (i + 0.5) * scale;
    int b = static_cast<int>(std::floor(c - fs + 0.5));
    int e = static_cast<int>(std::floor(c + fs + 0.5));
    if (b < lo) b = lo;
    if (e > hi) e = hi;
    std::vector<double> w;
    double sum = 0;
    for (int p = b; p < e; ++p) {
      double t = std::fabs((p + 0.5 - c) / fs);
      w.push_back(t < 1 ? 1 - t : 0);
      sum += w.back();
    }
    for (double& v : w) v /= sum;
    a.first.push_back(b);
    a.weights.push_back(w);
  }
  return a;
}

/// Resamples `img` with the two axes' weights: the reference output, float RGB.
inline std::vector<double> ReferenceResample(const Image& img, const RefAxis& ax,
                                             const RefAxis& ay) {
  const size_t ow = ax.first.size(), oh = ay.first.size();
  std::vector<double> out(ow * oh * 3, 0.0);
  for (size_t y = 0; y < oh; ++y) {
    for (size_t x = 0; x < ow; ++x) {
      for (size_t j = 0; j < ay.weights[y].size(); ++j) {
        for (size_t i = 0; i < ax.weights[x].size(); ++i) {
          const uint8_t* p =
              img.at(ax.first[x] + static_cast<int>(i), ay.first[y] + static_cast<int>(j));
          double w = ay.weights[y][j] * ax.weights[x][i];
          for (int c = 0; c < 3; ++c) out[(y * ow + x) * 3 + c] += w * p[c];
        }
      }
    }
  }
  return out;
}

}  // namespace stoker::testing
