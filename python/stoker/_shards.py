"""Sharded streams: an IterableDataset that names its shards (``shards()``) and
reads one (``iter_shard(shard)``) is split by stoker itself, a shard to an
engine item. Workers claim shards as they go, so the pool resizes at any
moment; the epoch's order is a permutation of the rank's shards drawn as
torch's RandomSampler draws it; a shard's samples are batched in the worker
that read it (its last batch may be short, as each of torch's workers' last
one is); a checkpoint is the shards delivered plus the batches taken from the
open one."""

import inspect
import os
import random
import struct
import threading

import torch.utils.data

from . import _args


class ShardedIterable(torch.utils.data.IterableDataset):
    """A stream read shard by shard. Subclasses give ``shards()`` (a list of
    picklable shard names, the same in every process) and ``iter_shard(shard)``
    (that shard's samples, in order, the same at each call).

    ``stoker.DataLoader`` splits it by shard itself and resizes its workers
    live; under torch's DataLoader, ``__iter__`` splits the rank's shards by
    ``get_worker_info()`` (worker i reads every num_workers-th shard), so the
    same dataset runs unchanged there. Ranks: ``rank`` and ``world_size``,
    both or neither (default: torch.distributed's process group where one is
    made, else torchrun's RANK and WORLD_SIZE, else 0 and 1), take every
    world_size-th shard from ``rank`` on."""

    rank = None
    world_size = None

    def shards(self):
        raise NotImplementedError(f"{type(self).__name__} must define shards()")

    def iter_shard(self, shard):
        raise NotImplementedError(f"{type(self).__name__} must define iter_shard(shard)")

    def __getstate__(self):
        # A copy sent to a fresh interpreter (torch's workers started by
        # spawn, as they are in mp.spawn's ranks) finds no process group
        # there: the group's rank goes with it, as the copy's own.
        getstate = getattr(super(), "__getstate__", None)  # object's, since Python 3.11
        state = getstate() if getstate is not None else self.__dict__
        if self.rank is None and self.world_size is None and isinstance(state, dict):
            rank, world = _process_group()
            if world is not None:
                state = dict(state, rank=rank, world_size=world)
        return state

    def __iter__(self):
        mine = rank_shards(self)
        info = torch.utils.data.get_worker_info()
        if info is not None:
            mine = mine[info.id::info.num_workers]
        for shard in mine:
            yield from self.iter_shard(shard)


def names_shards(dataset):
    """An IterableDataset with both shards() and iter_shard()."""
    return (isinstance(dataset, torch.utils.data.IterableDataset) and
            callable(getattr(dataset, "shards", None)) and
            callable(getattr(dataset, "iter_shard", None)))


def is_sharded(dataset):
    """Whether stoker splits `dataset` by shard: it names its shards, and no
    __iter__ of its own says what its stream is (overrides_iter)."""
    return names_shards(dataset) and not overrides_iter(dataset)


def overrides_iter(dataset):
    """A stream whose class defines an __iter__ of its own, not
    ShardedIterable's (filtering, mapping its shards' samples; any class
    with shards() and iter_shard() that is no ShardedIterable): torch's
    DataLoader reads that, so stoker does too, as a plain stream, rather
    than its shards."""
    own = getattr(type(dataset), "__iter__", None)
    return own is not ShardedIterable.__iter__ and \
        own is not getattr(torch.utils.data.IterableDataset, "__iter__", None)


def _rank_split(dataset):
    """(rank, world_size): the dataset's own, else torch.distributed's
    process group (as a DistributedSampler reads it: mp.spawn sets no
    RANK), else the launcher's (stoker.shard_from_env: torchrun's, Open
    MPI's), else (0, 1)."""
    world, rank = getattr(dataset, "world_size", None), getattr(dataset, "rank", None)
    if (world is None) != (rank is None):  # as stoker.Loader: one alone names no rank
        given, missing = ("world_size", "rank") if rank is None else ("rank", "world_size")
        raise ValueError(f"{type(dataset).__name__} has a {given} ({getattr(dataset, given)!r}) "
                         f"but no {missing}: give both rank and world_size, or neither (then "
                         "torch.distributed's process group, or torchrun's RANK and WORLD_SIZE, is read)")
    if world is None:
        rank, world = _process_group()
    if world is None:
        from ._loader import shard_from_env
        launched = shard_from_env()
        world, rank = launched["world_size"], launched["rank"]
    world = _args.integer("world_size", world, 1, 1 << 20)
    rank = _args.integer("rank", rank, 0, world - 1)
    return rank, world


