"""The built-in ImageNet-like JPEG data set."""

import os

from . import _stoker

# Shared with the CLI (tools/cli/pipeline.cc): the same folder and marker, so
# `stoker demo` and Python make the default data set once between them.
DEFAULT_IMAGES = 2000
DEFAULT_CLASSES = 10
_COMPLETE_MARKER = ".stoker-complete"


def make_dataset(output, images=DEFAULT_IMAGES, classes=DEFAULT_CLASSES, seed=0, shards=0,
                 photos="/usr/share/wallpapers"):
    """Writes an ImageNet-like class-per-folder JPEG data set,
    ``output/<class>/<class>_<index>.jpg``, cut from the installed wallpaper
    photographs (Debian's plasma-workspace-wallpapers); with ``shards`` > 0
    also as WebDataset tar shards in ``output-shards/``. The same seed gives
    byte-identical files. Returns what it wrote, as a dict."""
    report = _stoker.make_dataset(os.fsencode(output), int(images), int(classes), int(seed),
                                  int(shards), os.fsencode(photos))
    report["root"] = os.fsdecode(report["root"])
    report["shards"] = [os.fsdecode(s) for s in report["shards"]]
    return report


def default_dataset_path():
    """Where the built-in data set lives: $STOKER_DATA_HOME/imagenet-like, else
    $XDG_CACHE_HOME/stoker/imagenet-like, else ~/.cache/stoker/imagenet-like."""
    if os.environ.get("STOKER_DATA_HOME"):
        return os.path.join(os.environ["STOKER_DATA_HOME"], "imagenet-like")
    if os.environ.get("XDG_CACHE_HOME"):
        base = os.environ["XDG_CACHE_HOME"]
    elif os.environ.get("HOME"):
        base = os.path.join(os.environ["HOME"], ".cache")
    else:
        base = "/tmp"
    return os.path.join(base, "stoker", "imagenet-like")


def default_dataset(quiet=False):
    """The built-in data set's root (2000 JPEGs in 10 classes, about
    0.18 MP each), made on first use (tens of seconds), as `stoker demo` does."""
    path = default_dataset_path()
    if not os.path.exists(os.path.join(path, _COMPLETE_MARKER)):
        if not quiet:
            print(f"stoker: making the built-in data set ({DEFAULT_IMAGES} images, "
                  f"{DEFAULT_CLASSES} classes) in {path} ...", flush=True)
        report = make_dataset(path)
        with open(os.path.join(path, _COMPLETE_MARKER), "w") as f:
            f.write(f"{report['images']}\n")
    return path
