"""stoker's tar shards as a stream: each shard read in member order by itself,
with no index pass over the set, as a sharded IterableDataset."""

import os

from . import _stoker
from ._shards import ShardedIterable


class TarStream(ShardedIterable):
    """WebDataset-style tar shards read shard by shard: one pattern with
    brace ranges ("shard-{000..003}.tar") or a list of paths/patterns, as
    ``stoker.TarShards`` takes them, with the same samples, keys and labels.

    ``shards()`` is the expanded paths in order; ``iter_shard(path)`` opens
    that shard alone and yields its samples as ``(image_bytes, label)``, or
    ``transform(image_bytes, label)`` when ``transform`` is given (say, a PIL
    decode and torchvision transforms); ``iter_shard(path, start=k)`` from
    sample k on (the earlier ones untransformed), where stoker continues a
    shard whose worker left. Constructing opens no file: a
    missing or broken shard is an error of its ``iter_shard``, naming it.
    Pickles as its patterns and transform, for workers in other processes.
    """

    def __init__(self, shards, transform=None):
        if isinstance(shards, (str, bytes, os.PathLike)):
            shards = [shards]
        self.patterns = [os.fspath(s) for s in shards]
        self.transform = transform
        self._paths = None
        self.shards()  # a pattern the brace rules refuse is an error here

    def shards(self):
        if self._paths is None:  # expanded again after unpickling: patterns travel, not paths
            self._paths = [os.fsdecode(p) for p in
                           _stoker.expand_shards([os.fsencode(p) for p in self.patterns])]
        return list(self._paths)

    def iter_shard(self, shard, start=0):
        """From sample `start` on: the earlier ones are read, not transformed."""
        transform = self.transform
        for k, (_, image, label) in enumerate(_stoker.TarShardReader(os.fsencode(shard))):
            if k < start:  # keys left as bytes
                continue
            yield (image, label) if transform is None else transform(image, label)

    def _iter_shard_marked(self, shard, start=0):
        """iter_shard as stoker.DataLoader reads it: a sample that cannot be
        read (no label, no image stoker decodes) is a _shards.Failed in its
        place, every one from the shard's start, and the shard goes on, as
        TarShards fails that sample alone (a transform that raises on it
        too); an error of the archive itself (cut, a bad header) ends it.
        `start` counts good samples (transformed: the transform may fail one)."""
        from ._shards import Failed
        reader = _stoker.TarShardReader(os.fsencode(shard))
        transform, good = self.transform, 0
        while True:
            try:
                _, image, label = next(reader)
            except StopIteration:
                return
            except _stoker.DataError as e:
                if reader.broken():
                    raise
                yield Failed(e)
                continue
            sample = image, label
            if transform is not None:
                try:
                    sample = transform(image, label)
                except Exception as e:  # noqa: BLE001 -- the sample's, as PIL's on a bad JPEG
                    yield Failed(e)
                    continue
            good += 1
            if good > start:
                yield sample

    def records(self, shard):
        """Shard ``shard``'s raw samples in order, untransformed:
        ``(key, image_bytes, label)``, the key "shard.tar:member"."""
        for key, image, label in _stoker.TarShardReader(os.fsencode(shard)):
            yield os.fsdecode(key), image, label

    def __getstate__(self):
        return dict(self.__dict__, _paths=None)

    def __repr__(self):
        shown = self.patterns[0] if len(self.patterns) == 1 else self.patterns
        return f"stoker.TarStream({shown!r}" + \
            ("" if self.transform is None else f", transform={self.transform!r}") + ")"
