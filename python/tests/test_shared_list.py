"""stoker.SharedList: a read-only sequence whose items forked workers read
without copying them (docs/dataloader.md, "Copy-on-read")."""

import gc
import multiprocessing
import os
import pickle
import threading
import time

import pytest

import stoker

torch = pytest.importorskip("torch")


def records(n):
    return [{"index": i, "name": f"sample-{i:07d}.jpg", "tags": ["a", str(i % 3)]}
            for i in range(n)]


def test_reads_like_a_list():
    plain = records(50)
    shared = stoker.SharedList(plain)
    assert len(shared) == 50
    assert shared[0] == plain[0] and shared[49] == plain[49]
    assert shared[-1] == plain[-1] and shared[-50] == plain[0]
    assert list(shared) == plain
    assert shared.index(plain[7]) == 7 and plain[3] in shared
    assert list(reversed(shared)) == plain[::-1]
    for s in (slice(3, 9), slice(None, None, 2), slice(None, None, -3), slice(40, 200),
              slice(-5, None), slice(9, 3), slice(None)):
        part = shared[s]
        assert isinstance(part, stoker.SharedList)
        assert list(part) == plain[s], s
    assert list(shared[5:20][2:4]) == plain[7:9]  # a slice of a slice
    assert "50 items" in repr(shared)


def test_builds_from_a_generator_and_from_nothing():
    shared = stoker.SharedList(f"s{i}" for i in range(1000))
    assert len(shared) == 1000 and shared[999] == "s999"
    empty = stoker.SharedList()
    assert len(empty) == 0 and list(empty) == [] and empty[:] is not empty
    with pytest.raises(IndexError):
        empty[0]


def test_items_are_fresh_copies():
    shared = stoker.SharedList([{"k": [1]}])
    item = shared[0]
    item["k"].append(2)
    assert shared[0] == {"k": [1]}  # documented: a change to a returned item is not seen


def test_errors_say_what_is_wrong():
    shared = stoker.SharedList([1, 2, 3])
    for bad in (3, -4, 10**20):
        with pytest.raises(IndexError, match=f"index {bad} out of range"):
            shared[bad]
    with pytest.raises(TypeError, match="integers or slices, not str"):
        shared["1"]
    with pytest.raises(pickle.PicklingError, match="item 2 .*lock.* cannot be pickled"):
        stoker.SharedList([1, "two", threading.Lock(), 4])


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_pickles_with_its_items(protocol):
    shared = stoker.SharedList(records(30))[4:20]  # a view into a larger buffer
    back = pickle.loads(pickle.dumps(shared, protocol))
    assert isinstance(back, stoker.SharedList) and list(back) == records(30)[4:20]
    assert len(pickle.dumps(shared, protocol)) < len(pickle.dumps(stoker.SharedList(records(30))))


def test_pickles_out_of_band():
    shared = stoker.SharedList(records(10))
    buffers = []
    data = pickle.dumps(shared, 5, buffer_callback=buffers.append)
    assert len(data) < 500  # the items' bytes (and the offsets) went out of band
    assert list(pickle.loads(data, buffers=buffers)) == records(10)


class Records(torch.utils.data.Dataset):
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def test_dataloader_batches_equal_a_plain_lists():
    plain = records(203)

    def batches(items):
        with stoker.DataLoader(Records(items), batch_size=16, shuffle=True, num_workers=2,
                               generator=torch.Generator().manual_seed(5)) as dl:
            return [(b["index"].tolist(), b["name"], b["tags"]) for b in dl]

    got = batches(stoker.SharedList(plain))
    assert got == batches(plain)
    assert sorted(i for indices, _, _ in got for i in indices) == list(range(203))


def _private_dirty():
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Private_Dirty:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no Private_Dirty in /proc/self/smaps_rollup")