def _process_group():
    """(rank, world_size) of torch.distributed's default group where one is
    made, else (None, None)."""
    import torch.distributed as distributed
    if distributed.is_available() and distributed.is_initialized():
        return distributed.get_rank(), distributed.get_world_size()
    return None, None


def rank_shards(dataset):
    """The shards this rank reads, in the order shards() gives them."""
    rank, world = _rank_split(dataset)
    shards = list(dataset.shards())
    return shards[rank::world]


class ShardTable:
    """The rank's shards as a sequence: what the loader's sampler orders (its
    length is the epoch's item count; an item is a shard's position here)."""

    def __init__(self, dataset):
        self._dataset = dataset
        self.names = self._read()

    def _read(self):
        names = rank_shards(self._dataset)
        if not names:
            rank, world = _rank_split(self._dataset)
            raise ValueError(f"rank {rank} of {world} has no shard: "
                             f"{type(self._dataset).__name__}.shards() gave "
                             f"{len(list(self._dataset.shards()))}")
        return names

    def digest(self):
        """The rank's shard names, in order, hashed: what a checkpoint's epoch
        read, checked at its resume. Equal names hash alike in any process
        (a set in any order, a tuple read back from JSON as a list)."""
        import hashlib
        return hashlib.sha256("\n".join(map(_canonical, self.names)).encode(
            "utf-8", "surrogatepass")).hexdigest()[:32]

    def refresh(self):
        """Reads shards() again, as torch's workers do at each epoch: True when
        the rank's shards changed (the table, and the jobs sharing its list,
        then name the new ones)."""
        names = self._read()
        if names == self.names:
            return False
        self.names[:] = names
        return True

    def __len__(self):
        return len(self.names)

    def __getitem__(self, position):
        return self.names[position]


def _canonical(name):
    """A shard name as text that equal names share."""
    if isinstance(name, (list, tuple)):
        return "(" + ",".join(map(_canonical, name)) + ")"
    if isinstance(name, (set, frozenset)):
        return "{" + ",".join(sorted(map(_canonical, name))) + "}"
    if isinstance(name, dict):
        return "{" + ",".join(sorted(f"{_canonical(k)}:{_canonical(v)}"
                                     for k, v in name.items())) + "}"
    if isinstance(name, os.PathLike):
        return repr(os.fspath(name))
    if isinstance(name, float) and name.is_integer():  # 1 and 1.0 alike
        return repr(int(name))
    return repr(name)


class ShardJob:
    """What a worker needs to turn a shard position into its batches: the
    dataset, the rank's shard names, the batching options."""

    def __init__(self, dataset, table, batch_size, drop_last, shuffle_buffer, unbatched):
        self.dataset = dataset
        self.table = table
        self.names = table.names
        self.batch_size = batch_size  # None: samples one by one (torch's batch_size=None)
        self.drop_last = drop_last
        self.shuffle_buffer = shuffle_buffer
        self.unbatched = unbatched
        self.opens_at = opens_at(dataset)  # iter_shard(shard, start=...)


class Batches(list):
    """A shard's batches, as one engine item carries them; the consumer hands
    them out one by one."""


class FailedBatch:
    """In place of a shard's batch whose collate_fn raised: the batch keeps
    its number in the shard (handed out, it counts as taken, so a resume
    skips its samples), and the consumer raises its error there, the
    shard's other batches delivered. `position`: the shard's among the
    rank's; `reason` and `trace` say what failed; `error`, the exception,
    leaves the process pickled as (type, exception) (`pickled`,
    _workers._pickled_exception's)."""

    __slots__ = ("position", "reason", "trace", "error", "pickled")

    def __init__(self, position, reason, trace, error, pickled):
        self.position, self.reason, self.trace = position, reason, trace
        self.error, self.pickled = error, pickled

    def __reduce__(self):
        return FailedBatch, (self.position, self.reason, self.trace, None, self.pickled)


class PartRefs(list):
    """A shard's batches as a worker process's item lists them: each part's
    (meta offset, meta length) in the segment, as PART announced it
    (_workers.read_batch reads them back as Batches)."""


