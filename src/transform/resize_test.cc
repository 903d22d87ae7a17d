#include "transform/resize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "testing/test_images.h"

namespace stoker {
namespace {

TEST(ResizeTest, SameSizeIsIdentity) {
  ResampleTaps t;
  ComputeTaps(0, 1.0, 10, 0, 10, &t);
  EXPECT_EQ(t.first, 0);
  EXPECT_EQ(t.end, 10);
  for (int i = 0; i < 10; ++i) {
    ASSERT_EQ(t.count[i], 1);
    EXPECT_EQ(t.start[i], i);
    EXPECT_FLOAT_EQ(t.weights[i * t.max_taps], 1.0f);
  }
}

TEST(ResizeTest, HalvingUsesTheWidenedTriangle) {
  ResampleTaps t;
  ComputeTaps(0, 2.0, 4, 0, 8, &t);
  // Output 1 is centred at 3.0: inputs 1..4 at distances 1.5, 0.5, 0.5, 1.5
  // over a radius of 2 weigh 0.25, 0.75, 0.75, 0.25 (sum 2).
  ASSERT_EQ(t.count[1], 4);
  EXPECT_EQ(t.start[1], 1);
  const float* w = &t.weights[1 * t.max_taps];
  EXPECT_FLOAT_EQ(w[0], 0.125f);
  EXPECT_FLOAT_EQ(w[1], 0.375f);
  EXPECT_FLOAT_EQ(w[2], 0.375f);
  EXPECT_FLOAT_EQ(w[3], 0.125f);
  // At the border the window is cut and the weights renormalised.
  EXPECT_EQ(t.start[0], 0);
  float sum = 0;
  for (int k = 0; k < t.count[0]; ++k) sum += t.weights[k];
  EXPECT_FLOAT_EQ(sum, 1.0f);
}

TEST(ResizeTest, TapsMatchTheReferenceFormula) {
  struct Case {
    double in0, scale;
    int out, lo, hi;
  };
  for (Case c : {Case{0, 3.7, 50, 0, 185}, Case{12.25, 0.4, 224, 12, 103},
                 Case{7.5, 1.93, 224, 7, 440}, Case{0, 1.0, 9, 0, 9}}) {
    ResampleTaps t;
    ComputeTaps(c.in0, c.scale, c.out, c.lo, c.hi, &t);
    auto ref = testing::ReferenceAxis(c.in0, c.scale, c.out, c.lo, c.hi);
    for (int i = 0; i < c.out; ++i) {
      // The table drops zero-weight end taps; compare as dense vectors.
      for (size_t k = 0; k < ref.weights[i].size(); ++k) {
        int pos = ref.first[i] + static_cast<int>(k);
        int j = pos - t.start[i];
        double got = (j >= 0 && j < t.count[i]) ? t.weights[i * t.max_taps + j] : 0.0;
        ASSERT_NEAR(got, ref.weights[i][k], 1e-6) << "output " << i << " input " << pos;
      }
      EXPECT_GE(t.start[i], c.lo);
      EXPECT_LE(t.start[i] + t.count[i], c.hi);
    }
  }
}

TEST(ResizeTest, ResampleMatchesReferenceAndKeepsFlatColour) {
  testing::Image img;
  img.width = 97;
  img.height = 61;
  img.rgb = testing::MakePicture(97, 61, 3);
  DecodedRegion src{img.rgb.data(), 0, 0, 97, 61, 97 * 3};
  ResampleTaps tx, ty;
  ResampleBuffers buffers;
  ComputeTaps(5.5, 80.0 / 40, 40, 5, 86, &tx);
  ComputeTaps(3.0, 50.0 / 70, 70, 3, 53, &ty);
  auto ref = testing::ReferenceResample(img, testing::ReferenceAxis(5.5, 2.0, 40, 5, 86),
                                        testing::ReferenceAxis(3.0, 50.0 / 70, 70, 3, 53));
  double worst = 0;
  for (bool mirror : {false, true}) {
    int rows = 0;
    ResampleRgb(src, tx, ty, mirror, buffers, [&](int y, const float* px) {
      EXPECT_EQ(y, rows++);
      for (int x = 0; x < 40; ++x) {
        const double* q = &ref[(static_cast<size_t>(y) * 40 + (mirror ? 39 - x : x)) * 3];
        for (int c = 0; c < 3; ++c) worst = std::max(worst, std::abs(px[4 * x + c] - q[c]));
      }
    });
    EXPECT_EQ(rows, 70);
  }
  EXPECT_LT(worst, 1e-3);

  std::vector<uint8_t> flat(50 * 50 * 3);
  for (size_t i = 0; i < flat.size(); ++i) flat[i] = static_cast<uint8_t>(i % 3 == 0 ? 200 : 17);
  DecodedRegion f{flat.data(), 0, 0, 50, 50, 150};
  ComputeTaps(0, 50.0 / 13, 13, 0, 50, &tx);
  ComputeTaps(0, 50.0 / 31, 31, 0, 50, &ty);
  ResampleRgb(f, tx, ty, false, buffers, [&](int, const float* px) {
    for (int x = 0; x < 13; ++x) {
      ASSERT_NEAR(px[4 * x], 200, 1e-3);
      ASSERT_NEAR(px[4 * x + 1], 17, 1e-3);
      ASSERT_NEAR(px[4 * x + 2], 17, 1e-3);
    }
  });
}

// The planar path with a mapping, mirrored, at a width that leaves a partial
// group of 8: the same values as the interleaved one, mapped in float.
TEST(ResizeTest, PlanarRowsAreTheMappedInterleavedRows) {
  const int w = 37, h = 29;
  testing::Image img;
  img.width = 120;
  img.height = 90;
  img.rgb = testing::MakePicture(120, 90, 6);
  DecodedRegion src{img.rgb.data(), 0, 0, 120, 90, 120 * 3};
  ResampleTaps tx, ty;
  ResampleBuffers buffers;
  ComputeTaps(2.25, 101.5 / w, w, 2, 104, &tx);
  ComputeTaps(0.0, 90.0 / h, h, 0, 90, &ty);
  ChannelAffine affine;
  for (int c = 0; c < 3; ++c) {
    affine.scale[c] = 1.0f / (255.0f * (0.2f + 0.01f * c));
    affine.bias[c] = -(0.4f + 0.03f * c) / (0.2f + 0.01f * c);
  }
  for (bool mirror : {false, true}) {
    std::vector<float> rgbx(static_cast<size_t>(w) * h * 4);
    ResampleRgb(src, tx, ty, mirror, buffers, [&](int y, const float* px) {
      std::copy(px, px + 4 * w, rgbx.begin() + static_cast<ptrdiff_t>(y) * w * 4);
    });
    // Slack past each row catches writes beyond out_size.
    std::vector<float> planes(static_cast<size_t>(3) * h * w + 8, -1.0f);
    int rows = 0;
    ResamplePlanar(
        src, tx, ty, mirror, affine, buffers,
        [&](int y) {
          float* r = planes.data() + static_cast<size_t>(y) * w;
          return PlanarRow{{r, r + h * w, r + 2 * h * w}};
        },
        [&](int y) { EXPECT_EQ(y, rows++); });
    EXPECT_EQ(rows, h);
    for (int c = 0; c < 3; ++c) {
      for (int i = 0; i < h * w; ++i) {
        const float v = rgbx[static_cast<size_t>(i) * 4 + c];
        ASSERT_EQ(planes[static_cast<size_t>(c) * h * w + i], v * affine.scale[c] + affine.bias[c])
            << "channel " << c << " pixel " << i;
      }
    }
    for (size_t i = static_cast<size_t>(3) * h * w; i < planes.size(); ++i) {
      ASSERT_EQ(planes[i], -1.0f);
    }
  }
}

// Whatever kernel the CPU picks, the portable one gives the same bits, the
// bicubic clamp included.
TEST(ResizeTest, RowKernelsAgreeBitForBit) {
  for (ImageInterpolation filter : {ImageInterpolation::kBilinear, ImageInterpolation::kBicubic}) {
    for (int taps_case = 0; taps_case < 3; ++taps_case) {
      const int out = 45;
      const int in = taps_case == 0 ? 30 : (taps_case == 1 ? 100 : 400);
      ResampleTaps tx;
      ComputeTaps(0.5, (in - 1.0) / out, out, 0, in, &tx, filter);
      ResampleBuffers buffers;
      float* col = PrepareResample(tx, taps_case == 1, &buffers);
      for (int i = 0; i < (tx.end - tx.first) * 3; ++i) {
        col[i] = static_cast<float>((i * 37) % 256) + 0.25f;
      }
      ChannelAffine a;
      a.scale[1] = 0.017f;
      a.bias[2] = -2.1f;
      if (filter == ImageInterpolation::kBicubic) {
        a.lo = 0.0f;
        a.hi = 255.0f;
      }
      std::vector<float> fast(3 * out), plain(3 * out);
      ResampleRow(col, buffers.plan, a, PlanarRow{{&fast[0], &fast[out], &fast[2 * out]}});
      ResampleRowPortable(col, buffers.plan, a,
                          PlanarRow{{&plain[0], &plain[out], &plain[2 * out]}});
      EXPECT_EQ(fast, plain) << "input width " << in;
    }
  }
}

// The weights of output `i` as a dense vector over inputs [lo, hi).
std::vector<double> Dense(const ResampleTaps& t, int i, int lo, int hi) {
  std::vector<double> w(static_cast<size_t>(hi - lo), 0.0);
  for (int k = 0; k < t.count[i]; ++k) w[t.start[i] + k - lo] = t.weights[i * t.max_taps + k];
  return w;
}

// Cubic convolution with a = -0.5 at distances 0.25, 0.75, 1.25 and 1.75
// weighs 0.8671875, 0.2265625, -0.0703125 and -0.0234375 (Pillow's BICUBIC).
TEST(ResizeTest, BicubicHalvingHasPillowsCoefficients) {
  ResampleTaps t;
  ComputeTaps(0, 2.0, 8, 0, 16, &t, ImageInterpolation::kBicubic);
  // Output 2 is centred at 5.0; the radius is 2 widened to 4: inputs 1..8 at
  // distances 3.5 .. 0.5 (1.75 .. 0.25 after the widening), sum 2.
  ASSERT_EQ(t.start[2], 1);
  ASSERT_EQ(t.count[2], 8);
  const float want[8] = {-0.01171875f, -0.03515625f, 0.11328125f,  0.43359375f,
                         0.43359375f,  0.11328125f,  -0.03515625f, -0.01171875f};
  for (int k = 0; k < 8; ++k) EXPECT_FLOAT_EQ(t.weights[2 * t.max_taps + k], want[k]) << k;
}

TEST(ResizeTest, BicubicUpscalingUsesTheCubicAsIs) {
  ResampleTaps t;
  ComputeTaps(0, 0.5, 16, 0, 8, &t, ImageInterpolation::kBicubic);
  // Output 5 is centred at 2.75: inputs 1..4 at 1.25, 0.25, 0.75, 1.75.
  ASSERT_EQ(t.start[5], 1);
  ASSERT_EQ(t.count[5], 4);
  const float want[4] = {-0.0703125f, 0.8671875f, 0.2265625f, -0.0234375f};
  for (int k = 0; k < 4; ++k) EXPECT_FLOAT_EQ(t.weights[5 * t.max_taps + k], want[k]) << k;
}

TEST(ResizeTest, BicubicWeightsSumToOneAndMirror) {
  for (int in : {7, 64, 100, 333}) {
    for (int out : {5, 37, 224}) {
      ResampleTaps t;
      ComputeTaps(0, static_cast<double>(in) / out, out, 0, in, &t, ImageInterpolation::kBicubic);
      for (int i = 0; i < out; ++i) {
        double sum = 0;
        for (int k = 0; k < t.count[i]; ++k) sum += t.weights[i * t.max_taps + k];
        ASSERT_NEAR(sum, 1.0, 1e-6) << in << " -> " << out << ", output " << i;
        // Output i and output out - 1 - i are mirror images of each other.
        std::vector<double> a = Dense(t, i, 0, in), b = Dense(t, out - 1 - i, 0, in);
        std::reverse(b.begin(), b.end());
        for (int x = 0; x < in; ++x) ASSERT_NEAR(a[x], b[x], 1e-6) << in << " -> " << out;
      }
    }
  }
}

// A hard edge overshoots under the cubic's negative lobes; the clamp keeps
// the output in the byte range, and without it the overshoot shows.
TEST(ResizeTest, BicubicOvershootIsClampedToTheByteRange) {
  const int w = 16, h = 4;
  std::vector<uint8_t> rgb(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int c = 0; c < 3; ++c) rgb[(y * w + x) * 3 + c] = x < w / 2 ? 0 : 255;
    }
  }
  DecodedRegion src{rgb.data(), 0, 0, w, h, static_cast<size_t>(w) * 3};
  ResampleTaps tx, ty;
  ComputeTaps(0, 0.25, 4 * w, 0, w, &tx, ImageInterpolation::kBicubic);
  ComputeTaps(0, 1.0, h, 0, h, &ty, ImageInterpolation::kBicubic);
  ResampleBuffers buffers;
  for (bool clamp : {false, true}) {
    ChannelAffine a;
    if (clamp) {
      a.lo = 0.0f;
      a.hi = 255.0f;
    }
    float lowest = 0, highest = 0;
    std::vector<float> plane(static_cast<size_t>(3) * 4 * w);
    ResamplePlanar(
        src, tx, ty, false, a, buffers,
        [&](int) {
          return PlanarRow{{plane.data(), plane.data() + 4 * w, plane.data() + 8 * w}};
        },
        [&](int) {
          for (float v : plane) {
            lowest = std::min(lowest, v);
            highest = std::max(highest, v);
          }
        });
    if (clamp) {
      EXPECT_EQ(lowest, 0.0f);
      EXPECT_EQ(highest, 255.0f);
    } else {
      EXPECT_LT(lowest, -5.0f);
      EXPECT_GT(highest, 260.0f);
    }
  }
}

