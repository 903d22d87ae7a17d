"""stoker.DataLoader over what stoker cannot plan an epoch of: a plain
IterableDataset (one without shards() and iter_shard()), or a map-style
dataset whose sampler or batch sampler has no len() (an endless one, a
generator). Each epoch runs on torch's own DataLoader at a worker count
chosen at its start, so its batches, get_worker_info(), order and errors are
torch's. The count cannot change inside an epoch without changing what the
user's split by get_worker_info() yields (or, for an order without len(),
without stoker's plan); with num_workers="auto" it is chosen from what the
epoch before measured (decide())."""

import collections
import dataclasses
import gc
import inspect
import time
import weakref

import torch.utils.data

from . import _args, _exit, _shards, _snapshot, _stats, _stoker

# The consumer waits when it spent more than this part of an epoch in next().
WAIT = 0.01
# A step up that raised samples/s by less than this is stepped back.
GAIN = 0.05
EPOCHS_KEPT = 50

# stoker-only options that a plain stream cannot honour: refused unless left
# at the DataLoader's defaults.
_NOT_FOR_STREAMS = ("on_error", "cluster", "cluster_security", "remote_timeout", "remote_min",
                    "memory_budget_bytes", "tune_interval", "trace_path",
                    "device_prefetch_bytes", "shuffle_buffer")
_WHY_NOT = ("its epochs run on torch's DataLoader: its failures end the epoch as torch's "
            "do, its workers are local processes, and its worker count is chosen per epoch")


# torch's options that a program may reassign on a loader between epochs
# (its guard refuses the others); the next iter() runs with them.
TORCH_REASSIGNABLE = ("collate_fn", "pin_memory", "pin_memory_device", "timeout", "worker_init_fn",
                 "generator", "prefetch_factor")
# stoker's own options a program may reassign between epochs.
STOKER_REASSIGNABLE = ("device", "on_error", "worker_kind", "in_order")
_SPLIT_BUDGET = 5_000  # objects splits_by_worker looks at, at most


def splits_by_worker(dataset, budget=_SPLIT_BUDGET):
    """Whether an IterableDataset's code may split its samples among workers:
    a function among the code it holds or calls (its classes' methods, the
    functions its fields hold, the module globals and module attributes
    their code names) both calls get_worker_info and reads a worker count
    (num_workers), as a split does (a stream that asks only for its
    worker's seed splits nothing, whatever else reads a num_workers); a
    torch ChainDataset when each of its datasets does. A split the code
    holds but a flag turns off still reads as one. One that
    does not yields every sample in each worker, so num_workers="auto" keeps
    it at one (torch's default is none). Past `budget` objects the answer is
    no: the one safe count."""
    import functools
    import sys
    import types
    if isinstance(dataset, torch.utils.data.ChainDataset):  # each in turn, whole
        return all(splits_by_worker(d, budget) for d in dataset.datasets)
    # Python's and torch's own code splits nothing: its names are not followed.
    foreign = set(sys.stdlib_module_names) | {"torch", "numpy", "builtins"}
    queue, seen, at = [dataset], set(), 0
    while at < len(queue) and at < budget:
        o = queue[at]
        at += 1
        if id(o) in seen or isinstance(o, (str, bytes, int, float, bool, type(None))):
            continue
        seen.add(id(o))
        if isinstance(o, (type, types.FunctionType)) and \
                (getattr(o, "__module__", None) or "").split(".")[0] in foreign:
            continue
        if isinstance(o, types.MethodType):
            queue += [o.__func__, o.__self__]
        elif isinstance(o, types.FunctionType):
            names, codes = set(), [o.__code__]
            while codes:
                code = codes.pop()
                names.update(code.co_names)
                codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
            found = o.__globals__
            # Both in one function (its nested code too): a config's
            # num_workers read elsewhere is no split.
            asks = "get_worker_info" in names or any(
                found.get(name) is torch.utils.data.get_worker_info for name in names)
            if asks and "num_workers" in names:
                return True
            for name in names:
                value = found.get(name)
                if isinstance(value, types.ModuleType):  # module.function, as code names it
                    if value.__name__.split(".")[0] not in foreign:
                        queue += [getattr(value, n) for n in names if hasattr(value, n)]
                elif value is not None:
                    queue.append(value)
            queue += [c.cell_contents for c in (o.__closure__ or ()) if _snapshot.filled(c)]
            queue += [o.__defaults__ or (), o.__kwdefaults__ or {}]
        elif isinstance(o, type):
            for value in vars(o).values():
                if isinstance(value, (staticmethod, classmethod)):
                    value = value.__func__
                elif isinstance(value, property):
                    value = value.fget
                queue.append(value)
        elif isinstance(o, functools.partial):
            queue += [o.func, o.args, o.keywords]
        elif isinstance(o, (list, tuple, set, frozenset)):
            queue += list(o)[:64]
        elif isinstance(o, dict):
            queue += list(o.values())[:64]
        elif not isinstance(o, types.ModuleType):
            queue += [c for c in type(o).__mro__]
            queue += list(getattr(o, "__dict__", {}).values())
    return False