def samples_in(parts, batch_size):
    """The samples a shard's first `parts` batches hold: all but its last are full."""
    return parts * (batch_size or 1)


class Resume:
    """Where a shard continues in its segment after its worker left the pool
    (YIELDED) or its process died: the metas of the parts made (PartRefs),
    whose samples the worker that continues it does not batch again. In the
    segment as a shard's resume (worker_protocol.h): int64 words, the parts
    made, then each one's meta offset and length."""

    def __init__(self, refs):
        self.refs = list(refs)

    def samples(self, batch_size):
        return samples_in(len(self.refs), batch_size)

    def pack(self):
        return struct.pack(f"={1 + 2 * len(self.refs)}q", len(self.refs),
                           *(word for ref in self.refs for word in ref))

    @classmethod
    def unpack(cls, data):
        (parts,) = struct.unpack_from("=q", data)
        words = struct.unpack_from(f"={2 * parts}q", data, 8)
        return cls(zip(words[0::2], words[1::2]))


class Yield(Exception):
    """A worker thread's shard stops at a part: its engine thread leaves."""


# run_batch's info for a shard that stopped at a part: ThreadWorkers reads
# a str there as that.
YIELDED = "yielded"


class Parts:
    """The batches of shards being read on worker threads, by (epoch, item),
    each as it is made: the consumer may take those of the shard it waits
    for before the shard ends (worker processes publish theirs in their
    segments instead, ProcessWorkers::Publish)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._items = {}
        self.handed_over = 0  # shards whose worker thread left mid-way (Yield)

    def publish(self, key, part, batch):
        with self._lock:
            made = self._items.setdefault(key, [])
            if part == len(made):
                made.append(batch)

    def made(self, key):
        """The batches of `key` made so far (those of a shard whose worker left)."""
        with self._lock:
            return list(self._items.get(key, ()))

    def take(self, key, part):
        """Batch `part` of `key`, as (batch,), or None while it is not made."""
        with self._lock:
            made = self._items.get(key, ())
            return (made[part],) if part < len(made) else None

    def end(self, key):
        """The shard's run ended: its batches are in its item now, or lost with it."""
        with self._lock:
            self._items.pop(key, None)


def _buffered(samples, size, rng):
    """`samples` through a shuffle buffer of `size` (0: as they come)."""
    if size <= 1:
        yield from samples
        return
    buffer = []
    for sample in samples:
        if len(buffer) < size:
            buffer.append(sample)
            continue
        j = rng.randrange(size)
        buffer[j], sample = sample, buffer[j]
        yield sample
    rng.shuffle(buffer)
    yield from buffer


def read(shard_job, position, seed, at, collate, consumer=False, made=None, start=0,
         first_part=0):
    """Shard `position`'s batches: (Batches, samples read, failures).
    `at(k)` is told before sample k (-1: done); `collate(samples)` makes a
    batch (a FailedBatch where collate_fn raised: it keeps its place);
    `made(k, batch, last)`, if given, is told each batch as it is made (the
    consumer may hand it out before the shard's end; `last`: no batch
    follows). A shard that raises keeps what it gave before: its
    failure is (offset, the exception, True), the samples read until then
    batched. A dataset with ``_iter_shard_marked`` (stoker's TarStream) is
    read through it: a bad sample is (offset, its error, False), and the
    shard goes on; all of them, from the shard's start, come with the run
    that ends the shard (a continued one's too: what a reader that left
    had seen went with it).
    On the `consumer`'s thread (num_workers=0) Ctrl-C and SystemExit
    propagate. A continued shard (Resume) skips the `start` samples its
    first `first_part` batches hold: iter_shard(shard, start=...) opens it
    there when it takes `start` and no shuffle buffer mixes the order, else
    they are read again and dropped."""
    name = shard_job.names[position]
    rng = random.Random(seed)  # the buffer's own, apart from the user's generators
    batches, chunk, count, failed = Batches(), [], 0, []
    size = shard_job.batch_size or 1
    opened, skip = 0, start
    if start and shard_job.shuffle_buffer <= 1 and shard_job.opens_at:
        opened, skip = start, 0
    dataset = shard_job.dataset
    reader = _marked_reader(dataset) or dataset.iter_shard
    stream = _numbered(lambda: iter(reader(name, **({"start": opened} if opened else {}))),
                       at, failed, consumer, opened)
    made = made or (lambda k, batch, last: None)
    for sample in _buffered(stream, shard_job.shuffle_buffer, rng):
        count += 1
        if skip:
            skip -= 1
            continue
        chunk.append(sample)
        if len(chunk) == size:
            batches.append(collate(chunk))
            made(first_part + len(batches) - 1, batches[-1], False)
            chunk = []
    if chunk and not shard_job.drop_last:
        batches.append(collate(chunk))
        made(first_part + len(batches) - 1, batches[-1], True)
    at(-1)
    return batches, opened + count, failed


