// libFuzzer target for the image decode path: arbitrary bytes through the
// JPEG and PNG decoders (whole image, DCT-scaled regions) and through the
// fused train and eval transforms. Any outcome but a crash, a sanitizer
// report or a hang is fine: bad bytes must become a Status.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "stoker/image.h"
#include "transform/jpeg_decoder.h"
#include "transform/png_decoder.h"

namespace {

// Small enough that no input can make the fuzzer run out of memory.
constexpr int64_t kMaxPixels = 1 << 22;

struct Fixture {
  std::shared_ptr<const stoker::Transform> train;
  std::shared_ptr<const stoker::Transform> eval;
  std::shared_ptr<const stoker::Transform> crop;  // CenterCrop alone: pads small images
  std::unique_ptr<stoker::TransformScratch> train_scratch;
  std::unique_ptr<stoker::TransformScratch> eval_scratch;
  std::unique_ptr<stoker::TransformScratch> crop_scratch;
  stoker::JpegDecoder jpeg;
  stoker::PngDecoder png;
  std::vector<uint8_t> pixels;
  std::vector<std::byte> out;

  Fixture() {
    stoker::ImageTransformOptions o;
    o.height = o.width = 24;
    o.layout = stoker::ImageLayout::kUInt8HWC;
    o.max_pixels = kMaxPixels;
    train = *stoker::MakeImageTransform(o);
    o.mode = stoker::ImageMode::kEval;
    o.resize_shorter = 28;
    o.layout = stoker::ImageLayout::kFloat32CHW;
    eval = *stoker::MakeImageTransform(o);
    o.resize_shorter = 0;
    o.interpolation = stoker::ImageInterpolation::kBicubic;
    crop = *stoker::MakeImageTransform(o);
    train_scratch = train->NewScratch();
    eval_scratch = eval->NewScratch();
    crop_scratch = crop->NewScratch();
    out.resize(eval->spec().bytes());
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture* f = new Fixture();
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  stoker::DecodedRegion region;

  if (f->jpeg.ReadHeader(bytes).ok()) {
    const int w = f->jpeg.width(), h = f->jpeg.height();
    if (w > 0 && h > 0 && static_cast<int64_t>(w) * h <= kMaxPixels) {
      const int denom = 1 << (size % 4);
      const int sw = stoker::JpegDecoder::ScaledSize(w, denom);
      const int sh = stoker::JpegDecoder::ScaledSize(h, denom);
      (void)f->jpeg.DecodeRegion(denom, sw / 3, sh / 4, sw, sh - sh / 5 > sh / 4 ? sh - sh / 5 : sh,
                                 &f->pixels, &region);
    }
  }
  if (f->png.ReadHeader(bytes).ok()) {
    const int w = f->png.width(), h = f->png.height();
    if (w > 0 && h > 0 && static_cast<int64_t>(w) * h <= kMaxPixels) {
      (void)f->png.DecodeRegion(w / 2, 0, w, h, &f->pixels, &region);
    }
  }

  stoker::Record record{bytes, 0};
  stoker::SampleRng rng(1, 0, size);
  (void)f->train->Apply(record, rng, std::span<std::byte>(f->out.data(), f->train->spec().bytes()),
                        f->train_scratch.get());
  (void)f->eval->Apply(record, rng, std::span<std::byte>(f->out.data(), f->out.size()),
                       f->eval_scratch.get());
  (void)f->crop->Apply(record, rng, std::span<std::byte>(f->out.data(), f->out.size()),
                       f->crop_scratch.get());
  return 0;
}
