"""stoker.SharedList: a read-only list whose items forked workers can read
without copying the memory that holds them (copy-on-read, torch issue #13246).

A list of millions of Python objects costs each forked worker a copy of it
over an epoch: reading an object updates its reference count, which writes to
its page, and the kernel copies every page written. SharedList keeps the
items pickled in one buffer plus an array of their offsets, two objects
whatever the count, so reading item i touches item i's bytes and no object
of the list's (docs/dataloader.md, "Copy-on-read").
"""

import array
import collections.abc
import io
import mmap
import operator
import pickle

import numpy as np

_PROTOCOL = 5
_CHUNK = 1 << 20  # pickled bytes gathered in a BytesIO before each move into the buffer
_SMALL = 64 << 10  # packed lists under this are bytes objects, not mappings


class _Buffer:
    """A private anonymous mapping that grows by doubling (mremap: moving
    pages, not copying them) and is cut to its length once written. Its pages
    are written only while it is built, so forked processes share them for
    good."""

    def __init__(self):
        self.map = mmap.mmap(-1, 16 << 20, flags=mmap.MAP_PRIVATE)
        self.length = 0

    def write(self, data):
        end = self.length + len(data)
        if end > len(self.map):
            self.map.resize(max(end, 2 * len(self.map)))
        self.map[self.length:end] = data
        self.length = end

    def finish(self):
        """The bytes written, as a buffer of their exact length: the mapping,
        or under 64 KiB a bytes object (a mapping each would spend the
        process's mappings on small lists)."""
        if self.length < _SMALL:
            small = self.map[:self.length]
            self.map.close()
            return small
        self.map.resize(self.length)
        return self.map


def _pack(items):
    """(buffer, offsets): every item pickled one after another, and the n + 1
    offsets where each starts (the last: where the last one ends).

    No large block is freed on the way (pickles go through one reused 1 MiB
    BytesIO, offsets are kept where they were appended): freed heap would be
    reused after a fork, and every page written then is copied."""
    out = _Buffer()
    chunk = io.BytesIO()
    pickler = pickle.Pickler(chunk, _PROTOCOL)
    dump, forget, tell = pickler.dump, pickler.clear_memo, chunk.tell
    offsets = array.array("q", [0])
    end = offsets.append
    written = 0  # bytes moved from `chunk` into `out` so far
    for i, item in enumerate(items):
        try:
            dump(item)
        except Exception as e:  # noqa: BLE001 -- said with the item's position
            raise pickle.PicklingError(
                f"SharedList: item {i} ({type(item).__name__}) cannot be pickled: "
                f"{type(e).__name__}: {e}") from e
        forget()  # each item's pickle stands alone: no reference to an earlier one's
        pending = tell()
        end(written + pending)
        if pending >= _CHUNK:
            _move(chunk, pending, out)
            written += pending
    _move(chunk, tell(), out)
    return out.finish(), np.frombuffer(offsets, dtype=np.int64)


def _move(chunk, length, out):
    """Writes the first `length` bytes of `chunk` to `out` and rewinds it (its
    buffer kept for the next bytes)."""
    with chunk.getbuffer() as pickled:
        out.write(pickled[:length])
    chunk.seek(0)


class SharedList(collections.abc.Sequence):
    """A read-only sequence of ``items`` (any iterable of picklable objects),
    packed once: each item pickled (protocol 5) into one buffer, with a numpy
    int64 array of where each starts.

    Use it for a dataset's list of many small Python objects (paths, labels,
    dicts of metadata) read by forked workers, stoker's or torch's: a plain
    list's objects are copied into every worker as the workers read them; a
    SharedList's two buffers are never written after packing, so the workers
    share them with the parent for good.

    Each access unpickles the item: a returned item is a fresh object, and
    changing it changes nothing in the list or in any other worker. Indexing
    takes ints (negative from the end) and slices (a new SharedList: a step of
    1 shares this one's buffer, other steps copy the pickled bytes). Pickling
    a SharedList (spawn-based workers) sends the buffer and the offsets, not
    the items.
    """

    __slots__ = ("_data", "_view", "_offsets", "_bounds")

    def __init__(self, items=()):
        data, offsets = _pack(items)
        self._set(data, offsets)

    def _set(self, data, offsets):
        # _view and _bounds are the buffers as memoryviews: slicing one and
        # reading an int from the other create no numpy object per access.
        self._data = data
        self._view = memoryview(data).toreadonly()
        self._offsets = offsets
        self._bounds = memoryview(offsets)

    @classmethod
    def _of(cls, data, offsets):
        shared = cls.__new__(cls)
        shared._set(data, offsets)
        return shared

    @property
    def nbytes(self):
        """Bytes of the items' pickles."""
        return self._bounds[-1] - self._bounds[0]

    def __len__(self):
        return len(self._bounds) - 1

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self._slice(index)
        try:
            i = operator.index(index)
        except TypeError:
            raise TypeError("SharedList indices must be integers or slices, "
                            f"not {type(index).__name__}") from None
        n = len(self._bounds) - 1
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"SharedList index {index} out of range (length {n})")
        return pickle.loads(self._view[self._bounds[i]:self._bounds[i + 1]])

    def __iter__(self):
        view, bounds, loads = self._view, self._bounds, pickle.loads
        for i in range(len(bounds) - 1):
            yield loads(view[bounds[i]:bounds[i + 1]])

    def _slice(self, s):
        start, stop, step = s.indices(len(self))
        if step == 1:
            return SharedList._of(self._data, self._offsets[start:max(start, stop) + 1])
        out = _Buffer()
        offsets = array.array("q", [0])
        for i in range(start, stop, step):
            out.write(self._view[self._bounds[i]:self._bounds[i + 1]])
            offsets.append(out.length)
        return SharedList._of(out.finish(), np.frombuffer(offsets, dtype=np.int64))

    def __reduce_ex__(self, protocol):
        # The pickled bytes in use and offsets from 0; protocol 5 can send the
        # bytes out of band, without a copy.
        first = self._bounds[0]
        used = self._view[first:self._bounds[-1]]
        data = pickle.PickleBuffer(used) if protocol >= 5 else used.tobytes()
        return SharedList._of, (data, self._offsets - first)

    def __repr__(self):
        return f"stoker.SharedList({len(self)} items, {self.nbytes} bytes pickled)"
