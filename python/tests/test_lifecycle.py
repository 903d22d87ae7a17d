"""stoker.DataLoader's processes beside processes the user forks: close()
never waits on them, and the zygote and workers never outlive the loader's
process because another process holds a copy of its socket. close() and the
interpreter's exit never wait for a thread worker's sample that hangs; for a
read of stoker's own workers that hangs, close() names its samples, and Ctrl-C
or the exit leaves it behind."""

import inspect
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

torch = pytest.importorskip("torch")

import stoker  # noqa: E402,F401 -- the scripts below import it; fail here first


def gone(pid):
    """True once `pid` is gone or a zombie (its parent's to collect)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] in "ZX"
    except OSError:
        return True


def wait_gone(pids, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not all(gone(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if not gone(p)]


PRELUDE = textwrap.dedent("""
    import multiprocessing, os, sys, time, torch, stoker
    class Numbers(torch.utils.data.Dataset):
        def __len__(self): return 64
        def __getitem__(self, i): return torch.tensor(i)
    def pids(dl):
        return [dl._run.zygote_pid] + dl.stats()["worker_pids"]
""")


def run_script(body, timeout=60):
    """Runs PRELUDE + body in a fresh interpreter; its stdout, or a failure
    naming the hang when it does not end within `timeout` seconds."""
    p = subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(body)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        pytest.fail(f"the script hung (killed after {timeout} s); stdout: {out}; stderr: {err}")
    assert p.returncode == 0, err
    return out


@pytest.mark.parametrize("beside", ["torch_workers", "fork_pool", "os_fork"])
def test_close_returns_while_processes_forked_after_the_loader_live(beside):
    # Each of these forks after the stoker loader exists, so each child holds
    # a copy of the zygote's socket: close() once waited for them forever.
    out = run_script(f"""
        dl = stoker.DataLoader(Numbers(), batch_size=4, num_workers=2)
        next(iter(dl))
        mine = pids(dl)
        beside = "{beside}"
        if beside == "torch_workers":
            other = torch.utils.data.DataLoader(Numbers(), batch_size=4, num_workers=2,
                                                persistent_workers=True)
            it = iter(other)
            next(it)
        elif beside == "fork_pool":
            pool = multiprocessing.get_context("fork").Pool(2)
            pool.map(abs, range(4))
        else:
            child = os.fork()
            if child == 0:
                time.sleep(30)
                os._exit(0)
        start = time.monotonic()
        dl.close()
        print(round(time.monotonic() - start, 2), *mine)
        if beside == "os_fork":
            os.kill(child, 9)
            os.waitpid(child, 0)
        elif beside == "fork_pool":
            pool.terminate()
    """)
    seconds, *pids = out.split()
    assert float(seconds) < 10  # a hang is killed by run_script; this bounds the slow path
    assert not wait_gone([int(p) for p in pids], 5), "the loader's processes outlived close()"


def test_processes_end_when_the_loader_process_is_killed_beside_a_forked_child():
    # kill -9 of the training process runs no close(); a child it forked
    # keeps a copy of the zygote's socket, so end of file never comes: the
    # zygote must notice that its parent is gone.
    script = PRELUDE + textwrap.dedent("""
        dl = stoker.DataLoader(Numbers(), batch_size=4, num_workers=2)
        next(iter(dl))
        child = os.fork()
        if child == 0:
            time.sleep(60)
            os._exit(0)
        print(child, *pids(dl), flush=True)
        time.sleep(60)
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        child, *pids = (int(w) for w in p.stdout.readline().split())
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
        left = wait_gone(pids, 10)
        os.kill(child, signal.SIGKILL)
        assert not left, f"processes {left} outlived the loader's process"
    finally:
        p.kill()
        p.wait()


