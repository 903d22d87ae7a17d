"""Remote slots on a Dask cluster for stoker.DataLoader(cluster=...) and
stoker.Loader(cluster=...).

The loader's engine sends some of its work to Dask workers as tasks, while
the tuner says so (local first: docs/remote.md). The job (DataLoader: the
dataset, collate_fn, worker_init_fn; Loader: the source, transform and seed)
is scattered to the cluster once; each task names it, and Dask keeps it in
each worker's memory. A DataLoader task seeds by the batch's seed, as a local
worker process does; a Loader task makes samples as the engine does, from
(seed, epoch, index): what a task makes is the same wherever it is made.

stoker opens no socket of its own here: everything goes through the Dask
client, with the user's Security (TLS) when given.
"""

import collections
import functools
import io
import logging
import os
import pickle
import sys
import threading
import time
import traceback
import uuid
import warnings
import weakref


class ClusterError(RuntimeError):
    """The cluster cannot make this loader's batches: it is unreachable, or
    its workers run another Python, torch or stoker than this process."""


# How long a task may take before it is re-run elsewhere (its worker is
# suspected of hanging), by default; DataLoader(remote_timeout=...).
DEFAULT_TIMEOUT_S = 60.0
_ATTEMPTS = 3            # sends of one batch before it is made locally
_CLOSED = ("closing", "closed")  # a client's status once closed: it never answers again
_POLL_S = 0.05           # a wait for a task looks at the cluster and the consumer this often
_SUSPECT_S = 60.0        # a worker that hung a task gets none for this long
_LAG_MEMORY_S = 600.0    # a worker whose task lagged this recently is left out at its next lag
_RATE_WINDOW_S = 5.0     # bytes_per_s is over this many recent seconds
_REFRESH_S = 0.5         # the cluster's workers are re-read this often
_CUT_OFF_S = 2.0         # a client cut off from its scheduler this long: the cluster is lost
_RESEND_S = 5.0          # a send of the job that failed is tried again after this long
# A task lags (made locally instead) once it has run twice, and the consumer
# has waited on it once, what a local worker takes to make it, and never
# sooner than this: the round trip a healthy remote task takes.
_LAG_FLOOR_S = 0.1
_LOCAL_UNKNOWN_S = 1.0   # a task's local time before any local worker made an item


def versions():
    """What a worker must share with the loader's process: Python, torch and
    stoker (STOKER_VERSION_OVERRIDE stands for stoker's, for the test of a
    mismatch)."""
    from . import _stoker
    try:
        import torch
        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    return {"python": "%d.%d.%d" % sys.version_info[:3], "torch": torch_version,
            "stoker": os.environ.get("STOKER_VERSION_OVERRIDE", _stoker.__version__)}


def _differences(mine, theirs):
    return ", ".join(f"{k} {theirs.get(k)!r} (here {v!r})" for k, v in mine.items()
                     if theirs.get(k) != v)


class _WorkerMismatch(RuntimeError):
    """A worker that would not make this loader's tasks as its process does:
    refused, said once; the other workers go on."""


class _VersionMismatch(_WorkerMismatch):
    pass


class _SourceMismatch(_WorkerMismatch):
    pass


def _check_here(expected):
    """In a task: _VersionMismatch unless this worker runs what the loader does."""
    mine = versions()
    if mine != expected:
        raise _VersionMismatch(
            f"this Dask worker runs {_differences(expected, mine)}; the loader's process runs "
            f"{expected}")


def resolve(option, workers, cluster, cluster_security, remote_timeout, remote_min):
    """A loader's remote options, checked: remote slots only with `option`
    (num_workers or workers) "auto", since the tuner decides how many."""
    from . import _args, _stoker
    remote_min = _args.integer("remote_min", remote_min, 0, _stoker.MAX_WORKERS)
    if cluster is None:
        if remote_min:
            raise ValueError(f"remote_min={remote_min} needs a cluster (cluster=...)")
        if cluster_security is not None:
            raise ValueError("cluster_security needs a cluster (cluster=...)")
    else:
        if workers != _stoker.AUTO_WORKERS:
            raise ValueError(f"cluster= needs {option}='auto': the tuner decides how many "
                             "remote slots to use, local workers first")
        if not isinstance(cluster, str) and not hasattr(cluster, "submit"):
            raise TypeError("cluster must be a Dask scheduler address ('tcp://host:port', "
                            f"'tls://host:port') or a distributed.Client, got "
                            f"{type(cluster).__name__}")
        if cluster_security is not None and not isinstance(cluster, str):
            raise ValueError("cluster_security goes with a scheduler address; a "
                             "distributed.Client brings its own")
        if cluster_security is not None:
            import distributed
            if not isinstance(cluster_security, (bool, distributed.Security)):
                # Said here: Dask's own refusal would read as the scheduler out of reach.
                raise TypeError("cluster_security must be a distributed.Security (or True for "
                                f"temporary credentials), got {cluster_security!r}")
    return {"cluster": cluster, "cluster_security": cluster_security,
            "remote_timeout": _args.real("remote_timeout", remote_timeout, above=0),
            "remote_min": remote_min}


# In a Dask worker: one batch at a time on its generators (Python's, numpy's,
# torch's are per process: two batches on two threads would draw from each
# other's). So a worker process makes one batch at a time, whatever its threads.
_batch_lock = threading.Lock()


