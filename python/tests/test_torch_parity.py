"""stoker.DataLoader beside torch's own DataLoader, run for real on the same
arguments: the same batches (torch's samplers, run as torch runs them, after
the same draws), the same attributes and refusals, checkpoints that resume in
a new process with no seed of the user's."""

import copy
import functools
import itertools
import json
import os
import pickle
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import stoker  # noqa: E402
from test_dataloader import drain  # noqa: E402
from torch.utils.data import (DataLoader as TorchDataLoader, Dataset,  # noqa: E402
                              DistributedSampler, WeightedRandomSampler, get_worker_info)


class Indexed(Dataset):
    def __init__(self, n=53):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


class WhoRuns(Dataset):
    """Sample i: i, and get_worker_info()'s num_workers (-1: the consumer's thread)."""

    def __len__(self):
        return 48

    def __getitem__(self, i):
        info = get_worker_info()
        return torch.tensor([i, -1 if info is None else info.num_workers])


def batches(loader, epochs=3, set_epoch=False):
    out = []
    for epoch in range(epochs):
        if set_epoch:
            loader.sampler.set_epoch(epoch)
        out.append([b.tolist() for b in loader])
    return out


def both(make, **kwargs):
    """Every epoch's batches from torch's DataLoader and from stoker's, each
    made by `make(cls)` after the same torch.manual_seed."""
    got = []
    for cls in (TorchDataLoader, stoker.DataLoader):
        torch.manual_seed(1234)
        loader = make(cls)
        got.append(batches(loader, **kwargs))
        if cls is stoker.DataLoader:
            loader.close()
    return got


class EagerBatches(torch.utils.data.Sampler):
    """A batch sampler whose __iter__ draws its order when called (builds its
    list, returns iter() of it), as length-grouping samplers do."""

    def __init__(self, n=12, size=3):
        self.n, self.size = n, size

    def __len__(self):
        return self.n // self.size

    def __iter__(self):
        return iter(torch.randperm(self.n).view(-1, self.size).tolist())


class EagerSampler(EagerBatches):
    def __len__(self):
        return self.n

    def __iter__(self):
        return iter(torch.randperm(self.n).tolist())


@pytest.mark.parametrize("workers,persistent", [(0, False), (2, False), (2, True)])
@pytest.mark.parametrize("order", ["batch_sampler", "sampler"])
def test_an_order_drawing_in_its_iter_gives_torchs_batches_and_generator_state(
        workers, persistent, order):
    # torch calls iter() before drawing its base seed and, with workers, again
    # after it; the order it reads is the last one.
    def make(cls):
        given = {"batch_sampler": EagerBatches()} if order == "batch_sampler" else \
            {"sampler": EagerSampler(), "batch_size": None}
        return cls([torch.tensor(i) for i in range(12)], num_workers=workers,
                   persistent_workers=persistent, **given)
    theirs, ours = both(make)
    assert ours == theirs
    for cls in (TorchDataLoader, stoker.DataLoader):  # the global generator after an epoch
        torch.manual_seed(7)
        loader = make(cls)
        list(loader)
        after = torch.rand(1)
        if cls is TorchDataLoader:
            expected = after
        else:
            loader.close()
    assert torch.equal(after, expected)


@pytest.mark.parametrize("taken_at,resumed_at", [(2, 0), (0, 2)])
def test_an_order_drawing_in_its_iter_resumes_at_another_worker_count(taken_at, resumed_at):
    data = [torch.tensor(i) for i in range(12)]

    def epoch(workers, taken=None, state=None):
        torch.manual_seed(3 if state is None else 99)
        with stoker.DataLoader(data, batch_sampler=EagerBatches(), num_workers=workers) as dl:
            if state is not None:
                dl.load_state_dict(state)
            it = iter(dl)
            got = [b.tolist() for b in itertools.islice(it, taken)]
            return got, dl.state_dict()
    whole, _ = epoch(taken_at)
    head, state = epoch(taken_at, taken=2)
    rest, _ = epoch(resumed_at, state=state)
    assert head + rest == whole


@pytest.mark.parametrize("workers,persistent", [(0, False), (2, False), (2, True)])
def test_shuffle_with_a_generator_gives_torchs_batches(workers, persistent):
    def make(cls):
        g = torch.Generator()
        g.manual_seed(99)
        return cls(Indexed(), batch_size=5, shuffle=True, generator=g, num_workers=workers,
                   persistent_workers=persistent)
    theirs, ours = both(make)
    assert ours == theirs


@pytest.mark.parametrize("workers,prefetch,persistent,drop_last,replacement", [
    (0, None, False, False, False), (1, 3, False, True, False), (2, None, True, False, False),
    (0, None, False, False, True)])
def test_an_epoch_left_early_leaves_the_generator_where_torchs_does(workers, prefetch, persistent,
                                                                    drop_last, replacement):
    # torch's RandomSampler draws its trailing permutation (with replacement:
    # 32 keys at a time) only when its iterator asks for the batches they
    # are in; an epoch left by a break leaves the generator where the
    # batches asked for by then (prefetch_factor x num_workers ahead) do.
    def run(cls):
        g = torch.Generator()
        g.manual_seed(5)
        kwargs = dict(batch_size=4, generator=g, num_workers=workers, drop_last=drop_last,
                      persistent_workers=persistent)
        if prefetch is not None:
            kwargs["prefetch_factor"] = prefetch
        if replacement:
            kwargs["sampler"] = torch.utils.data.RandomSampler(
                Indexed(42), replacement=True, num_samples=70, generator=g)
        else:
            kwargs["shuffle"] = True
        loader = cls(Indexed(42), **kwargs)
        seen = []
        for stop in (1, 100, 9, 3, 11, 6):
            got = []
            for i, b in enumerate(loader):
                got.append(b.tolist())
                if i + 1 == stop:
                    break
            seen.append((got, torch.rand(2, generator=g).tolist()))
        if cls is stoker.DataLoader:
            loader.close()
        return seen
    assert run(stoker.DataLoader) == run(TorchDataLoader)


