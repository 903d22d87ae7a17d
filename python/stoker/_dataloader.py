"""stoker.DataLoader: torch's DataLoader for any map-style dataset, on worker
processes whose number the tuner sets and changes live (num_workers="auto")."""

import atexit
import collections
import functools
import json
import os
import time
import weakref

from . import _args, _stats, _stoker, _workers
from ._loader import _prefetch_batches, _resolve_device
from ._stoker import DataError, ResourceError

_FORMAT = "stoker.DataLoader/1"


def _torch():
    import torch
    return torch


class DataLoader:
    """Batches from ``dataset`` as torch's DataLoader makes them (same arguments,
    same samplers, same ``default_collate`` or your ``collate_fn``), from worker
    processes that stoker starts, resizes and stops while you iterate.

    ``num_workers="auto"`` (the default): the tuner picks the count and the
    prefetch depth and keeps adjusting them, so the consumer does not wait, with
    the fewest workers. An int fixes the count; 0 loads in the calling thread.

    Differences from torch: workers are forked once from a zygote made here
    (the dataset is inherited, never pickled, so lambdas work), and kept
    (``persistent_workers`` is always true); the randomness of each batch's
    samples (``random``, numpy, torch) is seeded from (seed, epoch, batch), so
    batches are the same for any worker count and across resizes; the seed is drawn
    from ``generator`` (or torch's global generator) when the loader is made.
    Without a sampler, ``shuffle=True`` orders each epoch by (seed, epoch), so
    ``state_dict`` resumes in a new process. A sample whose ``__getitem__``
    raises (or whose worker dies) is reported by a ``stoker.DataError`` naming
    it, and the batch's other samples come with the next ``next()``;
    ``on_error="skip"`` leaves it out and records it in ``skipped()``, except
    what is not the sample's fault (MemoryError; an OSError of refused
    resources or of a store gone or out of reach, e.g. ENOTCONN, ESTALE,
    ETIMEDOUT): that raises ``stoker.ResourceError`` in either mode.
    IterableDataset is refused: its stream cannot be split among a changing
    number of workers without repeating or losing samples.
    ``device="cuda[:N]"``: batches arrive as tensors on that device, copied on a
    stream of their own while the consumer works on the batch before (at most
    ``device_prefetch_bytes`` ahead, default a quarter of the free device
    memory); the consumer's current stream waits for each copy, the host does not.
    ``worker_kind="threads"`` runs batches on threads of this process instead,
    for datasets whose work releases the GIL; ``"auto"`` measures both on your
    loop and keeps the faster (``stats()["kind_trial"]``; docs/dataloader.md).
    """

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
                 num_workers="auto", collate_fn=None, pin_memory=False, drop_last=False,
                 timeout=0, worker_init_fn=None, prefetch_factor=None, persistent_workers=True,
                 generator=None, in_order=True, *, worker_kind="processes", on_error="raise",
                 max_workers=0, device=None, device_prefetch_bytes=None,
                 memory_budget_bytes=0, tune_interval=0.2, trace_path=None):
        torch = _torch()
        from torch.utils.data import IterableDataset
        from torch.utils.data._utils.collate import default_collate, default_convert
        if isinstance(dataset, IterableDataset):
            raise TypeError("stoker.DataLoader takes map-style datasets (with __getitem__ and "
                            "__len__); an IterableDataset's stream cannot be split among a "
                            "changing number of workers without repeating or losing samples. "
                            "Use torch.utils.data.DataLoader for it.")
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise TypeError("dataset must have __getitem__ and __len__, got "
                            f"{type(dataset).__name__}")
        self.dataset = dataset
        self._pid = os.getpid()
        self._engine = None
        self._workers = None      # process workers (kinds "processes" and "auto")
        self._threads = None      # thread workers (kinds "threads" and "auto")
        self._zygote_pid = None
        self._closed = False
        _open_loaders.add(self)

        # -- batching, as torch decides it
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, "
                                 "shuffle, sampler, and drop_last")
            batch_size, drop_last = None, False
        elif batch_size is None:
            if drop_last:
                raise ValueError("batch_size=None option disables auto-batching and is mutually "
                                 "exclusive with drop_last")
        else:
            batch_size = _args.integer("batch_size", batch_size, 1, 1 << 31)
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        self.batch_size = batch_size
        self.drop_last = bool(drop_last)
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self._shuffle = bool(shuffle)
        self._unbatched = batch_sampler is None and batch_size is None
        if collate_fn is None:
            collate_fn = default_convert if self._unbatched else default_collate
        self.collate_fn = collate_fn
        self.pin_memory = bool(pin_memory)
        _, self.device = _resolve_device(device, torch)
        self._device_budget = _args.optional_integer(
            "device_prefetch_bytes", device_prefetch_bytes, 1, 2**63 - 1)
        if self.device is not None and self._device_budget is None:
            self._device_budget = torch.cuda.mem_get_info(self.device)[0] // 4
        self.timeout = _args.real("timeout", timeout, at_least=0)
        self.worker_init_fn = worker_init_fn
        self.persistent_workers = persistent_workers
        self.in_order = bool(in_order)
        self.generator = generator
        self.on_error = _args.on_error(on_error)

        # -- workers
        if num_workers == "auto":
            workers = _stoker.AUTO_WORKERS
        else:
            workers = _args.integer("num_workers", num_workers, 0, _stoker.MAX_WORKERS)
        if prefetch_factor is not None:
            if workers == 0:
                raise ValueError("prefetch_factor option could only be specified in "
                                 "multiprocessing (num_workers > 0 or 'auto')")
            prefetch_factor = _args.integer("prefetch_factor", prefetch_factor, 1, 1 << 16)
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        if worker_kind not in ("processes", "threads", "auto"):
            raise ValueError("worker_kind must be 'processes', 'threads' or 'auto', got "
                             f"{worker_kind!r}")
        if worker_kind == "threads" and worker_init_fn is not None:
            raise ValueError("worker_init_fn needs worker processes; thread workers share this "
                             "process (worker_kind='threads')")
        self.worker_kind = worker_kind
        self._kinds = None  # worker_kind="auto": both kinds' workers
        self._trial = None

        self._seed = int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())
        self._len = self._count_batches()
        self._next_epoch = 0
        self._resume = False      # load_state_dict: the next iter() continues that epoch
        self._iterator = None     # the live iterator, if any
        self._skipped = []
        self._inline_position = 0
        self._job = _workers._Job(dataset, collate_fn, default_collate, worker_init_fn,
                                  self._seed, self._unbatched)
        if workers == 0:
            return
        if self._len == 0:
            raise ValueError("the loader has no batch: the dataset is empty, or drop_last "
                             "leaves nothing")
        self._table = _stoker.EpochBatches(self._len)
        seed = self._seed & (2**64 - 1)
        if worker_kind != "threads":
            fd, self._zygote_pid = _workers.start_zygote(self._job)
            self._workers = _stoker.ProcessWorkers(fd, self._zygote_pid, seed, self._table)
        if worker_kind != "processes":
            self._threads = _stoker.ThreadWorkers(
                functools.partial(_workers.run_batch, self._job), seed, self._table)
        if self._workers is not None and (self.pin_memory or self.device is not None) \
                and torch.cuda.is_available():
            # Segments page-locked once each: batches from processes are pinned
            # where the workers wrote them, with no pinned copy per batch.
            self._workers.pin()
        if worker_kind == "auto":
            self._kinds = _stoker.WorkerKinds(self._workers, self._threads)
            self._trial = _KindTrial(self, "worker_init_fn needs worker processes"
                                     if worker_init_fn is not None else None)
            transform = self._kinds.transform()
        elif worker_kind == "threads":
            transform = self._threads.transform()
        else:
            transform = self._workers.transform()
        prefetch = None if prefetch_factor is None or workers == _stoker.AUTO_WORKERS \
            else prefetch_factor * workers
        try:
            tuner = _stoker.TunerOptions(
                memory_budget_bytes=_args.integer("memory_budget_bytes", memory_budget_bytes,
                                                  0, 2**63 - 1),
                max_workers=_args.integer("max_workers", max_workers, 0, _stoker.MAX_WORKERS),
                interval_s=_args.real("tune_interval", tune_interval, above=0),
                trace_path=None if trace_path is None else os.fsdecode(trace_path),
                initial_workers=self._initial_workers(workers, max_workers))
            # The user's batches are the engine's samples, in plan order; the
            # error policy is applied here to the failures each batch carries.
            self._engine = _stoker.Loader(_stoker.LoaderOptions(
                source=self._table.source(), transform=transform, batch_size=1, shuffle=False,
                workers=workers, prefetch_batches=_prefetch_batches(prefetch, workers),
                on_error=_stoker.ErrorPolicy.RAISE, ordered=self.in_order, tuner=tuner))
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _initial_workers(workers, max_workers):
        """With "auto": the CPU budget, where a user would start (the tuner
        then finds the fewest that keep up); processes are slow to add."""
        if workers != _stoker.AUTO_WORKERS:
            return 0
        budget = _stoker.probe(None, False)["cpu"]["budget_cores"] or 1
        return max(1, min(int(budget), max_workers or _stoker.MAX_WORKERS))

    # -- the plan -----------------------------------------------------------

    def _count_batches(self):
        if self.batch_sampler is not None:
            return len(self.batch_sampler)
        n = len(self.sampler) if self.sampler is not None else len(self.dataset)
        if self._unbatched:
            return n
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _batches(self, epoch):
        """Epoch `epoch`'s batches, lists of dataset indices."""
        if self.batch_sampler is not None:
            return [list(b) for b in self.batch_sampler]
        order = list(self.sampler) if self.sampler is not None else self._order(epoch)
        if self._unbatched:
            return [[i] for i in order]
        size = self.batch_size
        batches = [order[i:i + size] for i in range(0, len(order), size)]
        if self.drop_last and batches and len(batches[-1]) < size:
            batches.pop()
        return batches

    def _order(self, epoch):
        """Epoch `epoch`'s order of the dataset without a sampler: a function of (seed, epoch)."""
        if not self._shuffle:
            return list(range(len(self.dataset)))
        torch = _torch()
        g = torch.Generator()
        g.manual_seed(_stoker.batch_seed(self._seed & (2**64 - 1), epoch, -1))
        return torch.randperm(len(self.dataset), generator=g).tolist()

    def _own_order(self):
        """True when epochs are pure functions of (seed, epoch), so the next one
        may be handed to the workers early."""
        return self.sampler is None and self.batch_sampler is None

    def _give_batches(self, epoch):
        """Hands epoch `epoch`'s batches to the workers, once per epoch number
        (a user sampler is read then, as torch reads it at iter())."""
        if self._table.has(epoch):
            return
        if self._own_order() and not self._unbatched:
            # Consecutive slices of one order: no list per batch.
            flat = self._order(epoch)
            size = self.batch_size
            if self.drop_last:
                del flat[len(flat) - len(flat) % size:]
            offsets = list(range(0, len(flat), size)) + [len(flat)]
        else:
            batches = self._batches(epoch)
            if len(batches) != self._len:
                raise ValueError(f"epoch {epoch} has {len(batches)} batches, the loader was "
                                 f"made for {self._len}: the sampler's length changed")
            flat, offsets = [], [0]
            for b in batches:
                flat.extend(int(i) for i in b)
                offsets.append(len(flat))
        self._table.set(epoch, flat, offsets)

    # -- iteration ----------------------------------------------------------

    def __len__(self):
        return self._len

    def __iter__(self):
        self._check_usable()
        prev, epoch = self._iterator, self._next_epoch
        if self._engine is None:
            it = _InlineIterator(self, epoch, self._inline_position if self._resume else 0)
        else:
            if not self._resume and (self._engine.epoch != epoch or
                                     (prev is not None and not prev.finished)):
                self._engine.set_epoch(epoch)  # abandons what is left of the last one
            self._give_batches(epoch)
            it = _Iterator(self, epoch)
        if prev is not None:
            prev.done = True
        self._resume = False
        self._next_epoch = epoch + 1
        self._iterator = it
        return it

    def set_epoch(self, epoch):
        """Makes ``epoch`` the one the next ``iter()`` runs (as a sampler's
        set_epoch does for torch); an epoch in progress is abandoned then."""
        self._check_usable()
        epoch = _args.integer("epoch", epoch, 0, 2**62)
        self._next_epoch = epoch
        self._resume = False
        if self._engine is not None:
            self._engine.set_epoch(epoch)
        if self._iterator is not None:
            self._iterator.done = True

    def _check_usable(self):
        if os.getpid() != self._pid:
            raise RuntimeError(
                f"this stoker.DataLoader was made in process {self._pid} and cannot be used in "
                f"a forked child (pid {os.getpid()}): its workers belong to the parent; make a "
                "new loader in the child")
        if self._closed:
            raise ValueError("this stoker.DataLoader is closed")

    # -- checkpoints --------------------------------------------------------

    def state_dict(self):
        """Where the current epoch stands; ``load_state_dict`` in a new process
        (with any ``num_workers``) resumes with exactly the remaining batches.
        With your own sampler, it must give that epoch the same order again."""
        self._check_usable()
        it = self._iterator
        if self._engine is not None:
            engine = self._engine.state()
        else:
            epoch = it.epoch if it is not None and not it.finished else self._next_epoch
            position = it.position if it is not None and not it.finished else 0
            engine = {"epoch": epoch, "position": position}
        return {"format": _FORMAT, "seed": self._seed, "dataset_len": len(self.dataset),
                "batches_per_epoch": self._len, "batch_size": self.batch_size,
                "shuffle": self._shuffle, "drop_last": self.drop_last,
                "sampler": "default" if self._own_order() else type(
                    self.batch_sampler or self.sampler).__name__,
                "engine": engine}

    def load_state_dict(self, state):
        """Resumes at ``state`` (from ``state_dict``): the next ``iter()``
        continues that epoch. Errors name the field that differs."""
        self._check_usable()
        if not isinstance(state, dict) or state.get("format") != _FORMAT:
            raise ValueError(f"not a {_FORMAT} state dict")
        mine = self.state_dict()
        for field in ("seed", "dataset_len", "batches_per_epoch", "batch_size", "shuffle",
                      "drop_last", "sampler"):
            if state.get(field) != mine[field]:
                raise ValueError(f"state dict's {field} {state.get(field)!r} differs from this "
                                 f"loader's {mine[field]!r}")
        engine = state.get("engine")
        if not isinstance(engine, dict):
            raise ValueError("state dict has no 'engine' entry")
        epoch = _args.integer("state['engine']['epoch']", engine.get("epoch"), 0, 2**62)
        if self._engine is not None:
            self._engine.restore(json.dumps(engine))
            self._give_batches(epoch)
        else:
            self._inline_position = _args.integer("state['engine']['position']",
                                                  engine.get("position"), 0, self._len)
        self._next_epoch = epoch
        self._resume = True
        if self._iterator is not None:
            self._iterator.done = True

    # -- figures ------------------------------------------------------------

    def stats(self, gpu=True, pcie=False):
        """Figures: workers (processes now), their pids and memory (their unique
        memory and the batch segments), batches and samples per second, the
        consumer's stall, the tuner's view, worker_kind="auto"'s trial, and
        with ``gpu`` each GPU's utilisation and memory (NVML; with ``pcie`` its
        PCIe throughput too), as stoker.Loader.stats() gives them."""
        self._check_usable()
        out = _stats.gpu(pcie) if gpu else {}
        if self._engine is None:
            return {"workers": 0, "worker_kind": "none (num_workers=0)", **out}
        m = self._engine.metrics()
        view = self._engine.tuner_view()
        processes = self._workers is not None
        total, busy = self._workers.segment_bytes() if processes else (0, 0)
        return {
            "workers": self._engine.workers,
            "worker_kind": self.worker_kind if self._kinds is None else self._kinds.kind,
            "kind_trial": None if self._trial is None else self._trial.report(),
            "worker_pids": self._workers.pids() if processes else [],
            "worker_bytes": m["worker_bytes"],
            "segment_bytes": total,
            "segment_bytes_in_use": busy,
            "batches_delivered": m["batches_delivered"],
            **_stats.rates(m["batches_delivered"] * (self.batch_size or 1),
                           *_stats.consumer_seconds(m)),
            "prefetch_batches": m["prefetch_batches"],
            "tuner": view,
            **out,
        }

    def tuner_trace(self):
        return [] if self._engine is None else self._engine.tuner_trace()

    def skipped(self):
        """Samples left out under on_error="skip": dicts with epoch, batch,
        index and reason."""
        return list(self._skipped)

    # -- the end ------------------------------------------------------------

    def close(self):
        """Stops the workers and the zygote, at once; batches already handed out
        stay valid. Idempotent; also on garbage collection and ``with``."""
        if self._closed:
            return
        self._closed = True
        if os.getpid() != self._pid:
            return  # a forked child: everything here is the parent's
        processes = self._workers is not None
        if processes:
            self._workers.shutdown()
        if self._engine is not None:
            self._table.shutdown()
            self._engine.close()
        if processes:
            self._workers.close()
        if self._zygote_pid is not None:
            try:
                os.waitpid(self._zygote_pid, 0)
            except ChildProcessError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 -- nothing to tell at collection
            pass


