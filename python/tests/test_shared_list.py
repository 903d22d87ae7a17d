"""stoker.SharedList: a read-only sequence whose items forked workers read
without copying them (docs/dataloader.md, "Copy-on-read")."""

import gc
import os
import pickle
import threading

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

