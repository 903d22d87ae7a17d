"""The built-in ImageNet-like JPEG data set."""

import os

from . import _args, _stoker

DEFAULT_IMAGES = 2000
DEFAULT_CLASSES = 10


def make_dataset(output, images=DEFAULT_IMAGES, classes=DEFAULT_CLASSES, seed=0, shards=0,
                 photos="/usr/share/wallpapers"):
    """Writes an ImageNet-like class-per-folder JPEG data set,
    ``output/<class>/<class>_<index>.jpg``, cut from the installed wallpaper
    photographs (Debian's plasma-workspace-wallpapers), image i from
    photograph i % P and in that photograph's class, (i % P) % classes, so
    that the classes can be learned; with ``shards`` > 0
    also as WebDataset tar shards in ``output-shards/``. The same seed gives
    byte-identical files. Returns what it wrote, as a dict."""
    report = _stoker.make_dataset(
        os.fsencode(output), _args.integer("images", images, *_args.INT64),
        _args.integer("classes", classes, *_args.INT32),
        _args.integer("seed", seed, 0, _args.UINT64_MAX),
        _args.integer("shards", shards, *_args.INT32), os.fsencode(photos))
    report["root"] = os.fsdecode(report["root"])
    report["shards"] = [os.fsdecode(s) for s in report["shards"]]
    return report


def default_dataset_path():
    """Where the built-in data set lives: $STOKER_DATA_HOME/imagenet-like, else
    $XDG_CACHE_HOME/stoker/imagenet-like, else ~/.cache/stoker/imagenet-like."""
    return os.fsdecode(_stoker.default_dataset_path())


def default_dataset(quiet=False):
    """The built-in data set's root (2000 JPEGs in 10 classes, about
    0.18 MP each), made on first use (tens of seconds), shared with `stoker demo`."""
    return os.fsdecode(_stoker.ensure_default_dataset(bool(quiet)))
