#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "stoker/status.h"
#include "stoker/transform.h"

namespace stoker {

/// Which geometry an image transform applies.
enum class ImageMode {
  /// torchvision's RandomResizedCrop(size, scale, ratio) then
  /// RandomHorizontalFlip(flip_probability): for training.
  kTrain,
  /// torchvision's Resize(resize_shorter), or Resize((resize_height,
  /// resize_width)), then CenterCrop(size): for evaluation.
  kEval,
};

/// How an image transform lays out its output sample.
enum class ImageLayout {
  /// float32 {3, height, width}, each channel (v / 255 - mean) / std, like
  /// torchvision's ToTensor + Normalize.
  kFloat32CHW,
  /// uint8 {height, width, 3}, RGB interleaved.
  kUInt8HWC,
  /// uint8 {3, height, width}, planar RGB.
  kUInt8CHW,
};

/// The resampling filter of an image transform's resize, as Pillow's (which
/// torchvision uses on PIL images), always antialiased: the filter is widened
/// by the downscale factor when shrinking.
enum class ImageInterpolation {
  /// Pillow's BILINEAR: a triangle of radius 1 input pixel.
  kBilinear,
  /// Pillow's BICUBIC: cubic convolution with a = -0.5, radius 2, in
  /// Pillow's order (horizontal pass in its fixed point, rounded and clamped
  /// to bytes, then vertical), outputs clamped to [0, 255] before
  /// normalisation: its negative lobes overshoot at hard edges.
  kBicubic,
};

/// The largest side, in pixels, of an image transform's output and resize.
inline constexpr int kMaxTransformSide = 65535;

/// What an image transform does. The defaults are the usual ImageNet
/// training pipeline at 224x224.
struct ImageTransformOptions {
  ImageMode mode = ImageMode::kTrain;
  /// Output size in pixels.
  int height = 224;
  int width = 224;

  /// kTrain: the crop's area as a fraction of the image's, drawn uniformly
  /// from [scale_min, scale_max]; its aspect ratio w/h drawn log-uniformly
  /// from [ratio_min, ratio_max].
  double scale_min = 0.08;
  double scale_max = 1.0;
  double ratio_min = 3.0 / 4.0;
  double ratio_max = 4.0 / 3.0;
  /// kTrain: probability of a horizontal flip.
  double flip_probability = 0.5;
  /// kTrain: the flip comes before the crop (torchvision's
  /// Compose([RandomHorizontalFlip, RandomResizedCrop])): the box is drawn as
  /// on the flipped image, so a flipped sample's box is mirrored. Random
  /// boxes keep their distribution; the centre fallback lands where
  /// torchvision's does when the image is an odd number of pixels wider.
  bool flip_before_crop = false;

  /// kEval: the shorter side is resized to this, then the centre
  /// height x width is cut out. REQUIRES: >= max(height, width).
  int resize_shorter = 256;
  /// kEval: when both are > 0, the image is resized to exactly
  /// resize_height x resize_width (torchvision's Resize((h, w))) instead of
  /// by its shorter side, then the centre height x width is cut out (the
  /// whole of it when they are equal). REQUIRES: each >= its output side.
  int resize_height = 0;
  int resize_width = 0;

  /// The filter of the resize (RandomResizedCrop's or Resize's).
  ImageInterpolation interpolation = ImageInterpolation::kBilinear;

  ImageLayout layout = ImageLayout::kFloat32CHW;
  /// kFloat32CHW: per-channel mean and standard deviation, RGB order.
  std::array<float, 3> mean = {0.485f, 0.456f, 0.406f};
  std::array<float, 3> std = {0.229f, 0.224f, 0.225f};

  /// Images with more pixels than this (read from the header, before any
  /// pixel is decoded) are refused: a guard against decompression bombs.
  /// The default is Pillow's MAX_IMAGE_PIXELS.
  int64_t max_pixels = 89'478'485;

  /// Lets JPEG decoding use libjpeg's DCT scaling (1/2, 1/4, 1/8) when the
  /// scaled crop still has at least the output's size. Faster on large
  /// images, but not torchvision's pixels: up to 42/255 off on the built-in
  /// data's eval (exact: within 1/255). Off by default for eval and train
  /// (bench/dct_accuracy.py did not show equal accuracy); opt in for speed.
  bool dct_scaling = false;

  /// Decodes a record that is neither JPEG nor PNG (a file named .jpg that
  /// holds a GIF or a WebP, which torchvision's loader reads through PIL) to
  /// 8-bit RGB rows into `rgb`, setting `width` and `height`; the geometry
  /// then applies as to a PNG. Empty: such a record is a DataError.
  std::function<Status(std::span<const std::byte> record, std::vector<uint8_t>* rgb, int* width,
                       int* height)>
      other_decoder;
};

/// Makes the transform that decodes JPEG or PNG records (detected from their
/// first bytes; grayscale, palette, 16-bit, alpha and CMYK/YCCK images become
/// 8-bit RGB) and applies `options` in one fused pass, writing the output
/// sample once into its slot. Decoding reads only what the crop needs: its
/// columns and rows, at the coarsest DCT scale that keeps the detail.
///
/// The transform is immutable and safe for concurrent use; each worker keeps
/// its buffers in the scratch from NewScratch(), so that once warm stoker
/// allocates nothing per sample (libjpeg and libpng still allocate their own
/// per-image state).
///
/// Errors: InvalidArgument naming the option and its value. Apply returns
/// DataError for bytes that are not a whole, valid image (empty, truncated,
/// corrupt), Unsupported for valid kinds libjpeg/libpng refuse (e.g. 12-bit
/// JPEG), ResourceExhausted for images over max_pixels or whose full-size RGB
/// decode (width x height x 3) with the encoded bytes exceeds the scratch's
/// cap() (TransformScratch; both checked from the header, before decoding).
Result<std::shared_ptr<const Transform>> MakeImageTransform(const ImageTransformOptions& options);

}  // namespace stoker
