"""Worker processes for stoker.DataLoader: the zygote, the worker loop, and the
batch format in shared memory. The parent's half of the protocol is C++
(python/src/process_workers.cc); messages, the segment header and the
descriptors are laid out once, in python/src/worker_protocol.h, and read here
by name through ``_stoker.protocol`` (docs/dataloader.md has the table).

A zygote is forked once, when the DataLoader is made, before stoker starts any
thread for it; it holds the dataset (inherited, never pickled) and forks one
worker per engine worker thread on request. A worker runs one batch per task:
``dataset[i]`` for each index, with Python's, numpy's and torch's generators
seeded once from (seed, epoch, batch) -- a batch always runs whole and in
order in one process, so the data do not depend on which worker runs it --
then the collate function, then writes the result into the task's segment:
tensors and arrays as raw bytes, everything else pickled beside them.
"""

import ctypes
import errno
import functools
import gc
import io
import mmap
import multiprocessing
import os
import pickle
import select
import signal
import socket
import struct
import sys
import threading
import time
import traceback

from . import _stoker

P = _stoker.protocol
_WORD = struct.Struct("=q")
_HEADER = P.SEGMENT_HEADER
_ALIGN = P.DATA_ALIGN
_GROW = P.SEGMENT_GRAIN
_KINDS = {getattr(P, name).tag: getattr(P, name) for name in dir(P)
          if hasattr(getattr(P, name), "tag")}
_PARENT_CHECK_S = 1.0  # how often an idle zygote checks that its parent lives


def _message(kind, text=None, **words):
    """Message `kind` (a protocol layout, e.g. P.DONE) with its words by name,
    then its text (str, or bytes as they go) for the kinds that carry text."""
    if sorted(words) != sorted(kind.fields):
        raise TypeError(f"{kind.tag.decode()} takes words {kind.fields}, got {tuple(words)}")
    values = [0] * kind.words
    for name, value in words.items():
        values[getattr(kind, name)] = value
    body = b"".join(_WORD.pack(v) for v in values)
    if kind.text:
        body += text if isinstance(text, bytes) else text.encode(errors="replace")
    return kind.tag.ljust(P.TAG_BYTES, b"\0") + body


def _parse(data):
    """(kind, words) of a received message; kind None for a tag the protocol
    lacks; end of file (b"") reads as EXIT."""
    if not data:
        return P.EXIT, []
    kind = _KINDS.get(data[:P.TAG_BYTES].rstrip(b"\0"))
    if kind is None or kind.text:
        return kind, []
    end = P.TAG_BYTES + kind.words * _WORD.size
    return kind, [w for (w,) in _WORD.iter_unpack(data[P.TAG_BYTES:end])]


