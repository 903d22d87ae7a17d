#include "transform/png_decoder.h"

#include <png.h>

#include <cassert>
#include <cstdio>
#include <cstring>
#include <string>

namespace stoker {

namespace {

struct PngInput {
  const std::byte* data = nullptr;
  size_t size = 0;
  size_t offset = 0;
};

void ReadFromMemory(png_structp png, png_bytep out, size_t n) {
  auto* in = static_cast<PngInput*>(png_get_io_ptr(png));
  if (in->size - in->offset < n) png_error(png, "premature end of PNG data (truncated file)");
  std::memcpy(out, in->data + in->offset, n);
  in->offset += n;
}

[[noreturn]] void OnError(png_structp png, png_const_charp message) {
  auto* s = static_cast<char*>(png_get_error_ptr(png));
  std::snprintf(s, 256, "%s", message);
  png_longjmp(png, 1);
}

void OnWarning(png_structp, png_const_charp) {}

// Whether the file holds its image whole: its chunks, walked by their
// lengths from the signature, reach IEND. A region decode stops reading
// image data after the region's last row, so libpng's own "premature end"
// would catch a file cut short for some crops and not others; this check
// gives every crop the same verdict. Bytes after IEND are not part of the
// image. REQUIRES: LooksLikePng(data).
Status CheckReachesIend(std::span<const std::byte> data) {
  const auto* p = reinterpret_cast<const uint8_t*>(data.data());
  const size_t n = data.size();
  size_t i = 8;  // after the signature
  // A chunk: 4 bytes of length, 4 of type, the data, 4 of CRC.
  while (n - i >= 12) {
    const uint32_t length = uint32_t{p[i]} << 24 | uint32_t{p[i + 1]} << 16 |
                            uint32_t{p[i + 2]} << 8 | uint32_t{p[i + 3]};
    if (length > 0x7FFFFFFFu) {
      return DataError("PNG: chunk at byte " + std::to_string(i) + " has length " +
                       std::to_string(length) + ", more than PNG allows (corrupt)");
    }
    if (length > n - i - 12) break;
    if (std::memcmp(p + i + 4, "IEND", 4) == 0) return Status::Ok();
    i += 12 + length;
  }
  return DataError("PNG: premature end of PNG data (truncated file: " + std::to_string(n) +
                   " bytes, and no IEND chunk closes the image)");
}

// Pillow gives an index past the PLTE's entries (invalid, but some tools
// write it) the grey of its value, where libpng gives black: the palette is
// padded with that grey ramp to every index the bit depth allows.
void PadPalette(png_structp png, png_infop info, int bit_depth) {
  png_colorp stored = nullptr;
  int stored_entries = 0;
  if (png_get_PLTE(png, info, &stored, &stored_entries) == 0) return;
  const int entries = 1 << bit_depth;
  if (stored_entries >= entries) return;
  png_color padded[PNG_MAX_PALETTE_LENGTH];
  std::memcpy(padded, stored, sizeof(png_color) * static_cast<size_t>(stored_entries));
  for (int i = stored_entries; i < entries; ++i) {
    const auto grey = static_cast<png_byte>(i);
    padded[i] = {grey, grey, grey};
  }
  png_set_PLTE(png, info, padded, entries);
}

}  // namespace

struct PngDecoder::State {
  png_structp png = nullptr;
  png_infop info = nullptr;
  PngInput input;
  bool header_ok = false;
  char message[256] = {};
  std::vector<uint8_t> row;
  std::vector<uint8_t> full;  // interlaced images only

  void Release() {
    if (png != nullptr) png_destroy_read_struct(&png, &info, nullptr);
    png = nullptr;
    info = nullptr;
    header_ok = false;
  }
  Status ErrorStatus() const { return DataError(std::string("PNG: ") + message); }
};

bool LooksLikePng(std::span<const std::byte> data) {
  static constexpr uint8_t kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  return data.size() >= 8 && std::memcmp(data.data(), kSignature, 8) == 0;
}

PngDecoder::PngDecoder() : state_(std::make_unique<State>()) {}
PngDecoder::~PngDecoder() { state_->Release(); }

int PngDecoder::width() const {
  return static_cast<int>(png_get_image_width(state_->png, state_->info));
}
int PngDecoder::height() const {
  return static_cast<int>(png_get_image_height(state_->png, state_->info));
}

// No object with a destructor may be alive between setjmp and a longjmp out
// of libpng, so these functions keep only trivial locals until they return.
Status PngDecoder::ReadHeader(std::span<const std::byte> data) {
  State& s = *state_;
  s.Release();
  if (data.empty()) return DataError("PNG: empty record (0 bytes)");
  if (!LooksLikePng(data)) return DataError("PNG: bad signature");
  STOKER_RETURN_IF_ERROR(CheckReachesIend(data));
  s.input = {data.data(), data.size(), 0};
  s.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, s.message, OnError, OnWarning);
  if (s.png == nullptr) return Unavailable("PNG: cannot create the libpng reader");
  s.info = png_create_info_struct(s.png);
  if (s.info == nullptr) return Unavailable("PNG: cannot create the libpng reader");
  if (setjmp(png_jmpbuf(s.png))) return s.ErrorStatus();
  png_set_read_fn(s.png, &s.input, ReadFromMemory);
  // Pillow checks the CRC of every chunk before the image data and refuses a
  // bad one, ancillary or not (libpng would drop a bad ancillary chunk), but
  // never the image data's: libpng does the same from here.
  png_set_crc_action(s.png, PNG_CRC_DEFAULT, PNG_CRC_ERROR_QUIT);
  png_read_info(s.png, s.info);
  png_set_crc_action(s.png, PNG_CRC_QUIET_USE, PNG_CRC_QUIET_USE);
  s.header_ok = true;
  return Status::Ok();
}