def _remote_batch(job, epoch, batch, indices, seed, keys, expected):
    """A Dask task: batch `batch` of `epoch`, as _workers.run_batch makes it
    in a worker process, packed: a _Batch of (payload, info)."""
    from . import _workers
    _check_here(expected)
    _workers.batch_scheduling()  # the worker's own threads (its comms) come first
    with _batch_lock:
        if not getattr(job, "_remote_ready", False):
            # As a worker process starts: one thread for torch, worker info, the init hook.
            torch = sys.modules.get("torch")
            if torch is not None and torch.get_num_threads() != 1:
                torch.set_num_threads(1)
            if job.worker_init_fn is not None:
                # Worker info while it runs only: during batches torch's
                # default_collate would build each batch in shared memory,
                # which a batch sent over the network does not need.
                _workers._set_worker_info(job, 0, 1, seed)
                try:
                    job.worker_init_fn(0)
                except Exception as e:  # noqa: BLE001 -- the user's hook: its batch fails
                    # As a worker process's failed start: the user's error, raised
                    # by the loader (not the cluster's loss); tried again next task.
                    failed = (f"worker_init_fn failed on the cluster's worker: "
                              f"{type(e).__name__}: {e}", traceback.format_exc(),
                              _workers._pickled_exception(e, _workers.P.MAX_MESSAGE_BYTES,
                                                          _pickler()))
                    return _Batch(*_pack((None, ([], [], failed, epoch, batch))))
                finally:
                    _workers._clear_worker_info()
            job._remote_ready = True
        payload, info = _workers.run_batch(job, epoch, batch, indices, seed, keys)
        info = _portable(info)
        try:
            made = _Batch(*_pack((payload, info)))
        except Exception as e:  # noqa: BLE001 -- the user's batch does not pickle
            # It fails whole, as it does in a worker process (its shared-memory write).
            failed = (f"the batch failed outside its samples: {type(e).__name__}: {e}",
                      traceback.format_exc(),
                      _workers._pickled_exception(e, _workers.P.MAX_MESSAGE_BYTES, _pickler()))
            made = _Batch(*_pack((None, (info[0], info[1], failed, epoch, batch))))
        _register_serializers()
        return made


class SampleJob:
    """stoker.Loader's job on a cluster: what makes its samples."""

    def __init__(self, source, transform, seed):
        self.source = source
        self.transform = transform
        self.seed = seed
        # A worker opens the source again by its path (Remade): what it finds
        # there must be what this process opened, or its samples would differ.
        self.identity = source._identity()

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._seen = self.source._identity()  # once, where it is loaded

    def check_source(self):
        """In a task: _SourceMismatch unless the source this worker opened
        holds the samples, by count and keys, that the loader's does."""
        (count, keys), (seen, seen_keys) = self.identity, self._seen
        if (seen, seen_keys) == (count, keys):
            return
        differs = (f"{seen} samples where the loader's process has {count}" if seen != count
                   else f"{seen} samples as the loader's process, but other keys")
        raise _SourceMismatch(f"this Dask worker opened {self.source!r} again from its path and "
                              f"found {differs}: the data changed since the loader was made")


def _remote_samples(job, epoch, items, cap_bytes, expected):
    """A Dask task: samples `items` of `epoch`, made as the loader's engine
    makes them (its C++ pipeline, without the GIL: a worker's threads make
    several tasks at once), packed: a _Batch of (samples, labels, failures)."""
    from . import _stoker, _workers
    _check_here(expected)
    job.check_source()
    _workers.batch_scheduling()
    made = _Batch(*_pack(_stoker.make_samples(job.source._impl, job.transform._impl, job.seed,
                                              epoch, items, cap_bytes)))
    _register_serializers()
    return made


class _Batch:
    """A made batch on its way: the pickled header and the arrays' bytes,
    sent by Dask as frames of their own."""

    def __init__(self, header, buffers):
        self.header = header
        self.buffers = buffers

    def nbytes(self):
        return len(self.header) + sum(memoryview(b).nbytes for b in self.buffers)


_registered = False


def _register_serializers():
    """_Batch's Dask serializer, in each process that sends or receives one."""
    global _registered
    if _registered:
        return
    from distributed.protocol import dask_deserialize, dask_serialize

    @dask_serialize.register(_Batch)
    def _serialize(batch):
        frames = [batch.header, *batch.buffers]
        return {"compression": [False] * len(frames)}, frames

    @dask_deserialize.register(_Batch)
    def _deserialize(header, frames):
        return _Batch(frames[0], list(frames[1:]))

    _registered = True


@functools.cache
def _pickler():
    """The batch's pickler, made at first use (Dask is imported only with a
    cluster): cloudpickle's, as Dask's, where a class of the user's script,
    which a Dask worker has only as cloudpickle rebuilt it, goes by value
    (plain pickle cannot name it there) and comes back as the consumer's own
    class; plain CPU tensors go as numpy arrays, whose data travels out of
    band (torch's own pickling saves each storage into an archive in-band)."""
    import cloudpickle

    class Pickler(cloudpickle.Pickler):
        def reducer_override(self, obj):
            torch = sys.modules.get("torch")
            if torch is None or type(obj) is not torch.Tensor or obj.device.type != "cpu" \
                    or obj.requires_grad or obj.layout != torch.strided or obj.has_names():
                return super().reducer_override(obj)
            try:
                array = obj.numpy()  # shares the tensor's memory
            except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16)
                return super().reducer_override(obj)
            return _tensor, (array,)

    return Pickler


def _tensor(array):
    import torch
    # Writable memory, as a batch from a local worker: the consumer may change it in place.
    return torch.from_numpy(array if array.flags.writeable else array.copy())


