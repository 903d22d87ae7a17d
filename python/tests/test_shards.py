"""Sharded streams (stoker.ShardedIterable): split by shard on live-resizable
workers, exactly once, the same batches for any worker count, checkpoints
mid-shard, ranks by shard; and the same dataset under torch's DataLoader."""

import collections
import gc
import itertools
import json
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

sys.path.insert(0, os.path.dirname(__file__))
from test_dataloader import alive, run_resume, segments_open  # noqa: E402


class Shards(stoker.ShardedIterable):
    """Shard i holds samples i*1000 .. i*1000+lens[i]-1 (a tensor each, with
    a draw from torch's generator); shard `bad` raises after `bad_after`."""

    def __init__(self, lens=(5, 0, 7, 3, 10, 1, 12, 4), bad=None, bad_after=3, rank=None,
                 world_size=None):
        self.lens, self.bad, self.bad_after = list(lens), bad, bad_after
        self.rank, self.world_size = rank, world_size

    def shards(self):
        return [f"shard-{i:02d}" for i in range(len(self.lens))]

    def iter_shard(self, shard):
        i = int(shard.split("-")[1])
        for k in range(self.lens[i]):
            if i == self.bad and k == self.bad_after:
                raise OSError(f"{shard} is truncated")
            yield torch.tensor([i * 1000 + k]), torch.rand(1)

    def __len__(self):
        return sum(self.lens)

    def every(self, shards=None):
        return sorted(i * 1000 + k for i, n in enumerate(self.lens) for k in range(n)
                      if shards is None or i in shards)


def batches(loader):
    """Each batch's sample ids and draws, as lists."""
    return [(ids.flatten().tolist(), draws.flatten().tolist()) for ids, draws in loader]


def batches_of(it):
    """batches() of an iterator already started."""
    return [(a.flatten().tolist(), b.flatten().tolist()) for a, b in it]


def ids(got):
    return [i for b, _ in got for i in b]


def drain(dl, errors_of=(stoker.DataError,)):
    """The sample ids of an epoch and each error on the way, carrying on after each."""
    got, errors = [], []
    it = iter(dl)
    while True:
        try:
            got += next(it)[0].flatten().tolist()
        except StopIteration:
            return got, errors
        except errors_of as e:
            errors.append(e)


