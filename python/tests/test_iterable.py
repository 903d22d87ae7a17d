"""stoker.DataLoader over a plain IterableDataset, side by side with torch's
DataLoader: the same batches, worker info, errors and argument checks, a
worker count chosen per epoch with num_workers="auto", and no worker left
after close()."""

import collections
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

torch = pytest.importorskip("torch")

import stoker  # noqa: E402
from stoker import _iterable  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from test_dataloader import children  # noqa: E402

# torch's advice when a test asks for more workers than this machine has cores.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


class Stream(torch.utils.data.IterableDataset):
    """0..n-1, split among workers by get_worker_info() (worker w takes
    w, w+k, ...), each sample as (index, tensor) or, with `tagged`,
    (index, worker id, worker count)."""

    def __init__(self, n=23, tagged=False, fail_at=None):
        self.n, self.tagged, self.fail_at = n, tagged, fail_at

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        w, k = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(w, self.n, k):
            if i == self.fail_at:
                raise ValueError(f"sample {i} is broken")
            yield (i, w, k) if self.tagged else (i, torch.full((2,), float(i)))


class Sized(Stream):
    def __len__(self):
        return self.n


def plain(batch):
    """A batch as nested lists, for ==."""
    if isinstance(batch, torch.Tensor):
        return batch.tolist()
    if isinstance(batch, (list, tuple)):
        return [plain(b) for b in batch]
    if isinstance(batch, dict):
        return {k: plain(v) for k, v in batch.items()}
    return batch


def epoch(loader):
    return [plain(b) for b in loader]


def samples(batches):
    """An epoch's (index, worker, count) samples as a multiset."""
    return collections.Counter(tuple(s) for b in batches for s in zip(*b))




def pairs(batch):
    return [(i, float(t.sum())) for i, t in batch]


_ARGS = {"batched": {"batch_size": 4}, "unbatched": {"batch_size": None},
         "drop_last": {"batch_size": 5, "drop_last": True},
         "collate_fn": {"batch_size": 3, "collate_fn": pairs}}


@pytest.mark.parametrize("num_workers,args", [
    (n, a) for n in (0, 3) for a in _ARGS] + [(1, "batched")])
def test_batches_are_torchs(num_workers, args):
    args = _ARGS[args]
    ours = stoker.DataLoader(Stream(), num_workers=num_workers, **args)
    theirs = torch.utils.data.DataLoader(Stream(), num_workers=num_workers, **args)
    assert epoch(ours) == epoch(theirs)
    assert ours.stats(gpu=False)["epochs"][0]["workers"] == num_workers
    ours.close()


def test_persistent_workers_are_torchs_over_epochs():
    ours = stoker.DataLoader(Stream(), batch_size=4, num_workers=2, persistent_workers=True)
    theirs = torch.utils.data.DataLoader(Stream(), batch_size=4, num_workers=2,
                                         persistent_workers=True)
    for _ in range(2):
        assert epoch(ours) == epoch(theirs)
    ours.close()