def _pids_cgroup():
    """A fresh pids cgroup this test may fill (v1 or v2), or None."""
    for root in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup"):
        try:
            if root == "/sys/fs/cgroup" and "pids" not in open(
                    os.path.join(root, "cgroup.subtree_control")).read():
                continue
            path = os.path.join(root, f"stoker-test-{os.getpid()}-{time.monotonic_ns()}")
            os.mkdir(path)
            if os.path.exists(os.path.join(path, "pids.max")):
                return path
            os.rmdir(path)
        except OSError:
            continue
    return None


def _run_in_cgroup(cgroup, script, *args):
    """Runs `script` (which moves itself into `cgroup`) to its end, then
    removes the cgroup; the script must succeed."""
    try:
        done = subprocess.run([sys.executable, str(script), cgroup, *args], capture_output=True,
                              text=True, timeout=240)
    finally:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.rmdir(cgroup)
                break
            except OSError:
                time.sleep(0.1)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


_UNDER_PIDS_LIMIT = textwrap.dedent("""
    import os, sys, time
    cgroup, limit, workers = sys.argv[1], sys.argv[2], sys.argv[3]
    open(os.path.join(cgroup, "pids.max"), "w").write(limit)
    open(os.path.join(cgroup, "cgroup.procs"), "w").write(str(os.getpid()))
    import torch, stoker

    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return 600

        def __getitem__(self, i):
            time.sleep(0.002)
            return i

    sys.path.insert(0, {tests!r})
    from test_dataloader import drain

    workers = workers if workers == "auto" else int(workers)
    dl = stoker.DataLoader(Slow(), batch_size=10, num_workers=workers, persistent_workers=True)
    got, errors = [], []
    for _ in range(2):
        more, failed = drain(dl, errors_of=Exception)
        got, errors = got + more, errors + failed
    stats = dl.stats()
    print(len(got), sorted(set(got)) == list(range(600)), len(errors), stats["workers"],
          bool(stats["workers_refused"]))
    print(errors[:2], stats["workers_refused"])
    dl.close()
""")


@pytest.mark.parametrize("workers", ["8", "auto"])
def test_a_pids_limit_shrinks_the_pool_and_costs_no_batch(tmp_path, workers):
    # Under a pids cgroup the 8th worker cannot be had: the loader is made,
    # keeps the workers it could start, and delivers every sample.
    cgroup = _pids_cgroup()
    if cgroup is None:
        pytest.skip("no pids cgroup can be made here (needs write access to a pids controller)")
    script = tmp_path / "limited.py"
    script.write_text(_UNDER_PIDS_LIMIT.replace("{tests!r}", repr(os.path.dirname(__file__))))
    done = _run_in_cgroup(cgroup, script, "16", workers)
    first, detail = done.stdout.splitlines()[:2]
    count, whole, errors, running, refused = first.split()
    assert (count, whole, errors) == ("1200", "True", "0"), detail
    if workers == "8":
        assert int(running) < 8 and refused == "True", detail


_LIMIT_LIFTED = textwrap.dedent("""
    import os, sys, time
    cgroup = sys.argv[1]
    open(os.path.join(cgroup, "pids.max"), "w").write("16")
    open(os.path.join(cgroup, "cgroup.procs"), "w").write(str(os.getpid()))
    import torch, stoker

    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return 200

        def __getitem__(self, i):
            time.sleep(0.002)
            return i

    dl = stoker.DataLoader(Slow(), batch_size=10, num_workers=8, persistent_workers=True)
    seen = []
    for b in dl:
        seen += b.tolist()
    capped = dl.stats()["workers"]
    open(os.path.join(cgroup, "pids.max"), "w").write("max")  # room again
    deadline = time.monotonic() + 60
    while dl.stats()["workers"] < 8 and time.monotonic() < deadline:
        for b in dl:
            seen += b.tolist()
    print(capped, dl.stats()["workers"], sorted(seen) == sorted(list(range(200)) * (len(seen) // 200)))
    dl.close()
""")


