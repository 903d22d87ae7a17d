"""Sources: where samples come from. Each opens once and is shared, read-only,
by every worker of every loader made from it."""

import hashlib
import os

import numpy

from . import _args, _stoker


def _path_bytes(path):
    # The C++ side takes paths as bytes, so names that are not UTF-8 work.
    return os.fsencode(path)


def _made_at(path):
    """`path` as pickled for a cluster's worker: absolute, so the worker opens
    what this process opened, whatever its own working directory."""
    return os.path.abspath(os.fspath(path))


def expand_braces(pattern):
    """Expands brace ranges, e.g. "shard-{000..003}.tar" -> four names."""
    return [os.fsdecode(p) for p in _stoker.expand_braces(_path_bytes(pattern))]


class Source(_args.Remade):
    """An opened source of samples (the base of ImageFolder, FileList,
    TarShards and Synthetic); pickles as its path and options."""

    _impl = None

    def __len__(self):
        return len(self._impl)

    def key(self, index):
        """The sample's key: its file path, or "shard.tar:member"."""
        return os.fsdecode(self._impl.key(index))

    def read(self, index):
        """The sample's raw record, undecoded: (bytes, label)."""
        return self._impl.read(index)

    @property
    def classes(self):
        """Class names by label (image folders); [] for other sources."""
        return [os.fsdecode(n) for n in self._impl.class_names()]

    def _identity(self):
        """(samples, a digest of their keys and the class names): what a
        cluster's worker that opens this source again by its path must find."""
        digest = hashlib.blake2b(digest_size=16)
        for name in self._impl.class_names():
            digest.update(name + b"\0")
        digest.update(b"\0")
        for i in range(len(self)):
            digest.update(self._impl.key(i) + b"\0")
        return len(self), digest.hexdigest()

    def __repr__(self):
        return f"stoker.{type(self).__name__}({self._describe()}, {len(self)} samples)"

    def _describe(self):
        return ""


class ImageFolder(Source):
    """``root/<class>/**/<image>``: the same samples, order and labels as
    torchvision.datasets.ImageFolder on that tree, with two differences on
    trees it could not walk whole: a folder that cannot be read (its
    permissions, an I/O error) raises an OSError naming it, where torchvision
    leaves its images out without a word; and a folder reached again through
    a symlink loop is listed once, where torchvision follows the loop until
    the path is too long."""

    def __init__(self, root):
        self._adopt(_stoker.open_image_folder(_path_bytes(root)), root)

    def _adopt(self, impl, root):
        self.root = os.fspath(root)
        self._impl = impl
        self._made_with = ((_made_at(root),), {})

    def _describe(self):
        return repr(self.root)


class FileList(Source):
    """A list file of ``path<TAB>label`` lines (relative paths resolve against
    the list's folder)."""

    def __init__(self, list_path):
        self._adopt(_stoker.open_file_list(_path_bytes(list_path)), list_path)

    def _adopt(self, impl, list_path):
        self.list_path = os.fspath(list_path)
        self._impl = impl
        self._made_with = ((_made_at(list_path),), {})

    def _describe(self):
        return repr(self.list_path)


class TarShards(Source):
    """WebDataset-style tar shards: one pattern with brace ranges
    ("shard-{000..003}.tar") or a list of paths/patterns. A sample is an image
    member (.jpg/.jpeg/.png) and a .cls member holding its label."""

    def __init__(self, shards):
        if isinstance(shards, (str, bytes, os.PathLike)):
            shards = [shards]
        self._adopt(_stoker.open_tar_shards([_path_bytes(s) for s in shards]), shards)

    def _adopt(self, impl, shards):
        self.shards = [os.fspath(s) for s in shards]
        self._impl = impl
        self._made_with = (([_made_at(s) for s in shards],), {})

    def stream(self, transform=None):
        """The same shards as a ``stoker.TarStream``: read shard by shard in
        member order, each opened by itself (needs torch)."""
        from ._tar_stream import TarStream
        return TarStream(self.shards, transform)

    def _describe(self):
        return repr(self.shards[0] if len(self.shards) == 1 else self.shards)


class Synthetic(Source):
    """Made-up samples, for tests and benchmarks: sample i is ``shape`` of
    ``dtype`` whose bytes are a pure function of (seed, i); its label is
    ``i % num_classes``. ``cpu_cost_us`` burns CPU per read (like a decode),
    ``read_latency_us`` sleeps (like remote storage), reads of
    ``fail_indices`` fail. Without ``transforms`` a loader passes samples
    through unchanged."""

    def __init__(self, size=1024, shape=(3, 32, 32), dtype="uint8", num_classes=10, seed=0,
                 cpu_cost_us=0.0, read_latency_us=0.0, fail_indices=()):
        int64 = _args.INT64
        self.shape = tuple(_args.integers("shape", shape, *int64))
        self.dtype = numpy.dtype(dtype).name
        self._impl = _stoker.open_synthetic(
            _args.integer("size", size, *int64), list(self.shape), self.dtype,
            _args.integer("num_classes", num_classes, *int64),
            _args.integer("seed", seed, 0, _args.UINT64_MAX),
            _nanoseconds("cpu_cost_us", cpu_cost_us),
            _nanoseconds("read_latency_us", read_latency_us),
            _args.integers("fail_indices", fail_indices, *int64))

    def _identity(self):
        return len(self), None  # made from its arguments alone: nothing on disk to differ

    def _describe(self):
        return f"shape={self.shape}, dtype={self.dtype}"


def _nanoseconds(name, microseconds):
    ns = int(_args.real(name, microseconds, at_least=0) * 1000)
    if ns > _args.INT64[1]:
        raise ValueError(f"{name} must be at most {_args.INT64[1] // 1000}, got {microseconds}")
    return ns


def _open_path(path):
    """The source ``path`` names, as the C++ side decides (stoker's
    OpenDataPath): a folder is an ImageFolder, "*.tar" or a brace pattern
    TarShards, another file a FileList; FileNotFoundError when it is none."""
    impl = _stoker.open_data_path(_path_bytes(path))
    cls = {"image_folder": ImageFolder, "file_list": FileList, "tar_shards": TarShards}[impl.kind]
    made_with = [path] if cls is TarShards else path
    source = cls.__new__(cls, made_with)
    source._adopt(impl, made_with)
    return source
