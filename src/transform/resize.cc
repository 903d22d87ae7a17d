#include "transform/resize.h"

#include <algorithm>
#include <cassert>
#include <climits>
#include <cmath>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace stoker {
namespace {

template <typename T>
void GrowTo(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

// Cubic convolution (Keys) with a = -0.5: 1 at 0, 0 at every other integer,
// negative between 1 and 2 pixels, 0 past 2.
double Cubic(double t) {
  constexpr double a = -0.5;
  t = std::abs(t);
  if (t < 1.0) return ((a + 2.0) * t - (a + 3.0)) * t * t + 1.0;
  if (t < 2.0) return a * (((t - 5.0) * t + 8.0) * t - 4.0);
  return 0.0;
}

double Triangle(double t) {
  t = std::abs(t);
  return t < 1.0 ? 1.0 - t : 0.0;
}

}  // namespace

void ComputeTaps(double in0, double scale, int out_size, int lo, int hi, ResampleTaps* taps,
                 ImageInterpolation filter) {
  assert(out_size >= 1 && scale > 0 && lo < hi);
  const bool cubic = filter == ImageInterpolation::kBicubic;
  const double filter_scale = std::max(scale, 1.0);
  // The filter's radius in input pixels (triangle 1, cubic 2), widened.
  const double radius = (cubic ? 2.0 : 1.0) * filter_scale;
  const int max_taps = 2 * static_cast<int>(std::ceil(radius)) + 1;
  taps->out_size = out_size;
  taps->max_taps = max_taps;
  GrowTo(taps->start, static_cast<size_t>(out_size));
  GrowTo(taps->count, static_cast<size_t>(out_size));
  GrowTo(taps->weights, static_cast<size_t>(out_size) * static_cast<size_t>(max_taps));
  if (cubic) GrowTo(taps->fixed, static_cast<size_t>(out_size) * static_cast<size_t>(max_taps));
  int first = INT_MAX;
  int end = INT_MIN;
  int max_count = 0;
  for (int i = 0; i < out_size; ++i) {
    const double center = in0 + (i + 0.5) * scale;
    int begin = std::max(static_cast<int>(std::floor(center - radius + 0.5)), lo);
    int stop = std::min(static_cast<int>(std::floor(center + radius + 0.5)), hi);
    double sum = 0;
    int n = stop - begin;
    float* out = taps->weights.data() + static_cast<size_t>(i) * max_taps;
    for (int k = 0; k < n; ++k) {
      const double t = (begin + k + 0.5 - center) / filter_scale;
      const double v = cubic ? Cubic(t) : Triangle(t);
      out[k] = static_cast<float>(v);
      sum += v;
    }
    const bool nearest = n <= 0 || sum <= 0;
    if (nearest) {
      // The centre lies outside [lo, hi) (only when a caller's window does):
      // take the nearest input.
      begin = std::clamp(static_cast<int>(std::floor(center)), lo, hi - 1);
      n = 1;
      out[0] = 1.0f;
    } else {
      // Drop zero-weight taps at both ends; they cost a multiply each.
      int skip = 0;
      while (n > 1 && out[skip] == 0.0f) {
        ++skip;
        --n;
      }
      while (n > 1 && out[skip + n - 1] == 0.0f) --n;
      for (int k = 0; k < n; ++k) out[k] = static_cast<float>(out[skip + k] / sum);
      begin += skip;
    }
    std::fill(out + n, out + max_taps, 0.0f);
    if (cubic) {
      // Pillow's fixed-point weights: the double weight, rounded half away from 0.
      int32_t* f = taps->fixed.data() + static_cast<size_t>(i) * max_taps;
      for (int k = 0; k < n; ++k) {
        const double w = nearest ? 1.0 : Cubic((begin + k + 0.5 - center) / filter_scale) / sum;
        f[k] = static_cast<int32_t>(std::trunc(w * (1 << kFixedBits) + (w < 0 ? -0.5 : 0.5)));
      }
      std::fill(f + n, f + max_taps, 0);
    }
    max_count = std::max(max_count, n);
    taps->start[static_cast<size_t>(i)] = begin;
    taps->count[static_cast<size_t>(i)] = n;
    first = std::min(first, begin);
    end = std::max(end, begin + n);
  }
  taps->first = first;
  taps->end = end;
  taps->max_count = max_count;
}

void ZeroTapsOutside(int begin, int end, ResampleTaps* taps) {
  const size_t row = static_cast<size_t>(taps->max_taps);
  for (int i = 0; i < taps->out_size; ++i) {
    if (i >= begin && i < end) continue;
    const size_t at = static_cast<size_t>(i);
    taps->start[at] = taps->first;  // a real input, so the kernels read inside the region
    taps->count[at] = 1;
    std::fill_n(taps->weights.begin() + static_cast<std::ptrdiff_t>(at * row), row, 0.0f);
    if (taps->fixed.size() >= (at + 1) * row) {  // filled for bicubic only
      std::fill_n(taps->fixed.begin() + static_cast<std::ptrdiff_t>(at * row), row, 0);
    }
  }
}

namespace {

// Both passes have a portable kernel and an AVX2 one, picked at run time.
// Each AVX2 kernel does the portable one's float operations in the same
// order (a product per tap, summed left to right; no FMA), so the output does
// not depend on the machine's vector width.
#if defined(__x86_64__) && defined(__GNUC__)
#define STOKER_HAVE_AVX2 1
#endif
#define STOKER_INLINE [[gnu::always_inline]] inline

// The portable vertical kernels. Fixed tap counts let the compiler unroll
// the taps and vectorise over i.
template <int K>
STOKER_INLINE void ColumnsFixed(const uint8_t* p, size_t stride, const float* w, int n,
                                float* out) {
  float wk[K];
  const uint8_t* rows[K];
  for (int k = 0; k < K; ++k) {
    wk[k] = w[k];
    rows[k] = p + static_cast<size_t>(k) * stride;
  }
  for (int i = 0; i < n; ++i) {
    float s = wk[0] * static_cast<float>(rows[0][i]);
    for (int k = 1; k < K; ++k) s += wk[k] * static_cast<float>(rows[k][i]);
    out[i] = s;
  }
}

STOKER_INLINE void ColumnsAny(const uint8_t* p, size_t stride, const float* w, int taps, int n,
                              float* out) {
  for (int i = 0; i < n; ++i) out[i] = w[0] * static_cast<float>(p[i]);
  for (int k = 1; k < taps; ++k) {
    p += stride;
    const float wk = w[k];
    for (int i = 0; i < n; ++i) out[i] += wk * static_cast<float>(p[i]);
  }
}

constexpr int kGroup = 8;  // output positions per step of the row kernel

// The weight of tap k of the position `m` of a group: see RowKernelPlan.
size_t WeightIndex(int group, int taps, int k, int m) {
  return ((static_cast<size_t>(group) * taps + k) * 4 + (m & 3)) * 8 + (m & 4);
}

#if defined(STOKER_HAVE_AVX2)
// Eight bytes as eight floats.
[[gnu::target("avx2")]] STOKER_INLINE __m256 LoadBytes8(const uint8_t* q) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))));
}