def test_the_pool_grows_again_once_the_pids_limit_has_room(tmp_path):
    # A refused fork caps the pool for a while, not for good: once the limit
    # is raised, the loader gets the 8 workers it was asked for.
    cgroup = _pids_cgroup()
    if cgroup is None:
        pytest.skip("no pids cgroup can be made here (needs write access to a pids controller)")
    script = tmp_path / "lifted.py"
    script.write_text(_LIMIT_LIFTED)
    done = _run_in_cgroup(cgroup, script)
    capped, grown, whole = done.stdout.split()
    assert int(capped) < 8 and grown == "8" and whole == "True", done.stdout


class _HangsOnAThread:
    """From sample 24 on, a sample never ends when a thread worker loads it
    (in this process); a worker process loads it at once. `hanging` is set
    once one hangs; `release` ends them."""

    def __init__(self):
        import threading
        self.pid = os.getpid()
        self.hanging = threading.Event()
        self.release = threading.Event()

    def __len__(self):
        return 64

    def __getitem__(self, i):
        import torch
        if i >= 24 and os.getpid() == self.pid:
            self.hanging.set()
            self.release.wait()
        return torch.tensor(i)


def _until_a_sample_hangs(dl, ds):
    """Takes batches, epoch after epoch (worker_kind="auto" starts with
    processes), until a thread worker hangs on a sample; the loader's timeout
    ends the wait for the batch that hangs."""
    for _ in range(200):
        try:
            for _ in dl:
                if ds.hanging.is_set():
                    return
        except RuntimeError:  # timed out: the hanging batch was next
            pass
        if ds.hanging.is_set():
            return
    raise AssertionError("no sample hung")


def _quick_kind_trial(set_attribute=setattr):
    """worker_kind="auto" tries threads after a short window of processes."""
    from stoker import _dataloader
    for name, value in (("WARMUP_S", 0.05), ("WINDOW_S", 0.1), ("MIN_BATCHES", 3)):
        set_attribute(_dataloader._KindTrial, name, value)


@pytest.mark.parametrize("kind", ["threads", "auto"])
def test_close_returns_while_a_thread_workers_sample_hangs(monkeypatch, kind):
    import threading
    _quick_kind_trial(monkeypatch.setattr)
    ds = _HangsOnAThread()
    try:
        dl = stoker.DataLoader(ds, batch_size=4, num_workers=2, worker_kind=kind, timeout=2)
        _until_a_sample_hangs(dl, ds)
        closing = threading.Thread(target=dl.close, daemon=True)
        closing.start()
        closing.join(20)
        assert not closing.is_alive(), "close() waited for the sample that hangs"
        with pytest.raises(ValueError, match="closed"):
            next(iter(dl))
    finally:
        ds.release.set()  # the batch ends after close(): dropped, nobody waits for it


@pytest.mark.parametrize("kind", ["threads", "auto"])
@pytest.mark.parametrize("how", ["close", "exit"])
def test_the_process_exits_while_a_thread_workers_sample_hangs(kind, how):
    # "exit": the loader is left open, for the atexit hook to close; neither
    # way may the interpreter's exit wait for the sample, or crash on it.
    src = textwrap.dedent(inspect.getsource(_HangsOnAThread) + "\n" +
                          inspect.getsource(_until_a_sample_hangs) + "\n" +
                          inspect.getsource(_quick_kind_trial))
    out = run_script(src + textwrap.dedent(f"""
        _quick_kind_trial()
        ds = _HangsOnAThread()
        dl = stoker.DataLoader(ds, batch_size=4, num_workers=2, worker_kind="{kind}", timeout=2)
        _until_a_sample_hangs(dl, ds)
        if "{how}" == "close":
            dl.close()
        print("done", flush=True)
    """), timeout=90)
    assert out.split() == ["done"]