def _pack(made):
    """(pickled header, the arrays' bytes, out of band: no copy into the header)."""
    buffers = []
    out = io.BytesIO()
    _pickler()(out, protocol=5, buffer_callback=buffers.append).dump(made)
    return out.getvalue(), [b.raw() for b in buffers]


def _unpack(header, buffers):
    return pickle.loads(header, buffers=buffers)


def _portable(info):
    """The failures' exceptions that would not survive pickle (a field that
    does not pickle, a constructor its args do not fit) become None (the
    loader then raises the worker's traceback in their stead)."""
    kept, failures, collate_error, epoch, batch = info
    out = []
    for index, reason, trace, fatal, error in failures:
        try:
            pickled = io.BytesIO()
            _pickler()(pickled).dump(error)
            pickle.loads(pickled.getvalue())
        except Exception:  # noqa: BLE001 -- whatever pickling raises
            error = None
        out.append((index, reason, trace, fatal, error))
    return kept, out, collate_error, epoch, batch


def _configure_dask():
    """Spares the training process's CPUs, the ones this loader is short of:
    - batches travel uncompressed (lz4, Dask's default, costs more to undo
      here than decoded images shrink); Dask compresses only between peers
      that agree on a compression, so this process saying none is enough, and
      a compression the user chose is left alone;
    - stoker's frames are not searched for the code that submitted a task
      (Dask reads the caller's source file for its dashboard at every submit)."""
    import dask
    if dask.config.get("distributed.comm.compression", "auto") == "auto":
        dask.config.set({"distributed.comm.compression": False})
    ignored = list(dask.config.get("distributed.diagnostics.computations.ignore-modules", []))
    if "stoker" not in ignored:
        dask.config.set({"distributed.diagnostics.computations.ignore-modules":
                         ignored + ["stoker"]})


def _check_address(address):
    """Refuses an address Dask cannot connect to at all, read by Dask's own
    parsers (its scheme's: a port for tcp:// and tls://), before a Client is
    made."""
    from distributed.comm import parse_address
    from distributed.comm.registry import get_backend
    if not isinstance(address, str):
        return
    try:
        scheme, location = parse_address(address)
        backend = get_backend(scheme)
    except ValueError as e:
        raise ClusterError(f"cluster={address!r} is not a Dask scheduler's address: {e}") from e
    if not location:
        raise ClusterError(f"cluster={address!r} names no scheduler: give its address, e.g. "
                           "'tcp://host:8786'")
    try:
        backend.get_address_host_port(location)
    except NotImplementedError:  # not host:port (inproc://): the scheme's own form
        pass
    except ValueError as e:
        raise ClusterError(f"cluster={address!r} is not a Dask scheduler's address: {e}; give "
                           f"its host and port, e.g. '{scheme}://host:8786'") from e


@functools.cache
def _client_class():
    """distributed.Client, closed at once when it fails to start: one left
    half-made (an address its scheme refuses, tls:// without a Security)
    would be closed by its __del__ at the interpreter's exit, which then
    waited twice its timeout."""
    import distributed

    class Client(distributed.Client):
        def __init__(self, *args, **kwargs):
            try:
                super().__init__(*args, **kwargs)
            except BaseException:
                try:
                    self.close(timeout=2)
                except Exception:  # noqa: BLE001 -- what close raises: the first error is the one
                    pass
                raise

    return Client