# Loaders still open when the interpreter exits are closed first, while it
# can still run their threads: an engine thread that asks for the GIL once
# finalisation began is ended by the interpreter mid-C++ and aborts the
# process (an uncaught exception kept a loader alive through its traceback).
_open_loaders = weakref.WeakSet()


@atexit.register
def _close_open_loaders():
    for loader in list(_open_loaders):
        try:
            loader.close()
        except Exception:  # noqa: BLE001 -- the interpreter is exiting; nothing to tell
            pass


class _KindTrial:
    """worker_kind="auto": batches first come from worker processes, then from
    threads; each kind is timed over a window of the consumer's own loop
    (batches it took per second, its stall, worker CPU per batch) and the
    faster is kept, the other retired. Within 5 % the kind using less CPU per
    batch wins, processes when that ties too (their batches do not depend on
    how threads share the global generators)."""

    WARMUP_S = 1.0    # after a kind starts: workers starting, the other kind's batches draining
    WINDOW_S = 2.0    # measured per kind, and at least MIN_BATCHES of its batches
    MIN_BATCHES = 8
    TIE = 0.05

    def __init__(self, loader, fixed_reason=None):
        self._loader = loader
        self.phase = "processes"  # then "threads", then "done"
        self.reason = "measuring processes"
        self.figures = {}
        self._phase_start = None
        self._window = None       # (start time, metrics at start, batches, loop seconds)
        if fixed_reason is not None:
            self.phase, self.reason = "done", f"processes: {fixed_reason}"

    def report(self):
        return {"chosen": self._loader._kinds.kind if self.phase == "done" else None,
                "reason": self.reason, "figures": dict(self.figures)}

    def observe(self, kind, interval, now):
        """The consumer took a batch made by `kind`, `interval` s after its last one."""
        if self.phase == "done":
            return
        if self._phase_start is None:
            self._phase_start = now
        if kind != self.phase or now - self._phase_start < self.WARMUP_S:
            return
        if self._window is None:
            self._window = (now, self._loader._engine.metrics(), 0, 0.0)
            return
        start, metrics, batches, loop_s = self._window
        batches, loop_s = batches + 1, loop_s + interval
        self._window = (start, metrics, batches, loop_s)
        if now - start >= self.WINDOW_S and batches >= self.MIN_BATCHES:
            self._close_window(now)

    def _close_window(self, now):
        start, before, batches, loop_s = self._window
        after = self._loader._engine.metrics()
        elapsed = now - start

        def delta(key):
            return (after[key] - before[key]) / 1e9

        cpu = delta("cpu_ns")  # worker threads' CPU, their processes' included
        self.figures[self.phase] = {
            "batches_per_s": batches / loop_s,
            "stall_fraction": _stoker.stall_fraction(delta("consumer_wait_ns"), elapsed),
            "worker_cpu_s_per_batch": cpu / batches,
            "workers": self._loader._engine.workers,
        }
        self._window = None
        self._phase_start = now
        if self.phase == "processes":
            self.phase, self.reason = "threads", "measuring threads"
            self._loader._kinds.set("threads", False)
            return
        chosen, self.reason = self._choose(self.figures["processes"], self.figures["threads"])
        self.phase = "done"
        self._loader._kinds.set(chosen, True)

    @classmethod
    def _choose(cls, p, t):
        rates = (f"threads {t['batches_per_s']:.3g} vs processes {p['batches_per_s']:.3g} "
                 f"batches/s, stall {t['stall_fraction']:.1%} vs {p['stall_fraction']:.1%}")
        if t["batches_per_s"] > p["batches_per_s"] * (1 + cls.TIE):
            return "threads", "threads: faster, " + rates
        if p["batches_per_s"] > t["batches_per_s"] * (1 + cls.TIE):
            return "processes", "processes: faster, " + rates
        cpu = (f"; worker CPU {t['worker_cpu_s_per_batch'] * 1e3:.3g} vs "
               f"{p['worker_cpu_s_per_batch'] * 1e3:.3g} ms/batch")
        if t["worker_cpu_s_per_batch"] < p["worker_cpu_s_per_batch"] * (1 - cls.TIE):
            return "threads", "threads: as fast, less CPU, " + rates + cpu
        return "processes", "processes: as fast, no less CPU with threads, " + rates + cpu