def loader(dataset, workers, **kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("shuffle", True)
    return stoker.DataLoader(dataset, num_workers=workers,
                             generator=torch.Generator().manual_seed(5), **kw)


@pytest.mark.parametrize("workers", [0, 2])
def test_shards_smaller_than_a_batch_are_said_once(workers):
    # 60 shards of 2 samples, batch_size 16: 60 batches of 2 where len() says
    # 8, and no word of why (torch's workers batch across their shards).
    import warnings
    dl = loader(Shards(lens=[2] * 60), workers, batch_size=16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            assert sorted(ids(batches(dl))) == Shards(lens=[2] * 60).every()
    told = [str(w.message) for w in caught if "never spans two shards" in str(w.message)]
    assert told == ["stoker.DataLoader: this epoch gave 60 batches where len(loader) says 8: the "
                    "dataset's shards are small beside batch_size=16, and a batch never spans two "
                    "shards (each shard's last batch is short). Fewer, larger shards, or a smaller "
                    "batch_size, give full batches."]
    dl.close()
    # Shards of a few batches each: no word.
    dl = loader(Shards(lens=[40, 33, 50]), workers, batch_size=16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches(dl)
    assert not [w for w in caught if "never spans" in str(w.message)]
    dl.close()

    # Without len() (TarStream has none) there is nothing to compare with: the
    # epoch ends as always (the first cut of this raised TypeError at its end).
    class Unsized(Shards):
        __len__ = None

    dl = loader(Unsized(lens=[2] * 30), workers, batch_size=16)
    for _ in range(2):
        assert sorted(ids(batches(dl))) == Shards(lens=[2] * 30).every()
    dl.close()


@pytest.mark.parametrize("kind", ["processes", "threads"])
def test_the_same_batches_for_zero_one_three_and_auto_workers(kind):
    ds = Shards()
    seen = []
    for workers in (0, 1, 3, "auto"):
        if workers == 0 and kind == "threads":
            continue
        with loader(ds, workers, worker_kind=kind) as dl:
            epochs = [batches(dl), batches(dl)]
            if workers == "auto":
                assert dl.stats()["tuner"]["unit"] == "shard"  # the tuner counts shards
        if kind == "threads":  # threads share the process's generators: the ids only
            epochs = [[(b, None) for b, _ in got] for got in epochs]
        for got in epochs:
            assert sorted(ids(got)) == ds.every()
            # A shard's batches are its own: its last one may be short.
            assert all(len({i // 1000 for i in b}) == 1 for b, _ in got)
        assert epochs[0] != epochs[1]  # each iter() draws its own shard order
        seen.append(epochs)
    assert all(s == seen[0] for s in seen), "batches differ between worker counts"


def test_exactly_once_under_random_live_resizes():
    rng = random.Random(7)
    ds = Shards(lens=[rng.randrange(0, 30) for _ in range(40)])
    with loader(ds, 2) as dl:
        for _ in range(3):
            got = []
            for ids_, _ in dl:
                got += ids_.flatten().tolist()
                if rng.random() < 0.3:
                    dl._run.engine.resize(rng.randint(1, 4))
            assert sorted(got) == ds.every()


class SlowShards(Shards):
    """Shards whose samples take 1 ms each: workers are mid-shard when the pool shrinks."""

    def iter_shard(self, shard):
        for sample in super().iter_shard(shard):
            time.sleep(0.001)
            yield sample


@pytest.mark.parametrize("kind", ["processes", "threads"])
def test_shards_handed_over_under_random_live_resizes_lose_and_repeat_nothing(kind):
    rng = random.Random(11)
    ds = SlowShards(lens=[rng.randrange(0, 40) for _ in range(30)] + [25], bad=30, bad_after=13)
    want = [i for i in ds.every() if not 30013 <= i < 31000]
    with loader(ds, 3, worker_kind=kind) as dl:
        for _ in range(3):
            got, errors, it = [], [], iter(dl)
            while True:
                try:
                    got += next(it)[0].flatten().tolist()
                except StopIteration:
                    break
                except OSError as e:
                    errors.append(str(e))
                if rng.random() < 0.3:
                    dl._run.engine.resize(rng.randint(1, 4))
            assert sorted(got) == want
            assert len(errors) == 1 and "shard-30" in errors[0] and "after 13 samples" in errors[0]
            if dl.stats()["handovers"] > 0:
                break
        assert dl.stats()["handovers"] > 0


class SlowLastShard(Shards):
    """Two one-sample shards, then one of 40 samples taking 10 ms each."""

    def __init__(self):
        super().__init__(lens=(1, 1, 40))

    def iter_shard(self, shard):
        for sample in super().iter_shard(shard):
            if shard == "shard-02":
                time.sleep(0.01)
            yield sample


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["processes", "threads"])
def test_the_last_shard_is_not_handed_to_workers_waiting_for_the_next_epoch(kind):
    # The other worker has claimed the next epoch's first shard, whose list
    # comes with the next iter(): handed the last shard, it could never take
    # it, and the epoch would never end. The leaving worker finishes it.
    ds = SlowLastShard()
    with loader(ds, 2, shuffle=False, worker_kind=kind) as dl:
        it = iter(dl)
        got = batches_of([next(it), next(it), next(it)])  # shards 0 and 1, shard 2's first
        dl._run.engine.resize(1)
        got += batches_of(it)
        assert sorted(ids(got)) == ds.every()
        assert dl.stats()["handovers"] == 0
        assert sorted(ids(batches(dl))) == ds.every()  # and the next epoch runs


@pytest.mark.parametrize("workers,kind", [(0, "processes"), (2, "processes"), (2, "threads")])
def test_a_shard_that_raises_midway_is_named_then_the_rest(workers, kind):
    ds = Shards(bad=4, bad_after=3)
    with loader(ds, workers, worker_kind=kind) as dl:
        got, errors = drain(dl, OSError)  # the shard's own error type, a DataError too
    assert all(isinstance(e, stoker.DataError) for e in errors)
    assert [(e.index, e.key, e.shard) for e in errors] == [(4, "shard-04", "shard-04")]
    errors = [str(e) for e in errors]
    assert len(errors) == 1 and "shard-04" in errors[0] and "after 3 samples" in errors[0]
    assert "truncated" in errors[0]
    # Named by its shard, not by "batch 4" and "sample 4" (its position).
    assert errors[0].startswith("epoch 0: shard 'shard-04': raised after 3 samples")
    # What the shard gave before its error is delivered; nothing else is lost.
    assert sorted(got) == [i for i in ds.every() if not (4003 <= i < 5000)]

    with loader(ds, workers, on_error="skip", worker_kind=kind) as dl:
        assert sorted(ids(batches(dl))) == sorted(got)
        skipped = dl.skipped()
    # The record's key names the shard, its reason is the cause alone.
    assert [(r["index"], r["key"]) for r in skipped] == [(4, "shard-04")]
    assert "raised after 3 samples" in skipped[0]["reason"]


@pytest.mark.parametrize("workers,kind,in_order", [(0, "processes", True), (1, "processes", True),
                                                   (2, "processes", True), (2, "threads", True),
                                                   (2, "processes", False)])
def test_what_a_shard_gave_before_it_raised_comes_before_its_error(workers, kind, in_order):
    # As torch reads a stream: a loop ended by the error has seen the shard's
    # samples before it. A shard that failed before the consumer reached it
    # (the usual case beside a training step) gave its batches after its
    # error, and where it was read whole (num_workers=0) always.
    ds = Shards(lens=(8, 8, 10, 8), bad=2, bad_after=7)
    with loader(ds, workers, shuffle=False, worker_kind=kind, in_order=in_order) as dl:
        it = iter(dl)
        seen = []
        time.sleep(0.5)  # the workers read ahead: the shard fails before it is reached
        with pytest.raises(OSError) as raised:
            for got, _ in it:
                seen += got.flatten().tolist()
        assert "raised after 7 samples" in str(raised.value)
        assert set(range(2000, 2007)) <= set(seen), seen
        seen += ids(batches_of(it))
    assert sorted(seen) == [i for i in ds.every() if not 2007 <= i < 3000]


@pytest.mark.parametrize("workers,kind", [(0, "processes"), (2, "processes"), (2, "threads")])
def test_a_last_shard_that_raises_at_once_gives_its_error_then_the_end(workers, kind):
    # Its error deferred behind batches it never made: the epoch's end came
    # first and the error was lost.
    ds = Shards(lens=(8, 8, 10), bad=2, bad_after=0)
    with loader(ds, workers, shuffle=False, worker_kind=kind) as dl:
        seen, errors = drain(dl, OSError)
    assert len(errors) == 1 and "raised after 0 samples" in str(errors[0])
    assert sorted(seen) == list(range(8)) + list(range(1000, 1008))


def test_a_shuffle_buffer_mixes_a_shard_the_same_way_for_any_worker_count():
    ds = Shards(lens=[40, 40, 40])
    plain = None
    seen = []
    for workers in (0, 3):
        with loader(ds, workers, shuffle_buffer=16) as dl:
            got = batches(dl)
        assert sorted(ids(got)) == ds.every()
        seen.append(got)
    with loader(ds, 0) as dl:
        plain = batches(dl)
    with loader(ds, 0, shuffle_buffer=None) as dl:  # None is off, as 0
        assert batches(dl) == plain
    assert seen[0] == seen[1]
    assert ids(seen[0]) != ids(plain)  # mixed within each shard
    assert [b[0] // 1000 for b, _ in seen[0]] == [b[0] // 1000 for b, _ in plain]


COUNTS = (0, 2, "auto")


@pytest.mark.parametrize("taken_at", COUNTS)
@pytest.mark.parametrize("taken", [1, 2, 6, 10])  # mid-shard but 1 (seed 5)
def test_a_checkpoint_mid_shard_resumes_with_exactly_the_rest_at_any_count(taken_at, taken):
    ds = Shards()
    with loader(ds, taken_at) as dl:
        whole = batches(dl)
    with loader(ds, taken_at) as dl:
        it = iter(dl)
        head = []
        for _ in range(taken):
            a, b = next(it)
            head.append((a.flatten().tolist(), b.flatten().tolist()))
        state = dl.state_dict()
    assert head == whole[:taken]
    shard_of = [b[0] // 1000 for b, _ in whole]
    if shard_of[taken] == shard_of[taken - 1]:  # inside a shard: it is read again, in part
        assert state["stream"] == {"item": state["stream"]["item"], "batches_taken": taken -
                                   shard_of.index(shard_of[taken])}
    else:  # at a shard's end: done, or all of it taken as its worker made it (PART)
        assert state["stream"] in (None, {"item": (state["stream"] or {}).get("item"),
                                          "batches_taken": taken -
                                          shard_of.index(shard_of[taken - 1])})
    json.dumps(state)  # a checkpoint is plain data
    for resumed_at in COUNTS:
        with loader(ds, resumed_at) as dl:
            dl.load_state_dict(state)
            assert dl.state_dict() == state
            rest = batches(dl)
        assert head + rest == whole, (taken_at, resumed_at)


RESUME = textwrap.dedent("""
    import json, sys, torch
    sys.path.insert(0, {tests!r})
    import stoker
    from test_shards import Shards
    dl = stoker.DataLoader(Shards(), batch_size=4, shuffle=True, num_workers={workers!r})
    state = {state!r}
    out = []
    if state:
        dl.load_state_dict(json.loads(state))
        out = [b.flatten().tolist() for b, _ in dl]
        print(json.dumps(out))
    else:
        it = iter(dl)
        taken = [next(it)[0].flatten().tolist() for _ in range(5)]
        print(json.dumps({{"taken": taken, "state": dl.state_dict()}}))
    dl.close()
""")


def test_resume_in_a_new_process_with_another_worker_count():
    def run(workers, state=""):
        return run_resume(RESUME, workers, state)

    first = run(2)
    rest = run(1, json.dumps(first["state"]))
    got = [i for b in first["taken"] + rest for i in b]
    assert sorted(got) == Shards().every()
    assert run("auto", json.dumps(first["state"])) == rest


def test_a_checkpoint_is_refused_where_shards_now_names_other_shards():
    # A checkpoint keeps the positions of its epoch's shards: resumed where
    # shards() names others (one retired, one landed) or orders them
    # otherwise (a directory listed in another order), it would read other
    # data, lose some and repeat some.
    def make(names):
        ds = Landing()
        ds.names = names
        return stoker.DataLoader(ds, batch_size=None, shuffle=True, num_workers=0,
                                 generator=torch.Generator().manual_seed(3))
    dl = make(["a", "b", "c", "d"])
    it = iter(dl)
    taken = [next(it) for _ in range(3)]
    state = dl.state_dict()
    for names in (["a", "b", "c", "x"], ["d", "c", "b", "a"]):
        other = make(names)
        other.load_state_dict(state)
        with pytest.raises(ValueError, match="shards that shards\\(\\) now names otherwise"):
            iter(other)
        other.close()
    same = make(["a", "b", "c", "d"])
    same.load_state_dict(state)
    assert sorted(taken + list(same)) == sorted(f"{n}{k}" for n in "abcd" for k in range(2))
    dl.close()
    same.close()


def test_a_checkpoint_is_refused_by_a_loader_that_mixes_shards_otherwise():
    # A resume skips the batches the checkpoint's shuffle_buffer mixed; with
    # another buffer they are other samples: some lost, some repeated.
    def make(buffer):
        return loader(Shards(), 0, batch_size=3, shuffle_buffer=buffer)
    dl = make(4)
    it = iter(dl)
    taken = [next(it) for _ in range(3)]
    state = dl.state_dict()
    dl.close()
    for buffer in (0, 8):
        with make(buffer) as other, \
                pytest.raises(ValueError, match="shuffle_buffer 4 differs from this loader's"):
            other.load_state_dict(state)
    older = {k: v for k, v in state.items() if k != "shuffle_buffer"}  # a state of an older version
    with make(4) as same:
        same.load_state_dict(older)
        got = ids(batches_of(iter(same)))
    assert sorted(ids(batches_of(taken)) + got) == Shards().every()


def test_equal_shard_names_hash_alike_in_any_process():
    # The checkpoint's check of its shards: equal names, however they were
    # made (a set's order differs with PYTHONHASHSEED; a manifest read back
    # from JSON gives lists for tuples, ints for 1.0), pass; others do not.
    def digest(names, seed):
        code = textwrap.dedent(f"""
            from stoker import _shards
            class D:
                def shards(self):
                    return {names}
            print(_shards.ShardTable(D()).digest())
        """)
        env = dict(os.environ, PYTHONHASHSEED=str(seed))
        return subprocess.run([sys.executable, "-c", code], env=env, check=True,
                              capture_output=True, text=True).stdout
    one = digest("[('a', frozenset({'x', 'y', 'z', 'w'})), ('b', 1.0)]", 1)
    assert digest("[['a', frozenset({'w', 'z', 'y', 'x'})], ['b', 1]]", 2) == one
    assert digest("[('a', frozenset({'x', 'y'})), ('b', 1.0)]", 1) != one
    assert digest("[('b', 1.0), ('a', frozenset({'x', 'y', 'z', 'w'}))]", 1) != one


def test_ranks_take_disjoint_shards_that_cover_the_set(monkeypatch):
    ds = Shards()
    parts = []
    for rank in range(3):
        with loader(Shards(rank=rank, world_size=3), 2) as dl:
            parts.append(sorted(ids(batches(dl))))
    assert sorted(i for p in parts for i in p) == ds.every()
    assert parts[1] == ds.every(shards=range(1, 8, 3))
    # torchrun's environment when the dataset does not say.
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with loader(Shards(), 1) as dl:
        assert sorted(ids(batches(dl))) == parts[2]
    monkeypatch.setenv("WORLD_SIZE", "9")
    monkeypatch.setenv("RANK", "8")
    with pytest.raises(ValueError, match="rank 8 of 9 has no shard"):
        loader(Shards(), 1)


def test_ranks_of_a_process_group_made_without_torchruns_variables_take_their_own_shards():
    # mp.spawn's way: init_process_group(rank=, world_size=) and no RANK in
    # the environment. Before, every rank read every shard (rank 0 of 1).
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = textwrap.dedent(f"""
        import sys
        import torch.distributed as dist
        sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
        from test_shards import Shards, batches, ids, loader
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}",
                                rank=int(sys.argv[1]), world_size=2)
        with loader(Shards(), 2) as dl:
            print(sorted(ids(batches(dl))))
        dist.destroy_process_group()
    """)
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    ranks = [subprocess.Popen([sys.executable, "-c", code, str(r)], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in range(2)]
    said = [p.communicate(timeout=120) for p in ranks]
    assert [p.returncode for p in ranks] == [0, 0], said
    parts = [json.loads(out.strip().splitlines()[-1]) for out, _ in said]
    ds = Shards()
    assert parts == [ds.every(shards=range(0, 8, 2)), ds.every(shards=range(1, 8, 2))]


@pytest.mark.parametrize("given", [{"world_size": 2}, {"rank": 1}])
def test_a_rank_or_world_size_alone_is_refused_naming_the_other(monkeypatch, given):
    # Before: world_size=2 alone was read as rank 0 of 2 (each process the
    # same shards), rank=1 alone as rank 1 of torchrun's 1 (an error on range).
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    missing = "rank" if "world_size" in given else "world_size"
    with pytest.raises(ValueError, match=f"but no {missing}: give both"):
        loader(Shards(**given), 1)


@pytest.mark.parametrize("workers", [0, 3])
def test_the_same_dataset_runs_under_torchs_dataloader(workers):
    ds = Shards()
    dl = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=workers)
    assert sorted(ids(batches(dl))) == ds.every()


class Landing(stoker.ShardedIterable):
    """Shards named by a list that changes between epochs (files landing)."""

    def __init__(self):
        self.names = ["a", "b"]

    def shards(self):
        return list(self.names)

    def iter_shard(self, shard):
        for k in range(2):
            yield f"{shard}{k}"


@pytest.mark.parametrize("loader,workers,kind", [
    (torch.utils.data.DataLoader, 0, None), (stoker.DataLoader, 0, "threads"),
    (stoker.DataLoader, 2, "threads"), (stoker.DataLoader, 2, "processes")])
def test_shards_added_or_retired_between_epochs_are_read_by_the_next(loader, workers, kind):
    # torch's workers call shards() at each epoch (the dataset's __iter__);
    # stoker read it once, when the loader was made.
    ds = Landing()
    extra = {} if kind is None else {"worker_kind": kind}
    dl = loader(ds, batch_size=None, num_workers=workers, **extra)
    epochs = []
    for e in range(3):
        epochs.append(sorted(dl))
        if e == 0:
            ds.names.append("c")  # a shard lands
        if e == 1:
            ds.names.remove("a")  # one is retired
            dl.timeout = 0.0  # an option reassigned at the same iter() (another run is made)
    assert epochs == [["a0", "a1", "b0", "b1"], ["a0", "a1", "b0", "b1", "c0", "c1"],
                      ["b0", "b1", "c0", "c1"]]
    if loader is stoker.DataLoader:
        dl.close()


def test_batch_size_none_gives_samples_one_by_one_and_len_is_torchs():
    ds = Shards(lens=[3, 2])
    with stoker.DataLoader(ds, batch_size=None, num_workers=1) as dl:
        it = iter(dl)
        assert len(it) == len(dl) == 5  # the samples, not the 2 shards
        got = [int(s[0]) for s in it]
    assert got == [0, 1, 2, 1000, 1001]
    with stoker.DataLoader(ds, batch_size=2, drop_last=True, num_workers=1) as dl:
        assert [b[0].flatten().tolist() for b in dl] == [[0, 1], [1000, 1001]]
        assert len(dl) == 2


def test_bad_arguments_are_named():
    ds = Shards()
    with pytest.raises(ValueError, match="sampler"):
        stoker.DataLoader(ds, sampler=[0, 1])
    with pytest.raises(ValueError, match="shuffle_buffer"):
        stoker.DataLoader(list(range(10)), shuffle_buffer=4)
    with pytest.raises(ValueError, match="shuffle_buffer"):
        stoker.DataLoader(ds, shuffle_buffer=-1)

    class Endless(stoker.ShardedIterable):
        def shards(self):
            return ["a"]

        def iter_shard(self, shard):
            yield 1

    with stoker.DataLoader(Endless(), num_workers=0) as dl:
        with pytest.raises(TypeError):
            len(dl)
        it = iter(dl)
        with pytest.raises(TypeError):
            len(it)
        state = dl.state_dict()  # a stream without len() checkpoints all the same
        assert [b.tolist() for b in it] == [[1]]
    with stoker.DataLoader(Endless(), num_workers=1) as dl:
        dl.load_state_dict(state)
        assert [b.tolist() for b in dl] == [[1]]


def test_no_process_or_segment_outlives_close():
    gc.collect()  # earlier tests' loaders
    before = segments_open()
    dl = loader(Shards(), 3)
    it = iter(dl)
    kept = next(it)  # a batch outliving its loader stays readable
    assert dl.stats()["stream"] == "sharded"
    pids = [dl._run.zygote_pid] + dl.stats()["worker_pids"]
    assert len(pids) > 1
    dl.close()
    assert not any(alive(p) for p in pids)
    assert kept[0].flatten().tolist() == [7000, 7001, 7002, 7003]  # shard 7 first (seed 5)
    del kept, it, dl
    gc.collect()
    assert segments_open() == before  # the batches let go of the loader's shared memory


def test_unordered_delivery_and_its_checkpoints_lose_nothing():
    ds = Shards(lens=[9, 2, 14, 0, 7, 11, 5, 3])
    for taken in (1, 3, 5):
        with loader(ds, 3, in_order=False) as dl:
            it = iter(dl)
            head = [i for _ in range(taken) for i in next(it)[0].flatten().tolist()]
            state = dl.state_dict()
        with loader(ds, 2, in_order=False) as dl:
            dl.load_state_dict(state)
            rest = ids(batches(dl))
        assert sorted(head + rest) == ds.every(), taken


class Dying(Shards):
    """Shard 4's worker process dies at its sample `at` (by `sig`); after
    the first time only, when `once` names a file it may make."""

    def __init__(self, at=3, sig=signal.SIGSEGV, once=None):
        super().__init__()
        self.at, self.sig, self.once = at, sig, None if once is None else str(once)

    def iter_shard(self, shard):
        for k, sample in enumerate(super().iter_shard(shard)):
            if shard == "shard-04" and k == self.at:
                if self.once is None or not os.path.exists(self.once):
                    if self.once is not None:
                        open(self.once, "w").close()
                    os.kill(os.getpid(), self.sig)
            yield sample


@pytest.mark.parametrize("at", [3, 9])
def test_a_worker_that_dies_in_a_shard_names_it_and_the_rest_arrives(at):
    # At 9, after two batches: a fresh process goes on after them and dies
    # at the same sample again, without a new batch: the shard fails.
    ds = Dying(at)
    with loader(ds, 2, persistent_workers=True) as dl:
        got, errors = drain(dl)
        deadline = time.monotonic() + 30  # the last death's replacement may still be starting
        while len(dl.stats()["worker_pids"]) != dl.stats()["workers"] and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(dl.stats()["worker_pids"]) == dl.stats()["workers"]  # replaced
        assert dl.stats()["shard_deaths"] == (1 if at == 9 else 0)  # gone on once, at 9
    [error] = errors
    assert error.shard == "shard-04" and "killed by signal" in str(error)
    assert str(error).startswith("epoch 0: shard 'shard-04': "), str(error)
    # The shard's reader died (not "sample 4", the shard's position).
    assert "while reading it" in str(error) and "sample" not in str(error)
    # Of shard 4, at most the batches made before its reader died arrive
    # (taken as they were made); the rest is reported with the error.
    rest = [i for i in ds.every() if i // 1000 != 4]
    assert sorted(i for i in got if i // 1000 != 4) == rest
    assert [i for i in got if i // 1000 == 4] in ([], list(range(4000, 4000 + at // 4 * 4)))


def test_a_shard_whose_worker_is_killed_goes_on_after_the_batches_it_made(tmp_path):
    # SIGKILL at sample 9 (as the out-of-memory killer would), once: a fresh
    # process reads on from sample 8, after the shard's two batches, in the
    # same segment. The same batches as a read without deaths, draws too.
    with loader(Shards(), 0) as dl:
        want = batches(dl)
    ds = Dying(9, signal.SIGKILL, once=tmp_path / "died")
    with loader(ds, 2) as dl:
        got = batches(dl)
        assert dl.stats()["shard_deaths"] == 1
    assert os.path.exists(ds.once)
    assert got == want


class Gated(Shards):
    """Shard 0 gives its first four samples, then waits (up to a minute) for
    the file `go`; the file `done` says that it was read to its end."""

    def __init__(self, go, done):
        super().__init__(lens=(10, 6))
        self.go, self.done = str(go), str(done)

    def iter_shard(self, shard):
        for k, sample in enumerate(super().iter_shard(shard)):
            if shard == "shard-00" and k == 4:
                deadline = time.monotonic() + 60
                while not os.path.exists(self.go) and time.monotonic() < deadline:
                    time.sleep(0.01)
            yield sample
        if shard == "shard-00":
            open(self.done, "w").close()


@pytest.mark.parametrize("kind", ["processes", "threads"])
def test_a_shards_first_batch_is_handed_out_before_the_shard_is_read(tmp_path, kind):
    ds = Gated(tmp_path / "go", tmp_path / "done")
    with loader(Gated(tmp_path, tmp_path / "done-whole"), 0, shuffle=False) as dl:
        whole = batches(dl)  # with `go` there from the start
    # Threads share the process's generators: their draws differ, so the ids only.
    same = (lambda got: got) if kind == "processes" else ids
    with loader(ds, 2, shuffle=False, worker_kind=kind) as dl:
        it = iter(dl)
        a, b = next(it)
        assert not os.path.exists(ds.done)  # the rest of its shard is still to be read
        state = dl.state_dict()
        assert state["stream"] == {"item": 0, "batches_taken": 1}
        open(ds.go, "w").close()
        first = (a.flatten().tolist(), b.flatten().tolist())
        got = [first] + batches_of(it)
        assert ids(batches(dl)) == ids(whole)  # another epoch: its segments written again
        # The batch taken early views its segment, which stayed out of the pool.
        assert (a.flatten().tolist(), b.flatten().tolist()) == first
        assert same([first]) == same(whole[:1])
        del a, b
        gc.collect()
        if kind == "processes":  # and went back once it was dropped
            assert dl._run.workers.segment_bytes()[1] == 0
    assert same(got) == same(whole)
    for workers in (0, 3):  # the checkpoint taken mid-shard: exactly the rest
        with loader(ds, workers, shuffle=False) as dl:
            dl.load_state_dict(state)
            assert batches(dl) == whole[1:]


def test_a_timeout_holds_while_a_shard_is_read_in_parts(tmp_path):
    ds = Gated(tmp_path / "go", tmp_path / "done")
    with loader(ds, 2, shuffle=False, timeout=1) as dl:
        it = iter(dl)
        assert next(it)[0].flatten().tolist() == [0, 1, 2, 3]
        with pytest.raises(RuntimeError, match="timed out after 1"):
            next(it)
        open(ds.go, "w").close()


class Handover(Shards):
    """Two shards of 24 samples; each waits at its sample 4 for `go`, then
    takes 5 ms a sample. Each read is logged to `log` as "shard k reader"
    (the process and thread)."""

    def __init__(self, go, log):
        super().__init__(lens=(24, 24))
        self.go, self.log = str(go), str(log)

    def iter_shard(self, shard, start=0):
        i = int(shard.split("-")[1])
        for k in range(start, self.lens[i]):
            if k == 4:
                deadline = time.monotonic() + 60
                while not os.path.exists(self.go) and time.monotonic() < deadline:
                    time.sleep(0.01)
            time.sleep(0.005)
            with open(self.log, "a") as f:
                f.write(f"{shard} {k} {os.getpid()}-{threading.get_ident()}\n")
            yield torch.tensor([i * 1000 + k]), torch.rand(1)

    def reads(self):
        with open(self.log) as f:
            return [line.split() for line in f]


class HandoverFromTheStart(Handover):
    """The same, with an iter_shard that cannot start midway."""

    def iter_shard(self, shard):
        return super().iter_shard(shard)


@pytest.mark.parametrize("kind,opens_at", [("processes", True), ("processes", False),
                                           ("threads", True)])
def test_a_worker_that_leaves_mid_shard_hands_it_over_at_its_offset(tmp_path, kind, opens_at):
    ds = (Handover if opens_at else HandoverFromTheStart)(tmp_path / "go", tmp_path / "log")
    open(ds.go, "w").close()
    with loader(ds, 0, shuffle=False) as dl:
        whole = batches(dl)
    os.remove(ds.go)
    os.remove(ds.log)
    with loader(ds, 2, shuffle=False, worker_kind=kind) as dl:
        it = iter(dl)
        got = batches_of([next(it)])
        # Both workers wait in their shard, each with a part made (on a busy
        # machine the second may not be there yet when the first batch
        # comes): one leaves at its next part.
        deadline = time.monotonic() + 60
        while not {("shard-00", "3"), ("shard-01", "3")} <= {(s, k) for s, k, _ in ds.reads()}:
            assert time.monotonic() < deadline, ds.reads()
            time.sleep(0.01)
        dl._run.engine.resize(1)
        open(ds.go, "w").close()
        got += batches_of(it)
        assert dl.stats()["handovers"] == 1
    # The same batches; draws too where the generators are the worker's own.
    same = (lambda got: got) if kind == "processes" else ids
    assert same(got) == same(whole)
    reads = ds.reads()
    by_shard = {}
    for shard, k, pid in reads:
        by_shard.setdefault(shard, set()).add(pid)
    assert sorted(len(pids) for pids in by_shard.values()) == [1, 2]  # one shard changed hands
    counts = collections.Counter((shard, int(k)) for shard, k, _ in reads)
    if opens_at:  # it continued at its offset: no sample read twice
        assert sorted(counts) == [(s, k) for s in ("shard-00", "shard-01") for k in range(24)]
        assert set(counts.values()) == {1}
    else:  # read again from its start, the batches made before dropped
        assert max(counts.values()) == 2


def _none_for_every_third(samples):
    """A collate_fn that filters batches out as None (each whose first id is a multiple of 3)."""
    ids = torch.cat([ids for ids, _ in samples])
    return None if int(ids[0]) % 3 == 0 else ids


@pytest.mark.parametrize("kind", ["processes", "threads"])
def test_a_batch_that_is_none_is_delivered_like_any_other(kind):
    # Taken early (while its shard's worker still read the shard), a None
    # batch read as "no batch ready yet" and was lost.
    ds = SlowShards(lens=[9, 7, 12, 5, 10, 8])
    want = [None if b is None else b.tolist()
            for b in loader(ds, 0, batch_size=2, collate_fn=_none_for_every_third)]
    assert None in want
    for _ in range(2):
        with loader(ds, 2, batch_size=2, collate_fn=_none_for_every_third,
                    worker_kind=kind) as dl:
            got = [None if b is None else b.tolist() for b in dl]
        assert got == want


class Misbehaving(Shards):
    """Shard 2 cannot be opened; shard 5's samples cannot be collated."""

    def iter_shard(self, shard):
        if shard == "shard-02":
            raise FileNotFoundError(f"no such shard: {shard}")  # before any iteration
        if shard == "shard-05":
            return iter([(torch.zeros(1),), (torch.zeros(2),)])
        return super().iter_shard(shard)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_shard_that_cannot_open_or_collate_is_named(workers):
    ds = Misbehaving(lens=[3, 4, 5, 2, 6, 2])
    with loader(ds, workers) as dl:
        got, errors = drain(dl, (stoker.DataError, FileNotFoundError))
    errors = [str(e) for e in errors]
    # Shard 5's samples are its one batch, which fails alone.
    assert sorted(got) == [i for i in ds.every() if i // 1000 not in (2, 5)]
    assert len(errors) == 2, errors
    assert any("shard-02" in e and "no such shard" in e and "after 0 samples" in e
               for e in errors)
    assert any(e.startswith("epoch 0: shard 'shard-05': batch 0 of the shard: collate_fn raised")
               for e in errors)


class Uncollatable(SlowShards):
    """Sample 1005 has two ids: batch 1 of shard 1 (batch_size 4) cannot be stacked.
    Slow, so that its batches are taken as its workers make them."""

    def iter_shard(self, shard):
        for ids_, draw in super().iter_shard(shard):
            yield (torch.tensor([1005, 1005]) if ids_.item() == 1005 else ids_), draw


def outcomes(it, upto=None):
    """Each batch's ids, or "error" for one that raised, until the epoch's end
    (or `upto` of them); the errors."""
    got, errors = [], []
    while upto is None or len(got) < upto:
        try:
            got.append(next(it)[0].flatten().tolist())
        except StopIteration:
            break
        except RuntimeError as e:  # torch's own, or stoker's DataError that is one too
            got.append("error")
            errors.append(e)
    return got, errors


@pytest.mark.parametrize("on_error", ["raise", "skip"])
@pytest.mark.parametrize("workers,kind", [(0, "processes"), (2, "processes"), (2, "threads")])
def test_a_batch_that_cannot_be_collated_fails_alone_and_keeps_its_place(workers, kind,
                                                                         on_error):
    # A collate_fn that raised on one batch of a shard failed the whole shard
    # item: the batches after it were lost, and at num_workers=0 those before too.
    ds = Uncollatable(lens=[8, 12, 4, 8, 4])  # whole batches: torch's match stoker's
    want, _ = outcomes(iter(torch.utils.data.DataLoader(ds, batch_size=4)))
    assert want[3] == "error" and want.count("error") == 1
    options = dict(shuffle=False, worker_kind=kind, on_error=on_error)
    with loader(ds, workers, **options) as dl:
        got, errors = outcomes(iter(dl))
        # Not a sample's failure: raised under "skip" too, as a map-style batch's.
        assert dl.skipped() == []
    assert got == want
    (error,) = errors
    assert isinstance(error, stoker.DataError) and isinstance(error.__cause__, RuntimeError)
    assert (error.shard, error.key, error.index) == ("shard-01", "shard-01", None)
    assert str(error).startswith("epoch 0: shard 'shard-01': batch 1 of the shard: "
                                 "collate_fn raised RuntimeError: stack expects")

    def runs(got):  # each shard's batches and error, in order (an error is its shard's)
        shard_of = [None]
        for b in got:
            shard_of.append(shard_of[-1] if b == "error" else b[0] // 1000)
        return sorted((s, [b for b, t in zip(got, shard_of[1:]) if t == s])
                      for s in set(shard_of[1:]))

    # Shuffled, the shard is named as itself, not as its place in the epoch (4).
    with loader(ds, workers, worker_kind=kind, on_error=on_error) as dl:
        shuffled, errors = outcomes(iter(dl))
    assert shuffled != want and runs(shuffled) == runs(want)
    assert [e.shard for e in errors] == ["shard-01"]

    # A checkpoint just before or after the failed batch, resumed at another
    # count: the failed batch counts as taken, so exactly the rest comes.
    for cut in (3, 4):
        with loader(ds, workers, **options) as dl:
            head, _ = outcomes(iter(dl), upto=cut)
            state = dl.state_dict()
        assert state["stream"] == {"item": 1, "batches_taken": cut - 2}
        with loader(ds, 3 if workers == 0 else 0, shuffle=False, on_error=on_error) as dl:
            dl.load_state_dict(state)
            rest, _ = outcomes(iter(dl))
        assert head + rest == want, cut


@pytest.mark.parametrize("kind", ["threads", "processes"])
def test_a_shard_handed_over_after_its_last_full_batch_keeps_its_batches(kind):
    # A shard whose length is a multiple of batch_size, handed over (the pool
    # shrank) right after its last batch: the worker that continues it reads
    # nothing more, and the batches made before must still be delivered; and
    # the epoch ends (the worker left must not be waiting on the next one).
    rng = random.Random(3)
    lens = [4 * rng.randrange(1, 10) for _ in range(16)]

    class Multiples(stoker.ShardedIterable):
        def shards(self):
            return list(range(len(lens)))

        def iter_shard(self, s, start=0):
            for k in range(start, lens[s]):
                time.sleep(0.001)
                yield s * 1000 + k

    want = collections.Counter(s * 1000 + k for s in range(len(lens)) for k in range(lens[s]))
    for trial in range(4):
        with stoker.DataLoader(Multiples(), batch_size=4, num_workers=2, shuffle=True,
                               worker_kind=kind,
                               generator=torch.Generator().manual_seed(1)) as dl:
            r = random.Random(100 + trial)
            for _ in range(2):
                got = collections.Counter()
                for ids in dl:
                    got.update(ids.tolist())
                    if r.random() < 0.4:
                        dl._run.engine.resize(r.randint(1, 3))
                assert got == want, sorted((want - got).elements())


class Endless(Shards):
    """Shards 0 and 1 never end while the file `long` is there when they are
    opened (a stream read with `break`): past their length, sample k of
    shard i is -(i * 1000 + k) - 1, 1 ms each."""

    def __init__(self, long):
        super().__init__(lens=(6, 9, 5, 7))
        self.long = str(long)

    def iter_shard(self, shard):
        i = int(shard.split("-")[1])
        endless = i < 2 and os.path.exists(self.long)
        yield from super().iter_shard(shard)
        for k in itertools.count(self.lens[i]) if endless else ():
            time.sleep(0.001)
            yield torch.tensor([-(i * 1000 + k) - 1]), torch.rand(1)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["processes", "threads"])
def test_an_epoch_left_mid_shard_stops_its_shards_and_the_next_starts_at_once(tmp_path, kind):
    # Breaking out of an epoch, then iter() again (as torch's DataLoader
    # allows): the workers still reading the abandoned epoch's shards, which
    # never end, stop them; the next epoch's first batch comes, and again.
    ds = Endless(tmp_path / "long")
    open(ds.long, "w").close()
    with loader(ds, 2, shuffle=False, worker_kind=kind) as dl:
        for _ in range(3):
            for i, _ in enumerate(dl):
                if i == 4:  # both workers are in an endless shard
                    break
        first = next(iter(dl))[0].flatten().tolist()
        assert first == [0, 1, 2, 3]


class Stalling(Shards):
    """The first reading of shards 0 and 1 stalls after its first sample (a
    read that never ends) while the file `long` exists; later ones do not."""

    def __init__(self, folder):
        super().__init__(lens=(6, 9, 5, 7))
        self.folder = str(folder)
        self.long = os.path.join(self.folder, "long")

    def iter_shard(self, shard):
        i = int(shard.split("-")[1])
        for k, sample in enumerate(super().iter_shard(shard)):
            yield sample
            if k == 0 and i < 2 and self._first(i):
                while os.path.exists(self.long):
                    time.sleep(0.01)

    def _first(self, i):
        try:
            os.close(os.open(os.path.join(self.folder, f"read-{i}"), os.O_CREAT | os.O_EXCL))
            return True
        except FileExistsError:
            return False


@pytest.mark.timeout(120)
def test_an_epoch_left_while_its_workers_stall_in_a_sample_does_not_hold_the_next(tmp_path):
    # Before, the next epoch waited until the stalled samples returned (for
    # ever here): a process that does not answer DROP within kDropGrace is
    # killed and replaced, as torch's next epoch starts fresh workers.
    ds = Stalling(tmp_path)
    open(ds.long, "w").close()
    try:
        with loader(ds, 2, shuffle=False, batch_size=1) as dl:
            it = iter(dl)
            next(it)
            time.sleep(0.5)  # both workers in a stalled sample
            del it
            got = ids(batches(dl))  # the next epoch: whole, from fresh workers
    finally:
        os.remove(ds.long)
    assert sorted(got) == ds.every(), got


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["processes", "threads"])
def test_the_epoch_after_one_left_mid_shard_delivers_each_sample_once(tmp_path, kind):
    ds = Endless(tmp_path / "long")
    open(ds.long, "w").close()
    with loader(ds, 2, shuffle=False, worker_kind=kind) as dl:
        for i, _ in enumerate(dl):
            if i == 2:
                break
        os.remove(ds.long)  # the shards opened from now on end
        for _ in range(2):
            got = ids(batches(dl))
            assert sorted(got) == ds.every(), got
        assert dl.stats()["handovers"] == 0  # dropped, not handed over


def test_a_shards_batches_copied_ahead_to_the_device_are_not_in_the_checkpoint(gpu_stand_in):
    from test_checkpoint import _taken_ahead
    ds = Shards(lens=(30, 30))
    with loader(ds, 2, shuffle=False) as dl:
        whole = batches(dl)
    with loader(ds, 2, shuffle=False, device=gpu_stand_in,
                device_prefetch_bytes=1 << 20) as dl:
        head = [(a.flatten().tolist(), b.flatten().tolist())
                for a, b in _taken_ahead(iter(dl), 2)]
        state = dl.state_dict()
    assert head == whole[:len(head)]
    with loader(ds, 2, shuffle=False) as dl:
        dl.load_state_dict(state)
        assert head + batches(dl) == whole


SPAWNED_RANKS = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
    sys.path.insert(0, {tests!r})
    from test_shards import Shards

    def run(rank, port):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=rank,
                                world_size=2)
        got = sorted(int(ids) for ids, _ in torch.utils.data.DataLoader(
            Shards(), batch_size=None, num_workers=1, multiprocessing_context="spawn"))
        print(rank, got, flush=True)
        dist.barrier()
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(run, args=({port},), nprocs=2)
""")


def test_torchs_spawned_workers_read_the_process_groups_rank_not_every_shard(tmp_path):
    # mp.spawn's ranks set no RANK; torch's workers started by spawn have no
    # process group: each read every shard (each sample twice an epoch).
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "ranks.py"
    script.write_text(SPAWNED_RANKS.format(tests=os.path.dirname(__file__), port=port))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    got = dict((int(line.split(" ", 1)[0]), json.loads(line.split(" ", 1)[1]))
               for line in out.stdout.splitlines())
    ds = Shards()
    assert got == {r: ds.every(range(r, len(ds.lens), 2)) for r in (0, 1)}
