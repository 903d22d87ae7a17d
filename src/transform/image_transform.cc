#include "transform/image_transform.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <string>

#include "core/number_text.h"
#include "transform/image_format.h"
#include "transform/jpeg_decoder.h"
#include "transform/png_decoder.h"
#include "transform/resize.h"

namespace stoker {
namespace {

// Python's round(): half to even, as torchvision's arithmetic uses it.
int RoundHalfEven(double v) { return static_cast<int>(std::nearbyint(v)); }

// Named as stoker.transforms.Image's options are (size, scale, ratio, flip,
// resize), a whole number in full (not 1e+09).
Status BadOption(const std::string& name, double value, const std::string& expected) {
  const bool whole = std::abs(value) < 1e15 && value == std::trunc(value);
  return InvalidArgument("image transform: " + name + " = " + FormatNumber(value, whole ? 15 : 6) +
                         ", expected " + expected);
}

class ImageScratch final : public TransformScratch {
 public:
  size_t bytes() const override {
    return pixels.capacity() + rows.capacity() * sizeof(float) + resample.bytes() +
           TapBytes(taps_x) + TapBytes(taps_y) + TapBytes(taps_same) + between.capacity();
  }
  static size_t TapBytes(const ResampleTaps& t) {
    return (t.start.capacity() + t.count.capacity()) * sizeof(int) +
           t.weights.capacity() * sizeof(float) + t.fixed.capacity() * sizeof(int32_t);
  }

  JpegDecoder jpeg;
  PngDecoder png;
  std::vector<uint8_t> pixels;
  ResampleTaps taps_x;
  ResampleTaps taps_y;
  ResampleTaps taps_same;        // bicubic: the identity, for the vertical pass alone
  std::vector<uint8_t> between;  // bicubic: the horizontal pass's bytes
  ResampleBuffers resample;
  std::vector<float> rows;  // one output row, planar, before conversion to bytes
};

// Where the output samples the source: one axis of the resample, in the
// coordinates of the decoded (possibly DCT-scaled) image.
struct AxisWindow {
  double in0;
  double scale;
  int lo;
  int hi;
};

class ImageTransform final : public Transform {
 public:
  explicit ImageTransform(const ImageTransformOptions& o) : o_(o) {
    for (int c = 0; c < 3; ++c) {
      normalise_.scale[c] = 1.0f / (255.0f * o.std[c]);
      normalise_.bias[c] = -o.mean[c] / o.std[c];
    }
    // Pillow's resized pixels are bytes: bicubic's overshoot is clipped, and
    // bilinear's float rounding must not take white past 1.0 after ToTensor.
    normalise_.lo = 0.0f;
    normalise_.hi = 255.0f;
  }

  SampleSpec spec() const override {
    switch (o_.layout) {
      case ImageLayout::kFloat32CHW:
        return {{3, o_.height, o_.width}, DType::kFloat32};
      case ImageLayout::kUInt8HWC:
        return {{o_.height, o_.width, 3}, DType::kUInt8};
      case ImageLayout::kUInt8CHW:
        return {{3, o_.height, o_.width}, DType::kUInt8};
    }
    return {};
  }

  std::unique_ptr<TransformScratch> NewScratch() const override {
    return std::make_unique<ImageScratch>();
  }

  Status Apply(const Record& record, SampleRng& rng, std::span<std::byte> out,
               TransformScratch* scratch) const override {
    assert(out.size() == spec().bytes());
    if (scratch == nullptr) {
      // Works, but allocates everything afresh: the engine always passes one.
      ImageScratch local;
      return Run(record.bytes, rng, out, local);
    }
    return Run(record.bytes, rng, out, *static_cast<ImageScratch*>(scratch));
  }