@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_left_early_leaves_a_samplers_own_generator_where_torchs_does(workers):
    # RandomSampler(generator=g) given as the sampler (HF's Trainer's way), the
    # loader without one: g was left one permutation ahead of torch's after a
    # break, and every later epoch differed.
    def run(cls):
        g = torch.Generator().manual_seed(3)
        loader = cls(Indexed(40), batch_size=4, num_workers=workers,
                     sampler=torch.utils.data.RandomSampler(Indexed(40), generator=g))
        seen = []
        for stop in (2, 100, 5):
            got = []
            for i, b in enumerate(loader):
                got.append(b.tolist())
                if i + 1 == stop:
                    break
            seen.append(got)
        if cls is stoker.DataLoader:
            loader.close()
        return seen
    assert run(stoker.DataLoader) == run(TorchDataLoader)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sampler_whose_len_raises_runs_as_torchs_and_lengths_follow_len(workers):
    # torch asks a sampler's len() only for len(loader), and len(iter(loader))
    # is len(loader) even when the sampler gives more or fewer than it says.
    class Unsized(torch.utils.data.Sampler):
        def __iter__(self):
            return iter(range(6))

        def __len__(self):
            raise NotImplementedError

    class Says10Gives25(torch.utils.data.Sampler):
        def __iter__(self):
            return iter(range(25))

        def __len__(self):
            return 10

    for cls in (TorchDataLoader, stoker.DataLoader):
        loader = cls(Indexed(30), batch_size=4, sampler=Unsized(None), num_workers=workers)
        assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5]], cls
        loader = cls(Indexed(30), batch_size=4, sampler=Says10Gives25(None),
                     num_workers=workers)
        it = iter(loader)
        assert (len(loader), len(it)) == (3, 3), cls
        assert sum(len(b) for b in it) == 25
        if cls is stoker.DataLoader:
            loader.close()


def test_prefetch_factor_reads_as_torchs_and_rebuilds_a_torch_loader():
    # It read None: code that rebuilds a DataLoader from the loader's
    # attributes (accelerate's skip_first_batches) failed, and
    # num_workers * prefetch_factor raised a TypeError.
    for workers in (0, 2, "auto"):
        ours = stoker.DataLoader(Indexed(12), batch_size=4, num_workers=workers)
        count = 0 if workers == 0 else 2
        theirs = TorchDataLoader(Indexed(12), batch_size=4, num_workers=count)
        assert ours.prefetch_factor == theirs.prefetch_factor, workers
        rebuilt = TorchDataLoader(Indexed(12), batch_size=ours.batch_size,
                                  num_workers=ours.num_workers,
                                  prefetch_factor=ours.prefetch_factor)
        assert [b.tolist() for b in rebuilt] == [b.tolist() for b in ours]
        ours.close()
    # Reassigned counts: it follows, as torch's reads at each iter().
    ours = stoker.DataLoader(Indexed(12), batch_size=4, num_workers=2, prefetch_factor=3)
    assert ours.prefetch_factor == 3
    ours.num_workers = 0
    assert [len(b) for b in ours] == [4, 4, 4]
    assert ours.prefetch_factor == TorchDataLoader(Indexed(12)).prefetch_factor
    ours.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_shuffle_with_torchs_global_seed_gives_torchs_batches_and_leaves_its_generator(workers):
    after = []
    for cls in (TorchDataLoader, stoker.DataLoader):
        torch.manual_seed(7)
        loader = cls(Indexed(), batch_size=4, shuffle=True, num_workers=workers, drop_last=True)
        order = batches(loader, epochs=2)
        after.append((order, torch.rand(4).tolist()))  # e.g. the next layer's weights
        if cls is stoker.DataLoader:
            loader.close()
    assert after[1] == after[0]


def test_distributed_and_weighted_samplers_give_torchs_batches():
    def distributed(cls):
        sampler = DistributedSampler(Indexed(), num_replicas=3, rank=1, shuffle=True, seed=5)
        return cls(Indexed(), batch_size=4, sampler=sampler, num_workers=2)
    theirs, ours = both(distributed, set_epoch=True)
    assert ours == theirs and ours[0] != ours[1]

    def weighted(cls):
        g = torch.Generator()
        g.manual_seed(3)
        sampler = WeightedRandomSampler([1.0 + i % 4 for i in range(53)], 40, generator=g)
        return cls(Indexed(), batch_size=6, sampler=sampler, num_workers=2)
    theirs, ours = both(weighted)
    assert ours == theirs


def test_making_a_loader_draws_nothing_from_torchs_generator():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    with stoker.DataLoader(Indexed(), batch_size=4, shuffle=True, num_workers=1):
        assert torch.equal(torch.rand(3), expected)


def test_the_loader_is_a_torch_dataloader_with_its_attributes_and_refusals():
    from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler
    with stoker.DataLoader(Indexed(), batch_size=4, shuffle=True, num_workers=1,
                           pin_memory_device="cuda") as dl:
        assert isinstance(dl, TorchDataLoader)
        assert type(dl.sampler) is RandomSampler and type(dl.batch_sampler) is BatchSampler
        assert dl.batch_sampler.sampler is dl.sampler and len(dl) == 14
        assert dl.multiprocessing_context is None and dl.pin_memory_device == "cuda"
        for name, value in (("batch_size", 8), ("sampler", None), ("dataset", Indexed(3))):
            with pytest.raises(ValueError, match=f"{name} attribute should not be set"):
                setattr(dl, name, value)
        with pytest.raises(ValueError, match="multiprocessing_context cannot be changed"):
            dl.multiprocessing_context = "spawn"
        dl.multiprocessing_context = None  # the one it has: nothing changes
    with stoker.DataLoader(Indexed(), batch_size=4, num_workers=1,
                           multiprocessing_context="spawn") as dl:
        dl.multiprocessing_context = torch.multiprocessing.get_context("spawn")
        with pytest.raises(ValueError, match="has 'spawn', given 'fork'"):
            dl.multiprocessing_context = "fork"
        assert len([b for b in dl]) == 14
    with stoker.DataLoader(Indexed(), num_workers=0) as dl:
        assert type(dl.sampler) is SequentialSampler and dl.batch_sampler.batch_size == 1
    # num_workers is an int, as code written for torch reads it (a Lightning-style
    # `if loader.num_workers > 0`): with "auto", the count running now.
    with stoker.DataLoader(Indexed(), batch_size=4) as dl:
        assert sorted(i for b in dl for i in b.tolist()) == list(range(53))
        assert dl.num_workers == dl.stats()["workers"] and dl.num_workers > 0
    assert dl.num_workers == 0  # closed: none run
    with stoker.DataLoader(Indexed(), batch_size=None, num_workers=0) as dl:
        assert dl.batch_sampler is None and list(dl) == list(range(53))


def _tagged(batch):
    return ("tagged", [int(i) for i in batch])


