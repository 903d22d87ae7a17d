#include "transform/jpeg_decoder.h"

#include <algorithm>
#include <cassert>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

// jpeglib.h needs FILE and size_t declared first.
#include <jpeglib.h>
// After jpeglib.h: jerror.h reads jconfig.h's feature macros.
#include <jerror.h>

namespace stoker {
namespace {

// libjpeg warns and carries on where the entropy-coded data is damaged (a
// marker inside the scan, a bad Huffman or arithmetic code, a lost resync, a
// bogus progression), filling what it cannot read; Pillow ignores warnings
// and returns those pixels, so we do too. Only running out of data is fatal,
// as PIL's "image file is truncated" is (CheckReachesEoi sees it first).
bool IsFatalWarning(int code) { return code == JWRN_JPEG_EOF; }

StatusCode CodeFor(int msg_code) {
  switch (msg_code) {
    case JERR_BAD_PRECISION:
    case JERR_NOT_COMPILED:
    case JERR_ARITH_NOTIMPL:
    case JERR_NOTIMPL:
    case JERR_CONVERSION_NOTIMPL:
      return StatusCode::kUnsupported;
    case JERR_OUT_OF_MEMORY:
      return StatusCode::kUnavailable;
    default:
      return StatusCode::kDataError;
  }
}

struct ErrorManager {
  jpeg_error_mgr pub;  // first, so that cinfo->err casts to ErrorManager*
  std::jmp_buf jump;
  int code = 0;
  char message[JMSG_LENGTH_MAX] = {};
};

[[noreturn]] void FailAndJump(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  err->code = cinfo->err->msg_code;
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

void OnError(j_common_ptr cinfo) { FailAndJump(cinfo); }

void OnMessage(j_common_ptr cinfo, int level) {
  if (level >= 0) return;  // trace messages: never printed
  ++cinfo->err->num_warnings;
  if (IsFatalWarning(cinfo->err->msg_code)) FailAndJump(cinfo);
}

// CMYK as libjpeg hands it over to RGB with the multiplicative formula
// Pillow and TurboJPEG use. Adobe applications store CMYK inverted (each
// value 255 - ink); Pillow reads every CMYK JPEG so, with an Adobe APP14
// marker or without, and so do we: torchvision's pixels are Pillow's.
void CmykToRgb(const uint8_t* in, int width, uint8_t* out) {
  for (int x = 0; x < width; ++x) {
    const int c = in[0], m = in[1], y = in[2], k = in[3];
    // Each value is 255 - ink; multiply the two "not ink" amounts.
    out[0] = static_cast<uint8_t>((c * k + 127) / 255);
    out[1] = static_cast<uint8_t>((m * k + 127) / 255);
    out[2] = static_cast<uint8_t>((y * k + 127) / 255);
    in += 4;
    out += 3;
  }
}

constexpr int kRowsPerRead = 16;

// Whether libjpeg may smooth blocks from their neighbours (jdcoefct.c's
// smoothing_ok, widened): a progressive image whose AC coefficients are
// incomplete once all its scans are read, as when damage cut its later scans.
bool MaySmoothBlocks(const jpeg_decompress_struct& cinfo) {
  if (!cinfo.progressive_mode || !cinfo.do_block_smoothing || cinfo.coef_bits == nullptr) {
    return false;
  }
  for (int ci = 0; ci < cinfo.num_components; ++ci) {
    for (int k = 1; k < 10; ++k) {
      if (cinfo.coef_bits[ci][k] != 0) return true;
    }
  }
  return false;
}

// Whether the file holds its image whole: its markers, walked from SOI,
// reach EOI. A region decode reads the entropy-coded data only as far as the
// region's last row, so libjpeg's own "premature end" would catch a file cut
// short for some crops and not others; this check gives every crop the same
// verdict, for the price of a look at the last two bytes (a memchr over the
// data when something follows EOI).
//
// Marker segments are skipped by their length, so an EOI inside one (an EXIF
// thumbnail in APP1) does not count. In entropy-coded data 0xFF is followed
// by a stuffed 0x00 or a restart marker, both skipped; the next marker ends
// the scan. Bytes after EOI are not part of the image, as for libjpeg.
// REQUIRES: LooksLikeJpeg(data).
Status CheckReachesEoi(std::span<const std::byte> data) {
  const auto* p = reinterpret_cast<const uint8_t*>(data.data());
  const size_t n = data.size();
  // Nearly every file ends with its EOI, and a file cut inside entropy-coded
  // data cannot end with FF D9 (no marker occurs there): no need to walk.
  if (n >= 4 && p[n - 2] == 0xFF && p[n - 1] == 0xD9) return Status::Ok();
  size_t i = 2;  // after SOI
  while (i < n) {
    const void* ff = std::memchr(p + i, 0xFF, n - i);
    if (ff == nullptr) break;
    i = static_cast<size_t>(static_cast<const uint8_t*>(ff) - p);
    while (i + 1 < n && p[i + 1] == 0xFF) ++i;  // fill bytes
    if (i + 1 >= n) break;
    const uint8_t marker = p[i + 1];
    i += 2;
    if (marker == 0xD9) return Status::Ok();  // EOI
    // Stuffed 0xFF, TEM, restart markers and SOI have no length field.
    if (marker == 0x00 || marker == 0x01 || (marker >= 0xD0 && marker <= 0xD8)) continue;
    if (n - i < 2) break;
    // A length below 2 skips just the length field, as libjpeg does.
    const size_t length = std::max<size_t>(size_t{p[i]} << 8 | p[i + 1], 2);
    if (length > n - i) break;
    i += length;
  }
  return DataError("JPEG: Premature end of JPEG file: the data (" + std::to_string(n) +
                   " bytes) ends before the EOI marker that closes the image (truncated)");
}

}  // namespace

struct JpegDecoder::State {
  jpeg_decompress_struct cinfo;
  ErrorManager err;
  bool header_ok = false;
  std::vector<uint8_t> cmyk_rows;

