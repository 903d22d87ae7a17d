#include "transform/image_transform.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>

#include "testing/test_images.h"

namespace stoker {
namespace {

using testing::AsBytes;
using testing::Image;
using testing::Jpeg;
using testing::MakePicture;
using testing::ReferenceAxis;
using testing::ReferenceDecodeJpeg;
using testing::ReferenceResample;

std::shared_ptr<const Transform> Make(const ImageTransformOptions& o) {
  auto t = MakeImageTransform(o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return *t;
}

Status ApplyTo(const Transform& t, const std::vector<uint8_t>& file, uint64_t index,
               std::vector<uint8_t>* out, TransformScratch* scratch) {
  out->assign(t.spec().bytes(), 0);
  SampleRng rng(7, 0, index);
  Record rec{AsBytes(file), 0};
  return t.Apply(rec, rng, std::as_writable_bytes(std::span<uint8_t>(*out)), scratch);
}

// `jpeg` with its baseline frame header (SOF0) claiming width x height: a
// header alone must be enough to refuse it.
std::vector<uint8_t> WithFrameSize(std::vector<uint8_t> jpeg, int width, int height) {
  for (size_t i = 2; i + 8 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xFF && jpeg[i + 1] == 0xC0) {
      jpeg[i + 5] = static_cast<uint8_t>(height >> 8);
      jpeg[i + 6] = static_cast<uint8_t>(height);
      jpeg[i + 7] = static_cast<uint8_t>(width >> 8);
      jpeg[i + 8] = static_cast<uint8_t>(width);
      break;
    }
  }
  return jpeg;
}

struct Errors {
  double mean = 0;
  double max = 0;
};

// Compares a uint8 HWC output with float reference pixels (row-major RGB).
Errors Compare(const std::vector<uint8_t>& got, const std::vector<double>& ref, bool flipped,
               int width) {
  Errors e;
  const size_t n = got.size();
  for (size_t i = 0; i < n; ++i) {
    size_t pixel = i / 3, c = i % 3;
    size_t y = pixel / width, x = pixel % width;
    size_t rx = flipped ? width - 1 - x : x;
    double d = std::abs(got[i] - ref[(y * width + rx) * 3 + c]);
    e.mean += d;
    e.max = std::max(e.max, d);
  }
  e.mean /= static_cast<double>(n);
  return e;
}

// The straightforward pipeline: decode everything, crop the box, resize it.
std::vector<double> ReferenceTrain(const Image& full, CropBox box, int out_w, int out_h) {
  return ReferenceResample(
      full,
      ReferenceAxis(box.x, static_cast<double>(box.width) / out_w, out_w, box.x, box.x + box.width),
      ReferenceAxis(box.y, static_cast<double>(box.height) / out_h, out_h, box.y,
                    box.y + box.height));
}

// The same for eval: resize the whole image so its shorter side is
// o.resize_shorter, then cut the centre 224x224.
std::vector<double> ReferenceEval(const Image& full, int w, int h, const ImageTransformOptions& o) {
  ResizeCenterCrop g = EvalGeometry(w, h, o);
  const double sx = static_cast<double>(w) / g.resized_width;
  const double sy = static_cast<double>(h) / g.resized_height;
  return ReferenceResample(full, ReferenceAxis(g.left * sx, sx, o.width, 0, w),
                           ReferenceAxis(g.top * sy, sy, o.height, 0, h));
}

TEST(RandomResizedCropTest, BoxesStayInsideAndFollowScaleAndRatio) {
  ImageTransformOptions o;
  for (uint64_t i = 0; i < 2000; ++i) {
    SampleRng rng(1, 2, i);
    CropBox b = RandomResizedCropBox(500, 375, o, rng);
    ASSERT_GE(b.x, 0);
    ASSERT_GE(b.y, 0);
    ASSERT_GE(b.width, 1);
    ASSERT_GE(b.height, 1);
    ASSERT_LE(b.x + b.width, 500);
    ASSERT_LE(b.y + b.height, 375);
    const double area = static_cast<double>(b.width) * b.height / (500.0 * 375.0);
    const double ratio = static_cast<double>(b.width) / b.height;
    // Rounding w and h to whole pixels moves both a little.
    ASSERT_GE(area, 0.08 * 0.97);
    ASSERT_LE(area, 1.0);
    ASSERT_GE(ratio, 0.75 * 0.97);
    ASSERT_LE(ratio, 4.0 / 3.0 * 1.03);
  }
}

TEST(RandomResizedCropTest, SameStreamSameBox) {
  ImageTransformOptions o;
  SampleRng a(3, 1, 99), b(3, 1, 99), c(3, 1, 100);
  CropBox x = RandomResizedCropBox(640, 480, o, a);
  CropBox y = RandomResizedCropBox(640, 480, o, b);
  CropBox z = RandomResizedCropBox(640, 480, o, c);
  EXPECT_EQ(std::tie(x.x, x.y, x.width, x.height), std::tie(y.x, y.y, y.width, y.height));
  EXPECT_NE(std::tie(x.x, x.y, x.width, x.height), std::tie(z.x, z.y, z.width, z.height));
}

TEST(RandomResizedCropTest, FallsBackToTheRatioClampedCentreCrop) {
  ImageTransformOptions o;
  // No crop of >= 8 % of the area with a ratio in [3/4, 4/3] fits a strip
  // this thin, so all 10 tries fail.
  SampleRng rng(0, 0, 0);
  CropBox wide = RandomResizedCropBox(1000, 10, o, rng);
  EXPECT_EQ(wide.height, 10);
  EXPECT_EQ(wide.width, 13);  // round(10 * 4/3)
  EXPECT_EQ(wide.x, (1000 - 13) / 2);
  EXPECT_EQ(wide.y, 0);
  CropBox tall = RandomResizedCropBox(10, 1000, o, rng);
  EXPECT_EQ(tall.width, 10);
  EXPECT_EQ(tall.height, 13);  // round(10 / (3/4))
  EXPECT_EQ(tall.y, (1000 - 13) / 2);
  // Within the ratio range the fallback is the whole image.
  o.scale_min = o.scale_max = 1.0;
  o.ratio_min = 1.0;
  o.ratio_max = 2.0;
  CropBox whole = RandomResizedCropBox(300, 200, o, rng);
  EXPECT_EQ(whole.width, 300);
  EXPECT_EQ(whole.height, 200);
}

TEST(ImageTransformTest, EvalGeometryIsResizeThenCentreCrop) {
  ImageTransformOptions o;
  ResizeCenterCrop g = EvalGeometry(500, 375, o);
  EXPECT_EQ(g.resized_height, 256);
  EXPECT_EQ(g.resized_width, 341);  // int(256 * 500 / 375)
  EXPECT_EQ(g.left, 58);            // round(58.5) is 58: half to even
  EXPECT_EQ(g.top, 16);
  g = EvalGeometry(300, 600, o);
  EXPECT_EQ(g.resized_width, 256);
  EXPECT_EQ(g.resized_height, 512);
  EXPECT_EQ(g.top, 144);
}

TEST(ImageTransformTest, EvalGeometryTakesAnExactResize) {
  ImageTransformOptions o;
  o.resize_height = 240;
  o.resize_width = 300;
  ResizeCenterCrop g = EvalGeometry(500, 375, o);
  EXPECT_EQ(g.resized_height, 240);
  EXPECT_EQ(g.resized_width, 300);
  EXPECT_EQ(g.left, 38);
  EXPECT_EQ(g.top, 8);
  o.height = 240;  // Resize((240, 300)) alone: the crop is all of it
  o.width = 300;
  g = EvalGeometry(375, 500, o);
  EXPECT_EQ(g.left, 0);
  EXPECT_EQ(g.top, 0);
}

// torchvision's CenterCrop larger than the image: (crop - size) // 2 zeros
// before, the rest after; an axis that fits is cropped as usual.
TEST(ImageTransformTest, EvalGeometryPadsACropLargerThanTheImage) {
  ImageTransformOptions o;
  o.resize_shorter = 0;  // CenterCrop alone
  ResizeCenterCrop g = EvalGeometry(101, 300, o);
  EXPECT_EQ(g.resized_width, 101);
  EXPECT_EQ(g.resized_height, 300);
  EXPECT_EQ(g.left, -61);  // 123 // 2 zeros before, 62 after
  EXPECT_EQ(g.top, 38);    // round(38.0)
  o.resize_shorter = 200;  // Resize(200) then CenterCrop(224)
  g = EvalGeometry(400, 300, o);
  EXPECT_EQ(g.resized_width, 266);
  EXPECT_EQ(g.left, 21);
  EXPECT_EQ(g.top, -12);
  // One, two and three pixels larger: 0, 1 and 1 zeros before (torchvision's
  // F.center_crop), so a crop one larger pads after the image alone.
  o.resize_shorter = 0;
  for (const auto& [more, before] : {std::pair{1, 0}, std::pair{2, 1}, std::pair{3, 1}}) {
    o.width = 150 + more;
    o.height = 260;
    g = EvalGeometry(150, 260, o);
    EXPECT_EQ(std::tie(g.left, g.top), std::make_tuple(-before, 0)) << more;
    o.width = 150;
    o.height = 260 + more;
    g = EvalGeometry(150, 260, o);
    EXPECT_EQ(std::tie(g.left, g.top), std::make_tuple(0, -before)) << more;
  }
}

// The padding is zeros before the layout's mapping (normalised: -mean / std),
// and the image inside it is what a crop that fits gives. The zeros before
// the image are torchvision's (F.center_crop of a 150x260 image); the rest
// of the larger side is zeros after it, also where the crop is one larger.
TEST(ImageTransformTest, PaddedCentreCropIsZerosAroundTheImage) {
  const int w = 150, h = 260;
  auto file = Jpeg(MakePicture(w, h, 5), w, h);
  struct Case {
    int width, height;     // the crop
    int zeros_x, zeros_y;  // zero columns and rows before the image
  };
  const Case cases[] = {{224, 200, 37, 0}, {151, h, 0, 0}, {152, h, 1, 0}, {153, h, 1, 0},
                        {w, 261, 0, 0},    {w, 262, 0, 1}, {w, 263, 0, 1}};
  for (ImageInterpolation filter : {ImageInterpolation::kBilinear, ImageInterpolation::kBicubic}) {
    for (const Case& k : cases) {
      ImageTransformOptions o;
      o.mode = ImageMode::kEval;
      o.resize_shorter = 0;
      o.interpolation = filter;
      o.layout = ImageLayout::kUInt8HWC;
      o.width = std::min(k.width, w);
      o.height = std::min(k.height, h);
      std::vector<uint8_t> padded, inner;
      ASSERT_TRUE(ApplyTo(*Make(o), file, 0, &inner, nullptr).ok());
      const int inner_w = o.width, inner_h = o.height;
      o.width = k.width;
      o.height = k.height;
      ASSERT_TRUE(ApplyTo(*Make(o), file, 0, &padded, nullptr).ok());
      for (int y = 0; y < k.height; ++y) {
        for (int x = 0; x < k.width; ++x) {
          const bool inside = x >= k.zeros_x && x < k.zeros_x + inner_w && y >= k.zeros_y &&
                              y < k.zeros_y + inner_h;
          for (int c = 0; c < 3; ++c) {
            const uint8_t got = padded[(static_cast<size_t>(y) * k.width + x) * 3 + c];
            const uint8_t want =
                inside
                    ? inner[(static_cast<size_t>(y - k.zeros_y) * inner_w + x - k.zeros_x) * 3 + c]
                    : 0;
            ASSERT_EQ(got, want) << k.width << "x" << k.height << " at x " << x << " y " << y;
          }
        }
      }
    }
    ImageTransformOptions o;
    o.mode = ImageMode::kEval;
    o.resize_shorter = 0;
    o.interpolation = filter;
    o.width = 224;
    o.height = 200;
    std::vector<uint8_t> normalised;
    ASSERT_TRUE(ApplyTo(*Make(o), file, 0, &normalised, nullptr).ok());
    const float* f = reinterpret_cast<const float*>(normalised.data());
    for (int c = 0; c < 3; ++c) {
      EXPECT_NEAR(f[c * 200 * 224], -o.mean[c] / o.std[c], 1e-5);
      EXPECT_NEAR(f[c * 200 * 224 + 223], -o.mean[c] / o.std[c], 1e-5);
    }
  }
}

TEST(ImageTransformTest, DctScaleIsTheCoarsestThatKeepsTheOutputSize) {
  EXPECT_EQ(ChooseDctDenominator(2000, 1800, 224, 224), 8);
  EXPECT_EQ(ChooseDctDenominator(1000, 1000, 224, 224), 4);
  EXPECT_EQ(ChooseDctDenominator(500, 460, 224, 224), 2);
  EXPECT_EQ(ChooseDctDenominator(447, 900, 224, 224), 1);
  EXPECT_EQ(ChooseDctDenominator(100, 100, 224, 224), 1);
}

TEST(ImageTransformTest, OptionErrorsNameTheOption) {
  struct Case {
    void (*set)(ImageTransformOptions&);
    const char* name;
  };
  const Case cases[] = {
      {[](ImageTransformOptions& o) { o.height = 0; }, "size[0] (height)"},
      {[](ImageTransformOptions& o) { o.width = -3; }, "size[1] (width)"},
      {[](ImageTransformOptions& o) { o.scale_min = 0; }, "scale[0]"},
      {[](ImageTransformOptions& o) { o.scale_max = 0.01; }, "scale[1]"},
      {[](ImageTransformOptions& o) { o.ratio_min = -1; }, "ratio[0]"},
      {[](ImageTransformOptions& o) { o.ratio_max = 0.5; }, "ratio[1]"},
      {[](ImageTransformOptions& o) { o.flip_probability = 1.5; }, "flip"},
      {[](ImageTransformOptions& o) { o.std[1] = 0; }, "std[1]"},
      {[](ImageTransformOptions& o) { o.max_pixels = 0; }, "max_pixels"},
      {[](ImageTransformOptions& o) {
         o.mode = ImageMode::kEval;
         o.resize_shorter = -1;
       },
       "resize = -1"},
      {[](ImageTransformOptions& o) {
         o.mode = ImageMode::kEval;
         o.resize_height = 300;
         o.resize_width = 70000;
       },
       "resize[1] (width) = 70000"},
      {[](ImageTransformOptions& o) {
         o.mode = ImageMode::kEval;
         o.resize_width = 300;
       },
       "resize[0] (height)"},
      // A whole number in full, not 1e+09.
      {[](ImageTransformOptions& o) {
         o.mode = ImageMode::kEval;
         o.resize_shorter = 1000000000;
       },
       "resize = 1000000000, expected in [0, 65535]"},
  };
  for (const Case& c : cases) {
    ImageTransformOptions o;
    c.set(o);
    auto t = MakeImageTransform(o);
    ASSERT_FALSE(t.ok()) << c.name;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find(c.name), std::string::npos) << t.status().message();
  }
}

TEST(ImageTransformTest, SpecFollowsTheLayout) {
  ImageTransformOptions o;
  o.height = 100;
  o.width = 120;
  SampleSpec s = Make(o)->spec();
  EXPECT_EQ(s.shape, (std::vector<int64_t>{3, 100, 120}));
  EXPECT_EQ(s.dtype, DType::kFloat32);
  o.layout = ImageLayout::kUInt8HWC;
  s = Make(o)->spec();
  EXPECT_EQ(s.shape, (std::vector<int64_t>{100, 120, 3}));
  EXPECT_EQ(s.dtype, DType::kUInt8);
  o.layout = ImageLayout::kUInt8CHW;
  EXPECT_EQ(Make(o)->spec().shape, (std::vector<int64_t>{3, 100, 120}));
}

// Without DCT scaling the fused path must equal the plain pipeline (decode
// all, crop, resize in double) up to float rounding.
TEST(ImageTransformTest, TrainMatchesFullDecodeCropResize) {
  const int w = 480, h = 352;
  auto file = Jpeg(MakePicture(w, h), w, h);
  Image full = ReferenceDecodeJpeg(file);
  ImageTransformOptions o;
  o.layout = ImageLayout::kUInt8HWC;
  o.flip_probability = 0.5;
  o.dct_scaling = false;
  auto t = Make(o);
  auto scratch = t->NewScratch();
  std::vector<uint8_t> out;
  for (uint64_t i = 0; i < 12; ++i) {
    ASSERT_TRUE(ApplyTo(*t, file, i, &out, scratch.get()).ok());
    SampleRng rng(7, 0, i);
    CropBox box = RandomResizedCropBox(w, h, o, rng);
    bool flipped = rng.Uniform() < o.flip_probability;
    Errors e = Compare(out, ReferenceTrain(full, box, 224, 224), flipped, 224);
    EXPECT_LE(e.max, 1.0) << "sample " << i;
    EXPECT_LT(e.mean, 0.3) << "sample " << i;
  }
}

// With DCT scaling the decode is coarser, but the result stays close to the
// full-resolution pipeline.
TEST(ImageTransformTest, DctScaledTrainStaysCloseToFullDecode) {
  const int w = 1200, h = 900;
  auto file = Jpeg(MakePicture(w, h, 5), w, h);
  Image full = ReferenceDecodeJpeg(file);
  ImageTransformOptions o;
  o.layout = ImageLayout::kUInt8HWC;
  o.height = o.width = 128;
  o.dct_scaling = true;
  auto t = Make(o);
  auto scratch = t->NewScratch();
  std::vector<uint8_t> out;
  int scaled = 0;
  for (uint64_t i = 0; i < 16; ++i) {
    ASSERT_TRUE(ApplyTo(*t, file, i, &out, scratch.get()).ok());
    SampleRng rng(7, 0, i);
    CropBox box = RandomResizedCropBox(w, h, o, rng);
    bool flipped = rng.Uniform() < o.flip_probability;
    scaled += ChooseDctDenominator(box.width, box.height, 128, 128) > 1;
    Errors e = Compare(out, ReferenceTrain(full, box, 128, 128), flipped, 128);
    // Measured: mean 0.3-0.5, max 4-21 levels (on sharp edges).
    EXPECT_LT(e.mean, 1.0) << "sample " << i;
    EXPECT_LE(e.max, 40.0) << "sample " << i;
  }
  EXPECT_GT(scaled, 8);
}

// With the default options: also on a 1200x900 JPEG, where DCT scaling
// would apply, eval decodes at full size and gives torchvision's pixels.
TEST(ImageTransformTest, EvalMatchesResizeThenCentreCrop) {
  for (const auto& [w, h, seed] : {std::tuple{500, 375, 2}, std::tuple{1200, 900, 5}}) {
    auto file = Jpeg(MakePicture(w, h, seed), w, h);
    Image full = ReferenceDecodeJpeg(file);
    ImageTransformOptions o;
    o.mode = ImageMode::kEval;
    o.layout = ImageLayout::kUInt8HWC;
    std::vector<uint8_t> out;
    ASSERT_TRUE(ApplyTo(*Make(o), file, 0, &out, nullptr).ok());
    EXPECT_LE(Compare(out, ReferenceEval(full, w, h, o), false, 224).max, 1.0) << w << "x" << h;
    // Eval never draws randomness: any index gives the same output.
    std::vector<uint8_t> again;
    ASSERT_TRUE(ApplyTo(*Make(o), file, 12345, &again, nullptr).ok());
    EXPECT_EQ(out, again);
  }
  // Resize((h, w)) with and without a centre crop after it.
  auto file = Jpeg(MakePicture(500, 375, 3), 500, 375);
  Image full = ReferenceDecodeJpeg(file);
  for (const auto& [rh, rw, ch, cw] :
       {std::tuple{240, 300, 224, 224}, std::tuple{200, 260, 200, 260}}) {
    ImageTransformOptions o;
    o.mode = ImageMode::kEval;
    o.layout = ImageLayout::kUInt8HWC;
    o.resize_height = rh;
    o.resize_width = rw;
    o.height = ch;
    o.width = cw;
    std::vector<uint8_t> out;
    ASSERT_TRUE(ApplyTo(*Make(o), file, 0, &out, nullptr).ok());
    ASSERT_EQ(out.size(), static_cast<size_t>(ch) * cw * 3);
    EXPECT_LE(Compare(out, ReferenceEval(full, 500, 375, o), false, cw).max, 1.0)
        << rh << "x" << rw;
  }
  ImageTransformOptions o;
  o.mode = ImageMode::kEval;
  ResizeCenterCrop g = EvalGeometry(1200, 900, o);
  EXPECT_GT(ChooseDctDenominator(1200, 900, g.resized_width, g.resized_height), 1);
}

TEST(ImageTransformTest, FlipMirrorsAndNormaliseFollowsTheFormula) {
  auto file = Jpeg(MakePicture(300, 260), 300, 260);
  ImageTransformOptions o;
  o.layout = ImageLayout::kUInt8CHW;
  o.flip_probability = 0;
  std::vector<uint8_t> plain, mirrored, normalised;
  ASSERT_TRUE(ApplyTo(*Make(o), file, 4, &plain, nullptr).ok());
  o.flip_probability = 1;
  ASSERT_TRUE(ApplyTo(*Make(o), file, 4, &mirrored, nullptr).ok());
  for (int c = 0; c < 3; ++c) {
    for (int y = 0; y < 224; ++y) {
      for (int x = 0; x < 224; ++x) {
        ASSERT_EQ(plain[(c * 224 + y) * 224 + x], mirrored[(c * 224 + y) * 224 + 223 - x]);
      }
    }
  }
  o.layout = ImageLayout::kFloat32CHW;
  ASSERT_TRUE(ApplyTo(*Make(o), file, 4, &normalised, nullptr).ok());
  const float* f = reinterpret_cast<const float*>(normalised.data());
  for (int c = 0; c < 3; ++c) {
    for (int i = 0; i < 224 * 224; ++i) {
      const double v = mirrored[c * 224 * 224 + i];
      const double expected = (v / 255.0 - o.mean[c]) / o.std[c];
      ASSERT_NEAR(f[c * 224 * 224 + i], expected, 0.51 / 255.0 / o.std[c] + 1e-5);
    }
  }
}

// Compose([RandomHorizontalFlip, RandomResizedCrop]): torchvision draws the
// box on the flipped image, its mirror in the original. Where the ratio range
// forces the centre fallback (16x80 of a 101x80 image, 85 columns spare),
// that is columns [43, 59) of the original, not the floor-centred [42, 58).
TEST(ImageTransformTest, AFlipBeforeTheCropDrawsTheBoxOnTheFlippedImage) {
  const int w = 101, h = 80;
  const auto pixels = MakePicture(w, h, 3);
  const auto file = testing::Png(pixels, w, h, PNG_COLOR_TYPE_RGB, 8);
  const Image full{w, h, pixels};
  ImageTransformOptions o;
  o.layout = ImageLayout::kUInt8HWC;
  o.width = 8;
  o.height = 20;
  o.scale_min = o.scale_max = 1.0;
  o.ratio_min = 0.1;
  o.ratio_max = 0.2;
  o.flip_probability = 1.0;
  for (const bool before : {false, true}) {
    o.flip_before_crop = before;
    std::vector<uint8_t> out;
    ASSERT_TRUE(ApplyTo(*Make(o), file, 0, &out, nullptr).ok());
    const CropBox box{before ? 43 : 42, 0, 16, 80};
    EXPECT_LE(Compare(out, ReferenceTrain(full, box, 8, 20), true, 8).max, 1.0) << before;
  }
  // A random box is mirrored the same way (the same distribution).
  o = ImageTransformOptions{};
  o.layout = ImageLayout::kUInt8HWC;
  o.width = o.height = 32;
  o.flip_probability = 1.0;
  o.flip_before_crop = true;
  for (uint64_t i = 0; i < 6; ++i) {
    std::vector<uint8_t> out;
    ASSERT_TRUE(ApplyTo(*Make(o), file, i, &out, nullptr).ok());
    SampleRng rng(7, 0, i);
    CropBox box = RandomResizedCropBox(w, h, o, rng);
    box.x = w - box.width - box.x;
    EXPECT_LE(Compare(out, ReferenceTrain(full, box, 32, 32), true, 32).max, 1.0) << i;
  }
}

// ToTensor alone (mean 0, std 1): white stays 1.0 and black 0.0 through any
// resize, as torchvision's bytes do (float rounding took white to 1.0000004).
TEST(ImageTransformTest, ToTensorStaysWithinZeroAndOne) {
  const int w = 301, h = 257;
  std::vector<uint8_t> white(static_cast<size_t>(w) * h * 3, 255);
  for (size_t i = 0; i < white.size() / 2; ++i) white[i] = 0;  // the top half black
  const auto file = testing::Png(white, w, h, PNG_COLOR_TYPE_RGB, 8);
  for (const auto interpolation : {ImageInterpolation::kBilinear, ImageInterpolation::kBicubic}) {
    for (const auto mode : {ImageMode::kTrain, ImageMode::kEval}) {
      ImageTransformOptions o;
      o.mode = mode;
      o.interpolation = interpolation;
      o.mean = {0, 0, 0};
      o.std = {1, 1, 1};
      std::vector<uint8_t> out;
      ASSERT_TRUE(ApplyTo(*Make(o), file, 3, &out, nullptr).ok());
      const float* f = reinterpret_cast<const float*>(out.data());
      for (size_t i = 0; i < out.size() / sizeof(float); ++i) {
        ASSERT_GE(f[i], 0.0f) << i;
        ASSERT_LE(f[i], 1.0f) << i;
      }
    }
  }
}

TEST(ImageTransformTest, SameSampleSameBytesAnyScratch) {
  auto small = Jpeg(MakePicture(200, 150, 1), 200, 150);
  auto large = Jpeg(MakePicture(900, 700, 2), 900, 700);
  ImageTransformOptions o;
  auto t = Make(o);
  auto reused = t->NewScratch();
  std::vector<uint8_t> a, b;
  for (uint64_t i = 0; i < 6; ++i) {
    const auto& file = i % 2 ? small : large;
    ASSERT_TRUE(ApplyTo(*t, file, i, &a, reused.get()).ok());
    auto fresh = t->NewScratch();
    ASSERT_TRUE(ApplyTo(*t, file, i, &b, fresh.get()).ok());
    ASSERT_EQ(a, b) << "sample " << i;
  }
}

TEST(ImageTransformTest, GrayscaleAndPngInputs) {
  const int w = 260, h = 240;
  auto pic = MakePicture(w, h, 4);
  ImageTransformOptions o;
  o.layout = ImageLayout::kUInt8HWC;
  o.mode = ImageMode::kEval;
  auto t = Make(o);
  std::vector<uint8_t> out;
  auto png = testing::Png(pic, w, h, PNG_COLOR_TYPE_RGB, 8);
  ASSERT_TRUE(ApplyTo(*t, png, 0, &out, nullptr).ok());
  Image full{w, h, pic};
  ResizeCenterCrop g = EvalGeometry(w, h, o);
  const double sx = static_cast<double>(w) / g.resized_width;
  const double sy = static_cast<double>(h) / g.resized_height;
  auto ref = ReferenceResample(full, ReferenceAxis(g.left * sx, sx, 224, 0, w),
                               ReferenceAxis(g.top * sy, sy, 224, 0, h));
  EXPECT_LE(Compare(out, ref, false, 224).max, 1.0);

  std::vector<uint8_t> gray(w * h, 90);
  ASSERT_TRUE(ApplyTo(*t, Jpeg(gray, w, h, 1), 0, &out, nullptr).ok());
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], 90, 1);
}

