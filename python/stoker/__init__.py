"""stoker: a data loader whose worker count tunes itself while training runs.

    import stoker
    loader = stoker.Loader(stoker.ImageFolder("/data/train"), batch_size=64,
                           transforms=stoker.transforms.train(224))
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in loader:   # torch tensors (numpy without torch)
            ...

Workers are threads of the C++ engine: the dataset is opened once and shared,
batches are written in place into recycled aligned buffers and handed to
Python without a copy.
"""

try:
    from . import _stoker  # noqa: F401 -- the C++ extension, built next to this file
except ImportError as e:  # pragma: no cover -- a set-up problem, said plainly
    raise ImportError(
        f"stoker's C++ extension is missing next to {__file__} ({e}). Build it with "
        "`bash scripts/build.sh release`, which also puts build/release/python on Debian "
        "python3's path; the source folder python/stoker cannot be imported by itself."
    ) from e

from . import transforms
from ._bench import bench
from ._dataset import default_dataset, default_dataset_path, make_dataset
from ._loader import Loader, rank_facts, shard_from_env
from ._shared_list import SharedList
from ._sources import FileList, ImageFolder, Source, Synthetic, TarShards, expand_braces
from ._stoker import Cancelled, DataError, ResourceError
from ._stoker import __version__
from ._remote import ClusterError

__all__ = [
    "Cancelled",
    "ClusterError",
    "DataError",
    "DataLoader",
    "FileList",
    "ImageFolder",
    "Loader",
    "ResourceError",
    "SharedList",
    "ShardedIterable",
    "Source",
    "Synthetic",
    "TarShards",
    "TarStream",
    "bench",
    "default_dataset",
    "default_dataset_path",
    "expand_braces",
    "make_dataset",
    "probe",
    "rank_facts",
    "shard_from_env",
    "transforms",
]


def __getattr__(name):
    # stoker.DataLoader, ShardedIterable and TarStream subclass torch's classes: torch is
    # imported when one is first asked for.
    if name == "DataLoader":
        from ._dataloader import DataLoader
        return DataLoader
    if name == "ShardedIterable":
        from ._shards import ShardedIterable
        return ShardedIterable
    if name == "TarStream":
        from ._tar_stream import TarStream
        return TarStream
    raise AttributeError(f"module 'stoker' has no attribute {name!r}")


def probe(data_path=None, gpus=False):
    """The machine facts the tuner starts from (CPU budget, memory, shm, ranks,
    storage of ``data_path``; GPUs through NVML when ``gpus``), as a dict.
    A ``data_path`` that names nothing (a brace pattern none of whose shards
    exists) is a FileNotFoundError naming it."""
    import os

    path = None if data_path is None else os.fsdecode(data_path)
    return _stoker.probe(path, gpus)