def closed_error():
    """What a stoker.DataLoader's use after close() raises, whatever its path."""
    return ValueError("this stoker.DataLoader is closed")


def is_plain(dataset):
    """An IterableDataset that does not say what its shards are."""
    return isinstance(dataset, torch.utils.data.IterableDataset) and \
        not _shards.is_sharded(dataset)


def unplanned(dataset, sampler, batch_sampler):
    """Why stoker cannot plan `dataset`'s epochs (what PlainStream is told),
    or None where it can: a plain IterableDataset, or an order without len()
    (stoker reads an epoch's whole order at iter(); torch reads it lazily)."""
    if is_plain(dataset):
        if _shards.names_shards(dataset) and _shards.overrides_iter(dataset):
            return (f"a stream with shards whose {type(dataset).__name__}.__iter__ is its own "
                    "(what torch reads; its shards would bypass it)")
        return "a plain IterableDataset"
    if isinstance(dataset, torch.utils.data.IterableDataset):
        return None
    for name, order in (("batch_sampler", batch_sampler), ("sampler", sampler)):
        if order is None:
            continue
        try:
            len(order)
        except Exception as e:  # noqa: BLE001 -- torch calls len() only for len(loader)
            return f"{name} {type(order).__name__} has no len() ({type(e).__name__})"
        return None
    return None


@dataclasses.dataclass(frozen=True)
class EpochFigures:
    """What an epoch measured: its worker count, the part of its wall time the
    consumer spent waiting in next() (iter() included), and samples/s."""

    workers: int
    wait_fraction: float
    samples_per_s: float


@dataclasses.dataclass(frozen=True)
class TunerState:
    """What decide() carries between epochs: the epoch a step was tried from
    (`base`) and its direction, and the direction held off at this count
    because a step that way failed."""

    base: EpochFigures = None
    step: str = None      # "up", "down" or None: what the last epoch tried
    blocked: str = None   # "up" or "down": held off at this count


