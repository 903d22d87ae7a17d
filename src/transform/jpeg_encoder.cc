#include "transform/jpeg_encoder.h"

#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <string>

// jpeglib.h needs FILE and size_t declared first.
#include <jpeglib.h>
// After jpeglib.h: jerror.h reads jconfig.h's feature macros.
#include <jerror.h>

namespace stoker {
namespace {

struct EncodeErrors {
  jpeg_error_mgr pub;  // first, so that cinfo->err casts to EncodeErrors*
  std::jmp_buf jump;
  int code = 0;
  char message[JMSG_LENGTH_MAX] = {};
};

[[noreturn]] void OnEncodeError(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<EncodeErrors*>(cinfo->err);
  err->code = cinfo->err->msg_code;
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

void OnEncodeMessage(j_common_ptr, int) {}

// Owns what libjpeg's memory destination mallocs. Lives in the frame that
// calls setjmp, created before it, so a longjmp back there leaves it intact.
struct Destination {
  unsigned char* data = nullptr;
  unsigned long size = 0;
  ~Destination() { std::free(data); }
};

}  // namespace

Status EncodeJpeg(const uint8_t* pixels, int width, int height, int components,
                  const JpegEncodeOptions& options, std::vector<uint8_t>* out) {
  if (width < 1 || height < 1 || width > JPEG_MAX_DIMENSION || height > JPEG_MAX_DIMENSION) {
    return InvalidArgument("JPEG encode: size " + std::to_string(width) + "x" +
                           std::to_string(height) + " out of range");
  }
  if (components != 1 && components != 3 && components != 4) {
    return InvalidArgument("JPEG encode: components = " + std::to_string(components) +
                           ", expected 1, 3 or 4");
  }
  if (options.quality < 1 || options.quality > 100) {
    return InvalidArgument("JPEG encode: quality = " + std::to_string(options.quality) +
                           ", expected 1..100");
  }
  jpeg_compress_struct cinfo;
  EncodeErrors err;
  Destination dest;
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = OnEncodeError;
  err.pub.emit_message = OnEncodeMessage;
  if (setjmp(err.jump)) {
    jpeg_destroy_compress(&cinfo);
    StatusCode code = err.code == JERR_NOT_COMPILED || err.code == JERR_ARITH_NOTIMPL
                          ? StatusCode::kUnsupported
                          : StatusCode::kInternal;
    return Status(code, std::string("JPEG encode: ") + err.message);
  }
  jpeg_create_compress(&cinfo);
  jpeg_mem_dest(&cinfo, &dest.data, &dest.size);
  cinfo.image_width = static_cast<JDIMENSION>(width);
  cinfo.image_height = static_cast<JDIMENSION>(height);
  cinfo.input_components = components;
  cinfo.in_color_space = components == 1 ? JCS_GRAYSCALE : (components == 3 ? JCS_RGB : JCS_CMYK);
  jpeg_set_defaults(&cinfo);
  if (components == 4 && options.ycck) jpeg_set_colorspace(&cinfo, JCS_YCCK);
  jpeg_set_quality(&cinfo, options.quality, TRUE);
  cinfo.dct_method = JDCT_ISLOW;
  if (options.arithmetic) cinfo.arith_code = TRUE;
  if (options.progressive) jpeg_simple_progression(&cinfo);
  jpeg_start_compress(&cinfo, TRUE);
  const size_t stride = static_cast<size_t>(width) * components;
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(pixels + cinfo.next_scanline * stride);
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  out->assign(dest.data, dest.data + dest.size);
  return Status::Ok();
}

}  // namespace stoker