template <int K>
[[gnu::target("avx2")]] void ColumnsAvx2(const uint8_t* p, size_t stride, const float* w, int n,
                                         float* out) {
  __m256 wk[K];
  const uint8_t* rows[K];
  for (int k = 0; k < K; ++k) {
    wk[k] = _mm256_set1_ps(w[k]);
    rows[k] = p + static_cast<size_t>(k) * stride;
  }
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 lo = _mm256_mul_ps(wk[0], LoadBytes8(rows[0] + i));
    __m256 hi = _mm256_mul_ps(wk[0], LoadBytes8(rows[0] + i + 8));
    for (int k = 1; k < K; ++k) {
      lo = _mm256_add_ps(lo, _mm256_mul_ps(wk[k], LoadBytes8(rows[k] + i)));
      hi = _mm256_add_ps(hi, _mm256_mul_ps(wk[k], LoadBytes8(rows[k] + i + 8)));
    }
    _mm256_storeu_ps(out + i, lo);
    _mm256_storeu_ps(out + i + 8, hi);
  }
  for (; i < n; ++i) {
    float s = w[0] * static_cast<float>(rows[0][i]);
    for (int k = 1; k < K; ++k) s += w[k] * static_cast<float>(rows[k][i]);
    out[i] = s;
  }
}