def _growth_reading_all(items):
    """Private_Dirty bytes a forked child gains by reading every item of `items`."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only Python reads, then _exit
        code = 1
        try:
            os.close(read)
            gc.disable()  # a collection would touch every container in the heap
            before = _private_dirty()
            for item in items:
                item["name"]
            os.write(write, str(_private_dirty() - before).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        grown = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and grown, "the child failed"
    return int(grown)


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"),
                    reason="needs /proc/self/smaps_rollup (Linux 4.14+) to read private memory")
def test_forked_reader_does_not_copy_the_items():
    plain = records(200_000)  # about 60 MiB of dicts, lists and strings
    shared = stoker.SharedList(plain)
    gc.collect()
    plain_growth = _growth_reading_all(plain)
    shared_growth = _growth_reading_all(shared)
    assert plain_growth > 16 << 20, f"reading a plain list copied only {plain_growth} bytes"
    # Unpickling allocates and frees each item, dirtying a few pages of the
    # heap; the plain list's reads dirty every page that holds an item.
    assert shared_growth < 0.1 * plain_growth, (shared_growth, plain_growth)


class _FakeRun:
    """What stats._worker_growth reads of a DataLoader's run."""

    def __init__(self, pids):
        self.workers, self.live, self.zygote_pid = self, pids, os.getpid()

    def kind(self):
        return "processes"

    def pids(self):
        return self.live


def _metrics(unique_per_worker, done, segments=8 << 20):
    share = segments // len(done)
    return {"worker_bytes": sum(unique_per_worker + share for _ in done),
            "workers": [{"id": i, "samples": d} for i, d in enumerate(done)]}


def test_growth_counts_from_when_every_worker_reported():
    from stoker import _stats
    run = _FakeRun([101, 102])

    def growth(unique, done):
        got = _stats.worker_growth(run, _metrics(unique, done), 8 << 20)
        return got["worker_growth_bytes"], got["advice"]

    assert growth(10 << 20, [1, 1]) == (0, "")   # first seen
    assert growth(50 << 20, [3, 2]) == (0, "")   # worker 1 has not reported since
    assert growth(50 << 20, [3, 3]) == (0, "")   # the baseline: 2 x 50 MiB
    assert growth(80 << 20, [9, 9]) == (60 << 20, "")  # 30 MiB per worker: no advice
    grown, advice = growth((50 << 20) + (2 << 30), [20, 20])
    assert grown == 4 << 30
    assert advice.startswith("workers' memory grew by 4096 MiB in ") and \
        "(2048 MiB per worker)" in advice and "stoker.SharedList" in advice
    run.live = [101, 103]  # a worker replaced: counted again once it reported
    assert growth(10 << 20, [21, 0]) == (0, "")
    run.kind = lambda: "threads"
    assert growth(10 << 20, [30, 30]) == (0, "")


class _Touching(torch.utils.data.Dataset):
    """90 samples: from 24 on they wait for `go`; 24-39 each read 1/16 of
    `items`; 40-89 sleep, so that the worker measures and reports its memory
    after the reads (about once a second)."""

    def __init__(self, items, go):
        self.items, self.go = items, go

    def __len__(self):
        return 90

    def __getitem__(self, i):
        if i >= 24:
            self.go.wait()
        if 24 <= i < 40:
            chunk = len(self.items) // 16
            for _ in self.items[(i - 24) * chunk:(i - 23) * chunk]:
                pass
        elif i >= 40:
            time.sleep(0.05)
        return i


def _most_growth_seen(items):
    """The largest worker_growth_bytes stats() gave in an epoch over
    _Touching(items) on one worker, with its advice."""
    go = multiprocessing.get_context("fork").Event()
    seen = []
    with stoker.DataLoader(_Touching(items, go), batch_size=2, num_workers=1,
                           prefetch_factor=2) as dl:
        for b, _ in enumerate(dl):
            s = dl.stats(gpu=False)
            seen.append((s["worker_growth_bytes"], s["advice"]))
            if b == 8:  # the baseline is taken by now: the worker made 9 batches since
                go.set()
    return max(seen)


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"),
                    reason="workers measure their memory in /proc/self/smaps_rollup")
def test_stats_advises_shared_list_when_workers_copy_a_list():
    # About 150 MiB of strings: a worker that reads them all copies nearly all
    # of it; it reaches the advice's threshold of a quarter of the zygote.
    plain = [f"{i:08d}" * 12 for i in range(1_000_000)]
    grown, advice = _most_growth_seen(plain)
    assert grown > 64 << 20 and "stoker.SharedList" in advice, (grown, advice)
    grown, advice = _most_growth_seen(stoker.SharedList(plain))
    assert grown < 16 << 20 and advice == "", (grown, advice)