@pytest.mark.parametrize("how", ["close", "exit"])
def test_the_process_exits_cleanly_while_thread_workers_compute(how):
    # Batches of samples in torch ops (which give the GIL back from C++):
    # a thread woken there once the interpreter finalises aborts the process,
    # so the batches of closed loaders stop at their next sample and the exit
    # waits for that.
    run_script(f"""
        a = torch.randn(300, 300)
        class Computes(torch.utils.data.Dataset):
            def __len__(self): return 64
            def __getitem__(self, i):
                end = time.monotonic() + (0.3 if i >= 8 else 0)
                while time.monotonic() < end:
                    a.mm(a)
                return torch.tensor(i)
        dl = stoker.DataLoader(Computes(), batch_size=8, num_workers=2, worker_kind="threads")
        next(iter(dl))
        time.sleep(0.5)  # both threads mid-batch
        if "{how}" == "close":
            dl.close()
    """)


from test_dataloader import segments_open  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402 -- after the importorskip above


class _SlowSamples(Dataset):
    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        time.sleep(0.02)
        return i


def _iterate_on_a_thread(loader):
    """Iterates `loader` on a thread of its own until it ends; returns the
    thread, the list its exception goes into, and an event set at its first batch."""
    import threading
    errors, first = [], threading.Event()

    def run():
        try:
            for _ in loader:
                first.set()
        except BaseException as e:  # noqa: BLE001 -- handed to the test
            errors.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert first.wait(30), "no batch came"
    return thread, errors


@pytest.mark.parametrize("make", ["processes", "threads", "native"])
def test_close_from_another_thread_stops_the_iteration_and_frees_everything(make):
    if make == "native":
        loader = stoker.Loader(stoker.Synthetic(100_000, shape=(3, 8, 8), read_latency_us=2000),
                               batch_size=16, workers=1)
    else:
        loader = stoker.DataLoader(_SlowSamples(), batch_size=4, num_workers=1, worker_kind=make)
    thread, errors = _iterate_on_a_thread(loader)
    started = [] if make != "processes" else \
        [loader._run.zygote_pid] + loader.stats()["worker_pids"]
    loader.close()  # while the other thread waits in next()
    thread.join(30)
    assert not thread.is_alive(), "the iterating thread did not return"
    assert len(errors) == 1 and "stopped" in str(errors[0]), errors
    with pytest.raises(ValueError, match="closed"):
        next(iter(loader))
    # Its zygote and worker processes are gone with it.
    assert wait_gone(started, 30) == [], "a worker process or the zygote outlived close()"


class _Gated(Dataset):
    """Sample 0 waits for `release`, on the thread that iterates (num_workers=0)."""

    def __init__(self):
        import threading
        self.inside, self.release = threading.Event(), threading.Event()

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 0:
            self.inside.set()
            self.release.wait(30)
        return i


def test_a_second_thread_is_refused_naming_no_other_api():
    # The refusal said "this stoker.Loader" to users of stoker.DataLoader.
    import threading
    ds = _Gated()
    with stoker.DataLoader(ds, batch_size=4, num_workers=0) as loader:
        got = []
        first = threading.Thread(target=lambda: got.extend(loader), daemon=True)
        first.start()
        assert ds.inside.wait(30), "the first thread did not start its epoch"
        try:
            with pytest.raises(ValueError) as refused:
                next(iter(loader))
        finally:
            ds.release.set()
        first.join(30)
    assert str(refused.value).startswith("this stoker loader is being iterated by another thread")
    assert [b.tolist() for b in got] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # the first epoch is whole


class _ClosesItsLoader(Dataset):
    loader = None

    def __len__(self):
        return 8

    def __getitem__(self, i):
        self.loader.close()  # inside the loader's own next(), on its thread
        return i


def test_close_from_inside_the_loaders_own_next_is_refused_not_waited_for():
    ds = _ClosesItsLoader()
    ds.loader = stoker.DataLoader(ds, batch_size=4, num_workers=0)
    with pytest.raises(Exception, match="close\\(\\) from inside"):
        next(iter(ds.loader))
    ds.loader.close()  # once the call returned, it closes, its engine too
    assert ds.loader._run.engine.closed
    with pytest.raises(ValueError, match="closed"):
        next(iter(ds.loader))