def _tensors(payload, out):
    """The tensors in a collated batch (nested tuples, lists and dicts)."""
    torch = _torch()
    if isinstance(payload, torch.Tensor):
        out.append(payload)
    elif isinstance(payload, dict):
        for v in payload.values():
            _tensors(v, out)
    elif isinstance(payload, (list, tuple)):
        for v in payload:
            _tensors(v, out)
    return out


def _to_device(payload, device):
    torch = _torch()
    if isinstance(payload, torch.Tensor):
        return payload.to(device, non_blocking=True)
    if isinstance(payload, dict):
        return type(payload)((k, _to_device(v, device)) for k, v in payload.items())
    if isinstance(payload, tuple) and hasattr(payload, "_fields"):  # a namedtuple
        return type(payload)(*(_to_device(v, device) for v in payload))
    if isinstance(payload, (list, tuple)):
        return type(payload)(_to_device(v, device) for v in payload)
    return payload


class _DeviceAhead:
    """device=...: each batch is copied to the device on a stream of its own as
    soon as it is made, up to `budget` bytes ahead of the consumer (one batch
    at least, besides the one handed over), while the consumer works on the batch before. Handing one over
    makes the consumer's current stream wait for its copy's event (no host
    sync); the host batch is let go only once its copy's event has completed,
    since its shared memory is then reused. A failure met while copying ahead
    is raised after the batches before it, so the order is the loader's."""

    def __init__(self, produce, ready_now, device, budget):
        torch = _torch()
        self._produce, self._ready_now = produce, ready_now
        self._device, self._budget = device, budget
        cuda = device.type == "cuda"
        self._stream = torch.cuda.Stream(device) if cuda else None
        self._queue = collections.deque()  # (batch on the device, event, bytes, host batch)
        self._bytes = 0
        self._copying = []                 # (event, host batch) handed over, copy maybe running
        self._pending = None               # raised once the batches before it are handed over

    def next(self):
        torch = _torch()
        self._let_go()
        if not self._queue:
            if self._pending is not None:
                pending, self._pending = self._pending, None
                raise pending
            self._send(self._produce())
        while self._pending is None and (len(self._queue) < 2 or self._bytes < self._budget) \
                and self._ready_now():
            try:
                self._send(self._produce())
            except Exception as e:  # noqa: BLE001 -- StopIteration and DataError included
                self._pending = e
        batch, event, size, host = self._queue.popleft()
        self._bytes -= size
        if event is not None:
            current = torch.cuda.current_stream(self._device)
            current.wait_event(event)
            for t in _tensors(batch, []):
                t.record_stream(current)
            self._copying.append((event, host))
        return batch

    def _send(self, host):
        torch = _torch()
        if self._stream is None:
            batch, event = _to_device(host, self._device), None
        else:
            with torch.cuda.stream(self._stream):
                batch = _to_device(host, self._device)
                event = torch.cuda.Event()
                event.record(self._stream)
        size = sum(t.numel() * t.element_size() for t in _tensors(batch, []))
        self._queue.append((batch, event, size, host))
        self._bytes += size

    def _let_go(self):
        self._copying = [(event, host) for event, host in self._copying if not event.query()]

    def __del__(self):
        # Host batches go back to the workers now: their copies must be done.
        for event in [e for _, e, _, _ in self._queue] + [e for e, _ in self._copying]:
            if event is not None:
                event.synchronize()


