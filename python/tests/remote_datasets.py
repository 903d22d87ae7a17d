"""The dataset of python/tests/test_remote.py, in a module of its own: Dask
workers (python/tests is on their PYTHONPATH, see conftest.py) unpickle it by
reference, and import it first (--preload), so that a worker has torch and
stoker loaded before its first task."""

import os
import threading
import time

import torch
from torch.utils.data import Dataset

import stoker  # noqa: F401 -- the preload loads the stoker the test process runs
from dask_cluster import WORKER_NAME_ENV

# Set in a worker's environment: it makes samples there log or hang.
STARTED_DIR_ENV = "STOKER_TEST_STARTED_DIR"
HANG_ENV = "STOKER_TEST_HANG"
SLOW_ENV = "STOKER_TEST_SLOW"  # seconds each sample takes more there: a slow worker
GATE_ENV = "STOKER_TEST_GATE"  # a file: a dataset loads there once it exists (LoadsAtGate)


class Seeded(Dataset):
    """Sample i: {"index": i, "x": i + torch.rand(4)}. `x` depends on the
    seed the sample's batch was given, so equal batches mean equal seeding.

    delay_s: each sample sleeps that long first (a slow read; no CPU used).
    Where $STOKER_TEST_STARTED_DIR is set (a Dask worker's environment), each
    sample appends its index to the file named after the worker
    ($STOKER_TEST_WORKER) in that folder before it sleeps: a test sees a
    remote task under way. With hang_where_marked, a sample sleeps forever
    where $STOKER_TEST_HANG is set: a worker that hangs. Where
    $STOKER_TEST_SLOW is set, each sample sleeps that many seconds more.
    """

    def __init__(self, n, delay_s=0.0, hang_where_marked=False):
        self.n, self.delay_s, self.hang_where_marked = n, delay_s, hang_where_marked

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        started = os.environ.get(STARTED_DIR_ENV)
        if started:
            with open(os.path.join(started, os.environ.get(WORKER_NAME_ENV, "unnamed")), "a") as f:
                f.write(f"{i}\n")
        if self.hang_where_marked and os.environ.get(HANG_ENV):
            while True:  # a read that never returns: only SIGKILL ends it
                time.sleep(3600)
        if self.delay_s:
            time.sleep(self.delay_s)
        if os.environ.get(SLOW_ENV):
            time.sleep(float(os.environ[SLOW_ENV]))
        return {"index": i, "x": torch.full((4,), float(i)) + torch.rand(4)}


class LoadsAtGate(Seeded):
    """Seeded, which takes as long to load where $STOKER_TEST_GATE is set (a
    Dask worker's environment) as the file it names takes to appear, 60 s at
    most: a big dataset whose send to a worker the test holds."""

    def __setstate__(self, state):
        gate = os.environ.get(GATE_ENV)
        deadline = time.monotonic() + 60.0
        while gate and not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.__dict__.update(state)


def collate_raising_where_made(batch):
    """A collate_fn that always raises a RuntimeError naming where it ran:
    the Dask worker's name, else "here"."""
    raise RuntimeError(f"made on {os.environ.get(WORKER_NAME_ENV, 'here')}")


class SeededShards(stoker.ShardedIterable):
    """Shard i holds samples i*1000 .. i*1000+lens[i]-1, each a tensor and a
    draw from torch's generator, `delay_s` apart (a slow read)."""

    def __init__(self, lens, delay_s=0.0):
        self.lens, self.delay_s = list(lens), delay_s

    def shards(self):
        return [f"shard-{i:02d}" for i in range(len(self.lens))]

    def iter_shard(self, shard):
        i = int(shard.split("-")[1])
        for k in range(self.lens[i]):
            if self.delay_s:
                time.sleep(self.delay_s)
            yield torch.tensor([i * 1000 + k]), torch.rand(1)


class TwoArgError(Exception):
    """An exception whose constructor its args do not fit: it pickles, and
    does not load back."""

    def __init__(self, path, code):
        super().__init__(f"cannot read {path}: code {code}")


class FailsAt(Seeded):
    """Seeded, whose sample `bad` raises TwoArgError."""

    def __init__(self, n, bad):
        super().__init__(n, delay_s=0.005)
        self.bad = bad

    def __getitem__(self, i):
        if i == self.bad:
            raise TwoArgError(f"/data/{i}.jpg", 5)
        return super().__getitem__(i)


def init_failing_where_made_remotely(worker_id):
    """A worker_init_fn that raises on a Dask worker only (its environment
    lacks what the script's own machine has)."""
    if os.environ.get(WORKER_NAME_ENV):
        raise KeyError(f"no shard for worker {worker_id} here")


def collate_unpicklable_where_made(batch):
    """torch's default_collate, with a lock added where a Dask worker makes
    the batch: a batch that cannot be sent back."""
    made = torch.utils.data.default_collate(batch)
    if os.environ.get(WORKER_NAME_ENV):
        made["lock"] = threading.Lock()
    return made


MISSING_THERE = "/nonexistent/stoker-test/index.bin"


class LoadsOnlyHere(Seeded):
    """Seeded, which does not load on a Dask worker: it opens MISSING_THERE
    as it loads there (FileNotFoundError), as a dataset that reads an index
    file the worker's machine lacks."""

    def __setstate__(self, state):
        if os.environ.get(WORKER_NAME_ENV):
            open(MISSING_THERE).close()
        self.__dict__.update(state)