def test_ctrl_c_anywhere_in_construction_or_close_leaves_no_process_behind():
    # SIGALRM raises KeyboardInterrupt at random moments of making, iterating
    # and closing loaders, as Ctrl-C would; afterwards (the next loader's
    # start and end collect what an interrupted close left) the process has
    # no child left: no zygote, no worker, no zombie.
    out = run_script("""
        import gc, random, signal
        def interrupt(*_):
            raise KeyboardInterrupt
        signal.signal(signal.SIGALRM, interrupt)
        # Imported before any timer: CPython exits by SIGINT at the end of a
        # program once a KeyboardInterrupt has left a string exec (a dataclass
        # being made by a first import), even one the program caught.
        stoker.DataLoader
        rng = random.Random(7)
        interrupted = 0
        for attempt in range(60):
            try:
                try:
                    signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.0, 0.15))
                    dl = stoker.DataLoader(Numbers(), batch_size=8, num_workers=2)
                    next(iter(dl))
                    dl.close()
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except KeyboardInterrupt:
                interrupted += 1
            dl = None
            gc.collect()
        with stoker.DataLoader(Numbers(), batch_size=8, num_workers=1) as dl:
            assert len(list(dl)) == 8
        def children():
            out = []
            for task in os.listdir("/proc/self/task"):
                with open(f"/proc/self/task/{task}/children") as f:
                    out += f.read().split()
            return out
        deadline = time.monotonic() + 10
        while children() and time.monotonic() < deadline:
            time.sleep(0.05)
        states = []
        for pid in children():  # with what stoker knew of it, should one be left
            with open(f"/proc/{pid}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0] +
                              f":tracked={pid in stoker._workers._zygotes}"
                              f":killed={pid in stoker._workers._killed}")
        print(interrupted, states)
    """, timeout=240)
    interrupted, states = out.split(" ", 1)
    assert int(interrupted) >= 10, out  # the interrupts did land, in most runs
    assert states.strip() == "[]", f"children left: {states}"


class _Megabytes(Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        return torch.full((256 * 1024,), float(i))  # 1 MiB a sample


@pytest.mark.parametrize("persistent", [False, True])
def test_close_lets_go_of_the_shared_memory_of_a_loader_still_referenced(persistent):
    # `with ... as dl` keeps dl referenced after the block: its segments went
    # only with the object (before: about 36 MiB a closed loader; with
    # persistent workers, the next epoch's batches made ahead). A batch kept
    # past close() keeps its own segment only, until it is let go.
    before = segments_open()
    with stoker.DataLoader(_Megabytes(), batch_size=8, num_workers=2,
                           persistent_workers=persistent) as dl:
        kept = None
        for batch in dl:
            kept = batch if kept is None else kept
        del batch
        assert segments_open() > before
        if persistent:  # the next epoch's first batches, made ahead
            deadline = time.monotonic() + 60
            while dl.stats()["segment_bytes_in_use"] == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
    assert segments_open() - before == 1 and kept[1, 0].item() == 1.0  # still readable
    del kept
    assert segments_open() == before
    assert dl is not None  # referenced to the end


@pytest.mark.parametrize("use", ["none", "epoch", "break", "iterator_only"])
def test_a_loader_let_go_ends_its_processes_without_a_garbage_collection(use):
    # As torch's DataLoader frees its workers when dropped. Before, the loader
    # sat in reference cycles (its iterator, its plan's callback), and its
    # zygote and workers lived until the cycle collector ran (disabled here:
    # in a training loop it may not run for a long time).
    body = textwrap.dedent(f"""
        import gc
        gc.disable()
        use = {use!r}
        dl = stoker.DataLoader(Numbers(), batch_size=4, num_workers=2)
        procs = pids(dl)
        if use == "iterator_only":  # the loader goes first, its iterator reads on
            it = iter(dl)
            del dl
            assert sum(len(b) for b in it) == 64
            del it
        else:
            if use == "epoch":
                assert sum(len(b) for b in dl) == 64
            elif use == "break":
                for i, b in enumerate(dl):
                    if i == 2:
                        break
                del b
            del dl
        print(" ".join(map(str, procs)), flush=True)
        time.sleep(60)  # the processes go while this one lives on
    """)
    p = subprocess.Popen([sys.executable, "-c", PRELUDE + body], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        procs = [int(pid) for pid in p.stdout.readline().split()]
        assert procs, p.stderr.read()  # the zygote, and the workers once started
        assert wait_gone(procs, 20) == []
        assert p.poll() is None  # the script still runs: they went with the loader
    finally:
        p.kill()
        p.communicate()


@pytest.mark.parametrize("kind", ["threads", "processes"])
def test_the_process_exits_cleanly_with_only_an_iterator_left_of_its_loader(kind):
    # The loader is gone, its iterator read by a daemon thread: its run is
    # closed at the exit as the loader would have been (without: "terminate
    # called without an active exception", the engine's thread at finalisation).
    p = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(f"""
        import threading
        class Slow(torch.utils.data.Dataset):
            def __len__(self): return 100000
            def __getitem__(self, i):
                time.sleep(0.001)
                return torch.tensor(i)
        it = iter(stoker.DataLoader(Slow(), batch_size=4, num_workers=2, worker_kind={kind!r}))
        next(it)
        def read():
            try:
                for _ in it:
                    pass
            except stoker.Cancelled:
                pass
        threading.Thread(target=read, daemon=True).start()
        time.sleep(0.5)
        print("done", flush=True)
    """)], capture_output=True, text=True, timeout=90)
    assert p.returncode == 0 and p.stdout.split() == ["done"], p.stderr
    assert "terminate" not in p.stderr, p.stderr