def decide(state, last, budget):
    """(workers, reason, state) for the next epoch, from `last`'s figures,
    the TunerState and the CPU budget: the rule docs/dataloader.md gives
    ("Plain IterableDataset"). A step that failed is undone and that
    direction held off at that count until the wait points the other way."""
    n = last.workers
    waited = last.wait_fraction > WAIT
    figures = f"waited {last.wait_fraction:.1%}, {last.samples_per_s:.4g} samples/s"
    base = state.base
    if state.step == "up" and last.samples_per_s < base.samples_per_s * (1 + GAIN):
        return base.workers, (
            f"{n} workers ({figures}) gained less than {GAIN:.0%} over {base.workers} "
            f"({base.samples_per_s:.4g} samples/s): back to {base.workers}, holding"), \
            TunerState(blocked="up")
    if state.step == "down" and waited:
        return base.workers, (
            f"at {n} workers the consumer {figures}: back to {base.workers}, "
            "holding"), TunerState(blocked="down")
    blocked = state.blocked if state.step is None else None
    if waited:
        if n >= budget:
            return n, f"{figures} at {n} workers, the CPU budget: staying", TunerState()
        if blocked == "up":
            return n, f"{figures} at {n} workers; a step up gained nothing: holding", state
        up = min(budget, n + max(1, n // 4))
        return up, f"{figures} at {n} workers: trying {up}", TunerState(last, "up")
    if n <= 1:
        return n, f"{figures} at 1 worker: staying", TunerState()
    if blocked == "down":
        return n, f"{figures} at {n} workers; fewer made it wait: holding", state
    down = max(1, n - max(1, n // 4))
    return down, f"{figures} at {n} workers: trying {down}", TunerState(last, "down")


class PlainStream:
    """A stoker.DataLoader over what stoker cannot plan (`why`, from
    unplanned()): the loader's public methods call these. Used by one thread
    at a time, as torch's DataLoader is."""

    def __init__(self, loader, dataset, why, *, batch_size, shuffle, sampler, batch_sampler,
                 num_workers, collate_fn, pin_memory, drop_last, timeout, worker_init_fn,
                 multiprocessing_context, generator, prefetch_factor, persistent_workers,
                 pin_memory_device, in_order, worker_kind, max_workers, device, native,
                 **stoker_only):
        from ._loader import _resolve_device
        _args.on_error(stoker_only["on_error"])
        from ._dataloader import DataLoader
        defaults = inspect.signature(DataLoader.__init__).parameters
        for name in _NOT_FOR_STREAMS:
            value = stoker_only.pop(name)
            if value != defaults[name].default:
                raise ValueError(f"{name}={value!r} does not apply to {why}: {_WHY_NOT}")
        assert not stoker_only, f"options not handled: {sorted(stoker_only)}"
        if worker_kind != "processes":
            raise ValueError(f"worker_kind={worker_kind!r} does not apply to {why}: "
                             f"{_WHY_NOT}")
        self._why = why
        self._dataset = dataset
        self._max_workers = _args.integer("max_workers", max_workers, 0, _stoker.MAX_WORKERS)
        workers, reason = self._given_count(num_workers)
        _, self._device = _resolve_device(device, torch)
        # torch's own arguments, as its DataLoader takes them; it checks them
        # here (an IterableDataset takes no sampler, shuffle or batch_sampler).
        self._args = dict(
            batch_size=batch_size, shuffle=shuffle, sampler=sampler,
            batch_sampler=batch_sampler, collate_fn=collate_fn, pin_memory=pin_memory,
            drop_last=drop_last, timeout=timeout, worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context, generator=generator,
            persistent_workers=persistent_workers, pin_memory_device=pin_memory_device)
        if prefetch_factor is not None:
            self._args["prefetch_factor"] = prefetch_factor
        if "in_order" in inspect.signature(torch.utils.data.DataLoader).parameters:
            self._args["in_order"] = in_order  # older torch: always in order
        self._retold = None  # "next", then "read": _inner reads first_epoch_from()'s order
        self._made = False  # a torch DataLoader was made: its options were checked
        self._inner = self._torch_loader(dataset, workers)
        self._next = (workers, reason)  # the next epoch's count, and why
        self._tuner = TunerState()
        self._epochs = collections.deque(maxlen=EPOCHS_KEPT)  # their records, latest last
        # The latest epoch's _Epoch, held weakly: it holds the loader, so a
        # dropped iterator ends at once and the loader then goes with it.
        self._live = lambda: None
        self._epoch = -1
        self._delivered = 0
        self._totals = [0, 0.0, 0.0]  # samples, wait s, wall s of the epochs so far
        self._closed = False
        self._show(loader, num_workers, in_order, worker_kind)
        _exit.close_at_exit(loader)

    def _given_count(self, num_workers):
        """(workers, reason) of the first epoch after num_workers was given (at
        construction, or reassigned); with "auto", the CPU budget, or 1 for a
        stream that never splits its samples among workers."""
        self._auto = num_workers == "auto"
        if not self._auto:
            workers = _args.integer("num_workers", num_workers, 0, _stoker.MAX_WORKERS)
            return workers, f"num_workers={workers}"
        from ._dataloader import _initial_workers
        self.budget = _initial_workers(self._max_workers)
        capped = " (at most max_workers)" if self._max_workers else ""
        if is_plain(self._dataset) and not splits_by_worker(self._dataset):
            self.budget = 1
            return 1, (f"1 worker: the code of {type(self._dataset).__name__} never calls "
                       "get_worker_info(), so more workers would each yield every sample "
                       "(a num_workers of your choosing runs as many)")
        return self.budget, f"first epoch: the CPU budget{capped}, {self.budget}"

    def _torch_loader(self, dataset, workers, order=None, length=None):
        """torch's DataLoader with the user's arguments; with `order`, one
        that reads that iterator instead of the sampler (batches; keys when
        batch_size is None), its len() `length` (the sampler's own)."""
        args = self._args
        if workers == 0 and self._made:
            # A count reassigned to 0: torch checks its workers' options when
            # made only, and runs the epoch in the main process with them.
            args = dict(args, persistent_workers=False, multiprocessing_context=None)
            args.pop("prefetch_factor", None)
        self._made = True
        if order is not None:
            which = "sampler" if args["batch_size"] is None else "batch_sampler"
            args = dict(args, sampler=None, batch_sampler=None, shuffle=None, drop_last=False)
            args[which] = _Told(order, length)
            if which == "batch_sampler":
                args["batch_size"] = 1
        return torch.utils.data.DataLoader(dataset, num_workers=workers, **args)

    def first_epoch_from(self, order, length):
        """iter() whose epoch reads `order` (what an endless sampler told the
        map path, then the rest of it) instead of a fresh pass of the sampler,
        whose len() (`length`) len(loader) still gives, as torch's does."""
        self._shut_inner()
        self._inner = self._torch_loader(self._dataset, self._next[0], order, length)
        self._retold = "next"
        return iter(self)

    def _show(self, loader, num_workers, in_order, worker_kind):
        """The attributes torch's DataLoader has, as it sets them for an
        IterableDataset, and stoker's own."""
        inner = self._inner
        for name in ("dataset", "batch_size", "drop_last", "sampler", "batch_sampler",
                     "collate_fn", "pin_memory", "pin_memory_device", "timeout",
                     "worker_init_fn", "persistent_workers", "generator", "prefetch_factor",
                     "_dataset_kind", "_IterableDataset_len_called"):
            setattr(loader, name, getattr(inner, name))
        loader._DataLoader__multiprocessing_context = inner.multiprocessing_context
        loader.num_workers, loader.in_order, loader.worker_kind = \
            num_workers, bool(in_order), worker_kind
        loader.device, loader.on_error = self._device, "raise"
        # What the loader showed at the last iter(): a value reassigned since is taken then.
        self._shown = {name: getattr(loader, name)
                       for name in (*TORCH_REASSIGNABLE, *STOKER_REASSIGNABLE)}
        self._shown["num_workers"] = num_workers
        loader._iterator = None
        self._loader = weakref.ref(loader)  # the loader owns this
        loader._DataLoader__initialized = True  # torch's guard: batch_size, sampler... are fixed

    def _check_open(self):
        if self._closed:
            raise closed_error()

    # -- iteration ----------------------------------------------------------

    def __len__(self):
        """torch's len(): from len(dataset) (a TypeError without one)."""
        n = len(self._inner)
        self._loader()._IterableDataset_len_called = self._inner._IterableDataset_len_called
        return n

    def __iter__(self):
        """A new epoch on torch's DataLoader at the count decided for it; the
        one before, if still live, is ended (its next use raises)."""
        self._check_open()
        prev = self._live()
        if prev is not None:
            prev.end("a newer iter()")
        given = self._shown["num_workers"]
        remake = self._take_reassigned()
        last = _figures(self._epochs[-1]) if self._epochs else None
        # num_workers given anew decides this epoch's count itself.
        if self._auto and last is not None and given is self._shown["num_workers"]:
            workers, reason, self._tuner = decide(self._tuner, last, self.budget)
            self._next = workers, reason
        workers, reason = self._next
        if workers != self._inner.num_workers or self._retold == "read" or remake:
            self._shut_inner()
            called = self._inner._IterableDataset_len_called  # for torch's length warning
            self._inner = self._torch_loader(self._dataset, workers)
            self._inner._IterableDataset_len_called = called
        # The order first_epoch_from() gave is read by this epoch only.
        self._retold = "read" if self._retold == "next" else None
        self._epoch += 1
        record = {"epoch": self._epoch, "workers": workers, "batches": 0,
                  "wait_fraction": None, "samples_per_s": None, "wall_s": 0.0,
                  "reason": reason}
        self._epochs.append(record)
        it = _Epoch(self, record, self._loader())
        self._live = weakref.ref(it)
        return it

    def _take_reassigned(self):
        """Options reassigned on the loader since the last iter(), as torch
        reads them at each iter(): torch's go to the next epoch's torch
        DataLoader, stoker's are checked as when given (device, and the
        refusals: on_error, worker_kind). True when that DataLoader is to be
        made anew."""
        loader = self._loader()
        changed = [name for name in (*TORCH_REASSIGNABLE, *STOKER_REASSIGNABLE)
                   if getattr(loader, name) is not self._shown[name]]
        given = loader.__dict__.get("_num_workers")
        if not changed and given is self._shown["num_workers"]:
            return False
        for name in changed:
            value = getattr(loader, name)
            if name in STOKER_REASSIGNABLE:
                self._check_stokers(name, value)
            elif name == "prefetch_factor" and value is None:
                self._args.pop(name, None)  # torch's default
            else:
                self._args[name] = value
        if given is not self._shown["num_workers"]:  # a count of the user's, or "auto" again
            self._next = self._given_count(given)
            changed.append("num_workers")
        # What a copy of the loader is made with (as torch's copy keeps them).
        loader._arguments.update({name: given if name == "num_workers" else getattr(loader, name)
                                  for name in changed})
        self._shown = {name: getattr(loader, name) for name in self._shown}
        self._shown["num_workers"] = given
        return True

    def shown(self):
        """{option: value} as the loader showed them at the last iter()."""
        return dict(self._shown)

    def _check_stokers(self, name, value):
        """A stoker option reassigned: device is used; the others must stay
        at what a plain stream can honour."""
        if name == "device":
            from ._loader import _resolve_device
            _, self._device = _resolve_device(value, torch)
        elif name == "on_error" and _args.on_error(value) != "raise":
            raise ValueError(f"on_error={value!r} does not apply to {self._why}: {_WHY_NOT}")
        elif name == "worker_kind" and value != "processes":
            raise ValueError(f"worker_kind={value!r} does not apply to {self._why}: {_WHY_NOT}")
        elif name == "in_order" and "in_order" in self._args:  # older torch: always in order
            self._args["in_order"] = bool(value)

    def set_epoch(self, epoch):
        """Ends an epoch in progress, as on the map path (a plain stream has
        no sampler to tell: the dataset's own set_epoch is the user's)."""
        self._check_open()
        _args.integer("epoch", epoch, 0, 2**62)
        live = self._live()
        if live is not None:
            live.end("set_epoch()")

    def state_dict(self):
        if not self._iterable():
            raise TypeError(
                f"the position of a loader whose {self._why} cannot be checkpointed: stoker "
                "does not plan its epochs (it reads the whole order at iter()); an order with "
                "len() can be")
        raise TypeError(
            "a plain IterableDataset's position cannot be checkpointed: its stream is its "
            "own (stoker cannot say where it stands, nor restart it there); a dataset that "
            "says what its shards are (stoker.ShardedIterable) can be")

    def _iterable(self):
        return isinstance(self._dataset, torch.utils.data.IterableDataset)

    def load_state_dict(self, state):
        self.state_dict()

    # -- figures ------------------------------------------------------------

    def stats(self, gpu=True, pcie=False):
        """The epochs' figures: the latest epoch's (the one running, else the
        last) as "samples_per_s" and "stall_fraction", all epochs' together
        as "..._since_start", and each epoch's in "epochs"."""
        self._check_open()
        last = self._epochs[-1] if self._epochs else None
        workers = self._inner.num_workers
        live = self._live()
        samples, wait, wall = self._totals
        if live is not None and not live.over:
            samples, wait, wall = (a + b for a, b in zip(self._totals, live.live()))
        prefetch = getattr(self._inner, "prefetch_factor", None) or 2
        return {
            "pipeline": "python",
            "pipeline_reason": f"{self._why}: each epoch on torch's DataLoader",
            "pipeline_steps": None,
            "stream": "plain" if self._iterable() else None,
            "workers": workers,
            "worker_kind": "processes" if workers else "none (num_workers=0)",
            "kind_trial": None,
            "worker_pids": [] if live is None else live.pids(),
            "worker_bytes": None,
            "batches_delivered": self._delivered,
            "samples_per_s": None if last is None else last["samples_per_s"],
            "stall_fraction": None if last is None else last["wait_fraction"],
            "window_s": None if last is None else last["wall_s"],
            **({"samples_per_s_since_start": None, "stall_fraction_since_start": None}
               if wall <= 0 else
               {f"{k}_since_start": v for k, v in _stats.rates(samples, wait, wall).items()}),
            "prefetch_batches": prefetch * workers if workers else 0,
            "epochs": [dict(e) for e in self._epochs],
            "tuner": None,
            "remote": None,
            **(_stats.gpu(pcie) if gpu else {}),
        }

    def tuner_trace(self):
        """Each epoch's count and why (num_workers="auto": decide()'s reason)."""
        self._check_open()
        return [{k: e[k] for k in ("epoch", "workers", "reason")} for e in self._epochs]

    def skipped(self):
        self._check_open()
        return []  # a plain stream's failures end the epoch: nothing is skipped

    # -- the end ------------------------------------------------------------

    def close(self):
        """Ends the live epoch and shuts torch's workers at once; idempotent."""
        if self._closed:
            return
        self._closed = True
        live = self._live()
        if live is not None:
            live.end("close()")
        self._shut_inner()

    def _shut_inner(self):
        """Shuts the persistent workers of the torch loader, if it kept any."""
        kept = getattr(self._inner, "_iterator", None)
        if kept is not None:
            _shut(kept)
            self._inner._iterator = None

    def _ended(self, epoch):
        """An epoch's figures join the totals once it ends."""
        self._totals = [a + b for a, b in zip(self._totals, epoch.live())]


class _Told(torch.utils.data.Sampler):
    """An iterator as a sampler, read once (first_epoch_from), of the len()
    the sampler it comes from says."""

    def __init__(self, order, length):
        self._order, self._length = order, length

    def __iter__(self):
        return self._order

    def __len__(self):
        return self._length


def _shut(torch_iterator):
    shutdown = getattr(torch_iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def _ending_with(epoch, torch_iterator):
    """torch_iterator's _try_get_data in slices of 0.1 s, raising once the
    epoch (a weak reference) ends by close() or a newer iter(): a thread
    waiting in next() when its workers are shut under it would otherwise
    poll for ever. The timeout asked for holds. The class's function, with
    the iterator held weakly: no cycle keeps its workers, and a persistent
    iterator's next epoch wraps it anew, not the last wrapper."""
    get, owner = type(torch_iterator)._try_get_data, weakref.ref(torch_iterator)

    def try_get(timeout=torch.utils.data._utils.MP_STATUS_CHECK_INTERVAL):
        deadline = time.monotonic() + timeout
        while True:
            live = epoch()
            if live is not None and live._ended_by is not None:
                raise live.ended_error()
            del live
            left = deadline - time.monotonic()
            got = get(owner(), max(0.0, min(left, 0.1)))
            if got[0] or left <= 0.1:
                return got
    return try_get


class _Epoch:
    """One epoch: torch's iterator, timed (the consumer's wait in next(), the
    wall time since iter()) into its `record` in stats()["epochs"]."""

    def __init__(self, stream, record, owner):
        self._stream = stream
        self._owner = owner  # the loader lives while its iterator does (its close ends this)
        self._record = record
        self._samples, self._wait = 0, 0.0
        self._start = self._last = time.perf_counter()
        self._ended_by = None
        self.finished = False
        self.over = False
        if stream._inner.num_workers > 0:
            # The program's garbage (a failed torch iterator in a cycle) is
            # finalized here, not in the workers forked next, where its
            # __del__ would run in the wrong process.
            gc.collect()
        kept = getattr(stream._inner, "_iterator", None)  # persistent workers' iterator
        if kept is not None:  # its reset waits for them: not through the last epoch's wrapper
            kept.__dict__.pop("_try_get_data", None)
        self._torch = iter(stream._inner)  # starts the workers (or resets persistent ones)
        if hasattr(self._torch, "_try_get_data"):  # worker processes
            self._torch._try_get_data = _ending_with(weakref.ref(self), self._torch)
        self._timed(self._start)

    def __iter__(self):
        return self

    def __len__(self):
        return len(self._torch)

    def __next__(self):
        if self._ended_by is not None:
            raise self.ended_error()
        if self.finished:
            raise StopIteration
        start = time.perf_counter()
        try:
            batch = next(self._torch)
        except StopIteration:
            self._timed(start)
            self.finished = True
            self._end()
            raise
        except BaseException:
            self._timed(start)
            raise
        self._timed(start)
        self._record["batches"] += 1
        self._stream._delivered += 1
        self._samples += _samples_in(batch, self._stream._inner.batch_size)
        self._update()
        device = self._stream._device
        if device is not None:
            from ._dataloader import _to_device
            batch = _to_device(batch, device)
        return batch

    def ended_error(self):
        if self._ended_by == "close()":  # as every other use of a closed loader says
            return closed_error()
        return RuntimeError(
            f"this iterator's epoch {self._record['epoch']} was ended by {self._ended_by} "
            f"on the same stoker.DataLoader after {self._record['batches']} batches: a "
            "loader runs one epoch at a time (drop or finish an iterator before starting "
            "another)")

    def _timed(self, start):
        self._last = time.perf_counter()
        self._wait += self._last - start

    def _update(self):
        wall = self._last - self._start
        if wall > 0:
            rates = _stats.rates(self._samples, self._wait, wall)
            self._record.update(wait_fraction=rates["stall_fraction"],
                                samples_per_s=rates["samples_per_s"], wall_s=wall)

    def live(self):
        """(samples, wait s, wall s) so far."""
        return self._samples, self._wait, self._last - self._start

    def pids(self):
        return [w.pid for w in getattr(self._torch, "_workers", []) if w.is_alive()]

    def end(self, by):
        """The loader moved on (`by` says how): not at its epoch's end, this
        iterator raises at its next use; torch's workers not kept are shut."""
        if not self.finished and self._ended_by is None:
            self._ended_by = by
        self._end()

    def _end(self):
        if self.over:
            return
        self.over = True
        self._update()
        self._stream._ended(self)
        if not self._stream._inner.persistent_workers:
            _shut(self._torch)

    def __del__(self):
        try:
            self._end()
        except Exception:  # noqa: BLE001 -- nothing to tell at collection
            pass


def _figures(record):
    """An epoch's EpochFigures for decide(), or None when it delivered no batch."""
    if record["batches"] == 0 or record["wait_fraction"] is None:
        return None
    return EpochFigures(record["workers"], record["wait_fraction"], record["samples_per_s"])


def _samples_in(batch, batch_size):
    """How many samples a batch holds: its first tensor's length
    (default_collate's layout), else batch_size (1 unbatched)."""
    if batch_size is None:
        return 1
    while isinstance(batch, (list, tuple, dict)) and batch:
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    if isinstance(batch, torch.Tensor) and batch.dim() > 0:
        return batch.shape[0]
    return batch_size