 private:
  Status Run(std::span<const std::byte> bytes, SampleRng& rng, std::span<std::byte> out,
             ImageScratch& s) const {
    if (bytes.empty()) return DataError("empty record (0 bytes), not an image");
    const bool jpeg = LooksLikeJpeg(bytes);
    const bool png = !jpeg && LooksLikePng(bytes);
    if (!jpeg && !png && !o_.other_decoder) {
      // A format known by name has a way out: a decoder of other formats.
      const bool known = !OtherImageFormat(bytes).empty();
      return DataError(NotJpegOrPng(bytes) + (known ? ": convert it, or decode it in Python "
                                                      "(stoker.transforms.Image(decode_other=...))"
                                                    : ""));
    }
    int width = 0, height = 0;
    if (jpeg) {
      STOKER_RETURN_IF_ERROR(s.jpeg.ReadHeader(bytes));
      width = s.jpeg.width();
      height = s.jpeg.height();
    } else if (png) {
      STOKER_RETURN_IF_ERROR(s.png.ReadHeader(bytes));
      width = s.png.width();
      height = s.png.height();
    } else {
      // Decoded whole before any check: the decoder guards its own bombs.
      if (Status st = o_.other_decoder(bytes, &s.pixels, &width, &height); !st.ok()) {
        return Status(st.code(), NotJpegOrPng(bytes) + ", and " + st.message());
      }
      if (s.pixels.size() != static_cast<size_t>(std::max(width, 0)) * std::max(height, 0) * 3) {
        return DataError("the decoder of other formats gave " + std::to_string(s.pixels.size()) +
                         " bytes for " + std::to_string(width) + "x" + std::to_string(height) +
                         " RGB pixels");
      }
    }
    if (width <= 0 || height <= 0) {
      return DataError("image header says " + std::to_string(width) + "x" + std::to_string(height) +
                       " pixels");
    }
    const int64_t pixels = static_cast<int64_t>(width) * height;
    if (pixels > o_.max_pixels) {
      return ResourceExhausted("image is " + std::to_string(width) + "x" + std::to_string(height) +
                               " = " + std::to_string(pixels) + " pixels, more than max_pixels = " +
                               std::to_string(o_.max_pixels) + " (refused before decoding)");
    }
    // The worker's share of the memory budget, checked from the header: a
    // full-size RGB decode (what a PNG or a progressive JPEG may hold, an
    // upper bound for a region or DCT-scaled one) with the encoded bytes.
    const uint64_t need = static_cast<uint64_t>(pixels) * 3 + bytes.size();
    if (!s.cap().Allows(need)) {
      return s.cap().Refuse("a " + std::to_string(width) + "x" + std::to_string(height) +
                                " image (decoded RGB with its encoded bytes)",
                            need, "decoding it");
    }

    // Geometry in full-size pixels, then at the DCT scale chosen.
    bool flip = false;
    int denom = 1;
    AxisWindow wx, wy;
    ResizeCenterCrop g;  // kEval's geometry
    bool pad_x = false, pad_y = false;
    if (o_.mode == ImageMode::kTrain) {
      CropBox box = RandomResizedCropBox(width, height, o_, rng);
      flip = rng.Uniform() < o_.flip_probability;
      if (flip && o_.flip_before_crop) box.x = width - box.width - box.x;
      if (jpeg && o_.dct_scaling)
        denom = ChooseDctDenominator(box.width, box.height, o_.width, o_.height);
      const double d = denom;
      const int scaled_w = JpegDecoder::ScaledSize(width, denom);
      const int scaled_h = JpegDecoder::ScaledSize(height, denom);
      wx = {box.x / d, box.width / d / o_.width, static_cast<int>(std::floor(box.x / d)),
            std::min(scaled_w, static_cast<int>(std::ceil((box.x + box.width) / d)))};
      wy = {box.y / d, box.height / d / o_.height, static_cast<int>(std::floor(box.y / d)),
            std::min(scaled_h, static_cast<int>(std::ceil((box.y + box.height) / d)))};
    } else {
      g = EvalGeometry(width, height, o_);
      // torchvision pads (crop - size) // 2 before and the rest after: a
      // crop one larger than the image pads only after, with left still 0.
      pad_x = o_.width > g.resized_width;
      pad_y = o_.height > g.resized_height;
      if (jpeg && o_.dct_scaling) {
        denom = ChooseDctDenominator(width, height, g.resized_width, g.resized_height);
      }
      const double d = denom;
      const double sx = width / d / g.resized_width;
      const double sy = height / d / g.resized_height;
      wx = {g.left * sx, sx, 0, JpegDecoder::ScaledSize(width, denom)};
      wy = {g.top * sy, sy, 0, JpegDecoder::ScaledSize(height, denom)};
    }
    ComputeTaps(wx.in0, wx.scale, o_.width, wx.lo, wx.hi, &s.taps_x, o_.interpolation);
    ComputeTaps(wy.in0, wy.scale, o_.height, wy.lo, wy.hi, &s.taps_y, o_.interpolation);
    if (pad_x) ZeroTapsOutside(-g.left, g.resized_width - g.left, &s.taps_x);
    if (pad_y) ZeroTapsOutside(-g.top, g.resized_height - g.top, &s.taps_y);

    DecodedRegion region;
    if (jpeg) {
      STOKER_RETURN_IF_ERROR(s.jpeg.DecodeRegion(denom, s.taps_x.first, s.taps_y.first,
                                                 s.taps_x.end, s.taps_y.end, &s.pixels, &region));
    } else if (png) {
      STOKER_RETURN_IF_ERROR(s.png.DecodeRegion(s.taps_x.first, s.taps_y.first, s.taps_x.end,
                                                s.taps_y.end, &s.pixels, &region));
    } else {
      region = {s.pixels.data(), 0, 0, width, height, static_cast<size_t>(width) * 3};
    }
    if (o_.interpolation == ImageInterpolation::kBicubic) {
      // Pillow's order: horizontal first, rounded and clamped to bytes, then
      // vertical. The cubic's negative lobes carry that rounding into whole
      // levels, so a float pass of both axes would be several levels off.
      const int w = o_.width;
      const int rows = s.taps_y.end - s.taps_y.first;
      uint8_t* between = GrowBuffer(s.between, static_cast<size_t>(rows) * w * 3);
      ResampleRowsToBytes(region, s.taps_x, flip, s.taps_y.first, s.taps_y.end, between);
      ComputeTaps(0, 1.0, w, 0, w, &s.taps_same);
      const DecodedRegion mid{between, 0, s.taps_y.first, w, rows, static_cast<size_t>(w) * 3};
      Write(mid, s.taps_same, s, false, out);
    } else {
      Write(region, s.taps_x, s, flip, out);
    }
    return Status::Ok();
  }