// Two pixels per vector: position j's R, G, B (and the next input's R,
// weighted and dropped) in the low half, position j + 4's in the high half.
[[gnu::target("avx2")]] STOKER_INLINE __m256 LoadPair(const float* lo, const float* hi) {
  return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(lo)), _mm_loadu_ps(hi), 1);
}

// kTaps > 0: the tap count, fixed at compile time (the loop unrolled and
// addresses folded into the loads); 0: read from the plan.
template <int kTaps>
[[gnu::target("avx2")]] void RowAvx2(const float* in, const RowKernelPlan& p,
                                     const ChannelAffine& a, PlanarRow out) {
  const int taps = kTaps > 0 ? kTaps : p.taps;
  const int out_size = p.out_size;
  const float* w = p.weights.data();
  const int* off = p.offsets.data();
  const __m256 lo = _mm256_set1_ps(a.lo);
  const __m256 hi = _mm256_set1_ps(a.hi);
  __m256 scale[3], bias[3];
  for (int c = 0; c < 3; ++c) {
    scale[c] = _mm256_set1_ps(a.scale[c]);
    bias[c] = _mm256_set1_ps(a.bias[c]);
  }
  for (int x = 0; x < out_size; x += kGroup, off += kGroup) {
    const float* q0 = in + off[0];
    const float* q1 = in + off[1];
    const float* q2 = in + off[2];
    const float* q3 = in + off[3];
    const float* q4 = in + off[4];
    const float* q5 = in + off[5];
    const float* q6 = in + off[6];
    const float* q7 = in + off[7];
    __m256 s0 = _mm256_mul_ps(_mm256_loadu_ps(w), LoadPair(q0, q4));
    __m256 s1 = _mm256_mul_ps(_mm256_loadu_ps(w + 8), LoadPair(q1, q5));
    __m256 s2 = _mm256_mul_ps(_mm256_loadu_ps(w + 16), LoadPair(q2, q6));
    __m256 s3 = _mm256_mul_ps(_mm256_loadu_ps(w + 24), LoadPair(q3, q7));
    w += 32;
    for (int k = 1; k < taps; ++k, w += 32) {
      const int d = 3 * k;
      s0 = _mm256_add_ps(s0, _mm256_mul_ps(_mm256_loadu_ps(w), LoadPair(q0 + d, q4 + d)));
      s1 = _mm256_add_ps(s1, _mm256_mul_ps(_mm256_loadu_ps(w + 8), LoadPair(q1 + d, q5 + d)));
      s2 = _mm256_add_ps(s2, _mm256_mul_ps(_mm256_loadu_ps(w + 16), LoadPair(q2 + d, q6 + d)));
      s3 = _mm256_add_ps(s3, _mm256_mul_ps(_mm256_loadu_ps(w + 24), LoadPair(q3 + d, q7 + d)));
    }
    // Transpose each half from 4 pixels of (R, G, B, -) to R, G, B of 4 pixels.
    const __m256 t0 = _mm256_unpacklo_ps(s0, s1);  // r0 r1 g0 g1
    const __m256 t1 = _mm256_unpackhi_ps(s0, s1);  // b0 b1 .. ..
    const __m256 t2 = _mm256_unpacklo_ps(s2, s3);  // r2 r3 g2 g3
    const __m256 t3 = _mm256_unpackhi_ps(s2, s3);  // b2 b3 .. ..
    __m256 v[3] = {_mm256_shuffle_ps(t0, t2, 0x44), _mm256_shuffle_ps(t0, t2, 0xEE),
                   _mm256_shuffle_ps(t1, t3, 0x44)};
    for (int c = 0; c < 3; ++c) {
      v[c] = _mm256_min_ps(_mm256_max_ps(v[c], lo), hi);
      v[c] = _mm256_add_ps(_mm256_mul_ps(v[c], scale[c]), bias[c]);
    }
    if (x + kGroup <= out_size) {
      for (int c = 0; c < 3; ++c) _mm256_storeu_ps(out.c[c] + x, v[c]);
    } else {
      alignas(32) float tail[kGroup];
      for (int c = 0; c < 3; ++c) {
        _mm256_store_ps(tail, v[c]);
        std::copy(tail, tail + (out_size - x), out.c[c] + x);
      }
    }
  }
}

