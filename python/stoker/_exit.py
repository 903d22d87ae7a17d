"""The interpreter's exit: every stoker loader still open (stoker.Loader and
stoker.DataLoader) is closed before finalisation begins.

A loader's threads must not outlive the interpreter. Once finalisation has
begun, a thread other than the main one that takes the GIL back is ended by
the interpreter where it stands; inside C++ (a daemon thread iterating a
loader, whose next() waits for a batch without the GIL; a thread worker in a
torch op) that ends in std::terminate ("terminate called without an active
exception", SIGABRT). Closed here, while threads still run, such a next()
raises SystemExit, which ends its thread without a word (as torch's daemon
threads stop at the exit), and the engine's own threads are joined before
the exit runs any static destructor they could use.
"""

import atexit
import os
import threading
import weakref

from . import _stoker, _workers

_open = weakref.WeakSet()

# How long the exit waits for thread workers' batches to stop (at their next
# sample, their loaders closed): 2 s, or while they compute, said on stderr
# past 10 s (see wait_for_thread_batches).
_GRACE_S = 2.0
_BUSY_S = 10.0


def close_at_exit(loader):
    """Has ``loader.close()`` called at the interpreter's exit if it is still
    alive then (held weakly: a loader collected before is closed by its own
    ``__del__``)."""
    _open.add(loader)


_exiting = False  # the exit closes the loaders


def ends_quietly():
    """Whether a loader's stop seen now (its next() cancelled, or used after
    close()) is the exit's, in a thread other than the main one: that
    thread ends with SystemExit, which threading's excepthook leaves
    unsaid, not a traceback ending "stoker.Cancelled" on every exit of a
    program with a daemon thread iterating."""
    return _exiting and threading.current_thread() is not threading.main_thread()


# A forked child's loaders are its parent's: nothing of theirs to close there.
os.register_at_fork(after_in_child=_open.clear)


@atexit.register
def _close_open_loaders():
    # A worker still on an item after a while (a read of a store that hangs)
    # is named and left behind: the process ends without it.
    global _exiting
    _exiting = True
    _stoker.closing_at_exit()
    for loader in list(_open):
        try:
            loader.close()
        except Exception:  # noqa: BLE001 -- the interpreter is exiting; nothing to tell
            pass
    _workers.sweep_zygotes(patience_s=1.0)  # those Ctrl-C left, killed: they end at once
    _workers.wait_for_thread_batches(_GRACE_S, _BUSY_S)
