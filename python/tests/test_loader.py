"""The loader's contract seen from Python: determinism, resume, lifetime, stats."""

import gc
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import stoker
from stoker import _stoker


def _epoch(loader):
    xs, ys = [], []
    for x, y in loader:
        xs.append(x.clone())
        ys.append(y.clone())
    return torch.cat(xs), torch.cat(ys)


def _train_loader(tree, workers, **kw):
    return stoker.Loader(tree, batch_size=5, seed=11, workers=workers,
                         transforms=stoker.transforms.train(20), **kw)


def test_import_from_any_directory(tmp_path):
    out = subprocess.run([sys.executable, "-c", "import stoker; print(stoker.Loader.__name__)"],
                         cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "Loader"


def test_same_batches_for_any_worker_count(image_tree):
    reference = _epoch(_train_loader(image_tree, 0))
    for workers in (1, 3, "auto"):
        images, labels = _epoch(_train_loader(image_tree, workers))
        assert torch.equal(images, reference[0]), workers
        assert torch.equal(labels, reference[1]), workers


def test_epochs_differ_and_repeat(image_tree):
    loader = _train_loader(image_tree, 2)
    first = _epoch(loader)
    second = _epoch(loader)  # the next pass is epoch 1
    assert loader.epoch == 2
    assert not torch.equal(first[0], second[0])
    loader.set_epoch(0)
    assert torch.equal(_epoch(loader)[0], first[0])


def test_resume_mid_epoch_with_other_worker_count(image_tree):
    full = _epoch(_train_loader(image_tree, 2))
    a = _train_loader(image_tree, 2)
    a.set_epoch(0)
    it = iter(a)
    head = [next(it) for _ in range(2)]
    head = (torch.cat([x.clone() for x, _ in head]), torch.cat([y.clone() for _, y in head]))
    state = a.state_dict()
    assert state["epoch"] == 0 and state["position"] == 2
    a.close()

    b = _train_loader(image_tree, 1)
    b.load_state_dict(state)
    tail = _epoch(b)
    assert torch.equal(torch.cat([head[0], tail[0]]), full[0])
    assert torch.equal(torch.cat([head[1], tail[1]]), full[1])


def test_a_resumed_loop_calls_set_epoch_as_always(image_tree):
    # for epoch in range(start, n): loader.set_epoch(epoch); for b in loader: ...
    a = _train_loader(image_tree, 2)
    a.set_epoch(1)
    it = iter(a)
    next(it), next(it)
    state = a.state_dict()
    tail = _epoch(a)
    a.close()
    b = _train_loader(image_tree, 1)
    b.load_state_dict(state)
    b.set_epoch(state["epoch"])  # keeps the checkpoint: the rest of epoch 1
    got = _epoch(b)
    assert torch.equal(got[0], tail[0]) and torch.equal(got[1], tail[1])
    b.load_state_dict(state)
    b.set_epoch(2)  # another epoch: whole
    assert len(_epoch(b)[1]) == len(tail[1]) + 2 * 5


def test_a_checkpoint_after_an_epochs_last_batch_is_that_epoch_all_delivered():
    # Taken inside the loop after the last batch (a checkpoint every N steps,
    # N dividing the epoch): it said the next epoch's start, so a resumed loop's
    # set_epoch(this epoch) dropped it and the whole epoch came again.
    a = stoker.Loader(stoker.Synthetic(size=20, shape=(1,)), batch_size=4, seed=3)
    a.set_epoch(1)
    for _ in a:
        state, epoch = a.state_dict(), a.epoch
    assert (state["epoch"], state["position"]) == (1, 5) and epoch == 1
    b = stoker.Loader(stoker.Synthetic(size=20, shape=(1,)), batch_size=4, seed=3)
    b.load_state_dict(state)
    b.set_epoch(1)
    assert list(b) == []  # all of epoch 1 was delivered
    b.set_epoch(2)
    assert len(list(b)) == 5
    # After the loop (its end asked for): the next epoch's start, as before.
    assert (a.state_dict()["epoch"], a.state_dict()["position"]) == (2, 0)


def test_a_pass_that_ended_stays_ended():
    # iter(loader) was the loader: next() after StopIteration went on into the
    # next epoch, and a loop stepping two loaders with next(it, None) until
    # both ran dry got the shorter one's samples over and over.
    loader = stoker.Loader(stoker.Synthetic(size=8, shape=(1,)), batch_size=4, seed=3)
    it = iter(loader)
    assert len(it) == 2 and len([next(it), next(it)]) == 2
    assert next(it, None) is None and next(it, None) is None
    assert len(list(loader)) == 2  # a new pass: the next epoch
    assert loader.epoch == 2


def test_a_pass_whose_epoch_another_pass_ended_ends_too():
    # A peeked pass left unfinished ran on after a later loop ended its
    # epoch: it took the whole next epoch, and the loop after started a
    # third.
    loader = stoker.Loader(stoker.Synthetic(size=16, shape=(1,)), batch_size=4, seed=3)
    peeked = iter(loader)
    next(peeked)
    assert len(list(loader)) == 3 and loader.epoch == 1  # the rest of epoch 0
    assert next(peeked, None) is None and loader.epoch == 1
    assert len(list(loader)) == 4 and loader.epoch == 2  # epoch 1, whole


def test_state_dict_from_another_seed_is_refused(image_tree):
    state = _train_loader(image_tree, 1).state_dict()
    other = stoker.Loader(image_tree, batch_size=5, seed=12, transforms=stoker.transforms.train(20))
    with pytest.raises(ValueError, match="seed"):
        other.load_state_dict(state)


def test_state_dict_errors_name_the_field():
    loader = stoker.Loader(stoker.Synthetic(size=8, shape=(4,)), batch_size=4, seed=3)
    state = loader.state_dict()
    assert set(state) == {"seed", "epoch", "position", "beyond", "num_samples", "batch_size",
                          "shuffle", "drop_last", "rank", "world_size", "pad_shards"}
    loader.load_state_dict({k: v for k, v in state.items() if k != "beyond"})
    with pytest.raises(ValueError, match="'position'"):
        loader.load_state_dict({"seed": 3, "epoch": 0})
    with pytest.raises(ValueError, match="'epoch'"):
        loader.load_state_dict(dict(state, epoch="zero"))


def test_shared_defaults_come_from_the_engine():
    from stoker import _stoker
    assert _stoker.MAX_WORKERS >= 1 and 0 < _stoker.MEMORY_BUDGET_SHARE <= 1
    assert _stoker.default_prefetch(0, 64) <= _stoker.default_prefetch(_stoker.MAX_WORKERS, 64)
    assert _stoker.stall_fraction(1.0, 4.0) == 0.25 and _stoker.stall_fraction(0.0, 0.0) == 0.0


def test_len_and_drop_last():
    source = stoker.Synthetic(size=103, shape=(4,))
    assert len(stoker.Loader(source, batch_size=10)) == 11
    loader = stoker.Loader(source, batch_size=10, drop_last=True, output="numpy")
    assert len(loader) == 10
    assert sum(len(y) for _, y in loader) == 100


def test_batch_outlives_the_loader_moving_on_and_being_deleted():
    # Each batch is a view of a recycled buffer: the buffer must not be reused
    # while a tensor still views it.
    source = stoker.Synthetic(size=400, shape=(64,), num_classes=1000)
    loader = stoker.Loader(source, batch_size=8, workers=2, prefetch=2, shuffle=False)
    kept, kept_labels = next(iter(loader))
    copy = kept.clone()
    for _ in loader:  # 49 more batches through a pool of a few buffers
        pass
    assert torch.equal(kept, copy)
    assert kept_labels.tolist() == list(range(8))
    del loader
    gc.collect()
    np_view = kept.numpy()
    assert torch.equal(kept, copy) and np_view.sum() == copy.numpy().sum()


def test_numpy_output_keeps_the_batch_alive():
    loader = stoker.Loader(stoker.Synthetic(size=64, shape=(16,)), batch_size=8, output="numpy")
    images, labels = next(iter(loader))
    assert isinstance(images, np.ndarray) and images.flags.c_contiguous
    assert images.ctypes.data % 4096 == 0
    copy = images.copy()
    del loader
    gc.collect()
    assert np.array_equal(images, copy)


def test_synthetic_passthrough_is_the_source_bytes():
    source = stoker.Synthetic(size=20, shape=(2, 3), dtype="float32", num_classes=20)
    loader = stoker.Loader(source, batch_size=20, shuffle=False, output="numpy")
    images, labels = next(iter(loader))
    assert images.dtype == np.float32 and images.shape == (20, 2, 3)
    raw, label = source.read(7)
    assert images[7].tobytes() == raw and labels[7] == label == 7


def test_stats_with_tuner_and_with_fixed_workers():
    source = stoker.Synthetic(size=512, shape=(256,), cpu_cost_us=20)
    auto = stoker.Loader(source, batch_size=16, workers="auto")
    for _ in auto:
        pass
    stats = auto.stats()
    assert stats["tuner"] is not None
    assert {"workers", "phase", "cpu_budget_workers", "samples_per_s"} <= set(stats["tuner"])
    assert stats["metrics"]["samples_delivered"] == 512
    assert stats["metrics"]["queue_ns"] >= 0
    assert all({"id", "samples", "busy_ns", "cpu_ns", "queue_ns", "cpu_elsewhere_ns",
                "remote_samples", "remote_busy_ns"} == set(w)
               for w in stats["metrics"]["workers"])
    assert 0.0 <= stats["stall_fraction"] <= 1.0
    assert isinstance(auto.decisions(), list)

    fixed = stoker.Loader(source, batch_size=16, workers=2)
    next(iter(fixed))
    assert fixed.stats()["tuner"] is None and fixed.stats()["workers"] == 2
    assert fixed.decisions() == []


def test_stats_rates_are_recent_and_since_start_is_named():
    # Issue 23: stats() averaged since the start, so a loop that slowed
    # down still showed its fast start. Its rates now cover the consumer's
    # last RECENT_WINDOW_S seconds; the average is "..._since_start".
    source = stoker.Synthetic(size=64, shape=(4,))
    loader = stoker.Loader(source, batch_size=8, workers=1)
    it = iter(loader)

    def take():
        nonlocal it
        batch = next(it, None)
        if batch is None:
            it = iter(loader)
            batch = next(it)
        return batch

    start = time.monotonic()
    while time.monotonic() - start < 1.0:  # fast: thousands of samples/s
        take()
    slow_start, slow = time.monotonic(), 0
    while time.monotonic() - slow_start < _stoker.RECENT_WINDOW_S + 0.6:
        take()
        slow += 1
        time.sleep(0.1)  # slow: a step of 0.1 s per batch of 8, at most 80 samples/s
    s = loader.stats(gpu=False)
    assert _stoker.RECENT_WINDOW_S == 5.0
    # Counts, not clocks: the window holds the slow phase's batches only (one
    # more at its edge at most), and its rate is far below the whole run's.
    assert 0.5 * _stoker.RECENT_WINDOW_S <= s["window_s"] <= 2 * _stoker.RECENT_WINDOW_S
    assert 0 < s["metrics"]["recent"]["samples_delivered"] <= 8 * (slow + 1), s
    assert s["samples_per_s_since_start"] > 3 * s["samples_per_s"], s
    assert 0.0 <= s["stall_fraction"] < 0.5 and 0.0 <= s["stall_fraction_since_start"] <= 1.0
    recent = s["metrics"]["recent"]
    assert set(recent) == {"batches_delivered", "samples_delivered", "user_samples_delivered",
                           "consumer_wait_ns", "consumer_step_ns"}
    assert recent["samples_delivered"] < s["metrics"]["samples_delivered"]


def test_stats_show_the_loaders_share_of_the_node(tmp_path, monkeypatch):
    # Two tuned loaders on one node registry split its CPU budget; stats()
    # shows each one's share and the node's totals.
    path = str(tmp_path / "node")
    monkeypatch.setenv("STOKER_NODE_REGISTRY", path)
    source = stoker.Synthetic(size=256, shape=(64,), cpu_cost_us=50)
    loaders = [stoker.Loader(source, batch_size=16, workers="auto", tune_interval=0.01)
               for _ in range(2)]
    iters = [iter(l) for l in loaders]

    def node(i):
        return loaders[i].stats()["tuner"]["node"]

    def split():
        # Each loader splits the budget by the wants it last read, at its own
        # tick: two readings add up to the budget once the wants hold still.
        shares = [node(i)["share_cores"] for i in (0, 1)]
        return sum(shares) == pytest.approx(node(0)["budget_cores"], rel=0.2)

    deadline = time.monotonic() + 60  # a generous bound for a loaded machine
    split_seen = False
    while time.monotonic() < deadline and not (
            all(node(i)["loaders"] == 2 for i in (0, 1)) and (split_seen := split())):
        for i in (0, 1):
            if next(iters[i], None) is None:
                iters[i] = iter(loaders[i])
    for i in (0, 1):
        n = node(i)
        assert n["registry"] == path and n["note"] == ""
        assert n["loaders"] == 2 and n["workers"] >= 2
        assert 0 < n["share_cores"] <= n["budget_cores"]
    assert split_seen, [node(i) for i in (0, 1)]

    monkeypatch.setenv("STOKER_NODE_REGISTRY", "off")
    alone = stoker.Loader(source, batch_size=16, workers="auto")
    n = alone.stats()["tuner"]["node"]
    assert n["registry"] is None and "STOKER_NODE_REGISTRY" in n["note"]


def test_argument_errors():
    source = stoker.Synthetic(size=8, shape=(4,))
    with pytest.raises(ValueError, match="batch_size"):
        stoker.Loader(source, batch_size=0)
    with pytest.raises(ValueError, match="workers"):
        stoker.Loader(source, workers="many")
    with pytest.raises(ValueError, match="on_error"):
        stoker.Loader(source, on_error="ignore")
    with pytest.raises(ValueError, match="world_size"):
        stoker.Loader(source, rank=1)
    with pytest.raises(TypeError):
        stoker.Loader(42)


def test_closed_loader_says_so():
    loader = stoker.Loader(stoker.Synthetic(size=8, shape=(4,)), batch_size=4)
    loader.close()
    with pytest.raises(ValueError, match="closed"):
        next(iter(loader))


def test_path_string_sources(image_tree, tmp_path):
    assert isinstance(stoker.Loader(image_tree, batch_size=4).source, stoker.ImageFolder)
    by_bytes = stoker.Loader(os.fsencode(image_tree), batch_size=4).source
    assert isinstance(by_bytes, stoker.ImageFolder) and by_bytes.root == image_tree
    with pytest.raises(FileNotFoundError):
        stoker.Loader(os.path.join(str(tmp_path), "nowhere"))


def test_the_engine_options_are_set_by_name():
    tuner = _stoker.TunerOptions(max_workers=5, trace_path=None)  # None keeps the default
    options = _stoker.LoaderOptions(batch_size=3, workers=_stoker.AUTO_WORKERS, device=None,
                                    on_error=_stoker.ErrorPolicy.SKIP, tuner=tuner)
    default = _stoker.LoaderOptions()
    assert options.batch_size == 3 and options.workers == _stoker.AUTO_WORKERS
    assert options.on_error == _stoker.ErrorPolicy.SKIP and options.device == default.device
    assert options.tuner.max_workers == 5 and options.tuner.trace_path == ""
    with pytest.raises(TypeError, match="LoaderOptions has no field 'batchsize'"):
        _stoker.LoaderOptions(batchsize=3)


ITERATED_AT_EXIT = """
import threading, time, stoker
source = stoker.Synthetic(size=1_000_000, shape=(64, 64, 3), num_classes=10)
loader = stoker.Loader(source, batch_size=64, output="numpy", workers={workers!r})
def train():
    for _ in loader:
        pass
threading.Thread(target=train, daemon=True).start()
time.sleep(1)  # the thread is inside next(), waiting for a batch without the GIL
"""


@pytest.mark.parametrize("workers", [1, "auto"])
def test_a_daemon_thread_iterating_at_the_interpreters_exit_does_not_abort_it(workers):
    # Issue 23: nothing closed a stoker.Loader at exit. Its next() came back
    # into Python once finalisation had begun, and the interpreter ended the
    # thread inside C++: "terminate called without an active exception",
    # SIGABRT, in every run. Two runs each.
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", ITERATED_AT_EXIT.format(workers=workers)],
                             capture_output=True, text=True, timeout=120, env=dict(os.environ))
        assert out.returncode == 0, out.stderr
        assert "terminate called" not in out.stderr
        # Nor a traceback: the thread ends without a word, as torch's do
        # (it printed "stoker.Cancelled: the loader was stopped" every exit).
        assert "Traceback" not in out.stderr and "Cancelled" not in out.stderr, out.stderr


