"""Per-sample transforms, run by the C++ workers in one fused pass: decode
(JPEG/PNG, reading only the region the crop needs), crop, resize, flip and
normalise, written once into the batch.

    stoker.transforms.train(224)   # RandomResizedCrop(224) + RandomHorizontalFlip
                                   # + ToTensor + Normalize(ImageNet)
    stoker.transforms.eval(224)    # Resize(256) + CenterCrop(224) + ToTensor + Normalize

Both match torchvision's pipeline of the same name (Pillow's antialiased
bilinear resize); randomness depends only on (seed, epoch, sample index).
"""

import numpy

from . import _args, _stoker

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

_LAYOUTS = ("float32", "uint8_hwc", "uint8_chw")
_INTERPOLATIONS = ("bilinear", "bicubic")


def _size_pair(size, name="size"):
    if not isinstance(size, (str, bytes)) and hasattr(size, "__len__"):
        if len(size) != 2:
            raise ValueError(f"{name} must be an int or (height, width), got {size!r}")
        height, width = _args.integers(name, size, *_args.INT32)
        return height, width
    side = _args.integer(name, size, *_args.INT32)
    return side, side


class Transform(_args.Remade):
    """A configured transform; immutable, may be shared by several loaders;
    pickles as its options."""

    _impl = None

    @property
    def shape(self):
        """Shape of one output sample, e.g. (3, 224, 224)."""
        return self._impl.shape

    @property
    def dtype(self):
        return self._impl.dtype

    def __repr__(self):
        return f"stoker.transforms.{type(self).__name__}({self._impl.description})"


class Image(Transform):
    """Decodes JPEG or PNG (grayscale, palette, alpha, CMYK become RGB) and
    applies one geometry:

    mode="train": RandomResizedCrop(size, scale, ratio), then a horizontal flip
        with probability ``flip`` (``flip_before_crop=True``: the flip first,
        as Compose([RandomHorizontalFlip, RandomResizedCrop]); a flipped
        sample's box is then drawn as on the flipped image).
    mode="eval": Resize(resize) of the shorter side (default size * 256 / 224),
        or to exactly (height, width) when ``resize`` is a pair, or none when
        ``resize=0``, then CenterCrop(size) (all of the resized image when
        they are equal; zeros around it where the crop is larger, as
        torchvision pads).
    ``scale``, ``ratio``, ``flip`` and ``flip_before_crop`` are train's, ``resize``
    eval's: given to the other mode, they are refused (it would ignore them).

    ``layout``: "float32" gives float32 (3, H, W) normalised with ``mean`` and
    ``std`` (ToTensor + Normalize); "uint8_chw" / "uint8_hwc" give raw RGB
    bytes (normalise on the GPU). ``dct_scaling=True`` lets libjpeg decode at
    1/2, 1/4 or 1/8 scale when that still covers the output: faster on large
    images, but no longer torchvision's pixels (up to 42/255 off on the
    built-in data's eval; exact decoding stays within 1/255). Off by default
    for both modes: bench/dct_accuracy.py did not show equal training accuracy.
    Images over ``max_pixels`` fail. ``interpolation``: "bilinear" (Pillow's
    antialiased BILINEAR, torchvision's default) or "bicubic" (Pillow's
    BICUBIC, antialiased, clamped to the byte range). ``decode_other``: a
    function from a record's bytes to its (H, W, 3) uint8 RGB pixels, for
    records that are neither JPEG nor PNG (without one they fail); it runs
    on the engine's threads under the GIL.
    """

    def __init__(self, mode="train", size=224, *, scale=None, ratio=None, flip=None,
                 flip_before_crop=None, resize=None, mean=IMAGENET_MEAN,
                 std=IMAGENET_STD, layout="float32",
                 max_pixels=89_478_485, dct_scaling=False, interpolation="bilinear",
                 decode_other=None):
        if mode not in ("train", "eval"):
            raise ValueError(f"mode must be 'train' or 'eval', got {mode!r}")
        # An option of the other mode's geometry would do nothing: refused.
        other = {"train": {"resize": resize},
                 "eval": {"scale": scale, "ratio": ratio, "flip": flip,
                          "flip_before_crop": flip_before_crop}}[mode]
        for name, value in other.items():
            if value is not None:
                owner = "eval" if mode == "train" else "train"
                raise ValueError(f"{name} is an option of mode={owner!r}"
                                 f" only; mode={mode!r} does nothing with it, got {name}={value!r}")
        scale = (0.08, 1.0) if scale is None else scale
        ratio = (3 / 4, 4 / 3) if ratio is None else ratio
        flip = 0.5 if flip is None else flip
        flip_before_crop = False if flip_before_crop is None else flip_before_crop
        if interpolation not in _INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {_INTERPOLATIONS}, got "
                             f"{interpolation!r}")
        if decode_other is not None and not callable(decode_other):
            raise TypeError(f"decode_other must be a function or None, got {decode_other!r}")
        if layout not in _LAYOUTS:
            raise ValueError(f"layout must be one of {_LAYOUTS}, got {layout!r}")
        height, width = _size_pair(size)
        if resize is None:  # within the largest side, so that a large size is no bad resize
            resize = min(int(max(height, width) * 256 / 224), _stoker.MAX_TRANSFORM_SIDE)
        if not isinstance(resize, (str, bytes)) and hasattr(resize, "__len__"):
            resize_height, resize_width = _size_pair(resize, "resize")
            if min(resize_height, resize_width) < 1:  # (0, 0) would read as no pair at all
                raise ValueError(f"resize must be an int >= 0 or (height, width) of at least 1, "
                                 f"got {resize!r}")
            resize = max(height, width)  # unused: the pair decides
        else:
            resize_height = resize_width = 0
        scale = _args.reals("scale", scale, 2)
        ratio = _args.reals("ratio", ratio, 2)
        self.mode = mode
        self._impl = _stoker.image_transform(
            mode, height, width, scale[0], scale[1], ratio[0], ratio[1], _args.real("flip", flip),
            _args.boolean("flip_before_crop", flip_before_crop),
            _args.integer("resize", resize, *_args.INT32), resize_height, resize_width, layout, _args.reals("mean", mean, 3),
            _args.reals("std", std, 3), _args.integer("max_pixels", max_pixels, *_args.INT64),
            _args.boolean("dct_scaling", dct_scaling), interpolation, decode_other)


def train(size=224, **options):
    """The usual training pipeline: RandomResizedCrop(size) +
    RandomHorizontalFlip + ToTensor + Normalize. See Image for the options."""
    return Image("train", size, **options)


def eval(size=224, **options):  # noqa: A001 -- the name users expect next to train()
    """The usual evaluation pipeline: Resize(size * 256 / 224) +
    CenterCrop(size) + ToTensor + Normalize. See Image for the options."""
    return Image("eval", size, **options)


class Raw(Transform):
    """Copies each record unchanged into a sample of ``shape`` and ``dtype``
    (records must be exactly that many bytes); with ``mix_rng`` XORs in the
    sample's random stream. For synthetic sources."""

    def __init__(self, shape, dtype="uint8", mix_rng=False):
        self._impl = _stoker.raw_transform(_args.integers("shape", shape, *_args.INT64),
                                           numpy.dtype(dtype).name,
                                           _args.boolean("mix_rng", mix_rng))