class Cluster:
    """One loader's use of a Dask cluster: the client, the job scattered to it,
    and the remote slots' figures. `run` (a DataLoader's batch) or
    `run_samples` (a Loader's task) is called on the engine's threads.
    `per_thread`: a worker offers one slot per thread (its tasks run
    together) instead of one per process."""

    def __init__(self, cluster, security, timeout_s, job, slots, per_thread=False):
        try:
            import distributed
        except ImportError as e:
            raise ClusterError(f"cluster= needs Dask distributed (python3-distributed): {e}") \
                from e
        self._distributed = distributed
        _register_serializers()
        _configure_dask()
        self._timeout_s = timeout_s
        self._slots = slots
        self._per_thread = per_thread
        self._own_client = not isinstance(cluster, distributed.Client)
        if self._own_client:
            _check_address(cluster)
            try:
                self.client = _client_class()(cluster, security=security, timeout=timeout_s,
                                              set_as_default=False)
            except Exception as e:  # noqa: BLE001 -- every way a connection fails
                hint = ("; a tls:// scheduler needs cluster_security"
                        if security is None and str(cluster).startswith("tls://") else "")
                raise ClusterError(f"cannot reach the Dask scheduler at {cluster}: "
                                   f"{type(e).__name__}: {e}{hint}") from e
        else:
            if cluster.status != "running":  # closed (a `with` block ended), or not yet connected
                raise ClusterError(f"the Dask client given as cluster= is {cluster.status}, not "
                                   "running: pass it while it is open, or the scheduler's address")
            self.client = cluster
        self.address = self.client.scheduler.address
        self._expected = versions()
        self._token = uuid.uuid4().hex[:12]
        self._lock = threading.Lock()
        self._closing = False
        self._batches = 0
        self._retries = 0
        self._received = collections.deque()  # (time, bytes) of recent batches
        self._suspects = {}                   # worker address -> time it hung a task
        self._refused = {}                    # worker address -> its other versions, for good
        self._rescatter = False               # the job's holders hang: send it to the others
        self._sending = None                  # the thread sending the job now (_send_job)
        self._send_failed = float("-inf")     # when a send of the job last failed
        self._lost = None
        self._warned = False
        self._known = {}                      # worker address -> threads, as last seen (warm)
        self._warm = set()                    # workers whose versions were checked: usable
        self._warming = {}                    # worker that joined later -> its check's future
        self._checks = 0                      # checks sent, for their keys
        self._check_errors = {}               # worker -> its checks that raised
        self._load_errors = {}                # worker -> sends of the job it could not load
        self._looked = threading.Event()      # a check ended: the watch looks again now
        self._lagged = {}                     # worker address -> when a task of it lagged
        self._lagged_tasks = 0                      # tasks that lagged, made locally instead
        self._engine = None                   # weakref to the loader's engine (follow)
        self._local = (0.0, None)             # (when read, a local item's seconds)
        self._cut_off = False                 # the last look at the workers had no answer
        try:
            self._check_versions()
            self._jobdata = job
            self._job, part = None, None
            try:
                if self.client.scheduler_info().get("workers"):
                    self._job = self.client.scatter(job, broadcast=True, hash=False,
                                                    timeout=timeout_s)
                else:
                    # No worker yet (a job script starting them beside the
                    # training): the job goes to the first to join, once a
                    # task needs it; Dask's scatter would wait for one here.
                    part = _unpicklable(job)
            except Exception as e:  # noqa: BLE001 -- Dask names only its wrapper: say which part
                part = _unpicklable(job)
                if part is None:
                    # It pickles here: the workers could not take it, most often
                    # for a module of the dataset's they cannot import. Dask's
                    # error is its connection's, closed by the worker that failed.
                    found = self._why_not_loaded(None)
                    why = (f"{e}" if not found else
                           "; ".join(f"{why} (on {worker})" for worker, why in found.items()))
                    hint = ("; its classes must be importable there (their modules on the "
                            "workers' PYTHONPATH)"
                            if "No module named" in why or "Can't get attribute" in why
                            else "")
                    raise ClusterError(
                        f"the Dask workers at {self.address} cannot load the loader's job "
                        f"({self._job_name()}): {why}{hint}") from e
            if part is not None:
                name, value, error = part
                # A function or class by its own name; any other value by its type's.
                named = value if hasattr(value, "__qualname__") else type(value)
                advice = ("keep paths in it, open files in __getitem__" if name == "dataset"
                          else "define it at a module's top level, holding no lock, file or "
                          "connection")
                raise ClusterError(
                    f"the loader's {name} ({named.__module__}.{named.__qualname__}) "
                    f"cannot be sent to the Dask workers at {self.address}: it does not pickle "
                    f"({type(error).__name__}: {error}); {advice}") from error
        except BaseException:
            self.close()
            raise
        self._note_workers(_workers_of(self.client.scheduler_info()))
        self.refresh()
        threading.Thread(target=self._watch, name="stoker-cluster-watch", daemon=True).start()

    def _job_name(self):
        """The part of the job a worker loads that is the user's: its dataset or source."""
        what = "dataset" if hasattr(self._jobdata, "dataset") else "source"
        data = getattr(self._jobdata, what, None)
        return f"{what} {type(data).__module__}.{type(data).__qualname__}"

    def _why_not_loaded(self, workers):
        """{worker: why the job does not load there} for those of `workers`
        (None: all) where it does not, found by loading it there; {} when
        the cluster cannot say. Waits up to the timeout."""
        from distributed.protocol import pickle as dask_pickle
        try:
            blob = dask_pickle.dumps(self._jobdata)
            found = _within(self._timeout_s, lambda: self.client.run(
                _load_error, blob, workers=workers, on_error="return"))
        except Exception:  # noqa: BLE001 -- cut off, or the workers gone: nothing found
            return {}
        return {worker: why for worker, why in found.items() if isinstance(why, str)}

    def _check_versions(self):
        try:
            found = self.client.run(versions)
        except Exception as e:  # noqa: BLE001 -- a worker that cannot even answer
            raise ClusterError(f"the Dask workers at {self.address} cannot run stoker: "
                               f"{type(e).__name__}: {e}") from e
        for worker, theirs in found.items():
            if theirs != self._expected:
                raise ClusterError(
                    f"Dask worker {worker} runs {_differences(self._expected, theirs)}: a "
                    "cluster's workers must run the Python, torch and stoker of the loader's "
                    "process")
        self._warm = set(found)

    def _note_workers(self, known):
        """The scheduler's workers ({address: threads}) now: those checked are usable."""
        with self._lock:
            self._known = {w: t for w, t in known.items() if w in self._warm}

    def _warm_up(self, known):
        """Workers that joined since: each gets tasks once a check of its
        versions has run there (stoker and torch imported, the job fetched and
        loaded by then), so that a cold start is not read as a straggler
        (_lags) and left out. Called by the watch; never waits."""
        for worker, future in list(self._warming.items()):
            if future.status == "pending":  # (its done() may say False after it ended)
                if worker not in known:  # gone before its check ran
                    _cancel(future)
                    del self._warming[worker]
                continue
            del self._warming[worker]
            if future.status == "error":  # it raised there: another stoker, or the job lost
                error = future.exception()
                if isinstance(error, _WorkerMismatch):  # its source differs: for good
                    self._refuse_worker(worker, error)
                    continue
                self._check_errors[worker] = self._check_errors.get(worker, 0) + 1
                if self._check_errors[worker] >= _ATTEMPTS:
                    self._refuse_worker(worker, ClusterError(
                        f"this Dask worker cannot run the loader's tasks: "
                        f"{type(error).__name__}: {error}"))
                continue
            if future.status != "finished":  # cancelled or lost (it left): checked again later
                _cancel(future)
                continue
            theirs = future.result()  # no wait: it ended (timeout=0 would time out)
            if theirs == self._expected:
                with self._lock:
                    self._warm.add(worker)
            else:
                self._refuse_worker(worker, _VersionMismatch(
                    f"this Dask worker runs {_differences(self._expected, theirs)}; the "
                    f"loader's process runs {self._expected}"))
        for worker in known:
            if worker in self._warm or worker in self._warming or worker in self._refused:
                continue
            self._checks += 1
            job = self._job
            # Fetched and loaded there too, unless its holders are gone (sent again later).
            held = (job,) if job is not None and job.status == "finished" else ()
            try:
                self._warming[worker] = self.client.submit(
                    _checked, *held, pure=False, workers=[worker], allow_other_workers=False,
                    key=f"stoker-{self._token}-check-{self._checks}")
            except Exception:  # noqa: BLE001 -- cut off: the next look sends it
                return
            _when_done(self._warming[worker], self._looked.set)

    def follow(self, engine):
        """The loader's engine (_stoker.Loader), once made: a task whose batch
        its consumer waits for too long is made locally (_lags)."""
        self._engine = weakref.ref(engine)

    # -- the engine's threads -------------------------------------------------

    def run(self, epoch, batch, indices, seed, keys=None):
        """Makes a DataLoader's batch on the cluster: (payload, info), or None
        when it could not (the batch is then made locally by the calling thread)."""
        made = self._run(_remote_batch, (epoch, batch, list(indices), seed, keys),
                         f"{epoch}-{batch}", (epoch, [batch]))
        return None if made is None else _unpack(made.header, made.buffers)

    def run_samples(self, epoch, items, cap_bytes):
        """Makes a Loader's samples on the cluster: (samples, labels,
        failures) as _stoker.make_samples gives them, or None when it could
        not (they are then made locally by the calling thread)."""
        items = list(items)
        made = self._run(_remote_samples, (epoch, items, cap_bytes), f"{epoch}-s{items[0]}",
                         (epoch, items))
        return None if made is None else _unpack(made.header, made.buffers)

    def _run(self, task, args, name, made_of):
        """task(job, *args, versions) on the cluster, re-sent to another
        worker when one fails: its _Batch, or None. `made_of`: (epoch, the
        engine's items it makes)."""
        if self._lost is not None or self._closing:
            return None
        avoid = set()
        for attempt in range(_ATTEMPTS):
            made = self._attempt(task, args, f"{name}-{attempt}", avoid, made_of)
            if made is _LAGGED or made is _NOT_SENT:
                return None  # the consumer waits for it, or no worker takes it: made here
            if made is not None:
                return made
            if self._lost is not None or self._closing:
                return None
            with self._lock:
                self._retries += 1  # sent and failed: made again, elsewhere or here
        return None

    def _attempt(self, task, args, name, avoid, made_of):
        distributed = self._distributed
        if not self._connected():
            self._lose(ClusterError(f"the connection to the scheduler is {self.client.status}"))
            return _NOT_SENT
        workers, restricted = self._usable_workers(avoid)
        if not workers:
            return _NOT_SENT
        job = self._job_ready()
        if job is None:  # being sent (_send_job): made here, not waited for
            return _NOT_SENT
        try:
            future = self.client.submit(
                task, job, *args, self._expected, key=f"stoker-{self._token}-{name}", pure=False,
                workers=workers if restricted else None, allow_other_workers=False)
        except Exception as e:  # noqa: BLE001 -- the client is closed or cut off
            self._lose(e)
            return _NOT_SENT
        done = threading.Event()
        _when_done(future, done.set)
        sent = time.monotonic()
        deadline = sent + self._timeout_s
        cut_off = None  # since when the client has not been connected
        try:
            while True:
                if done.wait(_POLL_S):
                    # Straight from the worker that made it: through the
                    # scheduler, every batch would cross the network twice.
                    # A client closed meanwhile (the user's) never answers: given up at once.
                    made = _within(self._timeout_s,
                                   lambda: self.client.gather(future, direct=True),
                                   lambda: self.client.status in _CLOSED)
                    break
                now = time.monotonic()
                if self._closing or self._lost is not None:
                    _cancel(future)
                    return None
                if self.client.status != "running":
                    cut_off = now if cut_off is None else cut_off
                    if now - cut_off > _CUT_OFF_S:
                        self._lose(ClusterError(f"the connection to the scheduler is "
                                                f"{self.client.status}"))
                        return None
                else:
                    cut_off = None
                if now > deadline:
                    self._suspect(future, job.key, avoid)
                    return None
                if self._lags(made_of, now - sent):
                    self._hand_back(future, job.key)
                    return _LAGGED
                usable = set(self._usable_workers(set())[0])
                # A list the scheduler gave: cut off, it is empty until it
                # answers (that case is the status check's, above).
                if not (usable & set(workers) if restricted else usable or self._cut_off):
                    _cancel(future)  # every worker it may run on is gone
                    return None
        except _WorkerMismatch as e:
            self._refuse(future.key, e)
            return None
        except (distributed.client.CancelledError, distributed.scheduler.KilledWorker,
                distributed.comm.CommClosedError, OSError) as e:
            # The worker died (Dask re-ran it until it gave up) or the connection broke.
            if self.client.status != "running":
                self._lose(ClusterError(f"the connection to the scheduler was lost (the client "
                                        f"is {self.client.status}; the task: "
                                        f"{type(e).__name__}: {e})"))
            return None
        except Exception:  # noqa: BLE001 -- the task itself raised: stoker's bug, said plainly
            if self.client.status in _CLOSED:  # its loop closed under it: no task's fault
                self._lose(ClusterError(f"the connection to the scheduler was lost (the client "
                                        f"is {self.client.status})"))
                return None
            self._lose(ClusterError("a remote task failed outside its samples:\n" +
                                    traceback.format_exc()))
            return None
        finally:
            future.release()
        received = made.nbytes()
        with self._lock:
            self._batches += 1
            now = time.monotonic()
            self._received.append((now, received))
            self._forget_before(now - _RATE_WINDOW_S)
            # The largest lately: what a slot may hold, for the tuner's memory budget.
            self._slots.task_bytes = max(b for _, b in self._received)
        return made

    def _connected(self):
        """The client is connected, or is again within _CUT_OFF_S."""
        deadline = time.monotonic() + _CUT_OFF_S
        while self.client.status != "running":
            if self._closing or time.monotonic() > deadline:
                return False
            time.sleep(_POLL_S / 5)
        return True

    def _job_ready(self):
        """The job's future while it is on the cluster, else None: not sent
        yet (no worker when the loader was made), or its holders are gone
        (Dask then forgets the data) or hang (Dask keeps one copy: the others
        would wait to fetch it). The watch sends it then (_send_job)."""
        job = self._job
        if job is None or job.status != "finished" or self._rescatter:
            return None
        return job

    def _send_job(self):
        """Starts sending the job to the usable workers when it is not on the
        cluster, on a thread of its own: a big dataset takes seconds to send,
        and no batch waits for it (no slot is offered until the job is
        there, refresh; a batch a slot holds meanwhile is made locally).
        One send at a time; one that failed is tried again after _RESEND_S.
        Called by the watch; never waits."""
        if self._closing or self._job_ready() is not None or \
                time.monotonic() - self._send_failed < _RESEND_S:
            return
        if self._sending is not None and self._sending.is_alive():
            return
        workers = self._usable_workers(set())[0]
        if not workers:
            return  # none checked yet: Dask's scatter would wait for one
        self._sending = threading.Thread(target=self._send, args=(workers,),
                                         name="stoker-cluster-send", daemon=True)
        self._sending.start()

    def _send(self, workers):
        """The sending thread: the job to `workers`. Unbounded (the next send
        waits for it to end): a scheduler that stops answering is the
        watch's to give up on."""
        try:
            job = self.client.scatter(self._jobdata, workers=workers, broadcast=True,
                                      hash=False, timeout=self._timeout_s)
        except Exception:  # noqa: BLE001 -- a worker gone, the connection lost: tried again
            if not self._closing:
                self._count_load_errors(workers)
            self._send_failed = time.monotonic()
            return
        if self._closing:
            _cancel(job)  # a client the user keeps would hold it on the workers
            return
        with self._lock:
            self._job, self._rescatter = job, False
        self._looked.set()  # the watch offers the slots now

    def _count_load_errors(self, workers):
        """A send of the job to `workers` failed: each of them where it does
        not load counts a failure, and is refused at the _ATTEMPTS-th, with
        the reason found there (a send that fails for a worker gone is no
        worker's fault)."""
        for worker, why in self._why_not_loaded(workers).items():
            with self._lock:
                self._load_errors[worker] = self._load_errors.get(worker, 0) + 1
                refuse = self._load_errors[worker] >= _ATTEMPTS
            if refuse:
                self._refuse_worker(worker, ClusterError(
                    f"it cannot load the loader's job ({self._job_name()}): {why}"))

    def _usable_workers(self, avoid):
        """(the workers a task may go to, whether that is fewer than all): a
        task is tied to them only when some are left out."""
        with self._lock:
            bad = avoid | set(self._suspects) | set(self._refused)
            return [w for w in self._known if w not in bad], bool(bad)

    def _suspect(self, future, job, avoid):
        """A task ran past the timeout: its worker gets no task for a while;
        or, when that worker still waits for the job, the workers it would
        fetch it from (they hang, not it), and the job is sent to the others.
        `job`: the key of the job the task was given."""
        blamed, holders = self._culprits(future, job)
        now = time.monotonic()
        with self._lock:
            for worker in blamed:
                avoid.add(worker)
                self._leave_out(worker, holders, now)

    def _culprits(self, future, job):
        """Cancels a task that takes too long: (the workers to blame, the
        workers holding the job). Its own worker; or, when that one still
        waits for the job, the holders it would fetch it from (they hang,
        not it). Nobody is blamed when the scheduler cannot say."""
        key = future.key
        try:
            where, holders = _within(_CUT_OFF_S, lambda: self.client.run_on_scheduler(
                _blame, key=key, job=job))
        except Exception:  # noqa: BLE001 -- the scheduler cannot say: nobody is blamed
            where, holders = None, []
        _cancel(future)
        if where is not None and holders and where not in holders:
            return holders, holders
        return [where] if where else [], holders

    def _leave_out(self, worker, holders, now):
        """`worker` gets no task for _SUSPECT_S; the job is sent to the
        others when it held it. The caller holds self._lock."""
        self._suspects[worker] = now
        if worker in holders:
            self._rescatter = True

    def _lags(self, made_of, running_s):
        """Whether the consumer waits for this task's batch, and has for as
        long as a local worker takes to make the task, which has run twice
        that (a slow worker, a straggler): it is then made locally."""
        ref = self._engine
        engine = None if ref is None else ref()
        if engine is None:
            return False
        epoch, items = made_of
        try:
            local_s = max(_LAG_FLOOR_S, self._local_seconds(engine, len(items)))
            if running_s < 2 * local_s:
                return False  # checked before asking the engine, which takes its lock
            head = engine.awaited()
        except ValueError:  # the loader closed meanwhile: nothing waits
            return False
        return head is not None and head["epoch"] == epoch and head["waited_s"] >= local_s \
            and not set(items).isdisjoint(head["items"])

    def _local_seconds(self, engine, items):
        """What a local worker takes to make `items` of the engine's items,
        from its figures (read once a second at most)."""
        now = time.monotonic()
        with self._lock:
            read, per_item = self._local
        if now - read > 1.0:
            m = engine.metrics()
            per_item = m["busy_ns"] / 1e9 / m["samples_produced"] \
                if m["samples_produced"] else None
            with self._lock:
                self._local = (now, per_item)
        return _LOCAL_UNKNOWN_S if per_item is None else per_item * items

    def _hand_back(self, future, job):
        """A lagging task is cancelled (its batch is made locally). The
        workers to blame (_culprits) get no task for a while when one of
        their tasks lagged in the last _LAG_MEMORY_S (a first task may lag
        on a cold start: the job to fetch, imports); a worker still slow
        after that lags once more."""
        blamed, holders = self._culprits(future, job)
        now = time.monotonic()
        with self._lock:
            self._lagged_tasks += 1
            for worker, since in list(self._lagged.items()):
                if now - since > _LAG_MEMORY_S:
                    del self._lagged[worker]
            for worker in blamed:
                if worker in self._lagged:
                    self._leave_out(worker, holders, now)
                self._lagged[worker] = now

    def _refuse(self, key, error):
        """A task found its worker running other versions (a worker that
        joined late): that worker gets no task from this loader, said once;
        the others go on. The whole cluster goes when the scheduler cannot
        say which worker it was."""
        try:
            where = _within(_CUT_OFF_S,
                            lambda: self.client.run_on_scheduler(_erred_on, key=key))
        except Exception:  # noqa: BLE001 -- the scheduler cannot say
            where = None
        if where is None:
            self._lose(ClusterError(f"{error} (the scheduler did not say which worker)"))
            return
        self._refuse_worker(where, error)

    def _refuse_worker(self, where, error):
        """Worker `where` cannot make this loader's tasks (other versions,
        another source, the job does not load there): no task of this
        loader, said once."""
        with self._lock:
            first = where not in self._refused
            self._refused[where] = str(error)
        self.refresh()  # its slots go now, not at the watch's next look
        if first and not self._closing:
            warnings.warn(f"stoker: Dask worker {where} of the cluster at {self.address} is not "
                          f"used ({error}); the other workers are", RuntimeWarning, stacklevel=2)

    def _lose(self, error):
        """The cluster cannot be used any more: the remote slots go, said once."""
        with self._lock:
            if self._lost is not None:
                return
            self._lost = f"{type(error).__name__}: {error}"
        self._slots.capacity = 0
        if self._own_client:
            # Closed now, not at the loader's close: it would try to reconnect
            # until its timeout, then log that it failed.
            threading.Thread(target=self._close_client, name="stoker-cluster-close",
                             daemon=True).start()
        if self._closing:
            return  # a task that outlived its closed loader: nobody to tell
        warnings.warn(f"stoker: the Dask cluster at {self.address} is no longer used "
                      f"({self._lost}); its batches are made locally",
                      RuntimeWarning, stacklevel=2)

    # -- the consumer's loop --------------------------------------------------

    def refresh(self):
        """Tells the tuner how many slots the cluster offers now, as the watch
        last saw it: one a worker process (it makes one DataLoader batch at a
        time) or, per_thread, one a worker thread; less those suspected of
        hanging; none until the job is on the cluster. Never waits."""
        if self._lost is not None:
            self._slots.capacity = 0
            return
        now = time.monotonic()
        with self._lock:
            for worker, since in list(self._suspects.items()):
                if now - since > _SUSPECT_S:
                    del self._suspects[worker]
            offered = sum(threads if self._per_thread else 1
                          for a, threads in self._known.items()
                          if a not in self._suspects and a not in self._refused)
        # None until the job is on the cluster (sent to the first workers, or
        # again once its holders left): a slot's batch would wait for the send.
        # Sent again for holders that hang, it is still there: a slot's batch
        # is made locally meanwhile (_attempt).
        job = self._job
        self._slots.capacity = offered if job is not None and job.status == "finished" else 0

    def _watch(self):
        """The watch's thread: the scheduler's list of workers, re-read every
        _REFRESH_S (each read waits on the scheduler, so never on the
        consumer's thread or an engine thread)."""
        while not self._closing and self._lost is None:
            if self.client.status in _CLOSED:  # closed under the loader: never answers again
                self._lose(ClusterError(f"the connection to the scheduler was lost (the client "
                                        f"is {self.client.status})"))
                return
            try:
                known = _within(self._timeout_s,
                                lambda: _workers_of(self.client.scheduler_info()))
            except _NoAnswer:
                # Its connections open but no answer (a scheduler stopped, its
                # machine hung): as if it had gone.
                self._lose(ClusterError(f"the scheduler did not answer in {self._timeout_s:g} s"))
                return
            except Exception:  # noqa: BLE001 -- cut off: none known until it answers
                known = None
            self._cut_off = known is None
            self._warm_up(known or {})
            self._note_workers(known or {})
            self._send_job()
            self.refresh()
            self._looked.wait(_REFRESH_S)  # or sooner, when a check ended
            self._looked.clear()

    def _forget_before(self, since):
        """Drops the received batches older than `since`. REQUIRES: _lock held."""
        while self._received and self._received[0][0] < since:
            self._received.popleft()

    def stats(self, target):
        now = time.monotonic()
        with self._lock:
            self._forget_before(now - _RATE_WINDOW_S)
            recent = sum(b for _, b in self._received)
            return {"workers": target, "peak": self._slots.peak, "batches": self._batches,
                    "bytes_per_s": recent / _RATE_WINDOW_S, "capacity": self._slots.capacity,
                    "retries": self._retries, "lagged": self._lagged_tasks, "lost": self._lost,
                    "refused": dict(self._refused), "address": self.address}

    def cancel(self):
        """The loader is closing: waits for tasks end, their batches unmade."""
        self._closing = True

    def close(self):
        self._closing = True
        # A client the user keeps would hold the job's data on the workers.
        if not self._own_client and getattr(self, "_job", None) is not None:
            _cancel(self._job)
        if self._own_client:
            self._close_client()

    def _close_client(self):
        """Closes the loader's own client, within 2 s."""
        # Closing cancels its attempts to reconnect to a scheduler gone,
        # which Dask logs as errors with their tracebacks, on its client's
        # logger and on the one of the frame that ran the task (asyncio's):
        # the loss was said already (_lose).
        hush = _Hush()
        quiet = [logging.getLogger(name) for name in ("distributed.client", "asyncio.events")]
        for logger in quiet:
            logger.addFilter(hush)
        try:
            self.client.close(timeout=2)
        except Exception:  # noqa: BLE001 -- a scheduler gone: nothing to close
            pass
        finally:
            for logger in quiet:
                logger.removeFilter(hush)


