"""stoker.Loader: the Python face of the C++ loader."""

import json
import os
import warnings

from . import _args, _exit, _remote, _stats, _stoker
from . import transforms as _transforms
from ._sources import Source, Synthetic, _open_path


def rank_facts():
    """Where this process sits in a distributed job, read by stoker's probe
    from the launcher's variables (torchrun: RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE; Open MPI's too): a dict with "rank", "world_size",
    "local_rank", "local_world_size" (None when unknown), "launcher" and
    "problem" (why rank or world_size is unknown under a launcher, else "")."""
    return _stoker.rank_facts()


def _open_source(source):
    if isinstance(source, Source):
        return source
    if isinstance(source, (str, bytes, os.PathLike)):
        return _open_path(os.fsdecode(source))
    raise TypeError("source must be a stoker source (stoker.ImageFolder, FileList, TarShards, "
                    f"Synthetic) or a path, got {type(source).__name__}")


def _make_transform(transforms, source):
    if transforms is None:
        if isinstance(source, Synthetic):
            return _transforms.Raw(source.shape, source.dtype)
        return _transforms.train(224)
    if isinstance(transforms, _transforms.Transform):
        return transforms
    if isinstance(transforms, str):
        if transforms == "train":
            return _transforms.train(224)
        if transforms == "eval":
            return _transforms.eval(224)
        raise ValueError(f"transforms must be 'train' or 'eval' when a string, got {transforms!r}")
    if isinstance(transforms, dict):
        return _transforms.Image(**transforms)
    raise TypeError("transforms must be a stoker.transforms.Transform (e.g. "
                    "stoker.transforms.train(224)), a dict of its options, 'train' or 'eval'; "
                    f"got {type(transforms).__name__}")


def shard_from_env():
    """``{"rank": r, "world_size": w}`` from the launcher's variables (torchrun's
    RANK and WORLD_SIZE; Open MPI's too), or rank 0 of 1 without a launcher.
    A loader shards only when told, as torch's DataLoader does with a
    DistributedSampler: ``stoker.Loader(source, **stoker.shard_from_env())``.
    A launcher's variable that is missing or malformed is a ValueError naming
    it: every process taking rank 0 would read the same part."""
    facts = rank_facts()
    if facts["problem"]:
        raise ValueError(f"the {facts['launcher']} launcher's rank is unknown: "
                         f"{facts['problem']}")
    return {"rank": facts["rank"], "world_size": facts["world_size"]}


def _resolve_ranks(rank, world_size):
    if rank is None and world_size is None:
        return 0, 1  # every sample: sharding is explicit, as with torch's DistributedSampler
    if rank is None or world_size is None:
        raise ValueError("give both rank and world_size, or neither (then the loader reads "
                         "every sample; stoker.shard_from_env() gives torchrun's)")
    rank = _args.integer("rank", rank, *_args.INT32)
    world_size = _args.integer("world_size", world_size, *_args.INT32)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size), got rank={rank}, "
                         f"world_size={world_size}")
    return rank, world_size


def _resolve_output(output):
    if output not in ("auto", "torch", "numpy"):
        raise ValueError(f"output must be 'auto', 'torch' or 'numpy', got {output!r}")
    if output == "numpy":
        return None
    try:
        import torch
    except ImportError:
        if output == "torch":
            raise
        return None
    return torch


def _prefetch_batches(prefetch, workers, batch_items):
    """The engine's prefetch bound: `prefetch` batches, or for None the
    default for `workers` making batches of `batch_items` (stoker/defaults.h)."""
    return _stoker.default_prefetch(workers, batch_items) if prefetch is None else prefetch


def _error_policy(on_error):
    """The engine's ErrorPolicy for on_error ("raise" or "skip", as _args.on_error checks it)."""
    return _stoker.ErrorPolicy.__members__[on_error.upper()]