DATALOADER_ITERATED_AT_EXIT = """
import threading, time, stoker
loader = stoker.DataLoader(list(range(10**6)), batch_size=64, num_workers={workers!r})
def train():
    while True:
        for _ in loader:
            time.sleep(0.01)
threading.Thread(target=train, daemon=True).start()
time.sleep(1)
"""


@pytest.mark.parametrize("workers", [0, 2])
def test_a_daemon_thread_iterating_a_dataloader_at_exit_ends_without_a_traceback(workers):
    out = subprocess.run([sys.executable, "-c", DATALOADER_ITERATED_AT_EXIT.format(workers=workers)],
                         capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    assert out.stderr == "", out.stderr


def test_a_trace_that_could_not_all_be_written_is_said_at_close(tmp_path):
    # A file size limit refuses the trace's writes as a full disk would. Before,
    # the decisions were lost without a word. Samples of 0.2 ms of CPU give
    # the tuner a decision within a few epochs (samples of nothing gave it
    # none in 2,000 at times).
    import textwrap
    trace = tmp_path / "t.jsonl"
    script = textwrap.dedent(f"""
        import resource, signal, warnings, stoker
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (16, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        loader = stoker.Loader(stoker.Synthetic(size=64, shape=(8,), cpu_cost_us=200),
                               batch_size=4, tune_interval=0.01, trace_path={str(trace)!r},
                               output="numpy")
        for _ in range(2000):
            for _ in loader:
                pass
            if loader.decisions():
                break
        assert loader.decisions()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader.close()
        print([str(w.message) for w in caught if w.category is RuntimeWarning])
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stderr
    assert f"the tuner's trace {trace} is incomplete" in r.stdout, r.stdout
    assert "File too large" in r.stdout, r.stdout