def opens_at(dataset):
    """Whether the dataset's iter_shard takes `start` (a continued shard
    opens there instead of reading its first samples again)."""
    try:
        return "start" in inspect.signature(dataset.iter_shard).parameters
    except (TypeError, ValueError):
        return False


def _marked_reader(dataset):
    """The dataset's ``_iter_shard_marked``, where its ``iter_shard`` is the
    one that goes with it: a subclass with an iter_shard of its own (a filter,
    a decode) is read through that, as torch reads it."""
    kind = type(dataset)
    owner = next((c for c in kind.__mro__ if "_iter_shard_marked" in c.__dict__), None)
    if owner is None or getattr(kind, "iter_shard", None) is not owner.__dict__.get("iter_shard"):
        return None
    return dataset._iter_shard_marked


class Failed:
    """In place of a sample, from a stream of stoker's that goes on past a
    bad one (TarStream's ``_iter_shard_marked``): its error, reported with
    the shard, which goes on."""

    __slots__ = ("error",)

    def __init__(self, error):
        self.error = error


def _numbered(open_stream, at, failed, consumer, offset=0):
    """The samples of the shard `open_stream()` opens, `at` told each one's
    offset (from `offset`); what opening or reading raises ends them, (the
    offset, the error, True) put in `failed`; a Failed in the stream is
    (offset, its error, False) there, and takes no offset."""
    stream = None
    while True:
        at(offset)
        try:
            if stream is None:
                stream = open_stream()
            sample = next(stream)
            while isinstance(sample, Failed):
                failed.append((offset, sample.error, False))
                sample = next(stream)
        except StopIteration:
            return
        except BaseException as e:  # noqa: BLE001 -- the shard's failure, named by the loader
            if consumer and isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            failed.append((offset, e, True))
            return
        yield sample
        offset += 1


def approximate_len(dataset, batch_size, drop_last):
    """len() of a loader over a sharded stream, as torch's for an
    IterableDataset: from len(dataset), which it must have (TypeError else).
    Each shard's last batch may be short, so the epoch may have more."""
    n = len(dataset)
    if batch_size is None:
        return n
    return n // batch_size if drop_last else -(-n // batch_size)


def reopen(engine, item, epoch, items):
    """The engine state `engine` (a dict) with `item` of `epoch` not yet
    delivered: the shard whose batches were being handed out is run again
    at a resume, which skips those already taken. `items`: the epoch's count."""
    if engine["epoch"] != epoch:  # the epoch's last item: the state had moved on
        delivered = set(range(items))
    else:
        delivered = set(range(engine["position"])) | set(engine.get("beyond", ()))
    delivered.discard(item)
    position = next(i for i in range(items + 1) if i not in delivered)
    return dict(engine, epoch=epoch, position=position,
                beyond=sorted(i for i in delivered if i > position))


def key_of(name):
    """A shard's name as an error's or a skip record's key (a str)."""
    return name if isinstance(name, str) else repr(name)


def name_failure(error, names):
    """A failed shard's error as the user knows it: `shard`, its name, and
    `key`, where the engine's index was the shard's position among the
    rank's shards (its message names the shard already)."""
    error.shard = None if error.index is None else names[error.index]
    if error.shard is not None:
        error.key = key_of(error.shard)


def check_stream_state(stream):
    """A checkpoint's "stream" entry as (item, batches taken), or 0."""
    if stream is None:
        return 0
    if not isinstance(stream, dict):
        raise ValueError("state dict's 'stream' is not a dict")
    item, taken = stream.get("item"), stream.get("batches_taken")
    for field, value in (("item", item), ("batches_taken", taken)):
        _args.integer(f"state['stream'][{field!r}]", value, 0, 2**62)
    return (item, taken)