// A record neither JPEG nor PNG (a GIF named .jpg) goes to other_decoder,
// and the same geometry applies to its pixels as to a PNG of them, in both
// modes; without one, and when it fails, the sample is a DataError.
TEST(ImageTransformTest, OtherFormatsGoThroughTheOtherDecoder) {
  const int w = 130, h = 90;
  const auto pic = MakePicture(w, h, 2);
  const std::vector<uint8_t> gif = {'G', 'I', 'F', '8', '9', 'a', 1, 2, 3};
  for (ImageMode mode : {ImageMode::kEval, ImageMode::kTrain}) {
    ImageTransformOptions o;
    o.layout = ImageLayout::kUInt8HWC;
    o.mode = mode;
    o.height = o.width = 64;
    o.resize_shorter = 72;
    std::vector<uint8_t> out, want;
    EXPECT_EQ(ApplyTo(*Make(o), gif, 3, &out, nullptr).code(), StatusCode::kDataError);
    ASSERT_TRUE(
        ApplyTo(*Make(o), testing::Png(pic, w, h, PNG_COLOR_TYPE_RGB, 8), 3, &want, nullptr).ok());
    int calls = 0;
    o.other_decoder = [&](std::span<const std::byte> record, std::vector<uint8_t>* rgb, int* width,
                          int* height) {
      ++calls;
      EXPECT_EQ(record.size(), gif.size());
      rgb->assign(pic.begin(), pic.end());
      *width = w;
      *height = h;
      return Status::Ok();
    };
    ASSERT_TRUE(ApplyTo(*Make(o), gif, 3, &out, nullptr).ok());
    EXPECT_EQ(calls, 1);
    EXPECT_EQ(out, want) << "mode " << static_cast<int>(mode);
    o.other_decoder = [](std::span<const std::byte>, std::vector<uint8_t>*, int*, int*) {
      return DataError("cannot identify image file");
    };
    const Status st = ApplyTo(*Make(o), gif, 3, &out, nullptr);
    EXPECT_EQ(st.code(), StatusCode::kDataError);
    EXPECT_NE(st.message().find("cannot identify"), std::string::npos) << st.ToString();
  }
}