bool CpuHasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
#endif

}  // namespace

void ResampleRowsToBytes(const DecodedRegion& src, const ResampleTaps& tx, bool mirror,
                         int row_first, int row_end, uint8_t* out) {
  const int w = tx.out_size;
  for (int y = row_first; y < row_end; ++y) {
    const uint8_t* row = src.pixels + static_cast<size_t>(y - src.y0) * src.stride;
    for (int m = 0; m < w; ++m) {
      const size_t x = static_cast<size_t>(mirror ? w - 1 - m : m);
      const int32_t* k = tx.fixed.data() + x * static_cast<size_t>(tx.max_taps);
      const uint8_t* p = row + static_cast<size_t>(tx.start[x] - src.x0) * 3;
      for (int c = 0; c < 3; ++c) {
        int32_t acc = 1 << (kFixedBits - 1);  // rounds half up
        for (int t = 0; t < tx.count[x]; ++t) acc += k[t] * p[3 * t + c];
        *out++ = static_cast<uint8_t>(std::clamp(acc >> kFixedBits, 0, 255));
      }
    }
  }
}

size_t ResampleBuffers::bytes() const {
  return (columns.capacity() + plan.weights.capacity() + rows.capacity() + pixels.capacity()) *
             sizeof(float) +
         plan.offsets.capacity() * sizeof(int);
}

void ResampleColumns(const uint8_t* first_row, size_t stride, const float* w, int taps, int n,
                     float* out) {
#if defined(STOKER_HAVE_AVX2)
  if (CpuHasAvx2()) {
    switch (taps) {
      case 1:
        return ColumnsAvx2<1>(first_row, stride, w, n, out);
      case 2:
        return ColumnsAvx2<2>(first_row, stride, w, n, out);
      case 3:
        return ColumnsAvx2<3>(first_row, stride, w, n, out);
      case 4:
        return ColumnsAvx2<4>(first_row, stride, w, n, out);
      case 5:
        return ColumnsAvx2<5>(first_row, stride, w, n, out);
      case 6:
        return ColumnsAvx2<6>(first_row, stride, w, n, out);
      case 7:
        return ColumnsAvx2<7>(first_row, stride, w, n, out);
      case 8:
        return ColumnsAvx2<8>(first_row, stride, w, n, out);
      default:
        break;
    }
  }
#endif
  switch (taps) {
    case 1:
      return ColumnsFixed<1>(first_row, stride, w, n, out);
    case 2:
      return ColumnsFixed<2>(first_row, stride, w, n, out);
    case 3:
      return ColumnsFixed<3>(first_row, stride, w, n, out);
    case 4:
      return ColumnsFixed<4>(first_row, stride, w, n, out);
    case 5:
      return ColumnsFixed<5>(first_row, stride, w, n, out);
    case 6:
      return ColumnsFixed<6>(first_row, stride, w, n, out);
    case 7:
      return ColumnsFixed<7>(first_row, stride, w, n, out);
    case 8:
      return ColumnsFixed<8>(first_row, stride, w, n, out);
    default:
      return ColumnsAny(first_row, stride, w, taps, n, out);
  }
}