def _resolve_device(device, torch):
    """(CUDA device index, torch.device) for ``device``, or (None, None) for
    batches in host memory. A device needs torch with CUDA and a GPU; without
    them it is a RuntimeError that says which is missing."""
    if device is None:
        return None, None
    if isinstance(device, bool) or not isinstance(device, (int, str)) and \
            type(device).__name__ != "device":
        raise TypeError(f"device must be None, 'cpu', 'cuda', 'cuda:N', an int or a "
                        f"torch.device, got {type(device).__name__}")
    spec = f"cuda:{device}" if isinstance(device, int) else str(device)
    if spec == "cpu":
        return None, None
    if spec != "cuda" and not (spec.startswith("cuda:") and spec[5:].isdigit()):
        raise ValueError(f"device must be None, 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if torch is None:
        raise RuntimeError(f"device={device!r} gives torch tensors, but torch is not installed "
                           "(or output='numpy' was asked for)")
    if not torch.cuda.is_available():
        why = ("was built without CUDA" if torch.version.cuda is None
               else f"(CUDA {torch.version.cuda}) sees no GPU")
        raise RuntimeError(f"device={device!r}: this PyTorch {torch.__version__} {why}; "
                           "use device=None for batches in host memory")
    index = torch.cuda.current_device() if spec == "cuda" else int(spec[5:])
    count = torch.cuda.device_count()
    if index >= count:
        raise ValueError(f"device={device!r} is out of range: torch sees {count} CUDA "
                         f"device(s)")
    return index, torch.device("cuda", index)


class _Pass:
    """One pass of a Loader (what iter() gives): the rest of its epoch, then
    StopIteration for good, as an iterator must (the next iter() starts the
    next pass). A pass whose epoch another pass ended ends with it, never
    running on into the next epoch."""

    def __init__(self, loader):
        self._loader, self._done = loader, False
        self._epoch = loader.epoch

    def __iter__(self):
        return self

    def __next__(self):
        if self._done or self._loader.epoch != self._epoch:
            self._done = True
            raise StopIteration
        try:
            return self._loader.__next__()
        except StopIteration:
            self._done = True
            raise
        except _stoker.DataError:
            if self._loader._ended:  # the epoch ended with its error: so does this pass,
                self._loader._ended = False  # and the next pass is the next epoch's
                self._done = True
            raise

    def __len__(self):
        return len(self._loader)


class Loader:
    """Batches of ``(images, labels)`` from ``source``, made by a pool of C++
    worker threads whose size the tuner picks while you train.

    source: a stoker source (ImageFolder, FileList, TarShards, Synthetic), or
        a path: a folder means ImageFolder, a file ending in .tar or a brace
        pattern ("shard-{000..099}.tar"; globs are not expanded) TarShards,
        another file a FileList.
    transforms: stoker.transforms.train(224) (the default for image sources),
        stoker.transforms.eval(224), stoker.transforms.Image(...), a dict of
        Image's options, or "train" / "eval". Synthetic sources default to
        passing samples through.
    workers: "auto" (the tuner decides, and keeps deciding) or a number of
        threads; 0 makes the iterating thread do the work.
    prefetch: at most this many batches in flight (default: the tuner's pick,
        or for a fixed worker count 2, more for many workers); prefetch_bytes
        bounds their bytes.
    memory_budget: bytes that batches in flight and workers' buffers may take
        together, for any worker count (default: 80 % of available memory).
        A batch_size whose two batches do not fit is a ValueError; a sample
        larger than a worker's share (a huge file, an image whose decode
        would not fit) is refused before it is read or decoded, as a
        stoker.ResourceError naming it and the cap, or a skip under
        on_error="skip".
    on_error: "raise" (a sample that cannot be read or decoded raises at its
        batch, naming the sample and file; iteration may continue after it)
        or "skip" (it is left out; see skipped()).
    rank, world_size: this process's share of each epoch. Default: every
        sample (as torch's DataLoader without a DistributedSampler); pass
        **stoker.shard_from_env() for torchrun's RANK and WORLD_SIZE. Every
        rank gets the same number of batches; shards are padded by repeating
        samples.
    output: "auto" (torch tensors when torch imports, numpy arrays otherwise),
        "torch" or "numpy". Images are zero-copy views of the batch buffer,
        which stays valid while any array or tensor of it is alive (even after
        the loader is gone); labels are int64.
    pin_memory: page-lock the loader's recycled batch buffers once (with
        cudaHostRegister; the CUDA runtime is loaded when asked for), so that
        ``images.to("cuda", non_blocking=True)`` copies asynchronously. Where
        no CUDA device can be used, nothing is pinned (as torch's DataLoader)
        and a RuntimeWarning says why.
    device: None (host batches), "cuda" (torch's current device) or
        "cuda:N": images and labels are torch tensors on that device. stoker
        copies each batch on its own CUDA stream as soon as it is ready (at
        most device_prefetch_bytes ahead; default a quarter of the free device
        memory) and makes torch's current stream wait for the copy, without
        blocking the host. The device buffer is reused once the tensor is
        gone and the work queued on that stream before then is done. Needs
        torch with CUDA (a RuntimeError otherwise); implies pin_memory.
    cluster: a Dask scheduler address ("tcp://host:port", "tls://...") or a
        distributed.Client, with workers="auto": when the local workers are
        at the CPU budget and your loop still waits, the tuner sends some
        batches' samples to the cluster's workers (one slot per worker
        thread), which read the same source (a path they can reach) and make
        the same bytes; the fewest slots that keep the loop fed
        (docs/remote.md). cluster_security: Dask's Security for an address;
        remote_timeout: seconds a task may take before it is re-sent
        elsewhere; remote_min: slots kept whatever the tuner says.

    Iterating yields the rest of the current epoch; the next pass (a new
    iter(), the next ``for``) starts the following epoch, or the one given to
    set_epoch(). A pass that ended keeps raising StopIteration. Use from one
    thread.
    """

    def __init__(self, source, batch_size=64, shuffle=True, seed=0, drop_last=False,
                 transforms=None, workers="auto", prefetch=None, on_error="raise", rank=None,
                 world_size=None, *, output="auto", ordered=True, prefetch_bytes=None,
                 memory_budget=None, max_workers=None, tune_interval=None, trace_path=None,
                 start_epoch=0, pin_memory=False, device=None, device_prefetch_bytes=None,
                 cluster=None, cluster_security=None, remote_timeout=_remote.DEFAULT_TIMEOUT_S,
                 remote_min=0):
        self._impl = None
        self._cluster = None
        # The last pass ended with an error (every sample skipped): its
        # StopIteration is still due.
        self._ended = False
        # Every argument is checked here, before the source is opened: a
        # wrong one is a TypeError or ValueError that names it.
        batch_size = _args.integer("batch_size", batch_size, 1, _args.INT64[1])
        shuffle = _args.boolean("shuffle", shuffle)
        seed = _args.integer("seed", seed, 0, _args.UINT64_MAX)
        drop_last = _args.boolean("drop_last", drop_last)
        if isinstance(workers, str):
            if workers != "auto":
                raise ValueError(f"workers must be 'auto' or an int in [0, {_stoker.MAX_WORKERS}], "
                                 f"got {workers!r}")
            workers = _stoker.AUTO_WORKERS
        else:
            workers = _args.integer("workers", workers, 0, _stoker.MAX_WORKERS)
        prefetch = _args.optional_integer("prefetch", prefetch, 1, _args.INT32[1])
        on_error = _args.on_error(on_error)
        ordered = _args.boolean("ordered", ordered)
        prefetch_bytes = _args.optional_integer("prefetch_bytes", prefetch_bytes, 1,
                                                _args.UINT64_MAX)
        # None keeps the engine's default (LoaderOptions and TunerOptions).
        memory_budget = _args.optional_integer("memory_budget", memory_budget, 1,
                                               _args.UINT64_MAX)
        max_workers = _args.optional_integer("max_workers", max_workers, 1, _args.INT32[1])
        trace_path = self._trace_path = _args.optional_path("trace_path", trace_path)
        _args.tuner_only("workers", None if workers == _stoker.AUTO_WORKERS else workers,
                         max_workers=max_workers, trace_path=trace_path,
                         tune_interval=tune_interval)
        tune_interval = _args.tune_interval(tune_interval)
        start_epoch = _args.integer("start_epoch", start_epoch, 0, _stoker.MAX_EPOCH)
        self.rank, self.world_size = _resolve_ranks(rank, world_size)
        self._torch = _resolve_output(output)
        pin_memory = _args.boolean("pin_memory", pin_memory)
        device_prefetch_bytes = _args.optional_integer(
            "device_prefetch_bytes", device_prefetch_bytes, 1, _args.UINT64_MAX)
        self._device_index, self.device = _resolve_device(device, self._torch)
        remote = _remote.resolve("workers", workers, cluster, cluster_security, remote_timeout,
                                 remote_min)
        self.source = _open_source(source)
        self.transform = _make_transform(transforms, self.source)
        tuner = _stoker.TunerOptions(memory_budget_bytes=memory_budget,
                                     memory_budget_name="option 'memory_budget'",
                                     max_workers=max_workers,
                                     interval_s=tune_interval, trace_path=trace_path,
                                     remote_min=remote["remote_min"])
        samples = {"source": self.source._impl, "transform": self.transform._impl}
        if cluster is not None:
            samples = {"kind": self._remote_kind(remote, seed)}
        self._impl = _stoker.Loader(_stoker.LoaderOptions(
            **samples, batch_size=batch_size,
            shuffle=shuffle, seed=seed, drop_last=drop_last, rank=self.rank,
            world_size=self.world_size, workers=workers,
            prefetch_batches=_prefetch_batches(prefetch, workers, batch_size),
            prefetch_bytes=prefetch_bytes,
            on_error=_error_policy(on_error), ordered=ordered, start_epoch=start_epoch,
            pin_memory=pin_memory, device=self._device_index,
            device_prefetch_bytes=device_prefetch_bytes, tuner=tuner))
        if self._impl.pin_skipped:  # as torch's DataLoader, which pins only where CUDA is
            warnings.warn(f"stoker.Loader(pin_memory=True): {self._impl.pin_skipped}: its "
                          "batches are not page-locked", RuntimeWarning, stacklevel=2)
        if self._cluster is not None:
            self._cluster.follow(self._impl)
        _exit.close_at_exit(self)  # its threads must not outlive the interpreter
        self.batch_size = batch_size

    def _remote_kind(self, remote, seed):
        """The engine's samples beside remote slots on the cluster."""
        slots = _stoker.RemoteSlots()
        self._cluster = _remote.Cluster(
            remote["cluster"], remote["cluster_security"], remote["remote_timeout"],
            _remote.SampleJob(self.source, self.transform, seed), slots, per_thread=True)
        local = _stoker.sample_kind(self.source._impl, self.transform._impl, seed)
        return _stoker.local_first_samples(local, self._cluster.run_samples, slots)

    # Iteration -------------------------------------------------------------

    def __iter__(self):
        return _Pass(self)

    def __next__(self):
        stream = 0
        if self.device is not None:  # torch's stream waits for stoker's copy
            stream = self._torch.cuda.current_stream(self.device).cuda_stream
        if self._ended:
            self._ended = False
            raise StopIteration
        while True:
            epoch = self._impl.epoch
            try:
                batch = self._impl.next(stream)
            except _stoker.Cancelled:
                if _exit.ends_quietly():
                    raise SystemExit from None  # the exit closed it under this thread (_exit)
                raise
            except _stoker.DataError:
                # An epoch that delivered nothing (every sample skipped) ends
                # with its error: the pass ends there, as after any other
                # end; the call after it is not the next epoch's first.
                self._ended = self._impl.epoch != epoch
                raise
            if batch is None:
                raise StopIteration
            images, labels = batch
            if len(labels):  # a batch whose samples were all skipped is left out
                break
        if self.device is not None:
            # A zero-copy view: the tensor keeps stoker's batch alive. The
            # labels' copy is queued on the current stream (a blocking one
            # would wait for all the work queued there); CUDA stages a copy
            # from pageable memory before the call returns.
            return (self._torch.as_tensor(images, device=self.device),
                    self._torch.from_numpy(labels).to(self.device, non_blocking=True))
        if self._torch is not None:
            return self._torch.from_numpy(images), self._torch.from_numpy(labels)
        return images, labels

    def __len__(self):
        """Batches per epoch (this rank's)."""
        return self._impl.batches_per_epoch

    # Epochs and checkpoints ---------------------------------------------------

    def set_epoch(self, epoch):
        """Makes ``epoch`` the one the next pass yields (its order and
        augmentations depend on it); abandons an epoch in progress. After
        load_state_dict, set_epoch of the checkpoint's epoch keeps it: a
        resumed loop calls set_epoch as it always does."""
        self._impl.set_epoch(_args.integer("epoch", epoch, 0, _stoker.MAX_EPOCH))
        self._ended = False

    @property
    def epoch(self):
        """The epoch in progress, or the one the next pass starts."""
        return self._impl.epoch

    def state_dict(self):
        """Where the current epoch stands, and the plan it belongs to:
        {"seed", "epoch", "position", "beyond", "num_samples", "batch_size",
        "shuffle", "drop_last", "rank", "world_size", "pad_shards"}. A loader
        with the same data set size and settings resumes from it with any
        worker count."""
        return self._impl.state()

    def load_state_dict(self, state):
        """Resumes at ``state``: the next pass yields exactly the batches of
        that epoch not yet delivered. A checkpoint of another plan (another
        data set size, batch size, shuffle, seed, drop_last, rank or
        world_size) raises ValueError naming the field and both values,
        and changes nothing."""
        # _args checks the types (and takes numpy / torch integers); the C++
        # side (LoaderStateFromJson, Loader::Restore) names a missing field
        # and a position outside the epoch.
        self._impl.restore(json.dumps(_args.loader_state(state)))
        self._ended = False

    # Observing ---------------------------------------------------------------

    @property
    def workers(self):
        """Worker threads now."""
        return self._impl.workers

    def stats(self, gpu=True, pcie=False):
        """What the loader is doing: "workers", "samples_per_s" and
        "stall_fraction" (the share of time your loop waited for data) over
        its last 5 seconds ("window_s" says the span: less while the loader
        is younger), the same since its first batch was asked for
        ("samples_per_s_since_start", "stall_fraction_since_start"),
        "tuner" (the tuner's current view, with its last
        decision and reason, and under "node" this loader's share of the
        machine's CPU budget beside the other stoker loaders there; None with
        a fixed worker count), "metrics" (the engine's raw counters) and, with
        ``gpu``, "gpu": every GPU's utilisation and memory from NVML, and with
        ``pcie`` its PCIe throughput too (which NVML takes ~40 ms per GPU to
        measure; -1 otherwise), as a list of dicts; or None with "gpu_note"
        saying why (e.g. "no GPU (NVML not found: ...)"). With a cluster,
        "remote": its slots in use ("workers"), the most at once ("peak"),
        tasks made there ("batches"), bytes received per second over the last
        5 s ("bytes_per_s"), and whether the cluster was "lost" (why); None
        without one."""
        m = self._impl.metrics()
        return {
            "workers": m["workers_target"],
            "prefetch_batches": m["prefetch_batches"],
            "epoch": self._impl.epoch,
            **_stats.consumer_rates(m, "samples_delivered"),
            "tuner": self._impl.tuner_view(),
            "remote": None if self._cluster is None else self._cluster.stats(m["workers_remote"]),
            "metrics": m,
            **(_stats.gpu(pcie) if gpu else {}),
        }

    def decisions(self):
        """Every decision the tuner made so far, with its reason and figures."""
        return self._impl.tuner_trace()

    tuner_trace = decisions  # stoker.DataLoader's first name for it

    def skipped(self):
        """The samples left out under on_error="skip": dicts with "epoch",
        "index", "key" (its file) and "reason": the first, up to the records
        a loader keeps (stats()["metrics"]["samples_skipped"] counts all)."""
        return self._impl.skipped()

    @property
    def classes(self):
        return self.source.classes

    # Ending ------------------------------------------------------------------

    def close(self):
        """Stops and joins the workers now (also done when the loader is
        garbage-collected, and at the interpreter's exit, where a thread
        still iterating ends quietly with SystemExit; closed by another
        thread it gets stoker.Cancelled). Batches already yielded stay
        valid."""
        if self._cluster is not None:
            self._cluster.cancel()  # remote slots waiting on a task return
        if self._impl is not None:
            if self._trace_path and not self._impl.closed:
                _stats.flush_trace(self._impl, self._trace_path)
            self._impl.close()
        if self._cluster is not None:
            self._cluster.close()

    def __del__(self):
        # The cluster's client and watch thread would outlive an unclosed loader.
        if getattr(self, "_cluster", None) is not None:
            self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"stoker.Loader({self.source!r}, batch_size={self.batch_size}, "
                f"transform={self.transform!r}, rank={self.rank}/{self.world_size})")