def _failure_error(epoch, batch, failures):
    lines = [f"sample {index}: {reason}" for index, reason, _, _ in failures]
    head = f"batch {batch} of epoch {epoch}: "
    head += lines[0] if len(lines) == 1 else f"{len(lines)} samples failed: " + "; ".join(lines)
    trace = next((t for _, _, t, _ in failures if t), "")
    tail = f"\n\nIn the worker:\n{trace}" if trace else ""
    if any(fatal for _, _, _, fatal in failures):
        return ResourceError(head + " (the machine or the store refused, not the sample: "
                             "never skipped)" + tail)
    return DataError(head + tail)


class _BatchIterator:
    """What both iterators share: failures reported once, then the rest."""

    def __init__(self, loader, epoch):
        self.loader = loader
        self.epoch = epoch
        self.done = False      # replaced by a newer iterator or a set_epoch
        self.finished = False  # reached the end of its epoch
        self.position = 0      # batches taken
        self._held = None      # the good samples of a batch whose failures were raised
        self._ahead = None     # device=...: batches copied ahead

    def __iter__(self):
        return self

    def __len__(self):
        return self.loader._len

    def __next__(self):
        loader = self.loader
        loader._check_usable()
        if loader.device is None:
            return self._next_host()
        if self._ahead is None:
            self._ahead = _DeviceAhead(self._next_host, self._ready_now, loader.device,
                                       loader._device_budget)
        return self._ahead.next()

    def _ready_now(self):
        """A batch can be had without waiting (device look-ahead only takes those)."""
        return False

    def _next_host(self):
        loader = self.loader
        if self.done:
            raise StopIteration
        while True:
            if self._held is not None:
                payload, self._held = self._held, None
                return self._finish(payload)
            got = self._produce()
            if got is None:
                self.finished = self.done = True
                raise StopIteration
            payload, batch, failures = got
            if failures:
                if loader.on_error == "raise" or any(fatal for _, _, _, fatal in failures):
                    self._held = payload
                    raise _failure_error(self.epoch, batch, failures)
                for index, reason, _, _ in failures:
                    loader._skipped.append({"epoch": self.epoch, "batch": batch,
                                            "index": index, "reason": reason})
            if payload is not None:
                return self._finish(payload)

    def _finish(self, payload):
        if self.loader.pin_memory and self.loader.device is None:
            torch = _torch()
            if torch.cuda.is_available():
                from torch.utils.data._utils.pin_memory import pin_memory
                payload = pin_memory(payload)
        return payload


