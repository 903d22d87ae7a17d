#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "stoker/image.h"
#include "transform/decoded_region.h"

namespace stoker {

/// The filter taps of one axis of a resample: output i is the weighted sum
/// of inputs [start[i], start[i] + count[i]) with weights
/// weights[i * max_taps + k]. Input positions are absolute (in the image the
/// region came from). Kept in per-worker scratch and refilled per sample;
/// its vectors only ever grow.
struct ResampleTaps {
  int out_size = 0;
  int max_taps = 0;   // the row length of `weights`
  int max_count = 0;  // the largest count; weights past an output's count are 0
  /// The inputs any output touches: [first, end).
  int first = 0;
  int end = 0;
  std::vector<int> start;
  std::vector<int> count;
  std::vector<float> weights;
  /// Bicubic only: the weights as Pillow's 8-bit resampler holds them, in
  /// fixed point with kFixedBits fraction bits (same layout as `weights`).
  std::vector<int32_t> fixed;
};

/// The fraction bits of ResampleTaps::fixed: Pillow's precision for 8-bit images.
inline constexpr int kFixedBits = 22;

/// Fills `taps` for an antialiased resample with `filter`, as Pillow's
/// BILINEAR (a triangle of radius 1) or BICUBIC (cubic convolution, a = -0.5,
/// radius 2) with its antialiasing, the filter widened by the downscale
/// factor: output i is centred at input position in0 + (i + 0.5) * scale,
/// where pixel p covers [p, p + 1); the filter's radius is its own times
/// max(scale, 1) pixels, and inputs outside [lo, hi) are left out (the
/// weights renormalised). Bicubic weights can be negative.
/// REQUIRES: out_size >= 1, scale > 0, lo < hi.
void ComputeTaps(double in0, double scale, int out_size, int lo, int hi, ResampleTaps* taps,
                 ImageInterpolation filter = ImageInterpolation::kBilinear);

/// Makes outputs outside [begin, end) weigh nothing (one tap of weight 0),
/// so they come out as 0: the zero padding of a centre crop larger than the
/// resized image. Inputs and taps of the other outputs are kept.
void ZeroTapsOutside(int begin, int end, ResampleTaps* taps);

/// Pillow's horizontal pass, for filters with negative lobes (bicubic), where
/// its rounding and clamping to bytes before the vertical pass shows: rows
/// [row_first, row_end) of `src` resampled by `tx` in fixed point
/// (ResampleTaps::fixed), mirrored left-right when `mirror`, rounded and
/// clamped to bytes, into `out`: row_end - row_first rows of tx.out_size RGB
/// pixels. REQUIRES: tx.fixed filled; src covers the rows and [tx.first, tx.end).
void ResampleRowsToBytes(const DecodedRegion& src, const ResampleTaps& tx, bool mirror,
                         int row_first, int row_end, uint8_t* out);

/// Maps each resampled value v of channel c to
/// min(max(v, lo), hi) * scale[c] + bias[c] (the identity by default), so
/// that a normalisation costs nothing extra. [lo, hi] is [0, 255] for
/// filters with negative lobes (bicubic), where v can leave the byte range;
/// unbounded by default, which leaves every value's bits as they are.
struct ChannelAffine {
  float scale[3] = {1.0f, 1.0f, 1.0f};
  float bias[3] = {0.0f, 0.0f, 0.0f};
  float lo = -std::numeric_limits<float>::infinity();
  float hi = std::numeric_limits<float>::infinity();
};

/// Where one output row goes: a row of out_size floats per channel (R, G, B).
struct PlanarRow {
  float* c[3];
};

/// The horizontal taps of a resample laid out for the row kernel, mirroring
/// applied: output positions in groups of 8; within a group, for each tap k
/// and pair j (0..3), 8 floats: four copies of the weight of position
/// 8g + j, then four of position 8g + j + 4. Positions past out_size weigh 0.
struct RowKernelPlan {
  int out_size = 0;
  int taps = 0;
  std::vector<int> offsets;    // per position: index in the column row of its first tap's R
  std::vector<float> weights;  // [group][tap][pair][8]
};

/// Per-worker buffers of the resampler; they only ever grow.
struct ResampleBuffers {
  std::vector<float> columns;  // one row after the vertical pass, RGB, then zeroed slack
  RowKernelPlan plan;
  std::vector<float> rows;    // planar rows, for ResampleRgb
  std::vector<float> pixels;  // one output row, RGBX, for ResampleRgb
  size_t bytes() const;
};

/// The vertical pass of one output row: out[i] = sum_k w[k] * rows[k][i]
/// for i < n, where row k starts `stride` bytes after row k - 1.
void ResampleColumns(const uint8_t* first_row, size_t stride, const float* w, int taps, int n,
                     float* out);

/// Lays out `tx` (mirrored left-right when `mirror`) for ResampleRow, sizes
/// buffers->columns for it and zeroes its slack. Returns the column row.
float* PrepareResample(const ResampleTaps& tx, bool mirror, ResampleBuffers* buffers);

/// The horizontal pass of one output row: `columns` holds RGB floats of
/// inputs [tx.first, tx.end) followed by zeroed slack (PrepareResample);
/// writes plan.out_size values of each channel, mapped by `affine`, to `out`.
void ResampleRow(const float* columns, const RowKernelPlan& plan, const ChannelAffine& affine,
                 PlanarRow out);

/// ResampleRow without SIMD, which it uses where the CPU lacks AVX2. Both do
/// the same float operations in the same order (a product per tap, summed
/// left to right, clamped, then a multiply and an add), so they give the same bits:
/// the output does not depend on the machine's vector width.
void ResampleRowPortable(const float* columns, const RowKernelPlan& plan,
                         const ChannelAffine& affine, PlanarRow out);

/// Resamples `src` (RGB) to ty.out_size rows by tx.out_size columns, mirrored
/// left-right when `mirror`: for each output row y in order, writes the row,
/// mapped by `affine`, to `row_for(y)` (a PlanarRow), then calls `done(y)`.
/// Vertical pass first (over contiguous bytes, vectorised), then horizontal
/// (two pixels per AVX2 vector, transposed into the planar rows).
/// REQUIRES: src covers [tx.first, tx.end) x [ty.first, ty.end).
template <typename RowFor, typename Done>
void ResamplePlanar(const DecodedRegion& src, const ResampleTaps& tx, const ResampleTaps& ty,
                    bool mirror, const ChannelAffine& affine, ResampleBuffers& buffers,
                    RowFor&& row_for, Done&& done) {
  float* columns = PrepareResample(tx, mirror, &buffers);
  const int n = (tx.end - tx.first) * 3;
  const uint8_t* origin = src.pixels + static_cast<size_t>(tx.first - src.x0) * 3;
  for (int y = 0; y < ty.out_size; ++y) {
    ResampleColumns(origin + static_cast<size_t>(ty.start[y] - src.y0) * src.stride, src.stride,
                    ty.weights.data() + static_cast<size_t>(y) * ty.max_taps, ty.count[y], n,
                    columns);
    ResampleRow(columns, buffers.plan, affine, row_for(y));
    done(y);
  }
}

/// ResamplePlanar without a mapping, handing over each row interleaved:
/// calls `emit(y, rgbx)` once per output row, in order, where `rgbx` holds
/// tx.out_size pixels of 4 floats (R, G, B and 0) with values in [0, 255].
template <typename Emit>
void ResampleRgb(const DecodedRegion& src, const ResampleTaps& tx, const ResampleTaps& ty,
                 bool mirror, ResampleBuffers& buffers, Emit&& emit) {
  const size_t w = static_cast<size_t>(tx.out_size);
  if (buffers.rows.size() < 3 * w) buffers.rows.resize(3 * w);
  if (buffers.pixels.size() < 4 * w) buffers.pixels.resize(4 * w);
  const PlanarRow row{{buffers.rows.data(), buffers.rows.data() + w, buffers.rows.data() + 2 * w}};
  float* px = buffers.pixels.data();
  ResamplePlanar(
      src, tx, ty, mirror, ChannelAffine{}, buffers, [&](int) { return row; },
      [&](int y) {
        for (size_t x = 0; x < w; ++x) {
          px[4 * x] = row.c[0][x];
          px[4 * x + 1] = row.c[1][x];
          px[4 * x + 2] = row.c[2][x];
          px[4 * x + 3] = 0.0f;
        }
        emit(y, static_cast<const float*>(px));
      });
}

}  // namespace stoker