_MARK = ["none"]


def _initialized(worker_id):
    _MARK[0] = f"init {worker_id}"  # in the worker: what its samples then carry


class Marked(Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        return _MARK[0]


@pytest.mark.parametrize("workers", [0, 2])
def test_options_reassigned_between_epochs_are_used_as_torch_uses_them(workers):
    # torch reads collate_fn, generator, worker_init_fn, num_workers... at each
    # iter(); stoker ran on with the values it was made with.
    got = {}
    for cls in (TorchDataLoader, stoker.DataLoader):
        dl = cls(Indexed(12), batch_size=4, shuffle=True, num_workers=workers,
                 generator=torch.Generator().manual_seed(0))
        first = [b.tolist() for b in dl]
        dl.collate_fn = _tagged
        dl.generator = torch.Generator().manual_seed(1)  # base seeds; the sampler keeps its own
        dl.timeout = 30 if workers == 0 else 0  # torch: a timeout needs workers
        dl.num_workers = 2 - workers
        second = list(dl)
        dl.collate_fn = None if cls is stoker.DataLoader else \
            torch.utils.data.default_collate  # stoker: None is the default again
        third = [b.tolist() for b in dl]
        got[cls] = (first, second, third, dl.timeout, dl.num_workers)
        if cls is stoker.DataLoader:
            assert dl.stats()["workers"] == 2 - workers
            dl.close()
    assert got[TorchDataLoader] == got[stoker.DataLoader]
    # worker_init_fn reassigned: the workers of the next epoch run it.
    marks = {}
    for cls in (TorchDataLoader, stoker.DataLoader):
        dl = cls(Marked(), batch_size=4, num_workers=1)
        dl.worker_init_fn = _initialized
        marks[cls] = list(dl)
        if cls is stoker.DataLoader:
            dl.close()
    assert marks[TorchDataLoader] == marks[stoker.DataLoader] == [["init 0"] * 4] * 3
    with stoker.DataLoader(Indexed(12), num_workers=0) as dl:
        dl.timeout = -1
        with pytest.raises(ValueError, match="timeout"):
            iter(dl)
        dl.timeout = 0  # fixed: the loader goes on
        assert len(list(dl)) == 12
    # Reassigned before or after load_state_dict: the resumed epoch runs with them.
    with stoker.DataLoader(Indexed(12), batch_size=4, num_workers=0) as dl:
        it = iter(dl)
        next(it)
        state = dl.state_dict()
        dl.collate_fn = _tagged
        dl.load_state_dict(state)
        dl.num_workers = 2
        assert list(dl) == [("tagged", [4, 5, 6, 7]), ("tagged", [8, 9, 10, 11])]
        assert dl.stats()["workers"] == 2
    # A copy has the options reassigned, read by an iter() or not yet, as torch's copy.
    for cls in (TorchDataLoader, stoker.DataLoader):
        dl = cls(Indexed(4), batch_size=2, num_workers=0)
        dl.collate_fn = _tagged
        for made in (copy.copy(dl), copy.deepcopy(dl), pickle.loads(pickle.dumps(dl))):
            assert list(made)[0] == ("tagged", [0, 1])
            if cls is stoker.DataLoader:
                made.close()
        if cls is stoker.DataLoader:
            dl.close()
    # persistent_workers means nothing at 0 workers: torch runs that epoch in-process.
    with stoker.DataLoader(Indexed(4), batch_size=2, num_workers=2,
                           persistent_workers=True) as dl:
        dl.num_workers = 0
        assert [b.tolist() for b in dl] == [[0, 1], [2, 3]]
        assert dl.stats()["workers"] == 0
        dl.num_workers = 2
        assert [b.tolist() for b in dl] == [[0, 1], [2, 3]]


class _SixFails(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 6:
            raise ValueError("six")
        return i


def test_workers_reassigned_to_none_run_the_epoch_here_whatever_their_options():
    # torch checks persistent_workers, prefetch_factor and the context when
    # made only: with num_workers reassigned to 0 its next epoch runs here.
    def make(cls):
        loader = cls(Indexed(), batch_size=4, num_workers=2, persistent_workers=True,
                     prefetch_factor=3, multiprocessing_context="fork")
        got = [[b.tolist() for b in loader]]
        loader.num_workers = 0
        got.append([b.tolist() for b in loader])
        loader.num_workers = 1  # and back: its options again
        got.append([b.tolist() for b in loader])
        return got, loader
    theirs, _ = make(TorchDataLoader)
    ours, loader = make(stoker.DataLoader)
    with loader:
        assert ours == theirs
        assert loader.stats(gpu=False)["prefetch_batches"] == 3


def test_skipped_records_outlive_a_run_made_anew():
    with stoker.DataLoader(_SixFails(), batch_size=4, num_workers=0, on_error="skip") as dl:
        list(dl)
        dl.collate_fn = _tagged  # reassigned: the next iter() makes a new run
        list(dl)
        assert [(r["epoch"], r["index"]) for r in dl.skipped()] == [(0, 6), (1, 6)]
        assert dl.stats(gpu=False)["samples_skipped"] == 2


@pytest.mark.parametrize("kwargs,error,words", [
    ({"num_workers": 0, "persistent_workers": True}, ValueError, "persistent_workers"),
    ({"num_workers": 1, "multiprocessing_context": "threads"}, ValueError, "valid start method"),
    ({"num_workers": 1, "multiprocessing_context": 3}, TypeError, "context object"),
    ({"num_workers": 0, "multiprocessing_context": "spawn"}, ValueError, "multi-process loading"),
    # torch asserts at iter(); no timeout can stop a batch made on this thread.
    ({"num_workers": 0, "timeout": 1}, ValueError, "timeout=1.0 needs num_workers > 0"),
    ({"pin_memory_device": "mps", "pin_memory": True}, ValueError, "pin_memory_device"),
    # Device strings torch refuses ("Invalid device string") when it pins; stoker took them.
    ({"pin_memory_device": "cuda:abc", "pin_memory": True}, ValueError, "pin_memory_device"),
    ({"pin_memory_device": "cuda:", "pin_memory": True}, ValueError, "pin_memory_device"),
    ({"pin_memory_device": "cuda:-1", "pin_memory": True}, ValueError, "pin_memory_device"),
    ({"pin_memory_device": "cuda:0:1", "pin_memory": True}, ValueError, "pin_memory_device"),
    ({"pin_memory_device": 0}, TypeError, "pin_memory_device"),
    ({"generator": 5}, TypeError, "generator must be a torch.Generator"),
    # torch's BatchSampler: ValueError for any batch_size that is no positive int.
    ({"batch_size": 2.5}, ValueError, "batch_size"),
    ({"batch_size": "8"}, ValueError, "batch_size"),
    ({"batch_size": True}, ValueError, "batch_size"),
    ({"batch_size": 0}, ValueError, "batch_size"),
])
def test_torchs_arguments_are_checked_as_torch_checks_them(kwargs, error, words):
    with pytest.raises(error, match=words):
        stoker.DataLoader(Indexed(), **kwargs)


@pytest.mark.parametrize("device", ["cpu", "mps", "cuda:abc"])
def test_a_pin_memory_device_without_pin_memory_is_unused_as_in_torch(device):
    # A script's pin_memory_device=str(device), pin_memory=device.type == "cuda",
    # run on a CPU: torch warns and loads.
    with pytest.warns(UserWarning, match="pin memory device is set"):
        dl = stoker.DataLoader(Indexed(), batch_size=4, pin_memory_device=device)
    with dl:
        assert [b.tolist() for b in dl] == [list(range(i, min(i + 4, len(Indexed()))))
                                            for i in range(0, len(Indexed()), 4)]


class _BigKeys(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, key):
        return key % 1000


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sampler_key_past_int64_reaches_the_dataset_as_in_torch(workers):
    # A dict-backed data set keyed by 64-bit unsigned ids: torch hands any key over.
    keys = [2**63 + 5, 7, -2**63 - 1, 2**64 - 1]
    with stoker.DataLoader(_BigKeys(), batch_size=2, sampler=keys, num_workers=workers) as dl:
        assert [b.tolist() for b in dl] == [[(2**63 + 5) % 1000, 7],
                                            [(-2**63 - 1) % 1000, (2**64 - 1) % 1000]]


class _Unpicklable:
    def __init__(self, i):
        self.i, self.load = i, (lambda: i)


class _ByKey(Dataset):
    def __len__(self):
        return 3

    def __getitem__(self, key):
        return key.load()


def test_a_sampler_key_that_cannot_be_pickled_is_named():
    keys = [_Unpicklable(i) for i in range(3)]
    with stoker.DataLoader(_ByKey(), batch_size=2, sampler=keys, num_workers=0) as dl:
        with pytest.raises(TypeError, match="the sampler gave a key that cannot be pickled"):
            iter(dl)


def _pids_when(loader, predicate, patience_s=30.0):
    deadline = time.monotonic() + patience_s
    while True:
        pids = loader.stats()["worker_pids"]
        if predicate(pids) or time.monotonic() > deadline:
            return pids
        time.sleep(0.05)


def test_workers_end_with_their_epoch_unless_persistent():
    with stoker.DataLoader(Indexed(), batch_size=4, num_workers=2) as dl:
        assert sorted(i for b in dl for i in b.tolist()) == list(range(53))
        assert _pids_when(dl, lambda p: not p) == []  # released at the epoch's end
        assert sorted(i for b in dl for i in b.tolist()) == list(range(53))  # forked anew
    with stoker.DataLoader(Indexed(), batch_size=4, num_workers=2, persistent_workers=True) as dl:
        list(dl)
        first = _pids_when(dl, lambda p: len(p) == 2)
        list(dl)
        assert len(first) == 2 and sorted(dl.stats()["worker_pids"]) == sorted(first)


def _late_second_worker(worker_id):
    if worker_id == 1:
        time.sleep(1.0)


def test_a_worker_that_ran_no_batch_of_the_epoch_ends_with_it_too():
    # Worker 1 greets after worker 0 made the whole epoch: its first task is
    # the next epoch's, whose list is not there yet; its process must go.
    with stoker.DataLoader(Indexed(), batch_size=4, num_workers=2,
                           worker_init_fn=_late_second_worker) as dl:
        assert sorted(i for b in dl for i in b.tolist()) == list(range(53))
        assert _pids_when(dl, lambda p: not p) == []
        assert sorted(i for b in dl for i in b.tolist()) == list(range(53))


@pytest.mark.parametrize("kind", ["processes", "threads"])
def test_get_worker_info_gives_the_number_of_workers_running(kind):
    with stoker.DataLoader(WhoRuns(), batch_size=4, num_workers=2, worker_kind=kind) as dl:
        seen = {int(n) for b in dl for n in b[:, 1]}
    # Thread workers share this process: torch's worker info is a worker process's.
    assert seen == ({2} if kind == "processes" else {-1})


class SeedsSeen(Dataset):
    """Sample i: the worker's id, get_worker_info().seed, and torch's
    initial_seed() as worker_init_fn saw it (_note_init_seed)."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        info = get_worker_info()
        return torch.tensor([info.id, info.seed, self.init_seed])


def _note_init_seed(worker_id):
    get_worker_info().dataset.init_seed = torch.initial_seed()


@pytest.mark.parametrize("persistent", [False, True])
def test_workers_see_the_epochs_base_seed_as_torchs_do(persistent):
    # Workers start before iter() draws the epoch's base seed (its samples,
    # then, already made ahead of the loop); each still sees base seed + id in
    # get_worker_info() and in worker_init_fn's torch.initial_seed(): the
    # first epoch's for every epoch with persistent workers, each epoch's own
    # without. Which worker runs which batch is the pool's choice.
    seen = {}
    for cls in (TorchDataLoader, stoker.DataLoader):
        torch.manual_seed(5)
        loader = cls(SeedsSeen(), batch_size=2, num_workers=2, worker_init_fn=_note_init_seed,
                     persistent_workers=persistent)
        seen[cls] = [{tuple(row) for b in loader for row in b.tolist()} for _ in range(3)]
        if cls is stoker.DataLoader:
            loader.close()
    for theirs, ours in zip(seen[TorchDataLoader], seen[stoker.DataLoader]):
        assert ours <= theirs, (ours, theirs)
    # One base seed an epoch, the same every epoch only with persistent workers.
    bases = [{seed - wid for wid, seed, _ in epoch} for epoch in seen[stoker.DataLoader]]
    assert all(len(b) == 1 for b in bases) and (bases[0] == bases[2]) == persistent


_RESUME = textwrap.dedent("""
    import json, sys
    import stoker
    sys.path.insert(0, {tests!r})
    from test_torch_parity import Indexed, OwnRandom
    mode, workers, path = sys.argv[1], sys.argv[2], sys.argv[3]
    workers = workers if workers == "auto" else int(workers)
    sampler = OwnRandom(53) if mode.startswith("own") else None
    dl = stoker.DataLoader(Indexed(), batch_size=4, shuffle=sampler is None, sampler=sampler,
                           num_workers=workers)
    it = iter(dl)
    if mode.endswith("take"):
        head = [next(it).tolist() for _ in range(5)]
        state = dl.state_dict()
        rest = [b.tolist() for b in it]
        json.dump({{"state": state, "rest": rest, "head": head}}, open(path, "w"))
    else:
        import torch
        state = json.load(open(path))["state"]
        dl.load_state_dict(state)
        try:
            print(json.dumps([b.tolist() for b in dl]))
        except ValueError as e:
            print(json.dumps(str(e)))
    dl.close()
""")


class OwnRandom(torch.utils.data.Sampler):
    """A sampler whose order comes from Python's generator, not torch's."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        import random
        order = list(range(self.n))
        random.shuffle(order)
        return iter(order)


def _run_script(tmp_path, *args):
    script = tmp_path / "resume.py"
    script.write_text(_RESUME.format(tests=os.path.dirname(__file__)))
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("taken_at,resumed_at", [(0, 2), (2, 0), ("auto", 1)])
def test_a_checkpoint_resumes_in_a_new_process_with_no_seed_given(tmp_path, taken_at, resumed_at):
    path = str(tmp_path / "state.json")
    _run_script(tmp_path, "take", str(taken_at), path)
    taken = json.load(open(path))
    resumed = json.loads(_run_script(tmp_path, "resume", str(resumed_at), path))
    assert resumed == taken["rest"]
    flat = [i for b in taken["head"] + resumed for i in b]
    assert sorted(flat) == list(range(53))


def test_a_sampler_whose_state_cannot_be_restored_is_refused_on_resume(tmp_path):
    path = str(tmp_path / "state.json")
    _run_script(tmp_path, "own-take", "1", path)
    said = json.loads(_run_script(tmp_path, "own-resume", "1", path))
    assert isinstance(said, str) and "other batches than when the state dict was taken" in said
    assert "OwnRandom" in said


def test_spawn_starts_the_zygote_afresh_with_the_dataset_pickled():
    with stoker.DataLoader(Indexed(), batch_size=4, num_workers=2,
                           multiprocessing_context="spawn") as dl:
        assert sorted(i for b in dl for i in b.tolist()) == list(range(53))
        assert dl.multiprocessing_context.get_start_method() == "spawn"


class _Store(Dataset):
    """A map-style dataset read by string keys, with no __len__ (torch's
    Dataset defines none): its sampler says which keys to read."""

    def __getitem__(self, key):
        return int(key[1:]) * 10


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataset_without_len_is_read_by_its_samplers_keys(workers):
    keys = ["k3", "k1", "k5", "k0", "k2"]
    for options in ({"sampler": keys, "batch_size": 2},
                    {"batch_sampler": [keys[:2], keys[2:]]}):
        theirs = [b.tolist() for b in TorchDataLoader(_Store(), **options)]
        with stoker.DataLoader(_Store(), num_workers=workers, **options) as dl:
            ours = [b.tolist() for b in dl]
            it = iter(dl)
            next(it)
            state = dl.state_dict()
        assert ours == theirs
        with stoker.DataLoader(_Store(), num_workers=workers, **options) as dl:
            dl.load_state_dict(state)
            assert [b.tolist() for b in dl] == theirs[1:]
    # Without a sampler torch's own would need its length: refused, saying so.
    with pytest.raises(TypeError, match="__len__ unless a sampler or batch_sampler"):
        stoker.DataLoader(_Store(), batch_size=2)


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_script_without_a_main_guard_is_told_so_under_spawn(tmp_path, method):
    # The zygote runs the main module again, which makes a loader at import
    # and fails there: the loader that started it names the missing guard
    # (it said "the worker fork server is gone: Bad file descriptor").
    script = tmp_path / "unguarded.py"
    script.write_text(textwrap.dedent(f"""
        import stoker
        loader = stoker.DataLoader(list(range(8)), batch_size=4, num_workers=2,
                                   multiprocessing_context={method!r})
        print(sum(len(b) for b in loader))
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: the worker processes' zygote"), done.stderr[-2000:]
    assert f"started by multiprocessing_context {method!r}" in last
    assert 'if __name__ == "__main__":' in last


def test_a_dataset_class_inside_the_main_guard_is_named_under_spawn(tmp_path):
    # The guard is there, but the dataset's class is defined inside it: the
    # zygote runs the main module without the guarded block and cannot load
    # the class. The error blamed a missing guard alone.
    script = tmp_path / "guarded.py"
    script.write_text(textwrap.dedent("""
        import stoker
        if __name__ == "__main__":
            class Inside:
                def __len__(self):
                    return 4

                def __getitem__(self, i):
                    return i

            loader = stoker.DataLoader(Inside(), batch_size=2, num_workers=2,
                                       multiprocessing_context="spawn")
            print(sum(len(b) for b in loader))
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode != 0
    assert "Can't get attribute 'Inside'" in done.stderr  # the zygote's own error, printed
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: the worker processes' zygote"), done.stderr[-2000:]
    assert "the dataset's classes and functions outside it (importable)" in last


def test_a_zygote_whose_loader_closes_while_it_forks_ends_without_a_word(capfd):
    # The loader closes (Ctrl-C, close() while the tuner grows the pool) just
    # after asking for a worker: the zygote's answer finds the socket closed,
    # which is the loader's EXIT, not a traceback on the user's stderr.
    import multiprocessing
    import socket
    from stoker import _workers
    job = _workers._Job(list(range(4)), None, None, None, True)
    fd, pid = _workers.start_zygote(job, multiprocessing.get_context("spawn"))
    ctl = socket.socket(fileno=fd)
    ctl.send(_workers._message(_workers.P.FORK, worker_id=0, num_workers=1))
    ctl.close()
    _workers.end_zygote(pid)
    assert "Traceback" not in capfd.readouterr().err


class Valued(Dataset):
    """Values torch hands over as they are: a structured array, a tensor that
    requires grad, a named tensor, sparse tensors (COO and CSR), an array in
    Fortran order."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        import numpy as np
        record = np.zeros(2, dtype=[("x", "<i4"), ("y", "<f8")])
        record["x"] = i
        dense = torch.eye(3) * i
        return {"record": record, "grad": torch.full((2,), float(i), requires_grad=True),
                "named": torch.zeros(2, 3).refine_names("row", "col") + i,
                "coo": dense.to_sparse(), "csr": dense.to_sparse_csr(),
                "fortran": np.asfortranarray(np.arange(24.0).reshape(2, 3, 4) + i)}


@pytest.mark.parametrize("workers,kind", [(0, "processes"), (2, "processes"), (2, "threads")])
def test_values_come_back_as_the_dataset_gave_them(workers, kind):
    def same(sample):  # torch's default_convert refuses structured arrays
        return sample
    with stoker.DataLoader(Valued(), batch_size=None, num_workers=workers, worker_kind=kind,
                           collate_fn=same) as dl:
        got = list(dl)
    theirs = list(TorchDataLoader(Valued(), batch_size=None, num_workers=0, collate_fn=same))
    assert len(got) == len(theirs) == 6
    for ours, want in zip(got, theirs):
        assert ours["record"].dtype == want["record"].dtype
        assert ours["record"].tolist() == want["record"].tolist()
        assert ours["grad"].requires_grad and torch.equal(ours["grad"].detach(),
                                                          want["grad"].detach())
        assert ours["named"].names == ("row", "col")
        assert ours["fortran"].strides == want["fortran"].strides  # as numpy pickles it
        assert (ours["fortran"] == want["fortran"]).all()
        for layout in ("coo", "csr"):
            assert ours[layout].layout == want[layout].layout
            assert torch.equal(ours[layout].to_dense(), want[layout].to_dense())
    # None kept past its batch (torch.load's list of sparse tensors to check held them).
    assert not getattr(torch._utils, "_sparse_tensors_to_validate", [])


@pytest.mark.parametrize("workers,kind", [(0, "processes"), (2, "processes"), (2, "threads")])
def test_what_collate_fn_returns_is_delivered_even_none_and_empty_batches(workers, kind):
    batches = [[0, 1], [], [2], []]

    def run(cls, **kw):
        loader = cls(Indexed(), batch_sampler=batches, collate_fn=lambda b: (len(b) or None),
                     num_workers=workers, **kw)
        out = list(loader)
        if cls is stoker.DataLoader:
            loader.close()
        return out
    assert run(stoker.DataLoader, worker_kind=kind) == run(TorchDataLoader) == [2, None, 1, None]


class Exiting(Dataset):
    """Sample 3 raises SystemExit (dataset code calling sys.exit by mistake)."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 3:
            raise SystemExit("bye")
        return i


@pytest.mark.parametrize("kind", ["processes", "threads"])
def test_a_base_exception_from_a_sample_names_it_and_keeps_the_rest(kind):
    with stoker.DataLoader(Exiting(), batch_size=4, num_workers=1, worker_kind=kind) as dl:
        got, errors = drain(dl)
    assert sorted(got) == [0, 1, 2, 4, 5, 6, 7]
    assert len(errors) == 1 and "sample 3" in errors[0] and "SystemExit" in errors[0]


class Starved(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 5:
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:75] . DefaultCPUAllocator: "
                               "can't allocate memory: you tried to allocate 1099511627776 bytes")
        return i


def test_an_allocators_refusal_is_never_skipped():
    with stoker.DataLoader(Starved(), batch_size=4, num_workers=1, on_error="skip") as dl:
        got, refused = drain(dl, errors_of=stoker.ResourceError)
        assert len(refused) == 1 and "sample 5" in refused[0] and dl.skipped() == []
    assert sorted(got) == [0, 1, 2, 3, 4, 6, 7]


def test_set_epoch_after_load_state_dict_keeps_the_resume():
    # A resumed loop calls set_epoch before iterating, as every epoch does:
    # the checkpoint's rest must follow, not a fresh epoch's draws.
    torch.manual_seed(5)
    with stoker.DataLoader(Indexed(), batch_size=3, shuffle=True, num_workers=1) as dl:
        it = iter(dl)
        head = [next(it).tolist() for _ in range(2)]
        state = dl.state_dict()
        rest = [b.tolist() for b in it]
    torch.manual_seed(6)  # a new process: the global generator elsewhere
    with stoker.DataLoader(Indexed(), batch_size=3, shuffle=True, num_workers=1) as dl:
        dl.load_state_dict(state)
        dl.set_epoch(0)
        assert [b.tolist() for b in dl] == rest
    assert sorted(i for b in head + rest for i in b) == list(range(53))


# A data set's lengths at successive epochs: it grows, shrinks, by a partial
# batch, and grows again.
_LENGTHS = (40, 50, 30, 31, 41)


def _epochs_over_lengths(cls, lengths, **kwargs):
    """(len(loader), the epoch's batches) for each length, set on the data set
    before that epoch's iter(); shuffled by a generator seeded alike."""
    dataset = Indexed(lengths[0])
    g = torch.Generator()
    g.manual_seed(11)
    loader = cls(dataset, generator=g, **kwargs)
    got = []
    try:
        for n in lengths:
            dataset.n = n
            got.append((len(loader), [b.tolist() for b in loader]))
    finally:
        if cls is stoker.DataLoader:
            loader.close()
    return got


@functools.lru_cache(maxsize=None)
def _torchs_epochs_over_lengths(workers, persistent, shuffle):
    # Torch's order depends on whether its iterator persists, not on who loads.
    return _epochs_over_lengths(TorchDataLoader, _LENGTHS, batch_size=4, shuffle=shuffle,
                                num_workers=workers, persistent_workers=persistent)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("workers,kind,persistent", [
    (0, "processes", False), (2, "processes", False), (2, "processes", True),
    (2, "threads", False), (2, "threads", True), (2, "auto", False)])
def test_a_dataset_that_grows_or_shrinks_between_epochs_gives_torchs_batches(
        workers, kind, persistent, shuffle):
    theirs = _torchs_epochs_over_lengths(min(workers, 1), persistent, shuffle)
    ours = _epochs_over_lengths(stoker.DataLoader, _LENGTHS, batch_size=4, shuffle=shuffle,
                                num_workers=workers, persistent_workers=persistent,
                                worker_kind=kind)
    assert [n for n, _ in theirs] == [10, 13, 8, 8, 11]
    assert ours == theirs


class Curriculum(torch.utils.data.Sampler):
    """A batch sampler whose batches cover the first `size` samples: a
    curriculum that enlarges (or empties) its set between epochs."""

    def __init__(self, size):
        self.size = size

    def __len__(self):
        return (self.size + 2) // 3

    def __iter__(self):
        return (list(range(i, min(i + 3, self.size))) for i in range(0, self.size, 3))


@pytest.mark.parametrize("workers,kind", [(0, "processes"), (2, "processes"), (2, "threads")])
def test_a_batch_sampler_whose_length_changes_gives_its_batches_even_none(workers, kind):
    sizes = (7, 0, 12, 2)
    got = []
    for cls in (TorchDataLoader, stoker.DataLoader):
        sampler = Curriculum(sizes[0])
        extra = {"worker_kind": kind} if cls is stoker.DataLoader else {}
        loader = cls(Indexed(), batch_sampler=sampler, num_workers=workers, **extra)
        epochs = []
        for size in sizes:
            sampler.size = size
            it = iter(loader)
            epochs.append((len(loader), len(it), [b.tolist() for b in it]))
        got.append(epochs)
        if cls is stoker.DataLoader:
            loader.close()
    assert got[1] == got[0]
    assert [n for n, _, _ in got[1]] == [3, 0, 4, 1]


def _checkpoint_in_grown_epoch(workers):
    """A loader made for 40 samples whose data set grew to 50: 3 batches into
    that epoch, its state and the rest."""
    dataset = Indexed(40)
    g = torch.Generator()
    g.manual_seed(4)
    with stoker.DataLoader(dataset, batch_size=4, shuffle=True, generator=g,
                           num_workers=workers) as dl:
        assert sum(len(b) for b in dl) == 40
        dataset.n = 50
        it = iter(dl)
        head = [next(it).tolist() for _ in range(3)]
        state = dl.state_dict()
        rest = [b.tolist() for b in it]
    assert state["batches_per_epoch"] == 13 and state["dataset_len"] == 50
    return head, state, rest


@pytest.mark.parametrize("taken_at,resumed_at", [(0, 2), (2, 0)])
def test_a_checkpoint_in_an_epoch_of_another_length_resumes_it(taken_at, resumed_at):
    head, state, rest = _checkpoint_in_grown_epoch(taken_at)
    dataset = Indexed(40)  # the new loader is made before the data set grows
    with stoker.DataLoader(dataset, batch_size=4, shuffle=True, generator=torch.Generator(),
                           num_workers=resumed_at) as dl:
        dataset.n = 50
        dl.load_state_dict(state)
        it = iter(dl)
        assert len(it) == 13
        assert [b.tolist() for b in it] == rest
    assert sorted(i for b in head + rest for i in b) == list(range(50))


def test_a_checkpoint_resumed_with_the_dataset_at_another_length_is_refused_naming_both():
    _, state, _ = _checkpoint_in_grown_epoch(2)
    with stoker.DataLoader(Indexed(40), batch_size=4, shuffle=True, generator=torch.Generator(),
                           num_workers=2) as dl:
        dl.load_state_dict(state)
        with pytest.raises(ValueError) as e:
            iter(dl)
    said = str(e.value)
    assert "13 batches" in said and "10" in said and "50 samples" in said and "40" in said


@pytest.mark.parametrize("workers", [0, 2])
def test_after_a_refused_resume_the_next_iter_is_a_whole_new_epoch(workers):
    # 50 samples then, 49 now: the same 13 batches, other ones. The refusal
    # names both lengths (before: the sampler, as if it kept state), and the
    # epoch the user then starts holds every sample (before: it began where
    # the refused checkpoint left off, 3 batches short).
    _, state, _ = _checkpoint_in_grown_epoch(2)
    with stoker.DataLoader(Indexed(49), batch_size=4, shuffle=True, generator=torch.Generator(),
                           num_workers=workers) as dl:
        dl.load_state_dict(state)
        with pytest.raises(ValueError) as e:
            iter(dl)
        epochs = [[i for b in dl for i in b.tolist()] for _ in range(2)]
    said = str(e.value)
    assert "50 samples" in said and "49 now" in said and "Sampler" not in said
    assert "checkpoint is dropped" in said
    for epoch in epochs:
        assert sorted(epoch) == list(range(49))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resume_refused_for_a_sampler_not_yet_restored_stays_loaded_for_the_next_iter(workers):
    # A DistributedSampler left at epoch 0 where the checkpoint's was at 2:
    # the refusal tells the user to call its set_epoch(); done, the next
    # iter() gives the rest of epoch 2 (before: the checkpoint was dropped and
    # the whole epoch came again), and the refused try left the loader's
    # generator as the user seeded it (before: the checkpoint's run's).
    from torch.utils.data.distributed import DistributedSampler

    def make(loader_class, seed):
        sampler = DistributedSampler(Indexed(37), num_replicas=2, rank=0, seed=3)
        g = torch.Generator()
        g.manual_seed(seed)
        return loader_class(Indexed(37), batch_size=3, sampler=sampler, generator=g,
                            num_workers=workers), sampler, g

    torch_dl, torch_sampler, _ = make(torch.utils.data.DataLoader, 1)
    torch_sampler.set_epoch(2)
    expected = [b.tolist() for b in torch_dl]
    with make(stoker.DataLoader, 1)[0] as dl:
        dl.sampler.set_epoch(2)
        it = iter(dl)
        head = [next(it).tolist() for _ in range(2)]
        state = dl.state_dict()
    assert head == expected[:2]
    resumed, sampler, g = make(stoker.DataLoader, 7)
    with resumed:
        before = g.get_state().clone()
        resumed.load_state_dict(state)
        with pytest.raises(ValueError) as e:
            iter(resumed)
        assert "set_epoch" in str(e.value) and "stays loaded" in str(e.value)
        assert torch.equal(g.get_state(), before)
        sampler.set_epoch(2)
        assert [b.tolist() for b in resumed] == expected[2:]


def test_a_checkpoint_whose_generator_state_is_damaged_is_refused_naming_the_field():
    # Before: binascii.Error "Incorrect padding" at iter(), naming nothing.
    with stoker.DataLoader(Indexed(20), batch_size=4, shuffle=True, num_workers=0) as dl:
        it = iter(dl)
        next(it)
        state = dl.state_dict()
    for damaged, words in ((state["epoch_start"]["rng"][:-3], "not base64"),
                           ("AAAA", "holds 3 bytes, not a generator's state")):
        bad = copy.deepcopy(state)
        bad["epoch_start"]["rng"] = damaged
        with stoker.DataLoader(Indexed(20), batch_size=4, shuffle=True, num_workers=0) as dl:
            with pytest.raises(ValueError, match=r"epoch_start\['rng'\].*" + words):
                dl.load_state_dict(bad)


def test_a_refusal_names_the_sampler_a_batch_sampler_draws_from():
    from torch.utils.data import BatchSampler, RandomSampler

    def make(seed):
        g = torch.Generator()
        g.manual_seed(seed)
        order = BatchSampler(RandomSampler(Indexed(23), generator=g), 4, False)
        return stoker.DataLoader(Indexed(23), batch_sampler=order, num_workers=0)

    with make(3) as dl:
        it = iter(dl)
        next(it)
        state = dl.state_dict()
    with make(50) as dl:
        dl.load_state_dict(state)
        with pytest.raises(ValueError) as e:
            iter(dl)
    assert "(RandomSampler, BatchSampler)" in str(e.value)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_checkpoint_at_an_epochs_end_resumes_into_a_dataset_grown_since(workers):
    # Uninterrupted: an epoch of 40, a checkpoint, the data set grows, an epoch of 50.
    dataset = Indexed(40)
    g = torch.Generator()
    g.manual_seed(8)
    with stoker.DataLoader(dataset, batch_size=4, shuffle=True, generator=g,
                           num_workers=workers) as dl:
        list(dl)
        state = dl.state_dict()
        dataset.n = 50
        expected = [b.tolist() for b in dl]
    # Resumed elsewhere, with the data set grown: the same next epoch.
    with stoker.DataLoader(Indexed(50), batch_size=4, shuffle=True, generator=torch.Generator(),
                           num_workers=workers) as dl:
        dl.load_state_dict(state)
        assert [b.tolist() for b in dl] == expected
    assert sorted(i for b in expected for i in b) == list(range(50))


@pytest.mark.parametrize("kind", ["processes", "threads"])
def test_batches_made_ahead_from_lists_since_changed_are_not_delivered(kind):
    # Persistent workers over a sequential order are handed the next epoch's
    # lists at the first batch of this one and make its batches ahead; a
    # length changed before the next iter() (5 -> 6: as many batches, the last
    # one longer) must give that epoch's batches as they are then.
    dataset = Indexed(5)
    with stoker.DataLoader(dataset, batch_size=4, num_workers=2, worker_kind=kind,
                           persistent_workers=True) as dl:
        for n in (5, 6, 7, 3, 4):
            dataset.n = n
            assert [b.tolist() for b in dl] == [list(range(i, min(i + 4, n)))
                                                for i in range(0, n, 4)]
            time.sleep(0.3)  # room for the workers to make the next epoch's batches ahead


class _Echo(torch.utils.data.Dataset):
    """Sample `key`: the key as the dataset received it, with its type's name."""

    def __len__(self):
        return 6

    def __getitem__(self, key):
        return f"{type(key).__name__}:{key!r}"


class _Keys(torch.utils.data.Sampler):
    """Keys that are not ints: a tuple, a float, a string, a numpy int, an int."""

    KEYS = [(0, "a"), 1.7, "1", np.int64(3), 4, ("x", (5,))]

    def __init__(self):
        super().__init__(None)

    def __len__(self):
        return len(self.KEYS)

    def __iter__(self):
        return iter(self.KEYS)


@pytest.mark.parametrize("workers, kind", [(0, "processes"), (2, "processes"), (2, "threads")])
@pytest.mark.parametrize("batch_size", [None, 4])
def test_the_samplers_keys_reach_the_dataset_as_they_were_given(workers, kind, batch_size):
    # torch hands the sampler's keys to __getitem__ untouched; so does stoker,
    # with workers too (no int(): 1.7 stays 1.7, "1" stays "1", tuples pass).
    options = dict(batch_size=batch_size, sampler=_Keys())
    want = list(torch.utils.data.DataLoader(_Echo(), **options))
    with stoker.DataLoader(_Echo(), num_workers=workers, worker_kind=kind, **options) as dl:
        assert list(dl) == want == list(dl)


class _RaisesOnStrings(_Echo):
    def __getitem__(self, key):
        if isinstance(key, str):
            raise KeyError(key)
        return super().__getitem__(key)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_failing_samplers_key_is_named_in_the_error(workers):
    with stoker.DataLoader(_RaisesOnStrings(), batch_size=None, sampler=_Keys(),
                           num_workers=workers) as dl:
        got, errors, it = [], [], iter(dl)
        while True:
            try:
                got.append(next(it))
            except StopIteration:
                break
            except KeyError as e:
                errors.append(str(e))
    want = list(torch.utils.data.DataLoader(_Echo(), batch_size=None, sampler=_Keys()))
    assert got == [s for s in want if s != "str:'1'"]
    assert len(errors) == 1 and "key '1'" in errors[0], errors


class _Layouts(torch.utils.data.Dataset):
    """Samples holding one tensor twice, a channels_last image, a transpose,
    a strided view and broadcast views (expand: stride 0)."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        t = torch.arange(24.0) + i
        image = torch.arange(2 * 3 * 4 * 5.0).reshape(2, 3, 4, 5) + i
        return {"a": t, "b": t, "image": image.contiguous(memory_format=torch.channels_last),
                "transposed": t.reshape(4, 6).t(), "every_other": t[::2],
                "expanded": torch.full((1,), float(i)).expand(50_000_000),
                "mask": torch.arange(6.0).reshape(1, 6, 1).expand(3, 6, 6)}


@pytest.mark.parametrize("kind", ["processes", "threads"])
def test_a_samples_tensors_keep_their_identity_and_memory_layout_from_workers(kind):
    # As torch's workers give them (before, from worker processes: `a` and
    # `b` two tensors, the image contiguous NCHW, the transpose contiguous).
    with stoker.DataLoader(_Layouts(), batch_size=None, num_workers=2, worker_kind=kind) as dl:
        got = list(dl)
    want = list(torch.utils.data.DataLoader(_Layouts(), batch_size=None, num_workers=0))
    for g, w in zip(got, want, strict=True):
        for key in w:
            assert torch.equal(g[key], w[key]), key
        assert g["a"] is g["b"]
        assert g["image"].is_contiguous(memory_format=torch.channels_last)
        assert g["transposed"].stride() == w["transposed"].stride()
        # A broadcast view comes as its span of storage, not its 200 MB
        # written out (torch's workers share its 4 bytes).
        for key in ("expanded", "mask"):
            assert g[key].stride() == w[key].stride(), key
        assert g["expanded"].storage().nbytes() == 4