def _outcome(epoch, batch, payload, info, notes):
    """(payload, batch, failures) from what a worker made; raises when collating failed."""
    failures = list(notes)
    if info is not None:
        _, worker_failures, collate_error, _, _ = info
        failures += worker_failures
        if collate_error is not None:
            raise DataError(f"batch {batch} of epoch {epoch}: collate_fn raised "
                            f"{collate_error[0]}\n\nIn the worker:\n{collate_error[1]}")
    return payload, batch, sorted(failures)


class _Iterator(_BatchIterator):
    """An epoch from the engine's workers (processes or threads)."""

    def _ready_now(self):
        return self._held is not None or self.loader._engine.wait_ready(0)

    _last = None  # when the last batch was handed out (worker_kind="auto" times the loop)

    def _produce(self):
        loader = self.loader
        engine = loader._engine
        if loader.timeout > 0 and not engine.wait_ready(loader.timeout):
            raise RuntimeError(f"DataLoader timed out after {loader.timeout} seconds")
        got = engine.next()
        if got is None:
            return None
        descriptor = got[0][0]
        self.position += 1
        if self.position == 1 and loader._own_order():
            loader._give_batches(self.epoch + 1)  # the workers may start on it early
        threads = int(descriptor[0]) == _stoker.THREAD_BATCH_MAGIC
        if threads:
            payload, info = loader._threads.take(descriptor)
            made = _outcome(self.epoch, int(descriptor[3]), payload, info, [])
        else:
            view, notes = loader._workers.view(descriptor)
            payload, info = _workers.read_batch(view, int(descriptor[4]), int(descriptor[5]))
            made = _outcome(self.epoch, int(descriptor[7]), payload, info,
                            [(i, why, "", False) for i, why in notes])
        if loader._trial is not None:
            now = time.perf_counter()
            if self._last is not None:
                loader._trial.observe("threads" if threads else "processes", now - self._last, now)
            self._last = now
        return made


class _InlineIterator(_BatchIterator):
    """num_workers=0: the same batches, made in the calling thread."""

    def __init__(self, loader, epoch, position):
        super().__init__(loader, epoch)
        self.position = position
        self._batches = loader._batches(epoch)

    def _produce(self):
        loader = self.loader
        if self.position >= len(self._batches):
            return None
        batch = self.position
        self.position += 1
        seed = _stoker.batch_seed(loader._seed & (2**64 - 1), self.epoch, batch)
        payload, info = _workers.run_batch(loader._job, self.epoch, batch,
                                           self._batches[batch], seed)
        return _outcome(self.epoch, batch, payload, info, [])
