#include "transform/png_decoder.h"

#include <png.h>
#include <zlib.h>

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace stoker {

namespace {

struct PngInput {
  const std::byte* data = nullptr;
  size_t size = 0;
  size_t offset = 0;
  size_t zeros = 0;  // read as zeros past the end: the rest of a last IDAT chunk cut short
};

void ReadFromMemory(png_structp png, png_bytep out, size_t n) {
  auto* in = static_cast<PngInput*>(png_get_io_ptr(png));
  if (in->size + in->zeros - in->offset < n) {
    png_error(png, "premature end of PNG data (truncated file)");
  }
  const size_t here = in->offset < in->size ? std::min(n, in->size - in->offset) : 0;
  std::memcpy(out, in->data + in->offset, here);
  std::memset(out + here, 0, n - here);
  in->offset += n;
}

[[noreturn]] void OnError(png_structp png, png_const_charp message) {
  auto* s = static_cast<char*>(png_get_error_ptr(png));
  std::snprintf(s, 256, "%s", message);
  png_longjmp(png, 1);
}

void OnWarning(png_structp, png_const_charp) {}

uint32_t BigEndian32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | uint32_t{p[3]};
}

// The bytes of filtered rows a PNG's image data inflates to, from its IHDR
// (the first chunk: width, height, bit depth, colour type, interlace); 0 when
// there is none to read.
uint64_t ImageDataBytes(const uint8_t* p, size_t n) {
  if (n < 8 + 8 + 13 || std::memcmp(p + 12, "IHDR", 4) != 0) return 0;
  const uint64_t width = BigEndian32(p + 16), height = BigEndian32(p + 20);
  const int depth = p[24], color = p[25], interlace = p[28];
  const int channels = color == 2 ? 3 : color == 4 ? 2 : color == 6 ? 4 : 1;
  const uint64_t bits = static_cast<uint64_t>(channels) * static_cast<uint64_t>(depth);
  auto rows = [bits](uint64_t w, uint64_t h) { return w == 0 ? 0 : h * (1 + (w * bits + 7) / 8); };
  if (interlace == 0) return rows(width, height);
  uint64_t total = 0;  // Adam7: each pass's columns and rows, from its start and step
  constexpr int kStart[7][2] = {{0, 0}, {4, 0}, {0, 4}, {2, 0}, {0, 2}, {1, 0}, {0, 1}};
  constexpr int kStep[7][2] = {{8, 8}, {8, 8}, {4, 8}, {4, 4}, {2, 4}, {2, 2}, {1, 2}};
  for (int pass = 0; pass < 7; ++pass) {
    auto count = [](uint64_t size, int start, int step) {
      return size > static_cast<uint64_t>(start) ? (size - start + step - 1) / step : 0;
    };
    total += rows(count(width, kStart[pass][0], kStep[pass][0]),
                  count(height, kStart[pass][1], kStep[pass][1]));
  }
  return total;
}

// Whether `idat` (the image data's pieces, in order) inflates to at least
// `wanted` bytes: every row is there.
bool InflatesTo(const std::vector<std::span<const uint8_t>>& idat, uint64_t wanted) {
  z_stream z{};
  if (inflateInit(&z) != Z_OK) return false;
  std::vector<uint8_t> scratch(64 * 1024);
  uint64_t got = 0;
  int rc = Z_OK;
  for (const auto& piece : idat) {
    z.next_in = const_cast<uint8_t*>(piece.data());
    z.avail_in = static_cast<uInt>(piece.size());
    while (z.avail_in > 0 && rc == Z_OK && got < wanted) {
      z.next_out = scratch.data();
      z.avail_out = static_cast<uInt>(scratch.size());
      rc = inflate(&z, Z_NO_FLUSH);
      got += scratch.size() - z.avail_out;
    }
    if (rc != Z_OK) break;
  }
  inflateEnd(&z);
  return got >= wanted;
}

// Whether the file holds its image whole, as Pillow judges it: the image
// data gives every row (inflated, when the file ends within or right after
// it), and no chunk after it whose header is there is cut short. IEND may be
// missing. A region decode stops reading image data after the region's last
// row, so libpng's own "premature end" would catch a file cut short for
// some crops and not others; this check gives every crop the same verdict.
// Bytes after IEND are not part of the image. `missing`: what the last IDAT
// chunk lacks of its data and CRC when the file ends in it, its rows all there
// (libpng reads it to the end). REQUIRES: LooksLikePng(data).
Status CheckImageWhole(std::span<const std::byte> data, size_t* missing) {
  *missing = 0;
  const auto* p = reinterpret_cast<const uint8_t*>(data.data());
  const size_t n = data.size();
  std::vector<std::span<const uint8_t>> idat;
  bool after_idat = false;  // a whole chunk follows the image data
  size_t i = 8;             // after the signature
  // A chunk: 4 bytes of length, 4 of type, the data, 4 of CRC.
  while (n - i >= 8) {
    const uint32_t length = BigEndian32(p + i);
    if (length > 0x7FFFFFFFu) {
      return DataError("PNG: chunk at byte " + std::to_string(i) + " has length " +
                       std::to_string(length) + ", more than PNG allows (corrupt)");
    }
    if (std::memcmp(p + i + 4, "IEND", 4) == 0) {
      if (!idat.empty()) return Status::Ok();
      break;
    }
    const bool is_idat = std::memcmp(p + i + 4, "IDAT", 4) == 0;
    const size_t here = n - i - 8;  // of its data and CRC
    if (is_idat && !after_idat) {
      idat.emplace_back(p + i + 8, std::min<size_t>(length, here));
      *missing = size_t{length} + 4 - std::min<size_t>(size_t{length} + 4, here);
    } else if (!idat.empty()) {
      after_idat = true;
    }
    if (length > here) {
      if (after_idat) {
        return DataError("PNG: premature end of PNG data (truncated file: " + std::to_string(n) +
                         " bytes; the " + std::string(reinterpret_cast<const char*>(p + i + 4), 4) +
                         " chunk after the image data is cut short)");
      }
      break;
    }
    i += std::min<size_t>(n - i, 12 + size_t{length});
  }
  if (after_idat) {  // the image data's chunks are whole
    *missing = 0;
    return Status::Ok();
  }
  const uint64_t wanted = ImageDataBytes(p, n);
  if (!idat.empty() && wanted > 0 && InflatesTo(idat, wanted)) return Status::Ok();
  return DataError("PNG: premature end of PNG data (truncated file: " + std::to_string(n) +
                   " bytes, and its image data does not hold every row)");
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
  size_t missing = 0;
  STOKER_RETURN_IF_ERROR(CheckImageWhole(data, &missing));
  s.input = {data.data(), data.size(), 0, missing};
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
  // The zlib checksum of image data cut short is read as zeros: Pillow stops
  // once it has every row, never reading it.
  if (missing > 0) png_set_option(s.png, PNG_IGNORE_ADLER32, PNG_OPTION_ON);
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