Status PngDecoder::DecodeRegion(int x0, int y0, int x1, int y1, std::vector<uint8_t>* buffer,
                                DecodedRegion* region) {
  State& s = *state_;
  assert(s.header_ok);
  assert(0 <= x0 && x0 < x1 && x1 <= width());
  assert(0 <= y0 && y0 < y1 && y1 <= height());
  s.header_ok = false;
  png_structp png = s.png;
  png_infop info = s.info;
  if (setjmp(png_jmpbuf(png))) return s.ErrorStatus();
  const int color_type = png_get_color_type(png, info);
  const int bit_depth = png_get_bit_depth(png, info);
  // 16-bit gray is PIL's mode "I": its RGB is each value clamped to 255, not
  // its high byte (every other 16-bit type keeps the high byte, as libpng's
  // strip does). Its rows stay 16-bit here and are clamped as they are copied.
  const bool gray16 = color_type == PNG_COLOR_TYPE_GRAY && bit_depth == 16;
  if (color_type == PNG_COLOR_TYPE_PALETTE) {
    PadPalette(png, info, bit_depth);
    png_set_palette_to_rgb(png);
    // That expands a tRNS chunk to alpha too; PIL's convert("RGB") drops it.
    if (png_get_valid(png, info, PNG_INFO_tRNS) != 0) png_set_strip_alpha(png);
  }
  if (color_type == PNG_COLOR_TYPE_GRAY && bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (bit_depth == 16 && !gray16) png_set_strip_16(png);
  if ((color_type & PNG_COLOR_MASK_ALPHA) != 0) png_set_strip_alpha(png);
  if ((color_type == PNG_COLOR_TYPE_GRAY && !gray16) || color_type == PNG_COLOR_TYPE_GRAY_ALPHA) {
    png_set_gray_to_rgb(png);
  }
  const int passes = png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const size_t full_width = png_get_image_width(png, info);
  const size_t row_bytes = png_get_rowbytes(png, info);
  const size_t pixel_bytes = gray16 ? 2 : 3;
  if (row_bytes != full_width * pixel_bytes) {
    return Internal("PNG: transforms did not give 8-bit RGB (or 16-bit gray) rows");
  }
  const size_t stride = static_cast<size_t>(x1 - x0) * 3;
  uint8_t* out = GrowBuffer(*buffer, stride * static_cast<size_t>(y1 - y0));
  const auto copy_row = [&](const uint8_t* row, int y) {
    uint8_t* to = out + static_cast<size_t>(y - y0) * stride;
    const uint8_t* from = row + static_cast<size_t>(x0) * pixel_bytes;
    if (!gray16) {
      std::memcpy(to, from, stride);
      return;
    }
    for (int x = 0; x < x1 - x0; ++x, from += 2, to += 3) {
      const uint8_t v = from[0] != 0 ? 255 : from[1];  // big-endian: > 255 clamps
      to[0] = to[1] = to[2] = v;
    }
  };
  if (passes == 1) {
    uint8_t* row = GrowBuffer(s.row, row_bytes);
    for (int y = 0; y < y1; ++y) {
      png_read_row(png, row, nullptr);
      if (y >= y0) copy_row(row, y);
    }
  } else {
    // Adam7 spreads every row over all passes: the whole image is needed.
    const int rows = height();
    uint8_t* full = GrowBuffer(s.full, row_bytes * static_cast<size_t>(rows));
    for (int pass = 0; pass < passes; ++pass) {
      for (int y = 0; y < rows; ++y)
        png_read_row(png, full + static_cast<size_t>(y) * row_bytes, nullptr);
    }
    for (int y = y0; y < y1; ++y) copy_row(full + static_cast<size_t>(y) * row_bytes, y);
  }
  region->pixels = out;
  region->x0 = x0;
  region->y0 = y0;
  region->width = x1 - x0;
  region->height = y1 - y0;
  region->stride = stride;
  return Status::Ok();
}

Status PngDecoder::DecodeFull(std::span<const std::byte> data, std::vector<uint8_t>* buffer,
                              DecodedRegion* region) {
  STOKER_RETURN_IF_ERROR(ReadHeader(data));
  return DecodeRegion(0, 0, width(), height(), buffer, region);
}

}  // namespace stoker