// A damaged file gets one verdict whatever crop a sample's random stream
// draws (so in every epoch): a crop that stops above the damage fails too.
TEST(ImageTransformTest, TruncatedImageFailsUnderEveryCrop) {
  const int w = 320, h = 240;
  auto pic = MakePicture(w, h);
  const std::vector<std::vector<uint8_t>> files = {Jpeg(pic, w, h),
                                                   testing::Png(pic, w, h, PNG_COLOR_TYPE_RGB, 8)};
  for (const std::vector<uint8_t>& file : files) {
    std::vector<uint8_t> cut(file.begin(), file.end() - 100);
    for (bool dct_scaling : {true, false}) {
      ImageTransformOptions o;
      o.height = o.width = 64;
      o.resize_shorter = 73;
      o.dct_scaling = dct_scaling;
      for (ImageMode mode : {ImageMode::kTrain, ImageMode::kEval}) {
        o.mode = mode;
        auto t = Make(o);
        auto scratch = t->NewScratch();
        std::vector<uint8_t> out;
        ASSERT_TRUE(ApplyTo(*t, file, 0, &out, scratch.get()).ok());
        int other_verdicts = 0;
        for (uint64_t index = 0; index < 40; ++index) {
          Status s = ApplyTo(*t, cut, index, &out, scratch.get());
          if (s.code() != StatusCode::kDataError) ++other_verdicts;
        }
        EXPECT_EQ(other_verdicts, 0)
            << (file[0] == 0xFF ? "JPEG" : "PNG")
            << (mode == ImageMode::kTrain ? ", train" : ", eval")
            << (dct_scaling ? ", DCT scaling" : "") << ": not a data error for " << other_verdicts
            << " of 40 samples";
      }
    }
  }
}

