"""A loader's workers are threads, which fork() does not copy: in a forked
child the loader raises RuntimeError saying so, instead of hanging."""

import os
import signal
import subprocess
import sys
import time

import pytest

import stoker


def _loader():
    return stoker.Loader(stoker.Synthetic(size=40, shape=(2,)), batch_size=4, workers=2,
                         rank=0, world_size=1, output="numpy")


def _wait(pid, seconds=120):
    """The child's exit code; fails (after killing it) when it hangs."""
    deadline = time.monotonic() + seconds
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung")
        time.sleep(0.01)


def _child_sees_the_fork_error(loader, parent):
    try:
        next(iter(loader))
    except RuntimeError as e:
        expected = (f"this stoker loader was made in process {parent} and cannot be used in a "
                    f"forked child (pid {os.getpid()}); make a new loader in the child")
        if type(e) is not RuntimeError or str(e) != expected:
            return 2
    else:
        return 1
    for call in (loader.state_dict, lambda: loader.set_epoch(1), loader.stats):
        try:
            call()
            return 3
        except RuntimeError:
            pass
    return 0


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork() of a threaded process
def test_a_forked_child_gets_an_error_and_the_parent_goes_on():
    loader = _loader()
    it = iter(loader)
    next(it)
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        code = 4
        try:
            code = _child_sees_the_fork_error(loader, parent)
        finally:
            os._exit(code)
    code = _wait(pid)
    assert code == 0, "1: it delivered; 2: another error; 3: a call was let by; 4: it crashed"
    assert sum(len(y) for _, y in it) == 36


_IN_TORCH_WORKERS = r"""
import sys
import torch
import stoker

class Wrapped(torch.utils.data.IterableDataset):
    def __init__(self):
        self.loader = stoker.Loader(stoker.Synthetic(size=40, shape=(2,)), batch_size=4,
                                    workers=2, rank=0, world_size=1)
    def __iter__(self):
        return iter(self.loader)

try:
    for _ in torch.utils.data.DataLoader(Wrapped(), batch_size=None, num_workers=2):
        pass
except RuntimeError as e:
    print(e)
    sys.exit(0)
sys.exit(3)
"""


def test_a_loader_in_torch_dataloader_workers_is_an_error_not_a_hang():
    pytest.importorskip("torch")
    run = subprocess.run([sys.executable, "-c", _IN_TORCH_WORKERS], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, f"exit {run.returncode}: {run.stdout[-2000:]}{run.stderr[-2000:]}"
    assert "cannot be used in a forked child" in run.stdout, run.stdout
    assert "make a new loader in the child" in run.stdout
