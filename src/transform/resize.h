#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

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
};

/// Fills `taps` for an antialiased linear resample (Pillow's BILINEAR with
/// its antialiasing: a triangle filter widened by the downscale factor):
/// output i is centred at input position in0 + (i + 0.5) * scale, where
/// pixel p covers [p, p + 1); the filter's radius is max(scale, 1) pixels,
/// and inputs outside [lo, hi) are left out (the weights renormalised).
/// REQUIRES: out_size >= 1, scale > 0, lo < hi.
void ComputeTaps(double in0, double scale, int out_size, int lo, int hi, ResampleTaps* taps);

/// Per-worker buffers of ResampleRgb; they only ever grow.
struct ResampleBuffers {
  std::vector<float> columns;  // one output row after the vertical pass
  std::vector<float> pixels;   // one output row, RGBX
};

/// The vertical pass of one output row: out[i] = sum_k w[k] * rows[k][i]
/// for i < n, where row k starts `stride` bytes after row k - 1.
void ResampleColumns(const uint8_t* first_row, size_t stride, const float* w, int taps, int n,
                     float* out);

/// The horizontal pass of one output row: `in` holds RGB floats of inputs
/// [tx.first, tx.end) followed by zeroed slack of 3 * tx.max_count + 1
/// floats; writes tx.out_size RGBX pixels to `out` (16-byte aligned), output
/// x at position x, or out_size - 1 - x when `mirror`.
void ResamplePixels(const float* in, const ResampleTaps& tx, bool mirror, float* out);

/// Resamples `src` (RGB) to ty.out_size rows by tx.out_size columns, mirrored
/// left-right when `mirror`, and calls `emit(y, rgbx)` once per output row,
/// in order, where `rgbx` holds tx.out_size pixels of 4 floats (R, G, B and
/// an unused fourth) with values in [0, 255]. Vertical pass first (over
/// contiguous bytes, vectorised), then horizontal (one pixel per vector).
/// REQUIRES: src covers [tx.first, tx.end) x [ty.first, ty.end).
template <typename Emit>
void ResampleRgb(const DecodedRegion& src, const ResampleTaps& tx, const ResampleTaps& ty,
                 bool mirror, ResampleBuffers& buffers, Emit&& emit) {
  const int columns = (tx.end - tx.first) * 3;
  const size_t slack = static_cast<size_t>(3 * tx.max_count + 1);
  if (buffers.columns.size() < columns + slack) buffers.columns.resize(columns + slack);
  if (buffers.pixels.size() < static_cast<size_t>(tx.out_size) * 4) {
    buffers.pixels.resize(static_cast<size_t>(tx.out_size) * 4);
  }
  float* acc = buffers.columns.data();
  std::fill(acc + columns, acc + columns + slack, 0.0f);
  const uint8_t* origin = src.pixels + static_cast<size_t>(tx.first - src.x0) * 3;
  for (int y = 0; y < ty.out_size; ++y) {
    ResampleColumns(origin + static_cast<size_t>(ty.start[y] - src.y0) * src.stride, src.stride,
                    ty.weights.data() + static_cast<size_t>(y) * ty.max_taps, ty.count[y], columns,
                    acc);
    ResamplePixels(acc, tx, mirror, buffers.pixels.data());
    emit(y, static_cast<const float*>(buffers.pixels.data()));
  }
}

}  // namespace stoker
