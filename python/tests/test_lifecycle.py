"""stoker.DataLoader's processes beside processes the user forks: close()
never waits on them, and the zygote and workers never outlive the loader's
process because another process holds a copy of its socket."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("torch")

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