  // The one pass that writes the output: resample, flip, convert, lay out.
  // `tx` is s.taps_x, or the identity once the horizontal pass is done.
  void Write(const DecodedRegion& region, const ResampleTaps& tx, ImageScratch& s, bool flip,
             std::span<std::byte> out) const {
    const int w = o_.width;
    const size_t plane = static_cast<size_t>(o_.height) * w;
    if (o_.layout == ImageLayout::kFloat32CHW) {
      // The normalisation rides on the resampler's last multiply-add, and
      // each row lands straight in its three planes.
      float* o = reinterpret_cast<float*>(out.data());
      ResamplePlanar(
          region, tx, s.taps_y, flip, normalise_, s.resample,
          [&](int y) {
            float* r = o + static_cast<size_t>(y) * w;
            return PlanarRow{{r, r + plane, r + 2 * plane}};
          },
          [](int) {});
      return;
    }
    const size_t row_size = static_cast<size_t>(w);
    if (s.rows.size() < 3 * row_size) s.rows.resize(3 * row_size);
    const PlanarRow row{{s.rows.data(), s.rows.data() + row_size, s.rows.data() + 2 * row_size}};
    uint8_t* o = reinterpret_cast<uint8_t*>(out.data());
    const bool hwc = o_.layout == ImageLayout::kUInt8HWC;
    ResamplePlanar(
        region, tx, s.taps_y, flip, ChannelAffine{}, s.resample, [&](int) { return row; },
        [&](int y) {
          if (hwc) {
            uint8_t* p = o + static_cast<size_t>(y) * w * 3;
            for (int x = 0; x < w; ++x) {
              p[3 * x] = ToByte(row.c[0][x]);
              p[3 * x + 1] = ToByte(row.c[1][x]);
              p[3 * x + 2] = ToByte(row.c[2][x]);
            }
          } else {
            for (int c = 0; c < 3; ++c) {
              uint8_t* p = o + c * plane + static_cast<size_t>(y) * w;
              for (int x = 0; x < w; ++x) p[x] = ToByte(row.c[c][x]);
            }
          }
        });
  }

  static uint8_t ToByte(float v) {
    v += 0.5f;
    return static_cast<uint8_t>(v <= 0.0f ? 0.0f : (v >= 255.0f ? 255.0f : v));
  }

  ImageTransformOptions o_;
  ChannelAffine normalise_;  // (v / 255 - mean) / std as v * scale + bias, v clamped to [0, 255]
};

}  // namespace

CropBox RandomResizedCropBox(int width, int height, const ImageTransformOptions& o,
                             SampleRng& rng) {
  const double area = static_cast<double>(width) * height;
  const double log_lo = std::log(o.ratio_min);
  const double log_hi = std::log(o.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * rng.Uniform(o.scale_min, o.scale_max);
    const double ratio = std::exp(rng.Uniform(log_lo, log_hi));
    const int w = RoundHalfEven(std::sqrt(target_area * ratio));
    const int h = RoundHalfEven(std::sqrt(target_area / ratio));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const int y = static_cast<int>(rng.Below(static_cast<uint64_t>(height - h + 1)));
      const int x = static_cast<int>(rng.Below(static_cast<uint64_t>(width - w + 1)));
      return {x, y, w, h};
    }
  }
  // Fallback: the whole image, cut to the nearest allowed ratio, centred.
  const double in_ratio = static_cast<double>(width) / height;
  int w = width, h = height;
  if (in_ratio < o.ratio_min) {
    h = RoundHalfEven(w / o.ratio_min);
  } else if (in_ratio > o.ratio_max) {
    w = RoundHalfEven(h * o.ratio_max);
  }
  w = std::clamp(w, 1, width);
  h = std::clamp(h, 1, height);
  return {(width - w) / 2, (height - h) / 2, w, h};
}