  Status ErrorStatus() const {
    return Status(CodeFor(err.code), std::string("JPEG: ") + err.message);
  }
};

bool LooksLikeJpeg(std::span<const std::byte> data) {
  return data.size() >= 3 && data[0] == std::byte{0xFF} && data[1] == std::byte{0xD8} &&
         data[2] == std::byte{0xFF};
}

JpegDecoder::JpegDecoder() : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.cinfo.err = jpeg_std_error(&s.err.pub);
  s.err.pub.error_exit = OnError;
  s.err.pub.emit_message = OnMessage;
  // jpeg_create_decompress only fails on out-of-memory; a bad_alloc-like
  // abort there is acceptable at construction.
  if (setjmp(s.err.jump)) std::abort();
  jpeg_create_decompress(&s.cinfo);
}

JpegDecoder::~JpegDecoder() { jpeg_destroy_decompress(&state_->cinfo); }

int JpegDecoder::width() const { return static_cast<int>(state_->cinfo.image_width); }
int JpegDecoder::height() const { return static_cast<int>(state_->cinfo.image_height); }

// No object with a destructor may be alive between setjmp and a longjmp out
// of libjpeg, so these functions keep only trivial locals until they return.
Status JpegDecoder::ReadHeader(std::span<const std::byte> data) {
  State& s = *state_;
  s.header_ok = false;
  jpeg_abort_decompress(&s.cinfo);  // whatever the last image left behind
  if (data.empty()) return DataError("JPEG: empty record (0 bytes)");
  // Not a JPEG at all: libjpeg says so below.
  if (LooksLikeJpeg(data)) STOKER_RETURN_IF_ERROR(CheckReachesEoi(data));
  if (setjmp(s.err.jump)) {
    jpeg_abort_decompress(&s.cinfo);
    return s.ErrorStatus();
  }
  s.err.pub.num_warnings = 0;
  jpeg_mem_src(&s.cinfo, reinterpret_cast<const unsigned char*>(data.data()),
               static_cast<unsigned long>(data.size()));
  jpeg_read_header(&s.cinfo, TRUE);
  s.header_ok = true;
  return Status::Ok();
}

Status JpegDecoder::DecodeRegion(int denom, int x0, int y0, int x1, int y1,
                                 std::vector<uint8_t>* buffer, DecodedRegion* region) {
  State& s = *state_;
  assert(s.header_ok);
  assert(denom == 1 || denom == 2 || denom == 4 || denom == 8);
  assert(0 <= x0 && x0 < x1 && x1 <= ScaledSize(width(), denom));
  assert(0 <= y0 && y0 < y1 && y1 <= ScaledSize(height(), denom));
  s.header_ok = false;
  jpeg_decompress_struct& cinfo = s.cinfo;
  if (setjmp(s.err.jump)) {
    jpeg_abort_decompress(&cinfo);
    return s.ErrorStatus();
  }
  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  cinfo.scale_num = 1;
  cinfo.scale_denom = static_cast<unsigned int>(denom);
  cinfo.dct_method = JDCT_ISLOW;
  cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_EXT_RGB;
  jpeg_start_decompress(&cinfo);
  if (cinfo.output_width != static_cast<JDIMENSION>(ScaledSize(width(), denom)) ||
      cinfo.output_height != static_cast<JDIMENSION>(ScaledSize(height(), denom))) {
    jpeg_abort_decompress(&cinfo);
    return Internal("JPEG: libjpeg scaled to an unexpected size");
  }
  // A column either side gives the chroma upsampler of the region's edge
  // columns their neighbours; without them, when x0 or x1 falls on an iMCU
  // boundary, the edge columns differ from a full decode's.
  const JDIMENSION crop_end =
      std::min<JDIMENSION>(static_cast<JDIMENSION>(x1) + 2, cinfo.output_width);
  JDIMENSION crop_x = static_cast<JDIMENSION>(x0 > 0 ? x0 - 1 : 0);
  JDIMENSION crop_width = crop_end - crop_x;
  // Smoothing reads the blocks beside a block, which a crop cuts off at its
  // edges: those images are decoded at full width, as Pillow decodes them.
  if (MaySmoothBlocks(cinfo)) {
    crop_x = 0;
    crop_width = cinfo.output_width;
  }
  if (crop_x > 0 || crop_width < cinfo.output_width) {
    jpeg_crop_scanline(&cinfo, &crop_x, &crop_width);
  }
  if (y0 > 0 &&
      jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(y0)) != static_cast<JDIMENSION>(y0)) {
    jpeg_abort_decompress(&cinfo);
    return DataError("JPEG: could not skip to row " + std::to_string(y0));
  }
  const size_t stride = static_cast<size_t>(crop_width) * 3;
  const int rows = y1 - y0;
  uint8_t* out = GrowBuffer(*buffer, stride * static_cast<size_t>(rows));
  uint8_t* cmyk_rows =
      cmyk ? GrowBuffer(s.cmyk_rows, static_cast<size_t>(crop_width) * 4 * kRowsPerRead) : nullptr;
  JSAMPROW pointers[kRowsPerRead];
  int done = 0;
  while (done < rows) {
    int want = rows - done < kRowsPerRead ? rows - done : kRowsPerRead;
    for (int i = 0; i < want; ++i) {
      pointers[i] = cmyk ? cmyk_rows + static_cast<size_t>(i) * crop_width * 4
                         : out + static_cast<size_t>(done + i) * stride;
    }
    int got =
        static_cast<int>(jpeg_read_scanlines(&cinfo, pointers, static_cast<JDIMENSION>(want)));
    if (got <= 0) {
      jpeg_abort_decompress(&cinfo);
      return DataError("JPEG: decoder returned no rows at row " + std::to_string(y0 + done));
    }
    if (cmyk) {
      for (int i = 0; i < got; ++i) {
        CmykToRgb(pointers[i], static_cast<int>(crop_width),
                  out + static_cast<size_t>(done + i) * stride);
      }
    }
    done += got;
  }
  // Stop here: rows below the region are never decoded.
  jpeg_abort_decompress(&cinfo);
  region->pixels = out;
  region->x0 = static_cast<int>(crop_x);
  region->y0 = y0;
  region->width = static_cast<int>(crop_width);
  region->height = rows;
  region->stride = stride;
  return Status::Ok();
}

Status JpegDecoder::DecodeFull(std::span<const std::byte> data, int denom,
                               std::vector<uint8_t>* buffer, DecodedRegion* region) {
  STOKER_RETURN_IF_ERROR(ReadHeader(data));
  return DecodeRegion(denom, 0, 0, ScaledSize(width(), denom), ScaledSize(height(), denom), buffer,
                      region);
}

}  // namespace stoker