// Every kind of bad input is an error that says why; none crashes.
TEST(ImageTransformTest, BadInputsAreClearErrors) {
  ImageTransformOptions o;
  auto t = Make(o);
  auto scratch = t->NewScratch();
  std::vector<uint8_t> out;
  auto good = Jpeg(MakePicture(320, 240), 320, 240);

  auto expect = [&](const std::vector<uint8_t>& file, StatusCode code, const std::string& words) {
    Status s = ApplyTo(*t, file, 0, &out, scratch.get());
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_NE(s.message().find(words), std::string::npos) << s.message();
  };
  expect({}, StatusCode::kDataError, "empty record");
  std::string html = "<html><body>not found</body></html>";
  expect(std::vector<uint8_t>(html.begin(), html.end()), StatusCode::kDataError,
         "not a JPEG or PNG image (first bytes: 3c 68 74 6d");
  expect(std::vector<uint8_t>(good.begin(), good.begin() + 2000), StatusCode::kDataError,
         "Premature end of JPEG file");
  // Images of formats stoker does not decode are named as such, with the
  // way out: torchvision lists them in an image folder, and "not an image"
  // would read as a corrupt file.
  auto bytes = [](std::string_view s) { return std::vector<uint8_t>(s.begin(), s.end()); };
  using namespace std::string_view_literals;
  for (auto [file, format] : {std::pair{"BM\x36\x0c\0\0\0\0\0\0"sv, "a BMP image"},
                              {"II*\0\x08\0\0\0"sv, "a TIFF image"},
                              {"MM\0*\0\0\0\x08"sv, "a TIFF image"},
                              {"RIFF\x24\0\0\0WEBPVP8 "sv, "a WebP image"},
                              {"GIF89a\x01\0\x01\0"sv, "a GIF image"},
                              {"P6\n1 1\n255\n\0\0\0"sv, "a PNM image"},
                              {"\0\0\0\x1c"
                               "ftypavif"sv,
                               "an AVIF image"},
                              {"\0\0\0\x18"
                               "ftypheic"sv,
                               "a HEIF image"}}) {
    expect(bytes(file), StatusCode::kDataError,
           std::string(format) + " (stoker decodes JPEG and PNG)");
    expect(bytes(file), StatusCode::kDataError, "decode_other");
  }
  // Text that starts "P6" is no PNM: a PNM's magic is followed by a space.
  expect(bytes("P6x"), StatusCode::kDataError, "not a JPEG or PNG image");
  // 60000 x 60000 in the frame header: refused from the header alone.
  expect(WithFrameSize(good, 60000, 60000), StatusCode::kResourceExhausted,
         "60000x60000 = 3600000000 pixels");
  ImageTransformOptions capped = o;
  capped.max_pixels = 320 * 240 - 1;
  std::vector<uint8_t> tmp;
  Status s = ApplyTo(*Make(capped), good, 0, &tmp, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  // The scratch still works after all that.
  EXPECT_TRUE(ApplyTo(*t, good, 0, &out, scratch.get()).ok());
}

// The scratch's cap (a worker's share of the loader's memory budget) refuses,
// from the header and before any pixel buffer grows, an image whose full-size
// decode would not fit: JPEG and PNG alike; smaller images still decode.
TEST(ImageTransformTest, ImagesOverTheScratchCapAreRefusedFromTheHeader) {
  ImageTransformOptions o;
  o.max_pixels = int64_t{1} << 40;  // the cap alone decides here
  auto t = Make(o);
  auto scratch = t->NewScratch();
  scratch->set_cap({.bytes = 64u << 20, .budget_bytes = 256u << 20, .workers = 3});
  std::vector<uint8_t> out;
  auto good = Jpeg(MakePicture(320, 240), 320, 240);
  for (int side : {9000, 30000}) {
    Status s = ApplyTo(*t, WithFrameSize(good, side, side), 0, &out, scratch.get());
    EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
    const std::string size = std::to_string(side) + "x" + std::to_string(side);
    for (const std::string& part :
         {size, std::string("per-sample cap of 64.0 MiB"),
          std::string("memory budget of 256.0 MiB"), std::string("refused before decoding")}) {
      EXPECT_NE(s.message().find(part), std::string::npos) << part << " in " << s.message();
    }
    EXPECT_LT(scratch->bytes(), size_t{1} << 20) << "nothing was allocated for its pixels";
  }
  EXPECT_TRUE(ApplyTo(*t, good, 0, &out, scratch.get()).ok());

  const size_t png_need = 320 * 240 * 3;
  auto png = testing::Png(MakePicture(320, 240), 320, 240, PNG_COLOR_TYPE_RGB, 8);
  scratch->set_cap({.bytes = png_need});
  Status s = ApplyTo(*t, png, 0, &out, scratch.get());
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_NE(s.message().find("320x240"), std::string::npos) << s.message();
  scratch->set_cap({.bytes = png_need + png.size()});
  EXPECT_TRUE(ApplyTo(*t, png, 0, &out, scratch.get()).ok());
}

}  // namespace
}  // namespace stoker