# A store that hangs, for stoker's own workers: every read sleeps 10 minutes,
# in C++, where no signal or stop reaches it. The first next() is cut short
# by a timer signal, with both workers inside a read.
_HUNG_STORE = textwrap.dedent("""
    import signal, sys, stoker
    class Cut(Exception): pass
    def cut(*_): raise Cut()
    signal.signal(signal.SIGALRM, cut)
    # Ctrl-C as in a terminal, whoever started the tests: a shell's
    # background job starts with SIGINT ignored, and Python keeps that.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    source = stoker.Synthetic(size=64, shape=(4,), read_latency_us=600e6)
    loader = stoker.Loader(source, batch_size=4, workers=2, shuffle=False)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        next(iter(loader))
    except Cut:
        pass
    print("reading", flush=True)
""")


@pytest.mark.parametrize("how", ["close", "exit"])
def test_close_names_the_samples_a_hung_read_holds_and_does_not_wait_for_ever(how):
    # close(): after 10 s a warning names the samples the workers are still on,
    # and Ctrl-C leaves them behind; at the interpreter's exit they are left
    # behind once named. torch's DataLoader ends its workers after 5 s.
    body = _HUNG_STORE + ("loader.close()\nprint('closed', flush=True)\n" if how == "close" else "")
    import threading
    p = subprocess.Popen([sys.executable, "-c", body], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(90, p.kill)  # a close that waits for ever ends the reads below
    watchdog.start()
    try:
        assert p.stdout.readline() == "reading\n"
        named = ""
        while "close() has waited" not in named:
            line = p.stderr.readline()
            assert line, f"ended without naming what it waited for: {p.stderr.read()}"
            named += line
        if how == "close":
            p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        watchdog.cancel()
        p.kill()
        p.wait()
    assert "2 workers still on sample " in named and "(synthetic:" in named, named
    if how == "close":
        assert "Ctrl-C stops waiting and leaves them behind" in named
        assert "KeyboardInterrupt" in err and "closed" not in out, (out, err)
    else:
        assert "the interpreter exits without them" in named and p.returncode == 0, err