class _Hush(logging.Filter):
    """Drops the records of a task's cancellation (a closing client's)."""

    def filter(self, record):
        import asyncio
        return not (record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError))


def _workers_of(info):
    """{worker address: its threads} from the scheduler's info."""
    return {address: max(1, int(w.get("nthreads", 1)))
            for address, w in info.get("workers", {}).items()}


_LAGGED = object()  # _attempt's answer for a task that lagged (_lags)
_NOT_SENT = object()  # _attempt's answer where no worker could take the task


class _NoAnswer(TimeoutError):
    pass


def _within(seconds, call, gave_up=None):
    """call() on a thread of its own, waited for `seconds` at most, or until
    `gave_up()` says no answer will come (then _NoAnswer, a TimeoutError;
    the thread ends when the call does)."""
    box = {}

    def run():
        try:
            box["value"] = call()
        except BaseException as e:  # noqa: BLE001 -- handed to the waiting thread
            box["error"] = e

    thread = threading.Thread(target=run, name="stoker-cluster-call", daemon=True)
    thread.start()
    deadline = time.monotonic() + seconds
    while thread.is_alive() and (left := deadline - time.monotonic()) > 0:
        thread.join(left if gave_up is None else min(left, _POLL_S))
        if gave_up is not None and thread.is_alive() and gave_up():
            break
    if thread.is_alive():
        if time.monotonic() < deadline:
            raise _NoAnswer("no answer will come: given up waiting")
        raise _NoAnswer(f"no answer from the cluster within {seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _when_done(future, signal):
    """signal() on the client's IO loop once `future` ends (finished, erred,
    cancelled, lost); it must not block. Not future.add_done_callback: Dask
    runs those on an executor that the interpreter's exit shuts down (a
    threading exit hook) before stoker's atexit closes the loader, and each
    task that ended then logged 'cannot schedule new futures after shutdown'."""
    try:
        from distributed.client import done_callback  # what add_done_callback schedules
    except ImportError:  # a Dask without it: its own way, noisy at exit only
        future.add_done_callback(lambda _: signal())
        return
    future.client.loop.add_callback(done_callback, future, lambda _: signal())


def _cancel(future):
    """future.cancel(), not waited for: it asks the scheduler, which may not answer."""
    def run():
        try:
            future.cancel()
        except Exception:  # noqa: BLE001 -- a client closed or cut off: nothing to cancel
            pass
    threading.Thread(target=run, name="stoker-cluster-cancel", daemon=True).start()


def _unpicklable(job):
    """(attribute, value, error) of the first part of `job` that Dask cannot
    pickle, or None."""
    from distributed.protocol import pickle as dask_pickle
    for name, value in vars(job).items():
        try:
            dask_pickle.dumps(value)
        except Exception as e:  # noqa: BLE001 -- whatever pickling raises
            return name, value, e
    return None


def _checked(*held):
    """A Dask task on a worker that joined late: its versions(), once `held`
    (the job, when it was sent) is there and, for a Loader's, its source
    checked (_SourceMismatch)."""
    for job in held:
        if isinstance(job, SampleJob):
            job.check_source()
    return versions()


def _load_error(blob):
    """On a worker (Client.run): why the pickled job does not load there,
    "Type: message", or None when it does."""
    from distributed.protocol import pickle as dask_pickle
    try:
        dask_pickle.loads(blob)
    except Exception as e:  # noqa: BLE001 -- whatever loading the user's objects raises
        return f"{type(e).__name__}: {e}"
    return None


def _blame(dask_scheduler, key, job):
    """On the scheduler: (the worker a task runs on or None, the workers
    holding the job)."""
    ts = dask_scheduler.tasks.get(key)
    where = None if ts is None or ts.processing_on is None else ts.processing_on.address
    jts = dask_scheduler.tasks.get(job)
    return where, [] if jts is None else sorted(ws.address for ws in jts.who_has)


def _erred_on(dask_scheduler, key):
    """On the scheduler: a worker a task failed on, or None."""
    ts = dask_scheduler.tasks.get(key)
    return None if ts is None or not ts.erred_on else sorted(ts.erred_on)[0]