def test_attributes_are_torchs():
    ours = stoker.DataLoader(Stream(), batch_size=4, num_workers=2)
    theirs = torch.utils.data.DataLoader(Stream(), batch_size=4, num_workers=2)
    for name in ("batch_size", "drop_last", "collate_fn", "pin_memory", "timeout",
                 "worker_init_fn", "persistent_workers", "generator", "_dataset_kind"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert type(ours.sampler) is type(theirs.sampler)
    assert type(ours.batch_sampler) is type(theirs.batch_sampler)
    assert ours.num_workers == 2 and ours.dataset is not None
    with pytest.raises(ValueError, match="batch_size"):
        ours.batch_size = 3  # fixed once made, as torch's
    ours.close()


class Info(torch.utils.data.IterableDataset):
    """Yields what get_worker_info() and worker_init_fn told the worker."""

    tag = "info"

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        yield (info.id, info.num_workers, info.seed, info.dataset.tag,
               os.environ.get("STOKER_TEST_INIT"))


def _init(worker_id):
    os.environ["STOKER_TEST_INIT"] = f"init {worker_id}"


class _OwnProcessOnly:
    """Says so on stderr when finalized in a process other than its maker's
    (a torch iterator's __del__ asserts there)."""

    def __init__(self):
        self.pid, self.cycle = os.getpid(), self

    def __del__(self):
        if os.getpid() != self.pid:
            sys.stderr.write("finalized in a forked worker\n")


class _Collecting(torch.utils.data.IterableDataset):
    def __iter__(self):
        import gc
        gc.collect()  # what a worker's own allocations would trigger, some time
        info = torch.utils.data.get_worker_info()
        yield from range(info.id, 6, info.num_workers)


def test_the_programs_garbage_is_not_finalized_in_the_workers(capfd):
    # A torch iterator left in a cycle (its epoch raised) and collected in a
    # worker forked after it prints "can only test a child process".
    import gc
    gc.disable()  # left for the workers, whatever this process allocates first
    try:
        _OwnProcessOnly()
        with stoker.DataLoader(_Collecting(), batch_size=2, num_workers=2) as dl:
            assert sorted(int(i) for b in dl for i in b) == list(range(6))
    finally:
        gc.enable()
    assert "finalized in a forked worker" not in capfd.readouterr().err


def test_worker_info_is_torchs():
    def seen(cls):
        loader = cls(Info(), batch_size=None, num_workers=3, worker_init_fn=_init,
                     generator=torch.Generator().manual_seed(7))
        got = sorted(loader)
        if cls is stoker.DataLoader:
            loader.close()
        return got

    ours = seen(stoker.DataLoader)
    assert ours == seen(torch.utils.data.DataLoader)
    assert [(w, k, tag, init) for w, k, _, tag, init in ours] == \
        [(w, 3, "info", f"init {w}") for w in range(3)]


def test_auto_runs_each_epoch_at_the_count_chosen_for_it(monkeypatch):
    counts = iter([1, 3, 2])

    def decide(state, last, budget):
        assert last.workers >= 1 and 0 <= last.wait_fraction <= 1
        n = next(counts)
        return n, f"test: {n}", state

    monkeypatch.setattr(_iterable, "decide", decide)
    loader = stoker.DataLoader(Stream(tagged=True), batch_size=4, num_workers="auto")
    first = loader.stats(gpu=False)["epochs"]
    assert first == []
    for e in range(4):
        batches = epoch(loader)
        n = loader.stats(gpu=False)["workers"]
        theirs = torch.utils.data.DataLoader(Stream(tagged=True), batch_size=4, num_workers=n)
        assert samples(batches) == samples(epoch(theirs))
        assert {s[2] for b in batches for s in zip(*b)} == {n}
    stats = loader.stats(gpu=False)
    assert [e["workers"] for e in stats["epochs"]][1:] == [1, 3, 2]
    assert [e["reason"] for e in stats["epochs"]][1:] == ["test: 1", "test: 3", "test: 2"]
    assert stats["epochs"][0]["reason"].startswith("first epoch: the CPU budget")
    assert stats["batches_delivered"] == sum(e["batches"] for e in stats["epochs"])
    assert [(d["epoch"], d["workers"]) for d in loader.tuner_trace()] == \
        [(e["epoch"], e["workers"]) for e in stats["epochs"]]
    loader.close()


def test_auto_decides_from_the_epoch_before():
    loader = stoker.DataLoader(Stream(tagged=True), batch_size=4, num_workers="auto",
                               max_workers=2)
    for _ in range(3):
        batches = epoch(loader)
        last = loader.stats(gpu=False)["epochs"][-1]
        assert 1 <= last["workers"] <= 2 and last["reason"]
        assert last["wait_fraction"] is not None and last["samples_per_s"] > 0
        theirs = torch.utils.data.DataLoader(Stream(tagged=True), batch_size=4,
                                             num_workers=last["workers"])
        assert samples(batches) == samples(epoch(theirs))
    assert len(loader.tuner_trace()) == 3
    loader.close()


class Naive(torch.utils.data.IterableDataset):
    """Every sample in each worker: no get_worker_info() in its code."""

    def __iter__(self):
        return iter(range(6))


from torch.utils.data import get_worker_info as _whose  # noqa: E402 (another name)


def _mine():
    """Worker w's (id, count), as a module function that a dataset calls."""
    info = _whose()
    return (0, 1) if info is None else (info.id, info.num_workers)


class ByHelper(torch.utils.data.IterableDataset):
    def __iter__(self):
        w, k = _mine()
        return iter(range(w, 6, k))


class Piped(torch.utils.data.IterableDataset):
    """Splits by a stage it holds (as pipelines such as WebDataset's do)."""

    def __init__(self, stages):
        self.stages = stages

    def __iter__(self):
        samples = iter(range(6))
        for stage in self.stages:
            samples = stage(samples)
        return samples


class _Config:
    num_workers = 8


class SeededWithAConfig(torch.utils.data.IterableDataset):
    """Asks for its seed only; keeps a config's num_workers (for its logs)."""

    def __init__(self, config):
        self.num_workers = config.num_workers

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        rng = random.Random(0 if info is None else info.seed)
        return iter([rng.random() for _ in range(6)])


def _split_stage(samples):
    w, k = _mine()
    return (s for i, s in enumerate(samples) if i % k == w)


def test_which_code_may_split_by_worker():
    assert not _iterable.splits_by_worker(Naive())
    assert _iterable.splits_by_worker(Stream())  # in its own __iter__
    assert _iterable.splits_by_worker(ByHelper())  # in a module function it names
    assert _iterable.splits_by_worker(Piped([_split_stage]))  # in a function it holds
    assert not _iterable.splits_by_worker(Piped([iter]))
    # A chain splits only if each of its streams does.
    chain = torch.utils.data.ChainDataset
    assert _iterable.splits_by_worker(chain([ByHelper(), Stream()]))
    assert not _iterable.splits_by_worker(chain([ByHelper(), Naive()]))
    assert not _iterable.splits_by_worker(Seeded())  # asks for its seed only
    assert not _iterable.splits_by_worker(SeededWithAConfig(_Config()))  # a count read elsewhere
    assert not _iterable.splits_by_worker(Stream(), budget=3)  # undecided: the safe answer


class Seeded(torch.utils.data.IterableDataset):
    """Asks get_worker_info() for its worker's seed only: every sample in each worker."""

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        random.seed(0 if info is None else info.seed)
        return iter(range(6))


def test_auto_keeps_a_stream_that_never_splits_at_one_worker():
    # torch's default (0 workers) yields each sample once; "auto" at the CPU
    # budget yielded each once per worker.
    theirs = sorted(int(x) for x in torch.utils.data.DataLoader(Naive(), batch_size=None))
    with stoker.DataLoader(Naive(), batch_size=None, num_workers="auto") as loader:
        for _ in range(2):
            assert sorted(int(x) for x in loader) == theirs
        epochs = loader.stats(gpu=False)["epochs"]
        assert [e["workers"] for e in epochs] == [1, 1]
        assert "never calls get_worker_info()" in epochs[0]["reason"]
    with stoker.DataLoader(Naive(), batch_size=None, num_workers=2) as loader:  # as asked
        assert sorted(int(x) for x in loader) == sorted(theirs * 2)
        loader.num_workers = "auto"  # reassigned: the same rule
        assert sorted(int(x) for x in loader) == theirs


def _tagged(batch):
    return ("tagged", batch)


def test_options_reassigned_between_epochs_are_used_as_torch_uses_them():
    got = {}
    for cls in (torch.utils.data.DataLoader, stoker.DataLoader):
        dl = cls(Stream(n=6, tagged=True), batch_size=3, num_workers=1)
        first = samples(epoch(dl))
        dl.collate_fn = _tagged
        dl.num_workers = 2
        second = list(dl)
        got[cls] = (first, [(tag, sorted(tuple(s) for s in b)) for tag, b in second])
        if cls is stoker.DataLoader:
            assert dl.stats(gpu=False)["epochs"][-1]["workers"] == 2
            dl.prefetch_factor = 7  # torch's, on the next epoch's torch DataLoader
            list(dl)
            assert dl._stream._inner.prefetch_factor == 7
            for name, value in (("on_error", "skip"), ("worker_kind", "threads")):
                setattr(dl, name, value)  # checked as when given: refused for a plain stream
                with pytest.raises(ValueError, match=f"{name}='{value}' does not apply"):
                    iter(dl)
                setattr(dl, name, "raise" if name == "on_error" else "processes")
            dl.close()
    assert got[torch.utils.data.DataLoader] == got[stoker.DataLoader]


def test_a_streams_workers_reassigned_to_none_run_its_epoch_here_whatever_their_options():
    # torch checks persistent_workers, prefetch_factor and the context when
    # made only: with num_workers reassigned to 0 its next epoch runs here.
    got = {}
    for cls in (torch.utils.data.DataLoader, stoker.DataLoader):
        dl = cls(Stream(n=6), batch_size=3, num_workers=2, persistent_workers=True,
                 prefetch_factor=3, multiprocessing_context="fork")
        first = sorted(int(i) for b in dl for i in b[0])
        dl.num_workers = 0
        got[cls] = (first, sorted(int(i) for b in dl for i in b[0]))
        if cls is stoker.DataLoader:
            dl.close()
    assert got[stoker.DataLoader] == got[torch.utils.data.DataLoader]


class _EveryThird(stoker.ShardedIterable):
    """Shards of 10; its own __iter__ keeps every third sample, times ten."""

    def shards(self):
        return list(range(4))

    def iter_shard(self, shard):
        return iter(range(shard * 10, shard * 10 + 10))

    def __iter__(self):
        for i, sample in enumerate(super().__iter__()):
            if i % 3 == 0:
                yield sample * 10


class _EveryThirdUnsharded(torch.utils.data.IterableDataset):
    """_EveryThird's shards and stream, no ShardedIterable: its __iter__ is
    what torch reads (stoker read its shards, every sample, unmapped)."""

    shards, iter_shard = _EveryThird.shards, _EveryThird.iter_shard

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        mine = self.shards()[info.id::info.num_workers] if info else self.shards()
        for i, sample in enumerate(s for shard in mine for s in self.iter_shard(shard)):
            if i % 3 == 0:
                yield sample * 10


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", [_EveryThird, _EveryThirdUnsharded])
def test_a_sharded_stream_with_an_iter_of_its_own_is_read_through_it_as_torch_reads_it(workers,
                                                                                      kind):
    theirs = sorted(int(x) for b in torch.utils.data.DataLoader(
        kind(), batch_size=2, num_workers=workers) for x in b)
    with stoker.DataLoader(kind(), batch_size=2, num_workers=workers) as dl:
        ours = sorted(int(x) for b in dl for x in b)
        reason = dl.stats(gpu=False)["pipeline_reason"]
    assert ours == theirs and f"{kind.__name__}.__iter__ is its own" in reason


def figures(workers, wait, rate):
    return _iterable.EpochFigures(workers, wait, rate)


def test_decide_steps_up_while_the_consumer_waits_and_holds_when_it_gains_nothing():
    decide, state = _iterable.decide, _iterable.TunerState()
    n, reason, state = decide(state, figures(4, 0.2, 100.0), budget=8)
    assert n == 5 and "trying 5" in reason
    n, reason, state = decide(state, figures(5, 0.1, 130.0), budget=8)  # gained 30 %
    assert n == 6
    n, reason, state = decide(state, figures(6, 0.1, 132.0), budget=8)  # gained 1.5 %
    assert n == 5 and "back to 5, holding" in reason
    n, reason, state = decide(state, figures(5, 0.1, 130.0), budget=8)
    assert n == 5 and "holding" in reason
    n, reason, state = decide(state, figures(5, 0.0, 130.0), budget=8)  # no longer waits
    assert n == 4 and "trying 4" in reason


def test_decide_steps_down_while_the_consumer_does_not_wait_and_back_when_it_does():
    decide, state = _iterable.decide, _iterable.TunerState()
    n, reason, state = decide(state, figures(8, 0.001, 100.0), budget=8)
    assert n == 6 and "trying 6" in reason
    n, reason, state = decide(state, figures(6, 0.002, 100.0), budget=8)
    assert n == 5
    n, reason, state = decide(state, figures(5, 0.3, 70.0), budget=8)
    assert n == 6 and "back to 6, holding" in reason
    n, reason, state = decide(state, figures(6, 0.0, 100.0), budget=8)
    assert n == 6 and "holding" in reason
    n, reason, state = decide(state, figures(6, 0.2, 90.0), budget=8)  # waits again: up
    assert n == 7


def test_decide_stays_between_one_worker_and_the_budget():
    decide, fresh = _iterable.decide, _iterable.TunerState()
    assert decide(fresh, figures(1, 0.0, 10.0), budget=4)[:1] == (1,)
    assert decide(fresh, figures(2, 0.0, 10.0), budget=4)[0] == 1
    assert decide(fresh, figures(4, 0.5, 10.0), budget=4)[0] == 4
    assert "CPU budget" in decide(fresh, figures(4, 0.5, 10.0), budget=4)[1]
    assert decide(fresh, figures(8, 0.5, 10.0), budget=9)[0] == 9
    assert decide(fresh, figures(1, 0.5, 10.0), budget=4)[0] == 2
    for n, wait, rate in [(3, 0.0, 1.0), (1, 0.9, 1.0), (2, 0.005, 3.0), (7, 0.02, 2.0)]:
        workers, reason, _ = decide(fresh, figures(n, wait, rate), budget=7)
        assert 1 <= workers <= 7 and reason


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_worker_error_reaches_the_consumer_as_torchs(num_workers):
    def first_error(cls):
        loader = cls(Stream(fail_at=6), batch_size=2, num_workers=num_workers)
        got = []
        try:
            for b in loader:
                got.append(plain(b))
        except ValueError as e:  # dropped here: torch's iterator then ends with its frame
            return got, str(e)
        finally:
            if cls is stoker.DataLoader:
                loader.close()
        pytest.fail(f"{cls.__module__}'s loader did not raise")

    ours, theirs = first_error(stoker.DataLoader), first_error(torch.utils.data.DataLoader)
    assert ours == theirs
    assert "sample 6 is broken" in ours[1]


class Dies(torch.utils.data.IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        if info.id == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        yield from range(info.id, 40, info.num_workers)


def test_a_worker_that_dies_is_named_as_torch_names_it():
    loader = stoker.DataLoader(Dies(), batch_size=2, num_workers=2)
    # torch's two words for it, whichever of its checks sees the death first
    named = r"DataLoader worker \(pid.* (is killed by signal|exited unexpectedly)"
    with pytest.raises(RuntimeError, match=named):
        for _ in loader:
            pass
    loader.close()


def test_a_second_iter_ends_the_first():
    loader = stoker.DataLoader(Stream(), batch_size=4, num_workers=2)
    first = iter(loader)
    next(first)
    second = iter(loader)
    with pytest.raises(RuntimeError, match="ended by a newer iter"):
        next(first)
    theirs = torch.utils.data.DataLoader(Stream(), batch_size=4, num_workers=2)
    assert [plain(b) for b in second] == epoch(theirs)
    third = iter(loader)
    loader.set_epoch(1)
    with pytest.raises(RuntimeError, match=r"ended by set_epoch\(\)"):
        next(third)
    loader.close()


class Slow(torch.utils.data.IterableDataset):
    def __iter__(self):
        time.sleep(1.5)  # longer than the loader's timeout
        yield 0


def test_timeout_is_torchs():
    def timed_out(cls):
        loader = cls(Slow(), num_workers=1, timeout=0.3)
        try:
            next(iter(loader))
        except RuntimeError as e:  # dropped here: torch's iterator then ends with its frame
            return str(e)
        finally:
            if cls is stoker.DataLoader:
                loader.close()
        pytest.fail(f"{cls.__module__}'s loader did not time out")

    assert timed_out(stoker.DataLoader) == timed_out(torch.utils.data.DataLoader)


def test_state_dict_is_refused_with_where_to_go():
    loader = stoker.DataLoader(Stream(), num_workers=0)
    for call in (loader.state_dict, lambda: loader.load_state_dict({})):
        with pytest.raises(TypeError, match="cannot be checkpointed.*ShardedIterable"):
            call()
    assert loader.skipped() == []
    loader.close()


def test_len_is_torchs():
    for args in ({"batch_size": 4}, {"batch_size": 4, "drop_last": True}, {"batch_size": None}):
        ours = stoker.DataLoader(Sized(), num_workers=0, **args)
        assert len(ours) == len(torch.utils.data.DataLoader(Sized(), **args))
        ours.close()
    with pytest.raises(TypeError):
        len(stoker.DataLoader(Stream(), num_workers=0))


def test_arguments_torch_refuses_are_refused_as_torch_does():
    for args in ({"shuffle": True}, {"sampler": [0, 1]}, {"batch_sampler": [[0]]}):
        with pytest.raises(ValueError) as theirs:
            torch.utils.data.DataLoader(Stream(), **args)
        with pytest.raises(ValueError) as ours:
            stoker.DataLoader(Stream(), **args)
        assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("option", [
    {"cluster": "tcp://nowhere:1"}, {"worker_kind": "threads"}, {"worker_kind": "auto"},
    {"on_error": "skip"}, {"memory_budget_bytes": 1 << 30}, {"trace_path": "/tmp/t.json"},
])
def test_stoker_options_a_stream_cannot_honour_are_named(option):
    (name, value), = option.items()
    with pytest.raises(ValueError, match=f"{name}={value!r} does not apply to a plain"):
        stoker.DataLoader(Stream(), **option)


@pytest.mark.parametrize("persistent", [False, True])
def test_close_leaves_no_worker(persistent):
    before = children()
    loader = stoker.DataLoader(Stream(), batch_size=2, num_workers=2,
                               persistent_workers=persistent)
    it = iter(loader)
    next(it)
    pids = set(loader.stats(gpu=False)["worker_pids"])
    assert len(pids) == 2 and pids <= children()
    loader.close()
    loader.close()  # idempotent
    assert not pids & children() and children() <= before
    # As a map-style or sharded loader says (it said "a loader runs one
    # epoch at a time", which was not the cause).
    with pytest.raises(ValueError, match="^this stoker.DataLoader is closed$"):
        next(it)
    with pytest.raises(ValueError, match="closed"):
        iter(loader)


def test_with_and_collection_close_the_workers():
    before = children()
    with stoker.DataLoader(Stream(), batch_size=2, num_workers=2) as loader:
        next(iter(loader))
    assert children() <= before
    it = iter(stoker.DataLoader(Stream(), batch_size=2, num_workers=2,
                                persistent_workers=True))
    next(it)  # the iterator holds its loader
    assert len(children() - before) == 2
    del it  # the last reference: the iterator, then its loader, end at once
    assert children() <= before


_AT_EXIT = textwrap.dedent(r"""
    import atexit, os, torch

    def check():  # registered before stoker's exit hook, so it runs after it
        alive = [p for p in pids if os.path.exists(f"/proc/{p}")]
        print("closed" if loader._stream._closed else "open", alive)

    atexit.register(check)
    import stoker

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(100))

    loader = stoker.DataLoader(Stream(), batch_size=2, num_workers=2, persistent_workers=True)
    it = iter(loader)
    next(it)
    pids = loader.stats(gpu=False)["worker_pids"]
    assert len(pids) == 2
""")


def test_the_exit_hook_closes_a_stream_left_open():
    run = subprocess.run([sys.executable, "-c", _AT_EXIT], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "closed []", run.stdout + run.stderr[-2000:]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_moves_each_batch():
    loader = stoker.DataLoader(Stream(), batch_size=4, num_workers=2, device="cuda")
    theirs = torch.utils.data.DataLoader(Stream(), batch_size=4, num_workers=2)
    got = list(loader)
    assert all(b[1].device.type == "cuda" for b in got)
    assert [plain(b) for b in got] == epoch(theirs)
    loader.close()


class Stalled(torch.utils.data.IterableDataset):
    """A stream whose first read never ends (a stalled store)."""

    def __iter__(self):
        time.sleep(60)
        yield 0


@pytest.mark.timeout(60)
def test_close_ends_a_next_waiting_on_a_stalled_stream_in_another_thread():
    # Before, the waiting next() polled for ever: torch's iterator, its
    # workers shut under it, sees no failed worker.
    loader = stoker.DataLoader(Stalled(), batch_size=None, num_workers=1)
    outcome = []

    def consume():
        try:
            next(iter(loader))
            outcome.append("a sample")
        except Exception as e:  # noqa: BLE001 -- the test looks at it
            outcome.append(e)

    waiting = threading.Thread(target=consume, daemon=True)
    waiting.start()
    time.sleep(1)
    assert waiting.is_alive() and not outcome
    loader.close()  # torch's join of the stalled worker, then its end
    waiting.join(10)
    assert not waiting.is_alive(), "next() still waits after close()"
    assert isinstance(outcome[0], ValueError) and "is closed" in str(outcome[0]), outcome


def test_persistent_workers_next_epoch_is_not_ended_by_the_one_a_newer_iter_ended():
    # Each epoch wraps torch's persistent iterator anew: the epoch a newer
    # iter() ended, still referenced, does not end the next one's waits.
    loader = stoker.DataLoader(Stream(tagged=True), batch_size=4, num_workers=2,
                               persistent_workers=True)
    first = iter(loader)
    next(first)
    second = iter(loader)  # ends the first
    assert samples(epoch(second)) == samples(epoch(torch.utils.data.DataLoader(
        Stream(tagged=True), batch_size=4, num_workers=2)))
    with pytest.raises(RuntimeError, match="newer iter"):
        next(first)
    loader.close()