def _pdeathsig():
    """A worker dies with its zygote (single-threaded, so with the process).
    The zygote itself is not tied so: the signal would come when the thread
    that made the loader ends; it leaves at end of file on its socket."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: end of file on the socket still ends the loop


# --- the zygote ---------------------------------------------------------------

# What the system refuses for want of a resource (descriptors, processes,
# memory): a ResourceError naming what was asked, not a bare OSError. The
# engine's text names the descriptor limits (errno_message); these the rest.
_REFUSED = {errno.EMFILE: "", errno.ENFILE: "",
            errno.EAGAIN: " (RLIMIT_NPROC or the cgroup's pids.max)", errno.ENOMEM: " (memory)"}


def _refused(what, error):
    """`error` (an OSError) as stoker.ResourceError naming what was asked,
    where the system refused a resource; else `error` itself."""
    limit = _REFUSED.get(error.errno)
    if limit is None:
        return error
    return _stoker.ResourceError(_stoker.errno_message(what, error.errno) + limit)


def start_zygote(job, context=None):
    """Starts the zygote for ``job`` (a _Job); returns (parent's socket fd,
    pid). Forked here, or with a "spawn" or "forkserver" multiprocessing
    ``context`` started afresh by it (the job is then pickled, as torch's
    workers' datasets are under those methods)."""
    sweep_zygotes()
    try:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    except OSError as e:
        raise _refused("the socket to the worker processes' zygote (socketpair)", e) from e
    if context is not None and context.get_start_method() != "fork":
        process = context.Process(target=_zygote_main, args=(child, job, True), daemon=False,
                                  name="stoker-zygote")
        try:
            process.start()
        finally:
            child.close()
        # Collected by end_zygote, not by multiprocessing (a zygote outlives no loader).
        multiprocessing.process._children.discard(process)
        _zygotes.add(process.pid)
        try:
            _await_started(parent, process, context.get_start_method())
        except BaseException:  # Ctrl-C in the wait too: the zygote goes with the error
            parent.close()
            if process.exitcode is None:  # once collected its pid may be another's
                _kill(process.pid)
            end_zygote(process.pid)
            raise
        return parent.detach(), process.pid
    _stoker.register_fd(parent.fileno())
    pid = None
    try:
        pid = os.fork()
        if pid:
            _zygotes.add(pid)
        if pid == 0:  # the zygote
            # What the program left for its collector stays uncollected here: the
            # finalizers of its garbage (a torch iterator's, a file's flush) are not ours to run.
            gc.freeze()
            code = 0
            try:
                _name_self(_ZYGOTE_NAME)  # how a sweep knows it, should its pid be lost
                _stoker.close_registered_fds(-1)  # other loaders' segments and sockets, our parent end
                _zygote_main(child, job)
            except BaseException:  # noqa: BLE001 -- a zygote never returns into the user's program
                code = 1
            finally:
                os._exit(code)
        child.close()
        _stoker.unregister_fd(parent.fileno())
        return parent.detach(), pid
    except BaseException as e:  # Ctrl-C right after the fork: the zygote goes with the error
        if pid:
            _kill(pid)
            end_zygote(pid)
        _stoker.unregister_fd(parent.fileno())
        if pid is None and isinstance(e, OSError):
            parent.close()
            child.close()
            raise _refused("forking the worker processes' zygote", e) from e
        raise


def _await_started(sock, process, method):
    """Waits for a started zygote's HELLO. One that ends first failed while
    its interpreter started: the main module, run again there, making a
    loader at import (no ``if __name__ == "__main__":`` guard), or the job
    naming a class or function that only the guarded block defines."""
    while not select.select([sock], [], [], 0.5)[0] and process.exitcode is None:
        pass
    if select.select([sock], [], [], 0)[0] and _parse(sock.recv(4096))[0] is P.HELLO:
        return
    process.join(5)
    raise RuntimeError(
        f"the worker processes' zygote (pid {process.pid}), started by multiprocessing_context "
        f"{method!r}, ended before it was ready ({_ended_how(process.exitcode)}; its error is "
        f"printed above): under {method!r} the main module is run again in it, without what its "
        "`if __name__ == \"__main__\":` block defines, so the code that makes and iterates "
        "loaders must be inside that block, and the dataset's classes and functions outside it "
        "(importable), as torch's DataLoader needs under that method too")


def _ended_how(code):
    """A multiprocessing exit code as words."""
    if code is None:
        return "it closed its socket"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


# Every zygote started and not yet collected: collected by end_zygote, or by
# the next sweep when Ctrl-C cut a close() short or orphaned a loader being
# made (its zygote exits when its socket closes); never a zombie for the life
# of the program.
_zygotes = set()
_killed = set()  # of those, killed by an interrupted end_zygote: they end at once


def end_zygote(pid, patience_s=5.0):
    """Collects a zygote told to exit, killing it if it outstays `patience_s`;
    interrupted, kills it and leaves it to sweep_zygotes. Then sweeps."""
    try:
        _wait(pid, patience_s=patience_s)
    except BaseException:
        _kill(pid)
        _killed.add(pid)
        # Collected the moment it ends, whether or not another loader sweeps.
        threading.Thread(target=_reap, args=(pid,), name="stoker-reap", daemon=True).start()
        raise
    _zygotes.discard(pid)
    sweep_zygotes()


def _reap(pid):
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:  # a sweep collected it first
        pass
    _zygotes.discard(pid)
    _killed.discard(pid)


_ZYGOTE_NAME = "stoker-zygote"


def _name_self(name):
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(name)
    except OSError:
        pass


def _lost_zygotes():
    """Zombie children named as zygotes whose pids were never recorded: Ctrl-C
    handled right after os.fork() returned, before the pid was stored."""
    lost = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return lost
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                pids = [int(p) for p in f.read().split()]
        except (OSError, ValueError):
            continue
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    comm, state = f.read().rsplit(")", 1)
            except OSError:
                continue
            if state.split()[0] == "Z" and comm.endswith("(" + _ZYGOTE_NAME):
                lost.append(pid)
    return lost


def sweep_zygotes(patience_s=1.0):
    """Collects the zygotes that have ended, waiting up to `patience_s` for
    those killed (a live one is left alone), and any zygote whose pid was lost."""
    for pid in _lost_zygotes():
        if pid not in _zygotes:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
    deadline = time.monotonic() + patience_s
    for pid in list(_zygotes):
        while True:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done or pid not in _killed or time.monotonic() >= deadline:
                break
            time.sleep(0.001)
        if done:
            _zygotes.discard(pid)
            _killed.discard(pid)


def _zygote_main(ctl, job, greet=False):
    """Serves the parent until it says EXIT, closes its socket, or dies (a
    process forked by the user may hold a copy of the parent's socket, so
    the zygote also watches its parent's pid), then ends its workers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    if greet:  # started afresh: start_zygote waits for it
        ctl.send(_message(P.HELLO))
    torch = sys.modules.get("torch")
    if torch is not None:  # its workers inherit it (see _worker_main)
        torch.set_num_threads(1)
    parent = os.getppid()
    ctl.settimeout(_PARENT_CHECK_S)
    children = set()
    while True:
        try:
            data = ctl.recv(4096)
        except socket.timeout:
            if os.getppid() == parent:
                continue
            data = b""
        except OSError:
            data = b""
        kind, words = _parse(data)
        try:
            if kind is P.FORK:
                _fork_worker(ctl, job, words[P.FORK.worker_id], words[P.FORK.num_workers],
                             children)
            elif kind is P.REAP:
                pid = words[P.REAP.pid]
                signalled, value = _wait(pid, patience_s=2.0)
                children.discard(pid)
                ctl.send(_message(P.REAPED, signalled=signalled, value=value))
        except (BrokenPipeError, ConnectionResetError):
            kind = P.EXIT  # the loader closed while this answered: as its EXIT
        if kind is P.EXIT:
            for pid in children:
                _kill(pid)
            for pid in children:
                _wait(pid)
            return


def _fork_worker(ctl, job, worker_id, num_workers, children):
    try:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
    except OSError as e:
        ctl.send(_message(P.FORKFAIL, str(e)))
        return
    if pid == 0:  # the worker
        code = 0
        try:
            ctl.close()
            mine.close()
            _pdeathsig()
            _worker_main(theirs, job, worker_id, num_workers)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the loader closed while this worker started: nobody to tell
        except BaseException:  # noqa: BLE001 -- the loader reports the exit; the why goes here
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    theirs.close()
    children.add(pid)
    socket.send_fds(ctl, [_message(P.FORKED, pid=pid)], [mine.fileno()])
    mine.close()


def _kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _wait(pid, patience_s=None):
    """(0, exit code) or (1, signal); kills a process that outstays `patience_s`."""
    deadline = None if patience_s is None else time.monotonic() + patience_s
    while True:
        try:
            done, status = os.waitpid(pid, 0 if deadline is None else os.WNOHANG)
        except ChildProcessError:
            return 0, -1
        if done:
            if os.WIFSIGNALED(status):
                return 1, os.WTERMSIG(status)
            return 0, os.WEXITSTATUS(status)
        if time.monotonic() > deadline:
            _kill(pid)
            deadline = None
        else:
            time.sleep(0.001)


# --- a worker -----------------------------------------------------------------

class _Job:
    """What every worker of one loader runs: picked up by fork, never pickled."""

    def __init__(self, dataset, collate_fn, default_collate, worker_init_fn, unbatched,
                 shards=None):
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.default_collate = default_collate
        self.worker_init_fn = worker_init_fn
        self.unbatched = unbatched
        self.shards = shards  # a sharded stream's _shards.ShardJob: an item is a shard


def _seed_all(seed):
    import random
    random.seed(seed)
    torch = sys.modules.get("torch")
    if torch is not None:  # the CPU generator only: torch.manual_seed costs 30x more
        torch.default_generator.manual_seed(seed)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(seed % (1 << 32))


def _set_worker_info(job, worker_id, num_workers, seed):
    """torch's get_worker_info() in this worker: its id, the workers running
    now, the base seed plus the id (as torch's), the dataset."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    from torch.utils.data._utils import worker as torch_worker
    torch_worker._worker_info = torch_worker.WorkerInfo(
        id=worker_id, num_workers=num_workers, seed=seed + worker_id, dataset=job.dataset)


def _clear_worker_info():
    """get_worker_info() gives None again, as outside a worker."""
    torch = sys.modules.get("torch")
    if torch is not None:
        from torch.utils.data._utils import worker as torch_worker
        torch_worker._worker_info = None


class _Segment:
    """A worker's mapping of one segment, remapped when its size changes. A
    grown segment keeps its old mappings until the task ends: tensors made
    during the task may still view them (the same file, so the same bytes)."""

    def __init__(self, fd):
        self.fd = fd
        self.map = None
        self.size = 0
        self.address = 0  # of self.map
        self.retired = []  # (map, address, size)

    def ensure(self, size):
        if self.map is not None and self.size == size:
            return
        if self.map is not None:
            self.retired.append((self.map, self.address, self.size))
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)  # no fault per page later
        self.map = mmap.mmap(self.fd, size, flags=flags)
        self.size = size
        view = ctypes.c_char.from_buffer(self.map)
        self.address = ctypes.addressof(view)
        del view  # its export would keep the map from closing

    def mappings(self):
        """(address, size) of each mapping this process holds of the segment."""
        held = [(a, n) for m, a, n in self.retired if not m.closed]
        return held + ([(self.address, self.size)] if self.map is not None else [])

    def grow(self, needed):
        size = max(needed + needed // 16, _GROW)  # batches of one shape need no more
        size = (size + _GROW - 1) // _GROW * _GROW
        os.ftruncate(self.fd, size)
        os.posix_fallocate(self.fd, 0, size)  # an error now, never SIGBUS later
        self.ensure(size)

    def end_task(self):
        for old, _, _ in self.retired:
            try:
                old.close()
            except BufferError:  # a tensor still views it: it goes with the tensor
                pass
        self.retired = []


class _Writer:
    """Places a task's arrays in its segment, one after the other from the
    data offset; remembers the tensors made in place (no copy needed)."""

    def __init__(self, seg, start):
        self.seg = seg
        self.cursor = start
        self.placed = {}  # id(tensor) -> (tensor, offset)

    def reserve(self, nbytes):
        off = (self.cursor + _ALIGN - 1) // _ALIGN * _ALIGN
        if off + nbytes > self.seg.size:
            self.seg.grow(off + nbytes)
        self.cursor = off + nbytes
        return off

    def empty(self, dtype, shape):
        """A tensor of `shape` living in the segment."""
        import torch
        count = 1
        for d in shape:
            count *= d
        nbytes = count * torch.empty((), dtype=dtype).element_size()
        off = self.reserve(nbytes)
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        t = torch.frombuffer(self.seg.map, dtype=torch.uint8, count=nbytes,
                             offset=off).view(dtype).view(shape)
        self.placed[id(t)] = (t, off)
        return t


def batch_scheduling():
    """The calling thread runs under SCHED_BATCH, as the engine's worker
    threads do (LoaderOptions::batch_scheduling): the same CPU share, but a
    waking consumer (or the thread bringing a remote batch in) is not kept
    waiting behind it. A refusal is harmless."""
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError):
        pass


def _worker_main(sock, job, worker_id, num_workers):
    _name_self("stoker-worker")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    batch_scheduling()
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != 1:
        # Parallelism comes from the processes (torch's workers do this too);
        # set once in the zygote, so a worker under a pids limit need not.
        torch.set_num_threads(1)
    sock.send(_message(P.HELLO))
    # It starts before iter() draws the epoch's base seed, which INIT brings.
    try:
        kind, words = _parse(sock.recv(4096))
    except OSError:
        return
    if kind is not P.INIT:
        return
    seed = words[P.INIT.base_seed]
    _set_worker_info(job, worker_id, num_workers, seed)
    try:
        _seed_all(seed + worker_id)
        if job.worker_init_fn is not None:
            job.worker_init_fn(worker_id)
    except BaseException as e:  # noqa: BLE001 -- said to the parent, which raises it as its type
        sock.send(_failed(P.INITFAIL, f"{type(e).__name__}: {e}", traceback.format_exc(), e,
                          refused=0))
        return
    # CPU time from here, as the run-queue delay below: its tasks', never the start-up's.
    started_cpu = time.process_time_ns()
    sock.send(_message(P.INITDONE))
    segments = {}
    memory = _Memory(segments)
    # Run-queue delay while waking for a task and running it, summed: what the
    # consumer's wall time for its batches holds (never the start-up's).
    queued = 0
    while True:
        waiting_since = _run_delay_ns()
        try:
            data, fds, flags, _ = socket.recv_fds(sock, 4096, 1)
        except OSError:
            return
        kind, words = _parse(data)
        if kind is P.YIELD or kind is P.DROP:  # came after its item ended: nothing to stop
            continue
        if kind is not P.TASK:
            return
        T = P.TASK
        epoch, batch, seg_id = words[T.epoch], words[T.batch], words[T.segment]
        seg_size = words[T.segment_size]
        if words[T.num_workers] != num_workers:  # the pool was resized
            num_workers = words[T.num_workers]
            _set_worker_info(job, worker_id, num_workers, seed)
        if fds:
            segments[seg_id] = _Segment(fds[0])
        seg = segments.get(seg_id)
        try:
            if seg is None:
                # The segment's descriptor came cut off: this process had
                # none free for it (the kernel drops what does not fit).
                code = errno.EMFILE if flags & socket.MSG_CTRUNC else errno.EBADF
                raise OSError(code, os.strerror(code))
            seg.ensure(seg_size)
            meta_off, meta_len, kept, failures, collate_error = _run_task(
                job, seg, epoch, batch, functools.partial(memory.check, words[T.memory_limit]),
                sock.send, functools.partial(_asked, sock))
        except _Dropped as d:  # its epoch was abandoned: nothing of it is wanted
            del d  # its frames hold the shard's batches, which view the segment
            seg.end_task()
            sock.send(_message(P.DROPPED))
            continue
        except _Yielded as y:
            words = dict(resume_offset=y.offset, resume_length=y.length, data_end=y.data_end)
            del y  # its frames hold the shard's batches, which view the segment
            seg.end_task()
            sock.send(_message(P.YIELDED, segment_size=seg.size, **words))
            continue
        except _OverLimit as over:
            # Its memory goes only with the process: the parent forks a fresh one.
            sock.send(_message(P.OVER, samples=over.samples, private_bytes=over.private))
            return
        except BaseException as e:  # noqa: BLE001 -- the loader names the batch
            # Writing the batch (its segment, its mapping) met a limit: the
            # machine's, named with the way out, never a DataError.
            said = _refused("the batch's shared-memory segment", e) if isinstance(e, OSError) else e
            sock.send(_task_failed("the batch failed outside its samples: " +
                                   (str(said) if said is not e else f"{type(e).__name__}: {e}"),
                                   traceback.format_exc(), e, refused=not_the_samples_fault(e)))
            continue
        for index, reason, trace, fatal, error in failures:
            sock.send(_sample_failed(index, reason, trace, fatal, error))
        if collate_error is not None:
            sock.send(_task_failed(*collate_error))
            continue
        cpu = time.process_time_ns() - started_cpu
        queued += _run_delay_ns() - waiting_since
        memory.ended()
        sock.send(_message(P.DONE, samples=len(kept), segment_size=seg.size, meta_offset=meta_off,
                           meta_length=meta_len, cpu_ns=cpu, run_delay_ns=queued,
                           private_bytes=memory.estimate()))
        memory.refresh()


class _OverLimit(Exception):
    """The worker's unique memory passed its task's memory_limit after `samples`."""

    def __init__(self, samples, private):
        super().__init__(samples, private)
        self.samples, self.private = samples, private


class _Memory:
    """This worker's unique memory, known at every sample: measured exactly
    (smaps_rollup, milliseconds in a process with torch) about once a second,
    and in between by what its anonymous resident pages (statm, microseconds)
    grew since that measure -- new allocations show at once; copy-on-write
    of inherited pages shows at the next exact measure."""

    def __init__(self, segments):
        self.segments = segments  # id -> _Segment: the loader's memory, not this worker's
        self.exact, self.anon, self.measured_at = 0, 0, 0.0
        self.start, self.grew = 0, 0  # at the batch's start; over the last batch
        self.batches = 0  # ended in this process
        try:
            self._statm = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._statm = None

    def _anon(self):
        if self._statm is None:
            return 0
        try:
            fields = os.pread(self._statm, 128, 0).split()
            return (int(fields[1]) - int(fields[2])) * _PAGE
        except (OSError, IndexError, ValueError):
            return 0

    def measure(self):
        # A segment's pages that only this worker maps show as private in
        # smaps, yet the parent counts every segment against the budget
        # already: counted here too, they would count twice.
        own = _own_private_bytes() - _exclusive_bytes(
            m for seg in self.segments.values() for m in seg.mappings())
        self.exact, self.anon, self.measured_at = max(0, own), self._anon(), time.monotonic()
        return self.exact

    def estimate(self):
        """The unique memory now; 0 until first measured."""
        if not self.measured_at:
            return 0
        return self.exact + max(0, self._anon() - self.anon)

    def refresh(self):
        """After a reply (reading smaps walks every mapping): the exact figure,
        at most once a second."""
        if time.monotonic() - self.measured_at > 1.0:
            self.measure()

    def check(self, limit, samples):
        """Raises _OverLimit when the unique memory passed `limit` (0: none)
        with `samples` of the batch made, or, before its first sample, would
        pass it by the end of a batch that grows it as the last one did (so
        that no work is thrown away); exact before it raises."""
        if not limit:
            return
        if not self.measured_at:
            self.measure()
        now = self.estimate()
        if samples == 0:
            self.start = now
            if now + self.grew > limit and self.measure() + self.grew > limit:
                raise _OverLimit(samples, self.exact)
        elif now > limit and self.measure() > limit:
            raise _OverLimit(samples, self.exact)

    def ended(self):
        """At the batch's end, before its reply. A process's first batch
        holds its one-time growth (a cache or file the dataset opens on first
        use), which later batches do not repeat: it predicts nothing (else
        every process would be replaced after its first batch)."""
        grew = max(0, self.estimate() - self.start)
        self.grew = grew if self.batches else 0
        self.batches += 1


_PAGE = os.sysconf("SC_PAGE_SIZE")


def _sample_failed(index, reason, trace, fatal, error):
    """The SAMPFAIL message of a sample that raised `error`, for the parent
    to raise as its type (not what is not the sample's fault: a plain
    ResourceError)."""
    return _failed(P.SAMPFAIL, reason, trace, None if fatal else error, index=index,
                   not_the_samples_fault=int(fatal))


def _task_failed(reason, trace, error, refused=False):
    """The TASKFAIL message of a batch that failed outside its samples
    (collate_fn raised), for the parent to raise as the error's type; where
    the machine `refused` a resource writing it (memory, descriptors: no
    fault of the data's), as a plain ResourceError."""
    return _failed(P.TASKFAIL, reason, trace, None if refused else error, refused=int(refused))


def _failed(kind, reason, trace, error, **words):
    """A FAIL message: its text, then `error` pickled (none for None), within
    the longest message the parent reads."""
    text = f"{reason}\0{trace}".encode(errors="replace")
    room = P.MAX_MESSAGE_BYTES - P.TAG_BYTES - kind.words * _WORD.size - len(text)
    pickled = b"" if error is None else _pickled_exception(error, room)
    return _message(kind, text + pickled, exception_bytes=len(pickled), **words)


class _TooLong(Exception):
    pass


class _Bounded(io.BytesIO):
    """Bytes written up to `limit`; past it, a write raises _TooLong (a huge
    exception is not pickled whole only to be dropped)."""

    def __init__(self, limit):
        super().__init__()
        self.limit = limit

    def write(self, data):
        if self.tell() + memoryview(data).nbytes > self.limit:
            raise _TooLong
        return super().write(data)


def _pickled_exception(error, limit, pickler=pickle.Pickler):
    """(type, error) pickled, for the parent to raise as that type with the
    original as its cause; else (type, None) when the exception does not
    survive pickle here (a field that does not pickle, a constructor its
    args do not fit); else b"" (a type pickle cannot name, or over `limit`
    bytes). `pickler`: a remote worker's is cloudpickle's. Best effort:
    never raises."""
    for value in ((type(error), error), (type(error), None)):
        out = _Bounded(limit)
        try:
            pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
            pickle.loads(out.getvalue())
        except Exception:  # noqa: BLE001 -- anything a user's class may raise
            continue
        return out.getvalue()
    return b""


def _own_private_bytes():
    """This process's unique memory, what it costs beyond what it shares with
    the zygote and the other workers: the private pages it wrote. Clean ones
    are left out: they are a file's cached pages (a numpy.memmap read), the
    kernel's to drop, which stay when the process goes."""
    total = 0
    try:
        with open("/proc/self/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Private_Dirty:"):
                    total += int(line.split()[1]) * 1024
    except OSError:
        pass
    return total


# The last byte of a pagemap entry, read as 1 where bit 63 (present) and bit
# 56 (mapped by this process alone) are set: a page smaps counts as private.
_EXCLUSIVE = bytes(int(v & 0x81 == 0x81) for v in range(256))


def _exclusive_bytes(mappings):
    """Bytes of the (address, size) mappings whose pages no other process
    maps, from /proc/self/pagemap (its flags need no privilege); 0 where it
    cannot be read."""
    total = 0
    try:
        fd = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        for address, size in mappings:
            entries = os.pread(fd, size // _PAGE * 8, address // _PAGE * 8)
            total += entries[7::8].translate(_EXCLUSIVE).count(1) * _PAGE
    except OSError:
        pass
    finally:
        os.close(fd)
    return total


_schedstat = None  # this worker's /proc/thread-self/schedstat, opened once


def _run_delay_ns():
    global _schedstat
    try:
        if _schedstat is None:
            _schedstat = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
        return int(os.pread(_schedstat, 128, 0).split()[1])
    except (OSError, IndexError, ValueError):
        return 0


class _NoSample:
    """What a batch whose every sample failed carries, so that the consumer
    skips it; a collate_fn may return None, and that is delivered (as
    torch's). Pickled by name: the same object in every process."""

    def __reduce__(self):
        return "NO_SAMPLE"

    def __repr__(self):
        return "stoker._workers.NO_SAMPLE"


NO_SAMPLE = _NoSample()


def not_the_samples_fault(e):
    """An exception on_error="skip" must not skip: out of memory (Python's,
    or an allocator's: torch's "can't allocate memory", CUDA's "out of
    memory"), or an OSError whose errno is the machine's or the store's (a
    refused resource, a store gone or out of reach), as the engine classes
    errnos."""
    if isinstance(e, MemoryError):
        return True
    if isinstance(e, RuntimeError):
        text = str(e)
        return "can't allocate memory" in text or "out of memory" in text
    return isinstance(e, OSError) and e.errno is not None and \
        not _stoker.errno_is_sample_error(e.errno)


def keys_of(indices, keys):
    """What dataset[...] gets for each of a batch's `indices`: the indices,
    or with `keys` (the sampler's keys, pickled: tuples, strings, floats...)
    the keys at those positions, as the sampler gave them."""
    if keys is None:
        return indices
    table = pickle.loads(keys)
    return [table[p] for p in indices]


def _load(job, indices, seed, at=None, samples=None, consumer=False, keys=None):
    """(samples, their indices, failures) of one batch, its generators seeded
    once; `at(position)` is told which sample is next (-1: done). `keys`:
    what dataset[...] gets for each index (default: the index). `samples`:
    where they go (a list, or a _Stream that places them as they come). A
    failure is (index, reason, traceback, not the sample's fault, the
    exception, its traceback cut to start at __getitem__). Whatever a sample
    raises is its failure, SystemExit and the like included, except on the
    `consumer`'s thread (num_workers=0), where Ctrl-C and SystemExit
    propagate as they would without a loader."""
    _seed_all(seed)
    samples = [] if samples is None else samples
    kept, failures = [], []
    keys = indices if keys is None else keys
    if not job.unbatched and getattr(job.dataset, "__getitems__", None):
        return _load_batched(job, indices, keys, at, samples, consumer)
    for position, index in enumerate(indices):
        if at is not None:
            at(position)
        try:
            samples.append(job.dataset[keys[position]])
            kept.append(index)
        except BaseException as e:  # noqa: BLE001 -- reported with its sample
            if consumer and isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            trace = "".join(traceback.format_exception(e))
            # Kept without this frame, which holds the batch's samples.
            e.__traceback__ = e.__traceback__.tb_next
            reason = f"{type(e).__name__}: {e}"
            if keys is not indices:  # the index is a position; name the sampler's key
                reason = f"key {keys[position]!r}: {reason}"
            failures.append((index, reason, trace, not_the_samples_fault(e), e))
    if at is not None:
        at(-1)
    return samples, kept, failures


class _Short(list):
    """The samples of a dataset's __getitems__ that gave other than one a key."""

    def __init__(self, asked):
        super().__init__()
        self.asked = asked


class _Given:
    """In place of a batch's samples: what the dataset's __getitems__ gave
    where it is no list (a dict of stacked columns, a tensor): collate_fn
    gets it as it is, as torch's fetcher hands it over."""

    def __init__(self, value):
        self.value = value


class _BatchRaised:
    """In place of a batch's samples: the dataset's __getitems__ raised `error`."""

    def __init__(self, error):
        self.error = error


def _load_batched(job, indices, keys, at, samples, consumer):
    """_load through the dataset's __getitems__ (the batch's keys at once), as
    torch's fetcher calls it where a dataset has one. What it raises fails
    the batch (no sample to blame), as a collate_fn's error does."""
    if at is not None:
        at(0)
    try:
        got = job.dataset.__getitems__(list(keys))
    except BaseException as e:  # noqa: BLE001 -- reported with the batch
        if consumer and isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return _BatchRaised(e), [], []
    if type(got) is not list:
        if at is not None:
            at(-1)
        return _Given(got), list(indices), []
    if len(got) != len(keys):  # collated as torch collates the list; named if that raises
        samples = _Short(len(keys))
    for sample in got:
        samples.append(sample)
    if at is not None:
        at(-1)
    return samples, list(indices), []


def _collate_or_error(job, samples, failures, writer=None):
    """(payload, None), or (None, (what failed, traceback, the exception)) when collating
    (or the dataset's __getitems__) raised; NO_SAMPLE when every sample
    failed (`failures`). No samples and no failures (an empty batch, a
    __getitems__ that gave none) is collate_fn([]), as torch calls it."""
    if isinstance(samples, _BatchRaised):
        e = samples.error
        return None, (f"{type(e).__name__} from the dataset's __getitems__: {e}",
                      "".join(traceback.format_exception(e)), e)
    if not samples and failures:
        return NO_SAMPLE, None
    try:
        if isinstance(samples, _Given):
            return _collate(job, samples.value, writer), None
        if isinstance(samples, _Stream):
            return samples.collate(lambda plain: _collate(job, plain, writer)), None
        return _collate(job, samples, writer), None
    except Exception as e:  # noqa: BLE001 -- the loader names the batch
        reason, trace, e = _collate_failure(e)
        if isinstance(samples, _Short):
            reason += (f" (the dataset's __getitems__ gave {len(samples)} samples for "
                       f"{samples.asked} keys)")
        return None, (reason, trace, e)


def _collate_failure(e):
    """(what failed, traceback, the exception) of a collate_fn that raised `e`."""
    return f"collate_fn raised {type(e).__name__}: {e}", "".join(traceback.format_exception(e)), e


def _load_shard(job, indices, seed, at=None, writer=None, consumer=False, made=None, start=0,
                first_part=0):
    """A sharded stream's item, the shard at position indices[0], as
    (payload: its _shards.Batches, or NO_SAMPLE when it gave none; the
    samples kept; failures). A shard that raised midway is one failure
    naming it and the offset, its earlier samples kept; a batch whose
    collate_fn raised is a _shards.FailedBatch in its place, the shard's
    other batches made as ever.
    `made(k, batch, last)`: told each batch as it is made (_shards.read);
    `start`, `first_part`: a continued item's (_shards.read)."""
    from . import _shards
    position = indices[0]
    step = job.shards.batch_size or 1

    def at_sample(offset):
        # Each batch's generators are seeded by (seed, its number), so that a
        # shard continued at a batch (Resume) makes the batches one read whole does.
        if offset >= 0 and offset % step == 0:
            _seed_all((seed ^ (offset // step * 0x9E3779B97F4A7C15)) & (1 << 63) - 1)
        if at is not None:
            at(offset)

    def collate(chunk):
        try:
            return _collate(job, chunk, writer)
        except Exception as e:  # noqa: BLE001 -- fails this batch alone; the consumer names it
            reason, trace, e = _collate_failure(e)
            return _shards.FailedBatch(position, reason, trace, e,
                                       _pickled_exception(e, P.MAX_MESSAGE_BYTES))

    batches, count, failed = _shards.read(job.shards, position, seed, at_sample, collate,
                                          consumer, made, start, first_part)
    failures = []
    for offset, e, ended in failed:  # the engine names the shard
        trace = "".join(traceback.format_exception(e))
        reason = f"{type(e).__name__}: {e}"
        reason = (f"raised after {offset} samples: " if ended else
                  f"a sample after {offset} samples: ") + reason
        failures.append((position, reason, trace, not_the_samples_fault(e), e))
    return (batches if batches else NO_SAMPLE), range(count), failures


def run_batch(job, epoch, batch, indices, seed, keys=None, consumer=False, parts=None):
    """One batch in this process (a worker thread, or the `consumer`'s at
    num_workers=0): (payload, (kept, failures, collate error, epoch, batch)).
    On a thread worker's thread it stops at the next sample once its loader
    closed (_Abandoned). A shard's batches go to `parts` (a _shards.Parts)
    as they are made, when given; a shard whose epoch the engine abandoned
    stops at its next sample, its batches dropped, and gives DROPPED."""
    cancelled = getattr(_thread_worker, "cancelled", None)
    at = None if cancelled is None else lambda position: _stop_if(cancelled)
    if job.shards is not None:
        from . import _shards
        key = (epoch, batch)
        made, before = None, ()
        drop_asked = getattr(_thread_worker, "drop_asked", None)
        if drop_asked is not None:
            def at(position, stop=at):
                if stop is not None:
                    stop(position)
                if position >= 0 and drop_asked():
                    raise _Dropped
        if parts is not None:
            yield_asked = getattr(_thread_worker, "yield_asked", lambda: False)
            before = parts.made(key)  # a continued shard's batches so far

            def made(k, b, last):
                parts.publish(key, k, b)
                if not last and yield_asked():
                    raise _shards.Yield
        ended = True
        collate_error = None  # a batch's is a FailedBatch among the shard's batches
        try:
            payload, kept, failures = _load_shard(
                job, indices, seed, at, consumer=consumer, made=made,
                start=_shards.samples_in(len(before), job.shards.batch_size),
                first_part=len(before))
            if before:  # a continued shard: its earlier batches, even if none came after them
                payload = _shards.Batches(before + ([] if payload is NO_SAMPLE else payload))
        except _shards.Yield:  # its batches stay in `parts`, for the worker that continues it
            ended = False
            parts.handed_over += 1
            return None, _shards.YIELDED
        except _Dropped:  # its batches go with it (`parts` ends it)
            return None, DROPPED
        finally:
            if parts is not None and ended:
                parts.end(key)
    else:
        samples, kept, failures = _load(job, indices, seed, at, consumer=consumer,
                                        keys=keys_of(indices, keys))
        payload, collate_error = _collate_or_error(job, samples, failures)
    if collate_error is not None:  # the exception pickled, as a worker process sends it
        reason, trace, error = collate_error
        collate_error = (reason, trace, _pickled_exception(error, P.MAX_MESSAGE_BYTES))
    return payload, (kept, failures, collate_error, epoch, batch)


class _Abandoned(Exception):
    """A thread worker's batch whose loader closed: nobody waits for it."""


# run_batch's info for a shard that stopped because its epoch was abandoned
# (ThreadWorkers reads this str as that; _shards.YIELDED is the other one).
DROPPED = "dropped"


def _stop_if(cancelled):
    if cancelled():
        raise _Abandoned


# A thread worker's thread: `cancelled()` says that its loader closed.
_thread_worker = threading.local()

# The thread workers' threads running a batch now (the GIL keeps set
# operations whole).
_threads_in_a_batch = set()


def serve_thread_worker(inbox, finish, cancelled, run_batch, worker, yield_asked,
                        drop_asked=None):
    """The Python thread of thread worker `worker` (ThreadWorkers starts it):
    runs each (sent, arguments) its engine thread puts in `inbox` through
    run_batch, and answers finish(worker, sent, result, None), or
    finish(worker, sent, None, text) when run_batch raised; ends at None.
    `yield_asked(sent)`, `drop_asked(sent)`: whether a shard's batch `sent`
    is to stop at its next part (handed over), or at its next sample (its
    epoch abandoned). The user's code runs here, not on the engine's thread, so that close()
    need not wait for it."""
    me = threading.current_thread()
    _thread_worker.cancelled = cancelled
    while (request := inbox.get()) is not None:
        _threads_in_a_batch.add(me)
        try:
            sent, args = request
            del request
            _thread_worker.yield_asked = functools.partial(yield_asked, sent)
            if drop_asked is not None:
                _thread_worker.drop_asked = functools.partial(drop_asked, sent)
            try:
                result, error = run_batch(*args), None
            except BaseException as e:  # noqa: BLE001 -- the batch's failure, for the engine
                result, error = None, "".join(traceback.format_exception_only(e)).strip()
            finish(worker, sent, result, error)
            del args, result  # the batch is the consumer's now, or dropped
        finally:
            _threads_in_a_batch.discard(me)


def wait_for_thread_batches(grace_s, busy_s):
    """Waits for the batches running on thread workers' threads to end (those
    of closed loaders end at their next sample): up to `grace_s`, then on
    while they still use CPU, saying so on stderr once past `busy_s`. For the
    interpreter's exit: a daemon thread woken inside C++ code (a torch op
    taking the GIL back) once finalisation began is ended by the interpreter
    mid-C++, which aborts the process. A sample blocked past the grace (hung)
    is left to its daemon thread; Ctrl-C ends the wait. In a forked child the
    parent's threads are not alive."""
    start = time.monotonic()
    cpu_before, said = None, False
    try:
        while running := [t for t in list(_threads_in_a_batch) if t.is_alive()]:
            waited = time.monotonic() - start
            if waited < grace_s:
                time.sleep(0.01)
                continue
            cpu = {t: _cpu_ns(t) for t in running}
            if cpu_before is not None and not any(cpu[t] > cpu_before.get(t, cpu[t])
                                                  for t in cpu):
                return  # none of them ran in the last interval: blocked
            if waited >= busy_s and not said:
                said = True
                print(f"stoker: the exit waits for {len(running)} sample(s) still computing on "
                      "thread workers of closed loaders (ended now, the process would abort "
                      "inside their C++ code); Ctrl-C to stop waiting", file=sys.stderr,
                      flush=True)
            cpu_before = cpu
            time.sleep(0.1)
    except KeyboardInterrupt:
        return


def _cpu_ns(thread):
    """The CPU time `thread` has used, 0 where /proc does not say."""
    try:
        with open(f"/proc/self/task/{thread.native_id}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _asked(sock):
    """P.YIELD or P.DROP when the parent sent it (taken off the socket), else
    None; other messages are left for the worker's loop."""
    try:  # the tag alone: asked before every sample of a shard
        data = sock.recv(P.TAG_BYTES, socket.MSG_DONTWAIT | socket.MSG_PEEK)
    except OSError:  # nothing waiting (BlockingIOError), or the parent is gone
        return None
    tag = data.rstrip(b"\0")
    asked = P.YIELD if tag == P.YIELD.tag else P.DROP if tag == P.DROP.tag else None
    if asked is not None:
        sock.recv(P.MAX_MESSAGE_BYTES)
    return asked


class _Dropped(Exception):
    """A sharded stream's item whose epoch was abandoned (DROP from a worker
    process's parent; a thread worker's engine thread said so): it stops at
    its next sample, and nothing of it is kept."""


class _Yielded(Exception):
    """A sharded stream's item stopped at a part for another worker to
    continue: its _shards.Resume (packed) is at `offset`, `length` long, in the
    segment; new data may start at `data_end`."""

    def __init__(self, offset, length, data_end):
        super().__init__(offset, length, data_end)
        self.offset, self.length, self.data_end = offset, length, data_end


def _run_task(job, seg, epoch, batch, check_memory, send, asked=lambda: None):
    """Loads and collates the task's samples into `seg`: (meta offset, meta
    length, the indices kept, the failures, the collate error or None).
    `check_memory(samples made)` runs before each sample and after the last
    (raising _OverLimit leaves the batch there). A sharded stream's batches
    are written as each is made and announced with `send` (PART); once
    `asked()` gives P.YIELD, it stops at the next one (_Yielded); once it
    gives P.DROP, at the next sample (_Dropped)."""
    m = seg.map
    header = struct.unpack_from(f"={_HEADER.words}q", m, 0)
    n, data_off, seed = header[_HEADER.samples], header[_HEADER.data_offset], header[_HEADER.seed]
    indices = struct.unpack_from(f"={n}q", m, _HEADER.words * _WORD.size)
    keys_at, keys_bytes = (_HEADER.words + n) * _WORD.size, header[_HEADER.keys_bytes]
    keys = keys_of(indices, bytes(m[keys_at:keys_at + keys_bytes]) if keys_bytes else None)
    writer = _Writer(seg, data_off)
    if job.shards is not None:
        from . import _shards
        made = [0]  # samples read so far: the memory check's count (0 means "before any")
        # The parts' metas: a continued item's earlier ones first.
        resume = _shards.Resume([])
        if header[_HEADER.resume_length]:
            at_resume = header[_HEADER.resume_offset]
            resume = _shards.Resume.unpack(m[at_resume:at_resume + header[_HEADER.resume_length]])
        refs, leave = list(resume.refs), [False]

        def leaving():  # whether to stop at the next part; the parent's DROP stops it now
            what = asked()
            if what is P.DROP:
                raise _Dropped
            leave[0] = leave[0] or what is P.YIELD
            return leave[0]

        def at_sample(offset):  # the shard's offset, -1 once read; a death blames its one index
            if offset >= 0:
                made[0] = offset
            check_memory(made[0])
            _WORD.pack_into(m, _HEADER.position * _WORD.size, 0 if offset >= 0 else -1)
            if offset >= 0:
                leaving()

        def publish(part, batch, last):  # in the segment now, for the consumer to take early
            refs.append(_write(writer, batch))
            send(_message(P.PART, part=part, segment_size=seg.size, meta_offset=refs[-1][0],
                          meta_length=refs[-1][1]))
            if not last and leaving():
                blob = _shards.Resume(refs).pack()
                at_blob = writer.reserve(len(blob))
                seg.map[at_blob:at_blob + len(blob)] = blob
                raise _Yielded(at_blob, len(blob), writer.cursor)
        payload, kept, failures = _load_shard(
            job, indices, seed, at_sample, writer, made=publish,
            start=resume.samples(job.shards.batch_size), first_part=len(resume.refs))
        if payload is not NO_SAMPLE or refs:  # the parts are in the segment: the item lists them
            payload = _shards.PartRefs(refs)
        return _written(writer, seg, payload, kept, failures, None)
    streamed = (job.collate_fn is job.default_collate and not job.unbatched and
                "torch" in sys.modules)
    # Whom to blame if this process dies: the position it is on.
    def at(position):
        check_memory(len(indices) if position < 0 else position)
        _WORD.pack_into(m, _HEADER.position * _WORD.size, position)

    samples, kept, failures = _load(job, indices, seed, at,
                                    _Stream(writer, len(indices)) if streamed else None,
                                    keys=keys)
    payload, collate_error = _collate_or_error(job, samples, failures, writer)
    del samples
    return _written(writer, seg, payload, kept, failures, collate_error)


def _written(writer, seg, payload, kept, failures, collate_error):
    """_run_task's result once `payload` is written into `seg`."""
    try:
        if collate_error is not None:
            return 0, 0, kept, failures, collate_error
        return (*_write(writer, payload), kept, failures, collate_error)
    finally:
        del payload
        writer.placed.clear()
        seg.end_task()


_SCALARS = (int, float, bool, str)


def _leaves(sample):
    """(structure, leaves) of a sample _Stream can place, else None: a tensor,
    or a tuple, list or dict of tensors and plain numbers or strings."""
    import torch
    if type(sample) is torch.Tensor:
        return (("tensor",), ((sample.dtype, tuple(sample.shape)),)), [sample]
    if type(sample) in (tuple, list):
        items, shape = list(sample), (type(sample), len(sample))
    elif type(sample) is dict:
        items, shape = list(sample.values()), (dict, tuple(sample))
    else:
        return None
    if not all(type(v) is torch.Tensor or type(v) in _SCALARS for v in items):
        return None
    kinds = tuple((v.dtype, tuple(v.shape)) if type(v) is torch.Tensor else type(v)
                  for v in items)
    return (shape, kinds), items


# Samples smaller than this are collected and collated at once: placing each
# costs more Python time than the copy it saves.
_STREAM_MIN_BYTES = 16 << 10


class _Stream:
    """A batch's samples for default_collate, placed as they come: each
    tensor is copied at once into its row of the stacked output in the
    segment, so a worker never holds a whole batch of samples (38 MB on the
    image pipeline). Small samples, and anything else, fall back to a list
    and torch's collate; the output is what default_collate gives
    (test_dataloader.py checks)."""

    def __init__(self, writer, capacity):
        self.writer, self.capacity = writer, capacity
        self.structure = None  # of the first sample; every other must match
        self.outs = None       # per leaf: the stacked tensor, or a list of values
        self.rows = 0
        self.plain = None      # the fallback list

    def __len__(self):
        return self.rows if self.plain is None else len(self.plain)

    def append(self, sample):
        if self.plain is not None:
            self.plain.append(sample)
            return
        got = _leaves(sample)
        if got is None or (self.structure is not None and got[0] != self.structure):
            self.plain = self._samples_so_far() + [sample]
            return
        structure, items = got
        if self.structure is None:
            if sum(v.numel() * v.element_size() for v in items
                   if not isinstance(v, _SCALARS)) < _STREAM_MIN_BYTES:
                self.plain = [sample]  # small: collated at once, cheaper than placing each
                return
            self.structure = structure
            self.outs = [self.writer.empty(v.dtype, (self.capacity, *v.shape))
                         if not isinstance(v, _SCALARS) else [] for v in items]
        for out, v in zip(self.outs, items):
            if isinstance(out, list):
                out.append(v)
            else:
                out[self.rows].copy_(v)
        self.rows += 1

    def _assemble(self, values):
        shape = self.structure[0]
        if shape == ("tensor",):
            return values[0]
        kind, keys = shape
        if kind is dict:
            return dict(zip(keys, values))
        return list(values) if kind is list else tuple(values)

    def _samples_so_far(self):
        return [self._assemble([out[i] for out in self.outs]) for i in range(self.rows)]

    def collate(self, fallback):
        if self.plain is not None or self.structure is None:  # none placed: an empty batch
            return fallback(self.plain or [])
        from torch.utils.data._utils.collate import default_collate
        columns = []
        sequence = self.structure[0] != ("tensor",) and self.structure[0][0] is not dict
        for out in self.outs:
            if isinstance(out, list):  # torch transposes a sequence with zip: tuples
                columns.append(default_collate(tuple(out) if sequence else out))
            else:
                rows = out[:self.rows]  # a view at the same offset: no copy
                placed = self.writer.placed.get(id(out))
                if placed is not None:
                    self.writer.placed[id(rows)] = (rows, placed[1])
                columns.append(rows)
        if self.structure[0] == ("tensor",):
            return columns[0]
        kind, _ = self.structure[0]
        if kind is dict:
            return dict(zip(self.structure[0][1], columns))
        return columns  # torch collates a tuple or a list of samples into a list


def _collate(job, samples, writer):
    if job.unbatched:
        return job.collate_fn(samples[0])
    if job.collate_fn is not job.default_collate or writer is None:
        return job.collate_fn(samples)
    # torch's default_collate puts its output in torch's own shared memory when
    # it sees a worker; ours goes straight into the segment instead.
    from torch.utils.data._utils import collate as torch_collate
    if hasattr(torch_collate, "default_collate_fn_map"):
        import torch

        def stack(batch, *, collate_fn_map=None):
            elem = batch[0]
            out = writer.empty(elem.dtype, (len(batch), *elem.shape))
            return torch.stack(batch, 0, out=out)

        fn_map = {**torch_collate.default_collate_fn_map, torch.Tensor: stack}
        return torch_collate.collate(samples, collate_fn_map=fn_map)
    from torch.utils.data._utils import worker as torch_worker
    info, torch_worker._worker_info = torch_worker._worker_info, None
    try:
        return job.collate_fn(samples)
    finally:
        torch_worker._worker_info = info


class _Pickler(pickle.Pickler):
    """Pickles everything but tensors and arrays, which it lists for copying."""

    def __init__(self, file, arrays):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.arrays = arrays
        self._listed = {}  # id -> its place in arrays: one object twice comes back as one

    def persistent_id(self, obj):
        listed = self._listed.get(id(obj))
        if listed is not None:
            return listed
        torch = sys.modules.get("torch")
        if torch is not None and type(obj) is torch.Tensor:
            if obj.device.type != "cpu":
                raise TypeError("worker processes must return CPU tensors, got one on "
                                f"{obj.device}")
            if obj.layout != torch.strided or obj.is_quantized or obj.is_nested:
                return None  # sparse (COO, CSR, ...) and the like: pickled whole, as torch does
            kind = "t"
        else:
            np = sys.modules.get("numpy")
            if np is None or type(obj) is not np.ndarray or obj.dtype.hasobject:
                return None
            kind = "a"
        self.arrays.append(obj)  # which also keeps obj, and so its id, alive
        self._listed[id(obj)] = (kind, len(self.arrays) - 1)
        return self._listed[id(obj)]


def _nbytes(a):
    """The bytes `a` takes in a segment: a broadcast tensor's memory span (_span)."""
    if hasattr(a, "numel"):
        return (_span(a) or a.numel()) * a.element_size()
    return a.nbytes


def _span(t):
    """The elements of storage tensor `t` reaches, where fewer than its own
    (a broadcast view: expand(), stride 0), else None: such a view is
    written as that span and its strides, as torch's workers share its
    storage (docs/dataloader.md)."""
    if t.numel() == 0 or t.is_contiguous():
        return None
    span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return span if span < t.numel() else None


def _layout(t):
    """The order of `t`'s dimensions in memory when it is dense but not
    contiguous (channels_last, a transpose): t.permute(order) is contiguous.
    None otherwise (contiguous, or a strided view: copied contiguous)."""
    if t.dim() < 2 or t.is_contiguous():
        return None
    order = tuple(sorted(range(t.dim()), key=lambda d: (-t.stride(d), -t.size(d))))
    return order if t.permute(order).is_contiguous() else None


def _numpy_order(a):
    """"F" for an array in Fortran order only, else "C" (how it is laid out in a segment)."""
    return "F" if a.flags.f_contiguous and not a.flags.c_contiguous else "C"


def _write(writer, payload):
    arrays = []
    body = io.BytesIO()
    _Pickler(body, arrays).dump(payload)
    table, copies = [], []
    for a in arrays:
        if hasattr(a, "numel"):
            # What a tensor is beyond its bytes comes back with it.
            names = a.names if any(n is not None for n in a.names) else None
            span = _span(a)
            order = None if span else _layout(a)  # its memory layout comes back too
            shape = tuple(a.shape) if order is None else tuple(a.shape[d] for d in order)
            strides = (span, tuple(a.stride())) if span else None
            entry = ["t", str(a.dtype).removeprefix("torch."), shape, None,
                     (a.requires_grad, names, order, strides)]
            placed = writer.placed.get(id(a))
            if placed is not None and placed[0] is a:
                entry[3] = placed[1]  # already in the segment
        else:
            # The dtype itself (a structured one keeps its fields), and Fortran
            # order where it is the array's (numpy pickles it so, and so does torch).
            entry = ["a", a.dtype, a.shape, None, _numpy_order(a)]
        if entry[3] is None:
            entry[3] = writer.reserve(_nbytes(a))
            # With its layout: a tensor's dimension order (_layout), an array's "C" or "F".
            copies.append((a, entry[3], entry[4][2:] if entry[0] == "t" else entry[4]))
        table.append(tuple(entry))
    meta = pickle.dumps((table, body.getvalue()), protocol=pickle.HIGHEST_PROTOCOL)
    meta_off = writer.reserve(len(meta))
    m = writer.seg.map
    for a, off, order in copies:
        n = _nbytes(a)
        if n == 0:
            continue
        if hasattr(a, "numel"):
            import torch
            dst = torch.frombuffer(m, dtype=torch.uint8, count=n, offset=off)
            src = a.detach()
            if any(n is not None for n in src.names):  # rename() warns even when names are none
                src = src.rename(None)
            order, strides = order
            if strides is not None:  # a broadcast view: its span of storage (_span)
                src = src.as_strided((strides[0],), (1,))
            elif order is not None:  # written in its memory order (_layout)
                src = src.permute(order)
            dst.view(a.dtype).view(src.shape).copy_(src)
            del dst
        else:
            import numpy as np
            np.frombuffer(m, dtype=a.dtype, count=a.size, offset=off).reshape(
                a.shape, order=order)[...] = a
    m[meta_off:meta_off + len(meta)] = meta
    return meta_off, len(meta)


# --- the consumer's side ------------------------------------------------------

class _Unpickler(pickle.Unpickler):
    def __init__(self, file, arrays):
        super().__init__(file)
        self.arrays = arrays

    def persistent_load(self, pid):
        return self.arrays[pid[1]]


def read_batch(view, meta_off, meta_len):
    """The payload in a segment's view (a numpy uint8 array), None for a
    batch whose every sample failed; tensors and arrays view the segment,
    no copy."""
    if meta_len == 0:
        return NO_SAMPLE
    table, body = pickle.loads(view[meta_off:meta_off + meta_len].tobytes())
    arrays = [_rebuild(view, entry) for entry in table]
    payload = _Unpickler(io.BytesIO(body), arrays).load()
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch._utils, "_sparse_tensors_to_validate", None):
        # Sparse tensors unpickled wait there for a check that torch.load
        # makes at its end; held there for ever otherwise, with their segments.
        torch._utils._validate_loaded_sparse_tensors()
    from . import _shards
    if type(payload) is _shards.PartRefs:  # a shard's batches, each where its part put it
        return _shards.Batches(read_batch(view, off, n) for off, n in payload)
    return payload


def _rebuild(view, entry):
    kind, dtype, shape, off = entry[:4]
    if kind == "t":
        import torch
        dt = getattr(torch, dtype)
        requires_grad, names, order, strides = entry[4]
        count = 1
        for d in shape:
            count *= d
        if strides is not None:  # a broadcast view: its span, seen through its strides
            itemsize = torch.empty((), dtype=dt).element_size()
            t = torch.frombuffer(view, dtype=torch.uint8, count=strides[0] * itemsize,
                                 offset=off).view(dt).as_strided(shape, strides[1])
        elif count == 0:
            t = torch.empty(shape, dtype=dt)
        else:
            itemsize = torch.empty((), dtype=dt).element_size()
            t = torch.frombuffer(view, dtype=torch.uint8, count=count * itemsize,
                                 offset=off).view(dt).view(shape)
        if order is not None:  # back to its dimensions' order, in its memory layout
            t = t.permute(sorted(range(len(order)), key=order.__getitem__))
        if names is not None:
            t = t.refine_names(*names)
        return t.requires_grad_() if requires_grad else t
    import numpy as np
    dt = np.dtype(dtype)
    count = 1
    for d in shape:
        count *= d
    return np.frombuffer(view, dtype=dt, count=count, offset=off).reshape(shape, order=entry[4])
