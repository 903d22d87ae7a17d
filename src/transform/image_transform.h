#pragma once

#include "stoker/image.h"
#include "stoker/rng.h"

namespace stoker {

/// A rectangle of an image in pixels: columns [x, x + width), rows [y, y + height).
struct CropBox {
  int x = 0;
  int y = 0;
  int width = 0;
  int height = 0;
};

/// The crop torchvision's RandomResizedCrop.get_params picks for a
/// `width` x `height` image: up to 10 tries of an area fraction uniform in
/// [scale_min, scale_max] and an aspect ratio log-uniform in
/// [ratio_min, ratio_max], the first that fits placed uniformly; otherwise
/// the centre crop of the whole image clamped to the ratio range. Draws from
/// `rng` in a fixed order, so the same stream gives the same box.
/// REQUIRES: width, height >= 1; options valid.
CropBox RandomResizedCropBox(int width, int height, const ImageTransformOptions& options,
                             SampleRng& rng);

/// torchvision's Resize(resize_shorter) (or Resize((resize_height,
/// resize_width))) then CenterCrop(height, width) on a
/// `width` x `height` image: the resized size and the crop's top-left corner
/// in the resized image.
struct ResizeCenterCrop {
  int resized_width = 0;
  int resized_height = 0;
  int left = 0;
  int top = 0;
};
ResizeCenterCrop EvalGeometry(int width, int height, const ImageTransformOptions& options);

/// The coarsest JPEG DCT scale 1/denom (denom 8, 4, 2, else 1) at which a
/// source area of `source_width` x `source_height` full-size pixels still
/// has at least `out_width` x `out_height` pixels.
int ChooseDctDenominator(double source_width, double source_height, int out_width, int out_height);

/// Checks `options`; the error names the option and its value.
Status ValidateImageTransformOptions(const ImageTransformOptions& options);

}  // namespace stoker
