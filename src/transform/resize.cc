#include "transform/resize.h"

#include <algorithm>
#include <cassert>
#include <climits>
#include <cmath>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace stoker {
namespace {

template <typename T>
void GrowTo(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

}  // namespace

void ComputeTaps(double in0, double scale, int out_size, int lo, int hi, ResampleTaps* taps) {
  assert(out_size >= 1 && scale > 0 && lo < hi);
  const double filter_scale = std::max(scale, 1.0);
  const double radius = filter_scale;  // the triangle's radius is 1 input pixel, widened
  const int max_taps = 2 * static_cast<int>(std::ceil(radius)) + 1;
  taps->out_size = out_size;
  taps->max_taps = max_taps;
  GrowTo(taps->start, static_cast<size_t>(out_size));
  GrowTo(taps->count, static_cast<size_t>(out_size));
  GrowTo(taps->weights, static_cast<size_t>(out_size) * static_cast<size_t>(max_taps));
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
      double t = std::abs((begin + k + 0.5 - center) / filter_scale);
      double v = t < 1.0 ? 1.0 - t : 0.0;
      out[k] = static_cast<float>(v);
      sum += v;
    }
    if (n <= 0 || sum <= 0) {
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

namespace {

// The two passes are compiled twice, for the x86-64 baseline and for AVX2,
// and picked at load time (GCC/clang function multiversioning). The kernels
// are inlined into each version. Without contraction to FMA (ISO C++ mode)
// both versions give identical results.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_ADDRESS__)
#define STOKER_MULTIVERSION __attribute__((target_clones("default", "avx2")))
#else
#define STOKER_MULTIVERSION
#endif
#define STOKER_INLINE [[gnu::always_inline]] inline

// Fixed tap counts let the compiler unroll the taps and vectorise over i.
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

template <int K>
STOKER_INLINE void PixelsFixed(const float* in, const ResampleTaps& tx, bool mirror, float* out) {
  const int n = tx.out_size;
  const float* weights = tx.weights.data();
  for (int x = 0; x < n; ++x) {
    const float* q = in + static_cast<size_t>(tx.start[static_cast<size_t>(x)] - tx.first) * 3;
    const float* w = weights + static_cast<size_t>(x) * tx.max_taps;
    float* o = out + static_cast<size_t>(mirror ? n - 1 - x : x) * 4;
#if defined(__SSE2__)
    // One pixel's R, G, B (and the next pixel's R, weighted but ignored) per
    // vector. Taps past an output's count have weight 0 and read the
    // neighbours or the zeroed slack.
    __m128 s = _mm_mul_ps(_mm_set1_ps(w[0]), _mm_loadu_ps(q));
    for (int k = 1; k < K; ++k) {
      s = _mm_add_ps(s, _mm_mul_ps(_mm_set1_ps(w[k]), _mm_loadu_ps(q + 3 * k)));
    }
    _mm_store_ps(o, s);
#else
    float r = 0, g = 0, b = 0;
    for (int k = 0; k < K; ++k) {
      r += w[k] * q[3 * k];
      g += w[k] * q[3 * k + 1];
      b += w[k] * q[3 * k + 2];
    }
    o[0] = r;
    o[1] = g;
    o[2] = b;
    o[3] = 0;
#endif
  }
}

STOKER_INLINE void PixelsAny(const float* in, const ResampleTaps& tx, bool mirror, float* out) {
  const int n = tx.out_size;
  for (int x = 0; x < n; ++x) {
    const float* q = in + static_cast<size_t>(tx.start[static_cast<size_t>(x)] - tx.first) * 3;
    const float* w = tx.weights.data() + static_cast<size_t>(x) * tx.max_taps;
    float r = 0, g = 0, b = 0;
    for (int k = 0; k < tx.count[static_cast<size_t>(x)]; ++k) {
      r += w[k] * q[3 * k];
      g += w[k] * q[3 * k + 1];
      b += w[k] * q[3 * k + 2];
    }
    float* o = out + static_cast<size_t>(mirror ? n - 1 - x : x) * 4;
    o[0] = r;
    o[1] = g;
    o[2] = b;
    o[3] = 0;
  }
}

}  // namespace

STOKER_MULTIVERSION void ResampleColumns(const uint8_t* first_row, size_t stride, const float* w,
                                         int taps, int n, float* out) {
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

STOKER_MULTIVERSION void ResamplePixels(const float* in, const ResampleTaps& tx, bool mirror,
                                        float* out) {
  switch (tx.max_count) {
    case 1:
      return PixelsFixed<1>(in, tx, mirror, out);
    case 2:
      return PixelsFixed<2>(in, tx, mirror, out);
    case 3:
      return PixelsFixed<3>(in, tx, mirror, out);
    case 4:
      return PixelsFixed<4>(in, tx, mirror, out);
    case 5:
      return PixelsFixed<5>(in, tx, mirror, out);
    case 6:
      return PixelsFixed<6>(in, tx, mirror, out);
    case 7:
      return PixelsFixed<7>(in, tx, mirror, out);
    case 8:
      return PixelsFixed<8>(in, tx, mirror, out);
    default:
      return PixelsAny(in, tx, mirror, out);
  }
}

}  // namespace stoker