// Pillow's 8-bit weights: each rounded to 22 fraction bits, summing to one.
TEST(ResizeTest, BicubicFixedPointWeightsArePillows) {
  ResampleTaps t;
  ComputeTaps(0, 2.0, 8, 0, 16, &t, ImageInterpolation::kBicubic);
  const int32_t want[8] = {-49152, -147456, 475136, 1818624, 1818624, 475136, -147456, -49152};
  for (int k = 0; k < 8; ++k) EXPECT_EQ(t.fixed[2 * t.max_taps + k], want[k]) << k;
  int32_t sum = 0;
  for (int k = 0; k < t.count[2]; ++k) sum += t.fixed[2 * t.max_taps + k];
  EXPECT_EQ(sum, 1 << kFixedBits);
}

// The horizontal pass to bytes rounds and clamps each value as Pillow does,
// and mirrors.
TEST(ResizeTest, RowsToBytesRoundClampAndMirror) {
  const int w = 8;
  std::vector<uint8_t> rgb(static_cast<size_t>(w) * 3);
  for (int x = 0; x < w; ++x) {
    for (int c = 0; c < 3; ++c) rgb[x * 3 + c] = x < w / 2 ? 0 : 255;
  }
  DecodedRegion src{rgb.data(), 0, 0, w, 1, static_cast<size_t>(w) * 3};
  ResampleTaps tx;
  ComputeTaps(0, 0.5, 2 * w, 0, w, &tx, ImageInterpolation::kBicubic);
  std::vector<uint8_t> out(static_cast<size_t>(2 * w) * 3), mirrored(out.size());
  ResampleRowsToBytes(src, tx, false, 0, 1, out.data());
  ResampleRowsToBytes(src, tx, true, 0, 1, mirrored.data());
  for (int x = 0; x < 2 * w; ++x) {
    // The exact value, from the float weights: the bytes are it rounded and clamped.
    double v = 0;
    for (int k = 0; k < tx.count[x]; ++k) {
      v += tx.weights[x * tx.max_taps + k] * rgb[(tx.start[x] + k) * 3];
    }
    EXPECT_EQ(out[x * 3], std::clamp(std::floor(v + 0.5), 0.0, 255.0)) << x;
    EXPECT_EQ(mirrored[(2 * w - 1 - x) * 3 + 1], out[x * 3 + 1]) << x;
  }
  EXPECT_EQ(out[0], 0);
  EXPECT_EQ(out[(2 * w - 1) * 3], 255);
}

}  // namespace
}  // namespace stoker