namespace {

// torchvision's CenterCrop on one axis of `size` pixels: a crop larger than
// the image pads (size_out - size) / 2 zeros before it (floor) and the rest
// after; otherwise the crop starts at round((size - size_out) / 2), half to even.
int CentreCropStart(int size, int size_out) {
  if (size_out > size) return -((size_out - size) / 2);
  return RoundHalfEven((size - size_out) / 2.0);
}

}  // namespace

ResizeCenterCrop EvalGeometry(int width, int height, const ImageTransformOptions& o) {
  ResizeCenterCrop g;
  const int s = o.resize_shorter;
  if (o.resize_height > 0 && o.resize_width > 0) {
    g.resized_width = o.resize_width;
    g.resized_height = o.resize_height;
  } else if (s == 0) {  // no Resize: CenterCrop alone
    g.resized_width = width;
    g.resized_height = height;
  } else if (width <= height) {
    g.resized_width = s;
    g.resized_height = static_cast<int>(static_cast<int64_t>(s) * height / width);
  } else {
    g.resized_height = s;
    g.resized_width = static_cast<int>(static_cast<int64_t>(s) * width / height);
  }
  g.left = CentreCropStart(g.resized_width, o.width);
  g.top = CentreCropStart(g.resized_height, o.height);
  return g;
}

int ChooseDctDenominator(double source_width, double source_height, int out_width, int out_height) {
  for (int denom : {8, 4, 2}) {
    if (source_width / denom >= out_width && source_height / denom >= out_height) return denom;
  }
  return 1;
}

Status ValidateImageTransformOptions(const ImageTransformOptions& o) {
  const std::string side = std::to_string(kMaxTransformSide);
  if (o.height < 1 || o.height > kMaxTransformSide) {
    return BadOption("size[0] (height)", o.height, "1.." + side);
  }
  if (o.width < 1 || o.width > kMaxTransformSide) {
    return BadOption("size[1] (width)", o.width, "1.." + side);
  }
  if (o.mode == ImageMode::kTrain) {
    if (!(o.scale_min > 0 && o.scale_min <= 1)) {
      return BadOption("scale[0]", o.scale_min, "a fraction in (0, 1]");
    }
    if (!(o.scale_max >= o.scale_min && o.scale_max <= 1)) {
      return BadOption("scale[1]", o.scale_max, "in [scale[0], 1]");
    }
    if (!(o.ratio_min > 0 && std::isfinite(o.ratio_min))) {
      return BadOption("ratio[0]", o.ratio_min, "> 0");
    }
    if (!(o.ratio_max >= o.ratio_min && std::isfinite(o.ratio_max))) {
      return BadOption("ratio[1]", o.ratio_max, ">= ratio[0]");
    }
    if (!(o.flip_probability >= 0 && o.flip_probability <= 1)) {
      return BadOption("flip", o.flip_probability, "a probability in [0, 1]");
    }
  } else if (o.resize_height != 0 || o.resize_width != 0) {
    // A crop larger than the resized image pads it with zeros, as torchvision does.
    if (o.resize_height < 1 || o.resize_height > kMaxTransformSide) {
      return BadOption("resize[0] (height)", o.resize_height,
                       "in [1, " + side + "] with resize[1]");
    }
    if (o.resize_width < 1 || o.resize_width > kMaxTransformSide) {
      return BadOption("resize[1] (width)", o.resize_width, "in [1, " + side + "] with resize[0]");
    }
  } else {
    if (o.resize_shorter < 0 || o.resize_shorter > kMaxTransformSide) {
      return BadOption("resize", o.resize_shorter, "in [0, " + side + "] (0: no resize)");
    }
  }
  if (o.layout == ImageLayout::kFloat32CHW) {
    static const char* kChannel[3] = {"0", "1", "2"};
    for (int c = 0; c < 3; ++c) {
      if (!std::isfinite(o.mean[c])) {
        return BadOption(std::string("mean[") + kChannel[c] + "]", o.mean[c], "a finite number");
      }
      if (!(std::isfinite(o.std[c]) && o.std[c] > 0)) {
        return BadOption(std::string("std[") + kChannel[c] + "]", o.std[c], "> 0");
      }
    }
  }
  if (o.max_pixels < 1) {
    return BadOption("max_pixels", static_cast<double>(o.max_pixels), ">= 1");
  }
  return Status::Ok();
}

Result<std::shared_ptr<const Transform>> MakeImageTransform(const ImageTransformOptions& options) {
  STOKER_RETURN_IF_ERROR(ValidateImageTransformOptions(options));
  return std::shared_ptr<const Transform>(std::make_shared<ImageTransform>(options));
}

}  // namespace stoker