float* PrepareResample(const ResampleTaps& tx, bool mirror, ResampleBuffers* b) {
  const int n = tx.out_size;
  const int taps = tx.max_count;
  const int groups = (n + kGroup - 1) / kGroup;
  RowKernelPlan& p = b->plan;
  p.out_size = n;
  p.taps = taps;
  GrowTo(p.offsets, static_cast<size_t>(groups) * kGroup);
  GrowTo(p.weights, static_cast<size_t>(groups) * taps * 4 * 8);
  for (int m = 0; m < groups * kGroup; ++m) {
    const int group = m / kGroup;
    const int at = m % kGroup;
    const float* w = nullptr;
    if (m < n) {
      const size_t x = static_cast<size_t>(mirror ? n - 1 - m : m);
      p.offsets[static_cast<size_t>(m)] = 3 * (tx.start[x] - tx.first);
      w = tx.weights.data() + x * static_cast<size_t>(tx.max_taps);
    } else {
      p.offsets[static_cast<size_t>(m)] = 0;  // reads the first input, weighs it 0
    }
    for (int k = 0; k < taps; ++k) {
      float* dst = p.weights.data() + WeightIndex(group, taps, k, at);
      std::fill(dst, dst + 4, w != nullptr ? w[k] : 0.0f);
    }
  }
  // Taps past an output's count weigh 0 but still read up to 3 * max_count
  // floats (and one more, the fourth lane) past its start: zeroed slack, so
  // that 0 * slack is 0.
  const size_t columns = static_cast<size_t>(tx.end - tx.first) * 3;
  const size_t slack = static_cast<size_t>(3 * taps + 1);
  GrowTo(b->columns, columns + slack);
  std::fill(b->columns.data() + columns, b->columns.data() + columns + slack, 0.0f);
  return b->columns.data();
}

void ResampleRowPortable(const float* in, const RowKernelPlan& p, const ChannelAffine& a,
                         PlanarRow out) {
  for (int x = 0; x < p.out_size; ++x) {
    const float* w = p.weights.data() + WeightIndex(x / kGroup, p.taps, 0, x % kGroup);
    const float* q = in + p.offsets[static_cast<size_t>(x)];
    float s[3] = {w[0] * q[0], w[0] * q[1], w[0] * q[2]};
    for (int k = 1; k < p.taps; ++k) {
      const float wk = w[static_cast<size_t>(k) * 32];
      for (int c = 0; c < 3; ++c) s[c] = s[c] + wk * q[3 * k + c];
    }
    for (int c = 0; c < 3; ++c) {
      out.c[c][x] = std::min(std::max(s[c], a.lo), a.hi) * a.scale[c] + a.bias[c];
    }
  }
}

void ResampleRow(const float* columns, const RowKernelPlan& plan, const ChannelAffine& affine,
                 PlanarRow out) {
#if defined(STOKER_HAVE_AVX2)
  if (CpuHasAvx2()) {
    switch (plan.taps) {
      case 1:
        return RowAvx2<1>(columns, plan, affine, out);
      case 2:
        return RowAvx2<2>(columns, plan, affine, out);
      case 3:
        return RowAvx2<3>(columns, plan, affine, out);
      case 4:
        return RowAvx2<4>(columns, plan, affine, out);
      case 5:
        return RowAvx2<5>(columns, plan, affine, out);
      case 6:
        return RowAvx2<6>(columns, plan, affine, out);
      default:
        return RowAvx2<0>(columns, plan, affine, out);
    }
  }
#endif
  ResampleRowPortable(columns, plan, affine, out);
}

}  // namespace stoker
