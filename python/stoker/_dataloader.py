"""stoker.DataLoader: torch's DataLoader for any map-style dataset, on worker
processes whose number the tuner sets and changes live (num_workers="auto")."""

import array
import base64
import collections
import copy
import ctypes
import dataclasses
import functools
import hashlib
import inspect
import itertools
import json
import math
import multiprocessing
import numbers
import operator
import os
import pickle
import re
import time
import warnings
import weakref

import torch.utils.data

from . import (_args, _errors, _exit, _iterable, _native, _remote, _shards, _snapshot, _stats,
               _stoker, _workers)
from ._loader import _error_policy, _prefetch_batches, _resolve_device

_FORMAT = "stoker.DataLoader/2"
# How often a consumer waiting for a shard looks for its batches made so far.
_PART_POLL_S = 0.003
# The user's batches are the engine's items, one to an engine batch.
_ENGINE_BATCH = 1
_PROTOCOL = _stoker.protocol
_PROCESS, _THREAD = _PROTOCOL.PROCESS_DESCRIPTOR, _PROTOCOL.THREAD_DESCRIPTOR


def _torch():
    import torch
    return torch


class DataLoader(torch.utils.data.DataLoader):
    """Batches from ``dataset`` as torch's DataLoader makes them (same arguments,
    same samplers, same ``default_collate`` or your ``collate_fn``), from worker
    processes that stoker starts, resizes and stops while you iterate.

    ``num_workers="auto"`` (the default): the tuner picks the count and the
    prefetch depth and keeps adjusting them, so the consumer does not wait, with
    the fewest workers (``loader.num_workers`` reads the count running now,
    an int as torch's). An int fixes the count; 0 loads in the calling thread,
    each batch when ``next()`` asks for it.

    The order is torch's: ``sampler`` and ``batch_sampler`` are torch's own
    objects (or yours), read at ``iter()`` after the same draw of the epoch's
    base seed from ``generator`` (or torch's global generator), so the same
    seed gives the same batches as torch's DataLoader. A dataset or sampler
    whose length changes between epochs (files appended, a curriculum) gives
    each epoch the batches the sampler gives at its ``iter()``, however many,
    and ``len()`` follows it, as with torch (worker processes hold the dataset
    as it was when the loader was made, as torch's persistent workers do:
    samples appended since must be reachable from that copy). Differences: workers
    are forked from a zygote made here (with ``multiprocessing_context``
    "fork", the default, the dataset is inherited, never pickled, so lambdas
    work); the randomness of each batch's samples (``random``, numpy, torch)
    is seeded from (base seed, epoch, batch), so batches are the same for any
    worker count and across resizes. ``state_dict`` keeps the generator's
    state at the epoch's start (and a sampler's ``state_dict()``, where it
    has one), so ``load_state_dict`` resumes in a new process with no seed
    of yours. A sample whose ``__getitem__``
    raises (or whose worker dies) is reported by a ``stoker.DataError`` naming
    it that is also of the exception's own type (``except OSError`` works, as
    with torch), with the original as ``__cause__`` and the sample's
    ``index``, ``key`` and ``worker``; the batch's other samples come with the
    next ``next()``;
    ``on_error="skip"`` leaves it out and records it in ``skipped()``, except
    what is not the sample's fault (MemoryError; an OSError of refused
    resources or of a store gone or out of reach, e.g. ENOTCONN, ESTALE,
    ETIMEDOUT): that raises ``stoker.ResourceError`` in either mode.
    A sharded stream (``stoker.ShardedIterable``: an IterableDataset with
    ``shards()`` and ``iter_shard(shard)``) is split by shard, a shard to a
    worker, so the pool still resizes live; ``shuffle=True`` shuffles the
    shard order, ``shuffle_buffer=N`` each shard's samples (docs/dataloader.md,
    "Sharded streams"). A plain ``IterableDataset`` gets torch's semantics
    exactly: each epoch runs on torch's own DataLoader (its batches,
    ``get_worker_info()``, order and errors), at a worker count that
    ``"auto"`` chooses at the epoch's start from what the epoch before
    measured (``stats()["epochs"]`` says which and why); its position cannot
    be checkpointed.
    ``device="cuda[:N]"``: batches arrive as tensors on that device, copied on a
    stream of their own while the consumer works on the batch before (at most
    ``device_prefetch_bytes`` ahead, default a quarter of the free device
    memory); the consumer's current stream waits for each copy, the host does not.
    ``worker_kind="threads"`` runs batches on threads of this process instead,
    for datasets whose work releases the GIL; ``"auto"`` measures both on your
    loop and keeps the faster (``stats()["kind_trial"]``; docs/dataloader.md).
    A torchvision ``ImageFolder`` whose transform is a ``Compose`` of steps
    stoker knows (RandomResizedCrop, RandomHorizontalFlip, Resize, CenterCrop,
    ToTensor, PILToTensor, ConvertImageDtype, Normalize), with the default
    collate_fn, runs natively: stoker's C++ source and transform on the
    engine's threads, the same samples, order and labels, torchvision's
    pixels within 1/255. ``stats()["pipeline"]`` says which path runs and
    ``stats()["pipeline_reason"]`` what kept it off; ``native=False`` turns
    it off.
    """

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
                 num_workers="auto", collate_fn=None, pin_memory=False, drop_last=False,
                 timeout=0, worker_init_fn=None, multiprocessing_context=None, generator=None,
                 *, prefetch_factor=None, persistent_workers=False, pin_memory_device="",
                 in_order=True, worker_kind="processes", on_error="raise",
                 max_workers=0, device=None, device_prefetch_bytes=None,
                 memory_budget_bytes=0, tune_interval=None, trace_path=None, cluster=None,
                 cluster_security=None, remote_timeout=_remote.DEFAULT_TIMEOUT_S, remote_min=0,
                 native=True, shuffle_buffer=0):
        self._run = None  # until every option is checked
        # What stoker cannot plan (a plain IterableDataset, an order without
        # len()) runs on torch's DataLoader: an _iterable.PlainStream.
        self._stream = None
        self._arguments = dict(locals())  # this method's arguments, as given
        del self._arguments["self"], self._arguments["dataset"]
        _args.tuner_only("num_workers", num_workers, max_workers=max_workers,
                         trace_path=trace_path, tune_interval=tune_interval)
        why = _iterable.unplanned(dataset, sampler, batch_sampler)
        if why is not None:
            self._stream = _iterable.PlainStream(self, dataset, why, **self._arguments)
            return
        options = _resolve_options(
            dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler,
            batch_sampler=batch_sampler, num_workers=num_workers, collate_fn=collate_fn,
            pin_memory=pin_memory, drop_last=drop_last, timeout=timeout,
            worker_init_fn=worker_init_fn, multiprocessing_context=multiprocessing_context,
            prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device, generator=generator, in_order=in_order,
            worker_kind=worker_kind, on_error=on_error, max_workers=max_workers, device=device,
            device_prefetch_bytes=device_prefetch_bytes, memory_budget_bytes=memory_budget_bytes,
            tune_interval=tune_interval, trace_path=trace_path, cluster=cluster,
            cluster_security=cluster_security, remote_timeout=remote_timeout,
            remote_min=remote_min, shuffle_buffer=shuffle_buffer)
        # The effects, in order: the zygote, the threads, the engine. Nothing
        # draws from torch's generators before iter() (torch's does not).
        self.dataset = dataset
        for name in _PUBLIC_OPTIONS:
            setattr(self, name, getattr(options, name))
        self._DataLoader__multiprocessing_context = options.multiprocessing_context
        kinds = torch.utils.data.dataloader._DatasetKind
        self._dataset_kind = kinds.Map if options.shards is None else kinds.Iterable
        self._IterableDataset_len_called = None
        self._options = options
        self._resume = False      # load_state_dict: the next iter() continues that epoch
        self._refused = False     # that iter() dropped the checkpoint it refused: the next starts anew
        self._remade = 0          # runs made anew for a changed dataset
        self._skipped_before = []  # skipped() of the runs made before this one
        self._skipped_count_before = 0  # and how many they skipped
        self._iterator = None     # the live iterator, if any
        self._skip = 0  # load_state_dict: batches of the resumed epoch's first shard taken
        shards = options.shards
        self._plan = _Plan(options, dataset if shards is None else shards.table)
        self._native_wanted = native
        self._batch_room = 0  # the largest batch an epoch gave the native path so far
        self._start_run()
        # Weakly: the run holds the plan, and the loader must not outlive its last use.
        self._plan.on_set = weakref.WeakMethod(self._fit_batches)
        _exit.close_at_exit(self)
        self._DataLoader__initialized = True  # torch's guard: batch_size, sampler... are fixed

    def _start_run(self):
        """Makes the run (the zygote, the workers, the engine) over the dataset
        as it is now, noting what it holds where torch's workers would see a
        change at the next iter() (no persistent workers)."""
        options, dataset, shards = self._options, self.dataset, self._options.shards
        native_plan, self._pipeline_reason = (None, "a sharded stream") if shards else \
            _native.recognise(dataset, options, self._native_wanted)
        if native_plan is not None and self._batch_room > native_plan.max_batch:
            native_plan = dataclasses.replace(native_plan, max_batch=self._batch_room)
        self._plan.index_keys = native_plan is not None
        job = _workers._Job(dataset, options.collate_fn, options.default_collate,
                            options.worker_init_fn,
                            options.unbatched if shards is None else shards.unbatched, shards)
        # Worker processes, remote slots and the native path hold the dataset as
        # it is now; thread workers read the live one.
        copied = native_plan is not None or options.processes or options.cluster is not None
        kept = options.persistent_workers and options.workers != 0
        self._snapshot = _snapshot.digest(dataset) if copied and not kept else None
        self._run = _Run.start(options, self._plan, job, native_plan)

    def _remake_if_changed(self):
        """iter() over a dataset changed since the run was made: the run is made
        anew, as torch forks its workers from the dataset at each iter()
        (what was made ahead is dropped)."""
        if self._snapshot is None:
            return
        now = _snapshot.digest(self.dataset)
        if now is None or now == self._snapshot:  # None: it cannot tell, so nothing changed
            return
        self._remake()

    def _fit_batches(self, offsets):
        """An epoch's batches (their `offsets`) as iter() hands them over: one
        larger than the native path has room for (a batch sampler's
        batch_size attribute is only what it mostly gives) makes the run anew
        with room for it."""
        native = self._run.native
        if native is None or self._resume:
            return
        largest = max((offsets[i + 1] - offsets[i] for i in range(len(offsets) - 1)), default=0)
        if largest > native.max_batch:
            self._batch_room = largest
            self._remake()

    def _take_reassigned(self):
        """Options reassigned as attributes since the last iter() (as torch,
        which reads them at each iter()): checked as when given, and made the
        options of the next run. True when any was."""
        options = self._options
        changed = self._reassigned({name: getattr(options, name) for name in _REASSIGNABLE})
        if not changed:
            return False
        args = dict(self._arguments, **changed)
        delivery = _resolve_delivery(args["pin_memory"], args["pin_memory_device"],
                                     args["device"], args["device_prefetch_bytes"],
                                     args["timeout"], args["in_order"], args["generator"],
                                     args["on_error"])
        # As torch: persistent_workers (which cannot be reassigned) and
        # prefetch_factor mean nothing at 0 workers (checked when made only).
        some = args["num_workers"] != 0
        workers = _resolve_workers(args["num_workers"], args["prefetch_factor"] if some else None,
                                   args["persistent_workers"] and some,
                                   args["worker_kind"], args["worker_init_fn"],
                                   args["multiprocessing_context"] if some else None,
                                   args["max_workers"], args["memory_budget_bytes"],
                                   args["tune_interval"], args["trace_path"])
        _check_timeout(delivery["timeout"], workers["workers"])
        remote = _remote.resolve("num_workers", workers["workers"], args["cluster"],
                                 args["cluster_security"], args["remote_timeout"],
                                 args["remote_min"])
        collate_fn = options.collate_fn
        if "collate_fn" in changed:
            collate_fn = changed["collate_fn"]
            if collate_fn is None:  # the default, as when none is given
                from torch.utils.data._utils.collate import default_convert
                unbatched = options.unbatched if options.shards is None else \
                    options.shards.unbatched
                collate_fn = default_convert if unbatched else options.default_collate
        self._options = dataclasses.replace(options, collate_fn=collate_fn, **delivery,
                                            **workers, **remote)
        self._arguments = args
        self._plan.reassigned(self._options)
        for name in changed:  # as the run now has it
            setattr(self, name, getattr(self._options, name))
        self.prefetch_factor = self._options.prefetch_factor  # follows num_workers when not given
        return True

    def _remake(self):
        """Closes the run and makes it anew over the dataset as it is now."""
        if self._iterator is not None:
            self._iterator.end("a newer iter()")
            self._iterator = None
        workers = self._run.engine.workers
        self._skipped_before += self._run.engine.skipped()  # the new run's start with none
        self._skipped_count_before += self._run.engine.metrics()["samples_skipped"]
        trial = self._run.trial
        if trial is not None:
            trial.suspend()
        self._run.close()
        self._plan.renew_table()
        self._remade += 1
        if self._options.initial_workers:  # "auto": the tuner goes on from the count it held
            self._options = dataclasses.replace(self._options, initial_workers=max(1, workers))
        self._start_run()
        if trial is not None and self._run.trial is not None:
            trial.carry_to(self._run.trial)  # the trial goes on, not over

    @property
    def num_workers(self):
        """An int, as torch's: the count given, or with "auto" the count
        running now (code that reads it, e.g. ``if loader.num_workers > 0``,
        works unchanged); stats()["workers"] says the same."""
        given = self.__dict__.get("_num_workers", 0)
        if given != "auto":
            return given
        stream = self.__dict__.get("_stream")
        if stream is not None:
            return stream.stats()["workers"]
        run = self.__dict__.get("_run")
        try:
            return run.engine.workers
        except (AttributeError, ValueError):  # not made yet, or closed: none run
            return 0

    @num_workers.setter
    def num_workers(self, value):
        self._num_workers = value

    @property
    def multiprocessing_context(self):
        return self._DataLoader__multiprocessing_context

    @multiprocessing_context.setter
    def multiprocessing_context(self, value):
        # The one it has (a script setting it again after the loader is
        # made) changes nothing.
        ours, theirs = self.multiprocessing_context, _start_method(value)
        if (ours and ours.get_start_method()) != (theirs and theirs.get_start_method()):
            raise ValueError(f"multiprocessing_context cannot be changed after a stoker.DataLoader "
                             f"is made (it has {ours and ours.get_start_method()!r}, given "
                             f"{value!r}): its zygote is started then")

    # -- iteration ----------------------------------------------------------

    def __len__(self):
        """The sampler's batches now, as torch's len(): a length that changed
        since the last iter() shows here at once."""
        if self._stream is not None:
            return len(self._stream)
        options = self._options
        if options.shards is not None:  # as torch's len() of an IterableDataset
            length = _shards.approximate_len(self.dataset, options.batch_size, options.drop_last)
            self._IterableDataset_len_called = len(self.dataset)  # what its warning holds to
            return length
        return len(self._plan.order())

    def __iter__(self):
        """A new epoch, as torch's iter() starts one (its base seed drawn, then
        the sampler read, however many batches it gives); after
        load_state_dict, the rest of that epoch."""
        if self._stream is not None:
            return iter(self._stream)
        self._run.check_usable()
        reassigned = self._take_reassigned()
        if self._resume:
            if reassigned:  # a new run, at the checkpoint load_state_dict restored
                self._remake()
                self._run.engine.restore(self._restored)
        else:
            shards = self._options.shards
            refreshed = shards is not None and shards.table.refresh()  # shards added or retired
            if reassigned or refreshed:
                self._remake()
            else:
                self._remake_if_changed()
        prev = self._iterator
        if self._resume:
            epoch = self._run.engine.epoch
            try:
                anew = self._plan.resume(epoch)
            except _Refused as refused:
                if not refused.kept:
                    # The next iter() starts a new epoch, whole (not at the
                    # checkpoint's place the engine was restored to).
                    self._resume, self._skip, self._refused = False, 0, True
                raise
        else:
            # Each iter() is an engine epoch of its own: the number the workers
            # may already be running ahead into, never one used before.
            epoch = self._plan.next_epoch()
            try:
                self._plan.start(epoch)  # may make the run anew (_fit_batches)
            except _EndlessOrder as endless:
                return self._to_torch(endless)
            anew = True
        run, plan = self._run, self._plan
        if anew and (self._refused or run.engine.epoch != epoch or
                     run.engine.batches_per_epoch != plan.batches or not plan.ahead_holds):
            # Abandons what is left of the last epoch, and what the workers
            # made ahead for this one from another count or other lists.
            run.engine.set_epoch(epoch, items=plan.batches, keep_ahead=plan.ahead_holds)
        resumed_at = 0 if anew else run.engine.state()["position"]
        it = _Iterator(run, epoch, self, plan.batches, 0 if anew else self._skip,
                       plan.draws(epoch, resumed_at))
        if prev is not None:
            prev.end("a newer iter()")
        self._resume = self._refused = False
        self._skip = 0
        self._iterator = it
        return it

    def _to_torch(self, endless):
        """An order found endless at iter(): this loader's epochs run on
        torch's DataLoader from now on (an _iterable.PlainStream), this one
        with what the order told so far, then the rest of it."""
        order = "sampler" if self._arguments["batch_sampler"] is None else "batch_sampler"
        unit = "keys" if self._options.unbatched else "batches"
        why = (f"{order} {type(getattr(self, order)).__name__} gave more than twice the "
               f"{endless.declared} {unit} its len() says: an endless order")
        self._run.close()
        self._iterator = None
        told = endless.told + [endless.then]  # batches; [key]s unbatched
        told = itertools.chain((b[0] for b in told) if self._options.unbatched else told,
                               endless.rest)
        self._DataLoader__initialized = False  # torch's guard: PlainStream sets torch's attributes
        self._stream = _iterable.PlainStream(self, self.dataset, why, **self._arguments)
        return self._stream.first_epoch_from(told, endless.declared)

    def set_epoch(self, epoch):
        """Passes ``epoch`` to the sampler's and batch sampler's ``set_epoch``
        where they have one (a DistributedSampler's order depends on it); an
        epoch in progress is abandoned, and the next ``iter()`` starts anew --
        unless load_state_dict came before it: a resumed loop calls set_epoch
        as it always does, and the next ``iter()`` continues the checkpoint."""
        if self._stream is not None:
            return self._stream.set_epoch(epoch)
        self._run.check_usable()
        epoch = _args.integer("epoch", epoch, 0, _stoker.MAX_EPOCH)
        for s in (self.sampler, self.batch_sampler):
            if hasattr(s, "set_epoch"):
                s.set_epoch(epoch)
        if self._iterator is not None:
            self._iterator.end("set_epoch()")

    # -- checkpoints --------------------------------------------------------

    def state_dict(self):
        """Where the current epoch stands, with the generator's state at its
        start; ``load_state_dict`` in a new process (same arguments, any
        ``num_workers``, 0 included, no seed of yours) resumes with exactly
        the remaining batches; a sampler's (or batch sampler's) own
        ``state_dict()``, where it has ``load_state_dict()`` too, is kept as
        it was before the epoch's ``iter()``. A sampler that gives that epoch
        another order then (state of its own it has no such methods for) is
        refused, and so is a dataset whose length differs from that epoch's
        (naming both); a state taken once its epoch ended (or set_epoch()
        abandoned it) starts the next one with the dataset as it is then."""
        if self._stream is not None:
            return self._stream.state_dict()
        self._run.check_usable()
        options = self._options
        record = self._plan.record
        it = self._iterator
        # With device=, batches copied ahead are not yet the user's.
        ahead = it.checkpoint_state() if it is not None and (it.finished or not it.done) else None
        engine = self._run.engine.state() if ahead is None else copy.deepcopy(ahead[0])
        if it is not None and it.done and not it.finished and not self._resume and record:
            # Its epoch abandoned (set_epoch()): the next iter() starts the
            # next epoch, as after an epoch's end, and so does a resume, from
            # the generators as the abandoned epoch left them (its batches
            # taken, as torch's iterator pulls its order).
            engine = dict(engine, epoch=it.epoch + 1, position=0, beyond=[])
            record = dict(record, **self._plan.left_by_abandoned())
        stream = None
        if options.shards is not None:
            if ahead is not None:
                opened = ahead[1]
            else:
                opened = it.open_item() if it is not None and not it.done else None
            if self._resume and self._skip:
                stream = {"item": self._skip[0], "batches_taken": self._skip[1]}
            elif opened is not None:  # the shard whose batches are being handed out
                engine = _shards.reopen(engine, opened[0], it.epoch, self._plan.batches)
                stream = {"item": opened[0], "batches_taken": opened[1]}
        return {"format": _FORMAT,
                # Of the checkpoint's epoch (the record's), else as they are now.
                "dataset_len": (record or {}).get("dataset_len", _len_or_none(self._plan.dataset)),
                "batches_per_epoch": (record or {}).get("batches", len(self._plan.order())),
                "batch_size": options.batch_size,
                "drop_last": options.drop_last,
                "sampler": type(options.sampler).__name__,
                "batch_sampler": type(options.batch_sampler).__name__,
                # How a sharded stream's shards are mixed: a resume skips what
                # that mix delivered.
                "shuffle_buffer": 0 if options.shards is None else options.shards.shuffle_buffer,
                "epoch_start": record, "engine": engine, "stream": stream}

    def load_state_dict(self, state):
        """Resumes at ``state`` (from ``state_dict``): the next ``iter()``
        continues that epoch. Errors name the field that differs; the
        lengths, which may change between epochs, are checked by that
        ``iter()`` against the sampler then."""
        if self._stream is not None:
            return self._stream.load_state_dict(state)
        self._run.check_usable()
        if not isinstance(state, dict) or state.get("format") != _FORMAT:
            raise ValueError(f"not a {_FORMAT} state dict")
        mine = self.state_dict()
        older = {"shuffle_buffer": mine["shuffle_buffer"]}  # what states of older versions lack
        for field in ("batch_size", "drop_last", "sampler", "batch_sampler", "shuffle_buffer"):
            if state.get(field, older.get(field)) != mine[field]:
                raise ValueError(f"state dict's {field} {state.get(field)!r} differs from this "
                                 f"loader's {mine[field]!r}")
        engine = state.get("engine")
        if not isinstance(engine, dict):
            raise ValueError("state dict has no 'engine' entry")
        epoch = _args.integer("state['engine']['epoch']", engine.get("epoch"), 0,
                              _stoker.MAX_EPOCH)
        record = _Plan.check_record(state.get("epoch_start"))
        if (record is None or record["epoch"] != epoch) and (
                engine.get("position") or engine.get("beyond")):
            # Mid-epoch, with no start of that epoch to replay: a resume would
            # skip batches of an order drawn afresh (an edited or mixed state).
            start = "none" if record is None else f"epoch {record['epoch']}'s"
            raise ValueError(f"state dict's engine stands at batch {engine.get('position')} of "
                             f"epoch {epoch}, but its epoch_start is {start}: a checkpoint in "
                             "mid-epoch holds that epoch's start")
        self._plan.check_order_states(record)
        skip = _shards.check_stream_state(state.get("stream"))
        self._restored = json.dumps(engine)  # again, should the next iter() make a new run
        self._run.engine.restore(self._restored)
        self._plan.restore(record, epoch)
        self._resume, self._refused = True, False
        self._skip = skip
        if self._iterator is not None:
            self._iterator.end("load_state_dict()")

    # -- figures ------------------------------------------------------------

    def stats(self, gpu=True, pcie=False):
        """Figures: workers (the pool's count; without persistent_workers its
        processes end between epochs, as torch's, and "worker_pids" lists
        those alive), their memory (their unique memory and the batch
        segments), batches delivered, samples per second
        and the consumer's stall over its last 5 seconds ("window_s") and
        since its first batch ("..._since_start"), the tuner's view (its
        figures count batches: "unit"), worker_kind="auto"'s trial, and
        with ``gpu`` each GPU's utilisation and memory (NVML; with ``pcie`` its
        PCIe throughput too), as stoker.Loader.stats() gives them; and the
        workers' memory growth, with advice past a threshold (docs/dataloader.md,
        "Copy-on-read")."""
        if self._stream is not None:
            return self._stream.stats(gpu, pcie)
        run = self._run
        run.check_usable()
        m = run.engine.metrics()
        processes = run.workers is not None
        total, busy = run.workers.segment_bytes() if processes else (0, 0)
        return {
            "pipeline": "python" if run.native is None else "native",
            "pipeline_reason": self._pipeline_reason,
            "pipeline_steps": None if run.native is None else run.native.steps,
            "stream": None if self._options.shards is None else "sharded",
            # Shards a leaving worker handed over mid-way, for another to continue.
            "handovers": None if self._options.shards is None else
            (run.workers.handed_over() if processes else 0) +
            (run.parts.handed_over if run.parts is not None else 0),
            # Shards whose worker process died, gone on after their batches by a fresh one.
            "shard_deaths": None if self._options.shards is None else
            (run.workers.shard_deaths() if processes else 0),
            "workers": run.engine.workers,
            "worker_kind": run.kind(),
            "kind_trial": None if run.trial is None else run.trial.report(),
            "worker_pids": run.workers.pids() if processes else [],
            "worker_bytes": m["worker_bytes"],
            "workers_refused": m["workers_refused"],
            "segment_bytes": total,
            "segment_bytes_in_use": busy,
            **_stats.worker_growth(run, m, total),
            "batches_delivered": m["batches_delivered"],
            "samples_skipped": self._skipped_count_before + m["samples_skipped"],
            **_stats.consumer_rates(m, "user_samples_delivered"),
            "prefetch_batches": m["prefetch_batches"],
            "tuner": run.engine.tuner_view(),
            "remote": None if run.cluster is None else run.cluster.stats(m["workers_remote"]),
            **(_stats.gpu(pcie) if gpu else {}),
        }

    def decisions(self):
        """Every decision the tuner made so far, with its reason and figures
        (a plain stream's: each epoch's count and why), as stoker.Loader's."""
        if self._stream is not None:
            return self._stream.tuner_trace()
        self._run.check_usable()
        return self._run.engine.tuner_trace()

    tuner_trace = decisions  # its first name

    def skipped(self):
        """Samples left out under on_error="skip": dicts with epoch, index
        (the dataset's), key (empty: a dataset has none) and reason, as
        stoker.Loader gives them: a run's first, up to the records it keeps
        (stats()'s "samples_skipped" counts all)."""
        if self._stream is not None:
            return self._stream.skipped()
        self._run.check_usable()
        records = self._skipped_before + self._run.engine.skipped()
        if self._options.shards is not None:  # a shard's record: its name is the key
            names = self._options.shards.names
            for r in records:
                if not r["key"] and 0 <= r["index"] < len(names):
                    r["key"] = _shards.key_of(names[r["index"]])
        return records

    # -- the end ------------------------------------------------------------

    def close(self):
        """Stops the workers and the zygote, at once; batches already handed out
        stay valid. Idempotent; also on garbage collection and ``with``."""
        if getattr(self, "_stream", None) is not None:
            return self._stream.close()
        it = getattr(self, "_iterator", None)  # unset when __init__ failed
        if it is not None:
            it.end("close()")
        if self._run is not None:
            self._run.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # An iterator still in use keeps the run (its own reference); the run
        # closes itself once the last of them goes.
        it = getattr(self, "_iterator", None)
        if it is not None and not it.done:
            return
        try:
            self.close()
        except Exception:  # noqa: BLE001 -- nothing to tell at collection
            pass

    # A copy, a deep copy or an unpickled loader is a new loader made with the
    # same arguments (its own workers), as torch's copies are; no epoch in
    # progress or checkpoint goes with it.
    def __copy__(self):
        return _made_again(self._kind(), self.dataset, self._given())

    def __deepcopy__(self, memo):
        return _made_again(self._kind(), *copy.deepcopy((self.dataset, self._given()), memo))

    def __reduce__(self):
        return _made_again, (self._kind(), self.dataset, self._given())

    def _given(self):
        """The arguments as given, with the options reassigned since (a copy
        has them, as torch's copy does)."""
        if self._stream is not None:
            applied = self._stream.shown()
        else:
            applied = {name: getattr(self._options, name) for name in _REASSIGNABLE}
        return dict(self._arguments, **self._reassigned(applied))

    def _reassigned(self, applied):
        """{name: value} of the options whose attribute is no longer the
        value `applied` (the run's) holds."""
        given = {name: self.__dict__["_num_workers"] if name == "num_workers"
                 else getattr(self, name) for name in _REASSIGNABLE}
        return {name: value for name, value in given.items() if value is not applied[name]}

    def _kind(self):
        """The class a copy is made of: this one's, unless it takes other arguments."""
        return type(self) if type(self).__init__ is DataLoader.__init__ else DataLoader


def _made_again(kind, dataset, arguments):
    return kind(dataset, **arguments)


# Options a program may reassign between epochs: torch's, num_workers and
# stoker's own delivery and kind; the next iter() runs with them.
_REASSIGNABLE = _iterable.TORCH_REASSIGNABLE + _iterable.STOKER_REASSIGNABLE + ("num_workers",)
# The options a DataLoader shows as attributes, as torch's does.
_PUBLIC_OPTIONS = ("batch_size", "drop_last", "sampler", "batch_sampler", "collate_fn",
                   "pin_memory", "pin_memory_device", "device", "timeout", "worker_init_fn",
                   "persistent_workers", "in_order", "generator", "on_error", "num_workers",
                   "prefetch_factor", "worker_kind")


@dataclasses.dataclass(frozen=True)
class _DataLoaderOptions:
    """Every option of a DataLoader, checked and resolved by _resolve_options
    before anything is made; the zygote, the threads and the engine are made
    from this alone."""

    # The batches, as torch decides them.
    batch_size: object        # an int; None: batch_sampler's batches, or unbatched
    sampler: object           # torch's RandomSampler or SequentialSampler, or the user's
    batch_sampler: object     # torch's BatchSampler over sampler, the user's, or None (unbatched)
    drop_last: bool
    unbatched: bool           # batch_size=None without a batch_sampler: sample by sample
    collate_fn: object
    default_collate: object   # torch's, which the workers collate into shared memory
    batches_per_epoch: int    # when the loader was made; each iter() reads its epoch's own
    # A sharded stream (_shards): the engine's items are shards, the sampler
    # orders the rank's shards; None for a map-style dataset.
    shards: object            # a _shards.ShardJob, or None
    # Who makes them.
    num_workers: object       # as given: an int or "auto"
    workers: int              # the engine's count: num_workers, or _stoker.AUTO_WORKERS
    initial_workers: int      # with "auto", the tuner's first count; else unused
    prefetch_factor: object
    prefetch_batches: int     # the engine's bound
    worker_kind: str
    worker_init_fn: object
    multiprocessing_context: object  # None, or how the zygote starts: "fork", "spawn", "forkserver"
    max_workers: int
    memory_budget_bytes: int
    tune_interval: float
    trace_path: str
    # Remote slots (docs/remote.md): a scheduler address or distributed.Client, or None.
    cluster: object
    cluster_security: object  # a distributed.Security for an address, or None
    remote_timeout: float     # seconds a remote batch may take before it is re-run
    remote_min: int           # remote slots kept whatever the tuner says (tests, benchmarks)
    # How they are delivered.
    timeout: float
    in_order: bool
    on_error: str
    pin_memory: bool
    pin_memory_device: str
    device: object            # a torch.device, or None: batches in host memory
    device_budget: object     # with a device: bytes copied ahead of the consumer
    generator: object
    persistent_workers: bool

    @property
    def processes(self):
        """Worker processes are made (from a zygote)."""
        return self.workers != 0 and self.worker_kind != "threads"

    @property
    def threads(self):
        """Batches are made by Python on this process's threads: thread
        workers, or the consumer's own thread at num_workers=0."""
        return self.workers == 0 or self.worker_kind != "processes"


def _resolve_options(dataset, *, batch_size, shuffle, sampler, batch_sampler, num_workers,
                     collate_fn, pin_memory, drop_last, timeout, worker_init_fn,
                     multiprocessing_context, prefetch_factor, persistent_workers,
                     pin_memory_device, generator, in_order, worker_kind, on_error, max_workers,
                     device, device_prefetch_bytes, memory_budget_bytes, tune_interval,
                     trace_path, cluster, cluster_security, remote_timeout, remote_min,
                     shuffle_buffer=0):
    """A DataLoader's options, every one checked (TypeError or ValueError
    naming the option and its value) before anything is made."""
    # None is off, as 0 (a config's unset value).
    shuffle_buffer = _args.integer("shuffle_buffer", 0 if shuffle_buffer is None else shuffle_buffer,
                                   0, 1 << 31)
    if _shards.is_sharded(dataset):
        batching = _resolve_shard_batching(dataset, batch_size, shuffle, sampler,
                                           batch_sampler, drop_last, collate_fn, generator,
                                           shuffle_buffer)
    elif not hasattr(dataset, "__getitem__") or (
            not hasattr(dataset, "__len__") and sampler is None and batch_sampler is None):
        # torch's default samplers read its length; a sampler of the user's names its keys.
        raise TypeError("dataset must have __getitem__, and __len__ unless a sampler or "
                        f"batch_sampler names its keys; got {type(dataset).__name__}")
    elif shuffle_buffer:
        raise ValueError("shuffle_buffer is for sharded streams (stoker.ShardedIterable); "
                         "a map-style dataset is shuffled by its sampler (shuffle=True)")
    else:
        batching = _resolve_batching(dataset, batch_size, shuffle, sampler, batch_sampler,
                                     drop_last, collate_fn, generator)
    delivery = _resolve_delivery(pin_memory, pin_memory_device, device, device_prefetch_bytes,
                                 timeout, in_order, generator, on_error)
    workers = _resolve_workers(num_workers, prefetch_factor, persistent_workers, worker_kind,
                               worker_init_fn, multiprocessing_context, max_workers,
                               memory_budget_bytes, tune_interval, trace_path)
    _check_timeout(delivery["timeout"], workers["workers"])
    remote = _remote.resolve("num_workers", workers["workers"], cluster, cluster_security,
                             remote_timeout, remote_min)
    return _DataLoaderOptions(**batching, **delivery, **workers, **remote)


def _batch_size(batch_size, drop_last):
    """batch_size as torch checks it (None: samples one by one)."""
    if batch_size is None:
        if drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually "
                             "exclusive with drop_last")
        return None
    # torch's BatchSampler raises ValueError for any batch_size that is no
    # positive int (a float, a str, a bool), not TypeError.
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or \
            batch_size <= 0:
        raise ValueError("batch_size should be a positive integer value, but got "
                         f"batch_size={batch_size!r}")
    return _args.integer("batch_size", batch_size, 1, 1 << 31)


def _resolve_shard_batching(dataset, batch_size, shuffle, sampler, batch_sampler, drop_last,
                            collate_fn, generator, shuffle_buffer):
    """A sharded stream's batching: the engine's items are the rank's shards,
    in the order torch's RandomSampler (shuffle) or SequentialSampler gives
    them; the workers batch each shard's samples."""
    from torch.utils.data import RandomSampler, SequentialSampler
    from torch.utils.data._utils.collate import default_collate, default_convert
    for name, value in (("sampler", sampler), ("batch_sampler", batch_sampler)):
        if value is not None:
            raise ValueError(f"DataLoader with IterableDataset: expected unspecified {name} "
                             f"option, but got {name}={value!r} (a sharded stream's order is "
                             "its shards', shuffled with shuffle=True)")
    batch_size = _batch_size(batch_size, drop_last)
    table = _shards.ShardTable(dataset)
    sampler = RandomSampler(table, generator=generator) if shuffle else SequentialSampler(table)
    unbatched = batch_size is None
    if collate_fn is None:
        collate_fn = default_convert if unbatched else default_collate
    return {"batch_size": batch_size, "sampler": sampler, "batch_sampler": None,
            "drop_last": bool(drop_last), "unbatched": True, "collate_fn": collate_fn,
            "default_collate": default_collate, "batches_per_epoch": len(table),
            "shards": _shards.ShardJob(dataset, table, batch_size, bool(drop_last),
                                       shuffle_buffer, unbatched)}


def _len_or_none(dataset):
    """len(dataset), or None for a map-style one read by its sampler's keys
    alone (torch needs no __len__ then)."""
    return len(dataset) if hasattr(dataset, "__len__") else None


def _resolve_batching(dataset, batch_size, shuffle, sampler, batch_sampler, drop_last,
                      collate_fn, generator):
    """The batch options as torch checks them, torch's samplers where the user
    gave none (as torch makes them), and the batches the sampler gives now."""
    from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler
    from torch.utils.data._utils.collate import default_collate, default_convert
    if batch_sampler is not None:
        if batch_size != 1 or shuffle or sampler is not None or drop_last:
            raise ValueError("batch_sampler option is mutually exclusive with batch_size, "
                             "shuffle, sampler, and drop_last")
        batch_size, drop_last = None, False
    else:
        batch_size = _batch_size(batch_size, drop_last)
    if sampler is not None and shuffle:
        raise ValueError("sampler option is mutually exclusive with shuffle")
    if sampler is None:
        sampler = RandomSampler(dataset, generator=generator) if shuffle else \
            SequentialSampler(dataset)
    unbatched = batch_sampler is None and batch_size is None
    if batch_size is not None and batch_sampler is None:
        batch_sampler = BatchSampler(sampler, batch_size, drop_last)
    if collate_fn is None:
        collate_fn = default_convert if unbatched else default_collate
    count = len(sampler) if unbatched else len(batch_sampler)
    return {"batch_size": batch_size, "sampler": sampler, "batch_sampler": batch_sampler,
            "drop_last": bool(drop_last), "unbatched": unbatched, "collate_fn": collate_fn,
            "default_collate": default_collate, "batches_per_epoch": count, "shards": None}


def _resolve_delivery(pin_memory, pin_memory_device, device, device_prefetch_bytes, timeout,
                      in_order, generator, on_error):
    """How batches reach the consumer: pinned, on a device, in order, within a timeout."""
    torch = _torch()
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {generator!r}")
    _, device = _resolve_device(device, torch)
    if not isinstance(pin_memory_device, str):
        raise TypeError(f"pin_memory_device must be a str, got {pin_memory_device!r}")
    if pin_memory and not (
            pin_memory_device == "" or re.fullmatch(r"cuda(:[0-9]+)?", pin_memory_device)):
        raise ValueError("pin_memory_device must be '' or a CUDA device ('cuda', 'cuda:N') with "
                         f"pin_memory=True, got {pin_memory_device!r}: stoker pins memory for "
                         "CUDA only")
    if pin_memory and pin_memory_device.startswith("cuda:") and torch.cuda.is_available() and \
            int(pin_memory_device[5:]) >= torch.cuda.device_count():
        raise ValueError(f"pin_memory_device={pin_memory_device!r} is out of range: torch sees "
                         f"{torch.cuda.device_count()} CUDA device(s)")
    if pin_memory_device and not pin_memory:  # unused, as torch warns (a CPU run's str(device))
        warnings.warn("pin memory device is set and pin_memory flag is not used then device "
                      "pinned memory won't be used please set pin_memory to true, if you need "
                      "to use the device pin memory")
    budget = _args.optional_integer("device_prefetch_bytes", device_prefetch_bytes, 1,
                                    2**63 - 1)
    if device is not None and budget is None:
        budget = torch.cuda.mem_get_info(device)[0] // 4
    return {"timeout": _args.real("timeout", timeout, at_least=0),
            "in_order": bool(in_order), "on_error": _args.on_error(on_error),
            "pin_memory": bool(pin_memory), "pin_memory_device": pin_memory_device,
            "device": device, "device_budget": budget, "generator": generator}


def _check_timeout(timeout, workers):
    """A timeout needs workers: without them each batch is made on the
    caller's thread, which nothing can stop waiting (torch refuses it too)."""
    if timeout > 0 and workers == 0:
        raise ValueError(f"timeout={timeout!r} needs num_workers > 0 (or 'auto'): with "
                         "num_workers=0 each batch is made on this thread, which no timeout "
                         "can interrupt")


def _torch_default(name):
    """The default of torch's DataLoader argument `name` in the installed torch."""
    return inspect.signature(_torch().utils.data.DataLoader.__init__).parameters[name].default


def _resolve_workers(num_workers, prefetch_factor, persistent_workers, worker_kind,
                     worker_init_fn, multiprocessing_context, max_workers, memory_budget_bytes,
                     tune_interval, trace_path):
    """Who makes the batches: the count, the kind, the prefetch bound, the tuner's options."""
    if num_workers == "auto":
        workers = _stoker.AUTO_WORKERS
    else:
        workers = _args.integer("num_workers", num_workers, 0, _stoker.MAX_WORKERS)
    if prefetch_factor is not None and workers == 0:
        # As the installed torch: 1.x takes its default (2) without workers, 2.x none.
        if prefetch_factor != _torch_default("prefetch_factor"):
            raise ValueError("prefetch_factor option could only be specified in "
                             "multiprocessing (num_workers > 0 or 'auto')")
        prefetch_factor = None  # nothing is made ahead without workers
    if prefetch_factor is not None:
        prefetch_factor = _args.integer("prefetch_factor", prefetch_factor, 1, 1 << 16)
    if persistent_workers and workers == 0:
        raise ValueError("persistent_workers option needs num_workers > 0 (or 'auto')")
    if multiprocessing_context is not None and workers == 0:
        raise ValueError("multiprocessing_context can only be used with multi-process loading "
                         "(num_workers > 0 or 'auto'), but got num_workers=0")
    if worker_kind not in ("processes", "threads", "auto"):
        raise ValueError("worker_kind must be 'processes', 'threads' or 'auto', got "
                         f"{worker_kind!r}")
    if worker_kind == "threads" and worker_init_fn is not None:
        raise ValueError("worker_init_fn needs worker processes; thread workers share this "
                         "process (worker_kind='threads')")
    max_workers = _args.integer("max_workers", max_workers, 0, _stoker.MAX_WORKERS)
    auto = workers == _stoker.AUTO_WORKERS
    # The attribute as torch's reads: 2 with workers when none was given (1.x's
    # default, 2.x's resolution), else its default (1.x: 2, 2.x: None).
    shown = prefetch_factor if prefetch_factor is not None else \
        2 if workers != 0 else _torch_default("prefetch_factor")
    return {
        "num_workers": num_workers, "workers": workers,
        "initial_workers": _initial_workers(max_workers) if auto else 0,
        "prefetch_factor": shown,
        "prefetch_batches": _prefetch_batches(
            None if prefetch_factor is None or auto else prefetch_factor * workers, workers,
            _ENGINE_BATCH),
        "worker_kind": worker_kind, "worker_init_fn": worker_init_fn, "max_workers": max_workers,
        "persistent_workers": bool(persistent_workers),
        "multiprocessing_context": _start_method(multiprocessing_context),
        "memory_budget_bytes": _args.integer("memory_budget_bytes", memory_budget_bytes, 0,
                                             2**63 - 1),
        "tune_interval": _args.tune_interval(tune_interval),
        "trace_path": _args.optional_path("trace_path", trace_path) or "",
    }


def _initial_workers(max_workers):
    """With "auto": the CPU budget, where a user would start (the tuner then
    finds the fewest that keep up); processes are slow to add."""
    budget = _stoker.probe(None, False)["cpu"]["budget_cores"] or 1
    return max(1, min(int(budget), max_workers or _stoker.MAX_WORKERS))


def _start_method(context):
    """multiprocessing_context as torch takes it (None, a start method's name,
    or a context), as the context object torch's attribute gives."""
    if context is None:
        return None
    if isinstance(context, str):
        methods = multiprocessing.get_all_start_methods()
        if context not in methods:
            raise ValueError("multiprocessing_context option should specify a valid start "
                             f"method in {methods!r}, but got {context!r}")
        return multiprocessing.get_context(context)
    if not isinstance(context, multiprocessing.context.BaseContext):
        raise TypeError("multiprocessing_context option should be a valid context object or a "
                        f"string specifying the start method, but got {context!r}")
    return context


class _Plan:
    """The batches of each epoch, read from the index sampler (torch's
    BatchSampler over torch's RandomSampler or SequentialSampler, or the
    user's) at iter(), right after the draw of the epoch's base seed, as
    torch's iterator does, however many there are then; handed to the
    workers through the table of epochs' batches. A checkpoint keeps the
    generator's state from before those draws (``record``), so a resume
    replays them, and from after them, so a resume past that epoch need not
    (its dataset may have changed length since); so too the state_dict() of
    a sampler that has one (_stateful_orders)."""

    def __init__(self, options, dataset):
        self._options = options
        self.dataset = dataset  # what the sampler orders: the user's, or a stream's shards
        self.batches = options.batches_per_epoch  # of the epoch started last
        # Whether what the workers may have made ahead for that epoch (from
        # lists handed over early, give_ahead) is of the lists it has.
        self.ahead_holds = True
        self._given_ahead = None  # (epoch, digest) of the lists handed over early
        self.index_keys = False  # the native path's: keys must be ints
        # A weakref.WeakMethod told each epoch's batch offsets before the workers get them.
        self.on_set = None
        self._generator = options.generator
        # torch draws a base seed at each iter(), but once only with
        # persistent workers (its iterator, and its seed, is then reused).
        self._seed_each_epoch = not (options.persistent_workers and options.workers != 0)
        self._base_seed = None
        self.record = None   # the current epoch's start, for state_dict
        self._pending = None  # from load_state_dict: the epoch start to replay
        self._last = -1       # the engine epoch of the last iter()
        # (epoch, [(pulls, state)]): the user's generator after each pull of
        # that epoch's order where it changed, the last once read whole (rewind).
        self._drawn = None
        self.renew_table()
        # Only an order that draws nothing may be handed to the workers early.
        from torch.utils.data import BatchSampler, SequentialSampler
        self.predictable = (not self._seed_each_epoch and
                            type(options.sampler) is SequentialSampler and
                            type(options.batch_sampler) in (BatchSampler, type(None)))

    def reassigned(self, options):
        """The loader's options after attributes were reassigned (the generator
        its base seeds are drawn from among them)."""
        self._options = options
        self._generator = options.generator
        self._seed_each_epoch = not (options.persistent_workers and options.workers != 0)

    def renew_table(self):
        """A new table of epochs' batches, for a new run (a closed run shut its own)."""
        # At least one: the engine is made with a non-empty epoch; an empty one
        # (a dataset that fills later, drop_last over too few) is set at iter().
        shards = self._options.shards
        self.table = _stoker.EpochBatches(max(1, self._options.batches_per_epoch),
                                          "batch" if shards is None else _stoker.EpochBatches.SHARD,
                                          [] if shards is None else [repr(n) for n in shards.names])
        self._given_ahead = None

    def order(self):
        """What gives the epoch's items now: one per sampler key unbatched
        (a sharded stream's items too), else the batch sampler's batches."""
        options = self._options
        return options.sampler if options.unbatched else options.batch_sampler

    def next_epoch(self):
        """The engine epoch of a new iter(): one never used before, and the one
        the workers may be running ahead into."""
        return self._last + 1

    def start(self, epoch):
        """iter(): draws as torch's iterator does and hands the batches over."""
        self._last = epoch
        state = self._rng_state()
        orders = self._order_states()  # with the generator's: a sampler may hold it
        drew = self._seed_each_epoch or self._base_seed is None
        calls = 2 if drew and self._options.workers != 0 else 1
        seed, source = self._iterated(drew, calls)
        if drew:
            self._base_seed = seed
        dataset_len = _len_or_none(self.dataset)
        flat, offsets, keys = self._read(epoch, source)
        digest = _digest(flat, offsets, keys)
        self.record = {"epoch": epoch, "rng": base64.b64encode(state).decode(),
                       "base_seed": self._base_seed, "drew_seed": drew, "digest": digest,
                       "batches": len(offsets) - 1, "iter_calls": calls}
        if dataset_len is not None:
            self.record["dataset_len"] = dataset_len
        if self._generator is not None:  # torch's global one is the user's between epochs
            self.record["rng_after"] = base64.b64encode(self._rng_state()).decode()
        if orders:  # a resume loads these, so that __iter__ gives that epoch's order again
            self.record["sampler_states"] = orders
            self.record["sampler_states_after"] = self._order_states()
        facts = _order_facts(self._options)
        if facts:  # a resume that gets other batches names what changed
            self.record["sampler_facts"] = facts
        if isinstance(self.dataset, _shards.ShardTable):  # which shards its items are
            self.record["shards"] = self.dataset.digest()
        self._set(epoch, flat, offsets, keys, digest)
        del flat, offsets, keys  # the table holds its own copy
        _return_freed_heap()

    def _set(self, epoch, flat, offsets, keys, digest):
        """Hands `epoch`'s batches to the workers, as the epoch started."""
        look = None if self.on_set is None else self.on_set()
        if look is not None:
            look(offsets)  # the loader's look at them first (it may renew the table)
        given, self._given_ahead = self._given_ahead, None
        self.ahead_holds = given is None or given == (epoch, digest)
        self.batches = len(offsets) - 1
        self.table.set(epoch, flat, offsets, self._base_seed, keys)

    def give_ahead(self, epoch):
        """With an order that draws nothing, hands `epoch` over early (its
        length may still change before its iter(): start() then says so)."""
        if self.predictable and not self.table.has(epoch):
            flat, offsets, keys = self._read()
            self._given_ahead = (epoch, _digest(flat, offsets, keys))
            self.table.set(epoch, flat, offsets, self._base_seed, keys)

    @staticmethod
    def check_record(record):
        """A checkpoint's epoch start, checked field by field (None: none yet).
        Checkpoints of earlier versions lack the optional fields."""
        if record is None:
            return None
        if not isinstance(record, dict):
            raise ValueError("state dict's 'epoch_start' is not a dict")
        for field, kind, optional in (
                ("epoch", int, False), ("rng", str, False), ("base_seed", int, False),
                ("drew_seed", bool, False), ("digest", str, False), ("batches", int, True),
                ("dataset_len", int, True), ("rng_after", str, True), ("shards", str, True),
                ("sampler_states", dict, True), ("sampler_states_after", dict, True),
                ("sampler_facts", dict, True), ("iter_calls", int, True)):
            if optional and field not in record:
                continue
            if not isinstance(record.get(field), kind):
                raise ValueError(f"state dict's epoch_start[{field!r}] is missing or not "
                                 f"{kind.__name__}: {record.get(field)!r}")
        if record.get("iter_calls", 1) not in (1, 2):
            raise ValueError("state dict's epoch_start['iter_calls'] is not 1 or 2: "
                             f"{record['iter_calls']!r}")
        size = _torch().get_rng_state().numel()  # a CPU generator's state, in bytes
        for field in ("rng", "rng_after"):
            if field not in record:
                continue
            try:
                state = base64.b64decode(record[field], validate=True)
            except ValueError as e:  # binascii.Error
                raise ValueError(f"state dict's epoch_start[{field!r}] is not base64: {e}") from None
            if len(state) != size:
                raise ValueError(f"state dict's epoch_start[{field!r}] holds {len(state)} bytes, "
                                 f"not a generator's state ({size} bytes)")
        return record

    def check_order_states(self, record):
        """A checkpoint's sampler states (None: none), each one this loader's
        sampler of that name can load."""
        mine = dict(_stateful_orders(self._options))
        for field in ("sampler_states", "sampler_states_after"):
            for name in (record or {}).get(field, {}):
                if name not in mine:
                    raise ValueError(
                        f"state dict's epoch_start[{field!r}] holds a state of the {name}, "
                        "which this loader's has no state_dict() and load_state_dict() for")

    def _order_states(self):
        """The state_dict() of each of _stateful_orders, by name; copies, as a
        sampler may go on changing what it returned."""
        return {name: copy.deepcopy(s.state_dict()) for name, s in _stateful_orders(self._options)}

    def _load_order_states(self, states):
        """Loads _order_states' `states` (copies: a sampler may keep what it is given)."""
        orders = dict(_stateful_orders(self._options))
        for name, state in states.items():
            orders[name].load_state_dict(copy.deepcopy(state))

    def restore(self, record, epoch):
        """load_state_dict: the next iter() replays `record`'s draws and
        continues engine epoch `epoch`; other epochs' lists are dropped."""
        self.table.restart()
        self._given_ahead = None
        self._drawn = None
        self._last = epoch - 1
        self._pending = self.record = record

    def resume(self, epoch):
        """The iter() after load_state_dict: the generator as it was at the
        checkpoint's epoch start, its draws replayed, the same batches checked.
        True when `epoch` starts anew (the checkpoint's had ended, or none had
        started): its batches are the sampler's now, however many. A refusal
        leaves the generator and the plan as they were, the checkpoint loaded."""
        record = self._pending
        if record is None:  # taken before any iter(): the first epoch, as new
            self.start(epoch)
            return True
        before = (None if self._generator is None else self._generator.get_state(),
                  self._base_seed, self._drawn, self._last, self.record)
        orders = self._order_states()  # a stateful sampler too, where it can be
        try:
            anew = self._resume(record, epoch)
        except BaseException as e:
            if before[0] is not None:
                self._generator.set_state(before[0])
            self._load_order_states(orders)
            self._base_seed, self._drawn, self._last, self.record = before[1:]
            if isinstance(e, _Refused) and not e.kept:
                self._pending = None
            raise
        self._pending = None
        return anew

    def _resume(self, record, epoch):
        torch = _torch()
        if record["epoch"] != epoch and ("rng_after" in record or self._generator is None):
            # The checkpoint's epoch had ended: the generator as it left it,
            # with no replay (the dataset may have another length now); a
            # replay on torch's global generator would run on a copy anyway.
            self._base_seed = record["base_seed"]
            if self._generator is not None:
                self._generator.set_state(_state_tensor(record["rng_after"]))
            self._load_order_states(record.get("sampler_states_after", {}))
            self.start(epoch)
            return True
        state = _state_tensor(record["rng"])
        if self._generator is not None:
            self._generator.set_state(state)
            self._load_order_states(record.get("sampler_states", {}))
            flat, offsets, keys = self._replay(record, epoch)
        else:  # torch's global generator: the user's own state is left as it is
            with torch.random.fork_rng(devices=[]):
                torch.set_rng_state(state)
                self._load_order_states(record.get("sampler_states", {}))
                flat, offsets, keys = self._replay(record, epoch)
        batches, dataset_len = len(offsets) - 1, _len_or_none(self.dataset)
        if "shards" in record and record["epoch"] == epoch and \
                self.dataset.digest() != record["shards"]:
            raise _Refused(
                f"the state dict's epoch {record['epoch']} read {record.get('batches')} shards "
                f"that shards() now names otherwise or orders otherwise ({batches} shards): "
                "a resume would read other data; resume with the shards as they were then",
                kept=False)
        other_count = batches != record.get("batches", batches)
        if other_count or _digest(flat, offsets, keys) != record["digest"]:
            if record.get("dataset_len", dataset_len) != dataset_len:
                raise _Refused(
                    f"the state dict's epoch {record['epoch']} read a dataset of "
                    f"{record['dataset_len']} samples; it has {dataset_len} now, and the sampler "
                    f"gives that epoch other batches ({record.get('batches')} batches then, {batches} "
                    "now): "
                    "resume with the dataset as it was then", kept=False)
            changed = _changed_facts(record.get("sampler_facts"), _order_facts(self._options))
            made_with = _order_settings(self._options)
            settings = {k: v for k, v in changed.items() if k in made_with}
            if settings:  # the sampler made otherwise (a world size, a seed)
                raise _Refused(
                    f"the sampler gives the state dict's epoch {record['epoch']} other batches "
                    f"now ({record.get('batches')} batches then, {batches} now): it is made "
                    "otherwise ("
                    + ", ".join(f"{k} {old!r} then, {now!r} now" for k, (old, now) in
                                changed.items())
                    + "): resume with the sampler as it was then", kept=False)
            # The sampler a user's batch_sampler draws from, not torch's placeholder.
            sampler = getattr(self._options.batch_sampler, "sampler", self._options.sampler)
            shared = self._generator is None and self._options.workers != 0 and \
                self._options.worker_kind != "processes"
            restored = record.get("sampler_states", {})
            yourself = ("restore it yourself, after load_state_dict(), to its state before that "
                        "epoch's iter(), e.g. its set_epoch()" + "".join(
                            f" ({k} {old!r} then, {now!r} now)"
                            for k, (old, now) in changed.items()))
            if restored:
                why = (f"the state_dict() of its {', '.join(restored)}, restored as it was "
                       "before that epoch's iter(), misses state its order depends on")
            elif _stateful_orders(self._options):
                why = ("it keeps state of its own, and the state dict holds none of its "
                       f"state_dict() (an older stoker's): {yourself}")
            else:
                why = ("it keeps state of its own that the loader cannot restore (give it "
                       "state_dict() and load_state_dict(), which the checkpoint then keeps; "
                       f"or {yourself}; or use a sampler whose order comes from the loader's "
                       "generator)")
            raise _Refused(
                f"the sampler gave epoch {record['epoch']} other batches than when the state "
                f"dict was taken ({type(sampler).__name__}, "
                f"{type(self._options.batch_sampler).__name__}): " + why + (
                    "; or its order comes from torch's global generator, which thread workers "
                    "reseed and draw from meanwhile: give the loader a generator= (a "
                    "torch.Generator) for checkpoints with thread workers" if shared else ""),
                kept=True)
        self.record = dict(record, epoch=epoch)
        if record["epoch"] == epoch:
            self._last = epoch
            self._set(epoch, flat, offsets, keys, record["digest"])
            return False
        # The checkpoint's epoch had ended (a checkpoint of an earlier version).
        self.start(epoch)
        return True

    def _replay(self, record, epoch):
        # As the checkpoint's epoch called them (the worker count may differ now).
        _, source = self._iterated(record["drew_seed"], record.get("iter_calls", 0))
        self._base_seed = record["base_seed"]
        return self._read(epoch, source)

    def _iterated(self, drew, calls):
        """(the base seed drawn or None, the order's iterator to read): iter()
        called as torch's iterator calls it, since an order's __iter__ may
        draw at once (one that builds its list and returns iter() of it):
        before the seed's draw and, with workers (`calls` 2), again after it
        (torch's multiprocessing iterator resets itself at its start), that
        one read; once where no seed is drawn (persistent workers' later
        epochs). `calls` 0: once, after the draw (a checkpoint of an earlier
        stoker, which recorded no `iter_calls`)."""
        order = self.order()
        if calls == 0:
            return (self._draw_seed() if drew else None), iter(order)
        source = iter(order)
        if not drew:
            return None, source
        seed = self._draw_seed()
        return seed, iter(order) if calls == 2 else source

    def draws(self, epoch, taken):
        """The iter() of `epoch`, `taken` of its batches taken before (a
        resume): its _Draws, or None where the order drew nothing from the
        user's generator after its first pull."""
        drawn, self._drawn = self._drawn, None
        if drawn is None or drawn[0] != epoch or len(drawn[1]) < 2:
            return None
        options = self._options
        ahead = 0  # batches torch's iterator asks for beyond those taken
        if isinstance(options.num_workers, int) and options.workers > 0:
            ahead = options.prefetch_factor * options.workers
        generators = drawn[2]
        return _Draws(generators, drawn[1], ahead, taken, lambda: _states(generators))

    def _order_generators(self):
        """The torch.Generators an epoch's order may draw from late, as torch's
        iterator pulls it: the loader's, and a sampler's own (RandomSampler(
        generator=g), as HF's Trainer makes it), each once."""
        found = [] if self._generator is None else [self._generator]
        for _, order in _orders(self._options):
            g = getattr(order, "generator", None)
            if isinstance(g, _torch().Generator) and all(g is not h for h in found):
                found.append(g)
        return found

    def left_by_abandoned(self):
        """The record's fields for the generators as an epoch abandoned now
        leaves them, which the next epoch draws from: a checkpoint taken
        then resumes at that next epoch."""
        left = {}
        if self._generator is not None:
            left["rng_after"] = base64.b64encode(self._rng_state()).decode()
        if "sampler_states_after" in (self.record or {}):
            left["sampler_states_after"] = self._order_states()
        return left

    def _rng_state(self):
        if self._generator is not None:
            return _states([self._generator])[0]
        return _torch().get_rng_state().numpy().tobytes()

    def _draw_seed(self):
        torch = _torch()  # torch's own draw, as its iterator makes it
        return int(torch.empty((), dtype=torch.int64).random_(generator=self._generator).item())

    def _read(self, epoch=None, source=None):
        """The epoch's batches: (flat, where each starts (one more than
        batches), keys), flat and offsets as arrays of int64 (a list would
        hold an int object per sample: 100 MiB at 3 million, whose freed heap
        stays with the process). The sampler's keys go to dataset[...] as it
        gave them: when all are ints, `flat` holds them and `keys` is empty;
        else (tuples, strings, floats, numpy ints) `flat` holds each key's
        position in its batch and `keys` each batch's keys, pickled. With
        `epoch`, the user's generator's changes on the way (_drawn)."""
        options = self._options
        order = options.sampler if options.unbatched else options.batch_sampler
        bound = 2 * len(order) + _ORDER_SLACK
        source = iter(order) if source is None else source
        batches = ([i] for i in source) if options.unbatched else source
        flat, offsets, keys = array.array("q"), array.array("q", [0]), None
        generators = self._order_generators() if epoch is not None and options.shards is None \
            else []
        track = bool(generators)
        drawn = [(0, _states(generators))] if track else None
        for b in batches:
            if len(offsets) > bound:  # an endless order: the rest of it goes to torch's loader
                told = [pickle.loads(keys[i]) if keys else list(flat[offsets[i]:offsets[i + 1]])
                        for i in range(len(offsets) - 1)]
                raise _EndlessOrder(len(order), told, b, source)
            b = [_index_key(k) for k in b] if self.index_keys else list(b)
            plain = keys is None and all(type(k) is int for k in b)
            if plain:
                try:
                    flat.extend(b)
                except OverflowError:  # an int past int64's range: a key like any other
                    del flat[offsets[-1]:]
                    plain = False
                    if self.index_keys:  # the native path reads by index
                        raise IndexError(
                            f"the sampler gave index {next(k for k in b if not -2**63 <= k < 2**63)}, "
                            f"outside the data set's {len(self.dataset)} samples") from None
            if not plain:
                if keys is None:
                    # The first key that is not an int64: the batches so far
                    # become pickled lists of their ints, and `flat` positions.
                    keys = [_pickled(list(flat[offsets[i]:offsets[i + 1]]))
                            for i in range(len(offsets) - 1)]
                    flat = array.array("q", (p for i in range(len(offsets) - 1)
                                             for p in range(offsets[i + 1] - offsets[i])))
                keys.append(_pickled(b))
                flat.extend(range(len(b)))
            offsets.append(len(flat))
            if track and (state := _states(generators)) != drawn[-1][1]:
                drawn.append((len(offsets) - 1, state))
        if track:  # the pull that found the order's end may draw too
            if (state := _states(generators)) != drawn[-1][1]:
                drawn.append((len(offsets), state))
            self._drawn = (epoch, drawn, generators)
        return flat, offsets, keys or []


def _states(generators):
    """The states of `generators` (torch.Generator), as bytes, in a tuple."""
    return tuple(g.get_state().numpy().tobytes() for g in generators)


class _Draws:
    """The user's generators where torch's would be as an epoch goes on.
    torch's iterator asks its sampler for batches as it goes (those taken,
    and with workers prefetch_factor x num_workers ahead), and a sampler may
    draw late: RandomSampler's trailing permutation comes only at the pull
    that finds the order's end. The loader reads the order whole at iter();
    this sets the generator back to its state after as many pulls as torch's
    would have made, and forward as batches are taken -- never over the
    user's own draws from it since (then it is left as it is)."""

    def __init__(self, generators, changes, ahead, taken, state_of):
        self._generators, self._ahead, self._state_of = generators, ahead, state_of
        self._changes = collections.deque(changes)  # [(pulls, state)], the last its state now
        self._set = changes[-1][1]  # the state last left in it
        self._before = taken  # batches taken before this iterator (a resume's)
        self.follow(0)

    def follow(self, taken):
        """`taken` batches taken by the iterator (math.inf: the epoch's end reached)."""
        pulls, changes, state = self._before + taken + self._ahead, self._changes, None
        while changes and changes[0][0] <= pulls:
            state = changes.popleft()[1]
        if state is None or state == self._set:
            return
        if self._state_of() != self._set:  # drawn from since: the user's now
            changes.clear()
            return
        torch = _torch()
        for generator, one in zip(self._generators, state):
            generator.set_state(torch.frombuffer(bytearray(one), dtype=torch.uint8))
        self._set = state


# Items an order may give past twice its len() before it is taken for endless.
_ORDER_SLACK = 1024


class _EndlessOrder(ValueError):
    """The sampler (or batch sampler) gave more than twice its len(): what
    it told so far (its batches; keys unbatched), the next, and the rest.
    Outside iter() (a checkpoint's resume), an error that says so."""

    def __init__(self, declared, told, then, rest):
        super().__init__(f"the sampler gave more than twice the {declared} items its len() "
                         "says: an endless order, which stoker runs on torch's DataLoader, "
                         "without checkpoints")
        self.declared, self.told, self.then, self.rest = declared, told, then, rest


def _stateful_orders(options):
    """[(name, order)] whose state a checkpoint keeps, torchdata's way: the
    sampler and the batch sampler that have state_dict() and load_state_dict(),
    and the sampler a batch sampler without them draws from (a user's
    BatchSampler over a sampler of theirs)."""
    def stateful(s):
        return callable(getattr(s, "state_dict", None)) and \
            callable(getattr(s, "load_state_dict", None))

    drawn_from = not stateful(options.batch_sampler)  # its own state holds its sampler's
    return [(name, s) for name, s in _orders(options)
            if stateful(s) and (drawn_from or name != "batch_sampler.sampler")]


def _orders(options):
    """[(name, order)]: the sampler, the batch sampler and the sampler it draws from, once each."""
    batch_sampler = options.batch_sampler
    found = [("sampler", options.sampler), ("batch_sampler", batch_sampler),
             ("batch_sampler.sampler", getattr(batch_sampler, "sampler", None))]
    seen, orders = set(), []
    for name, s in found:
        if s is not None and id(s) not in seen:
            seen.add(id(s))
            orders.append((name, s))
    return orders


def _order_settings(options):
    """Of _order_facts' names, those an order was made with (its class's
    __init__ takes them: a DistributedSampler's num_replicas, not its epoch)."""
    names = set()
    for name, s in _orders(options):
        try:
            made_with = inspect.signature(type(s).__init__).parameters
        except (TypeError, ValueError):  # a builtin's, with no signature
            continue
        names.update(f"{name}.{p}" for p in made_with if p != "self")
    return names


def _order_facts(options):
    """The plain attributes (public ints, floats, bools, strings) of the
    sampler and the batch sampler, by "name.attribute": what a resume compares
    to name what gave its epoch other batches (a DistributedSampler's
    num_replicas, seed, epoch)."""
    facts = {}
    for name, s in _orders(options):
        for attribute, value in sorted(getattr(s, "__dict__", {}).items())[:_FACTS_EACH]:
            if not attribute.startswith("_") and type(value) in (int, float, bool, str) and \
                    (type(value) is not str or len(value) <= 200):
                facts[f"{name}.{attribute}"] = value
    return facts


_FACTS_EACH = 64  # attributes looked at per sampler: a bound on a checkpoint's size


def _changed_facts(then, now):
    """{name: (then, now)} of _order_facts that differ (nothing where the
    checkpoint has none: an older stoker's)."""
    if then is None:
        return {}
    return {k: (then.get(k), now.get(k)) for k in sorted(set(then) | set(now))
            if then.get(k) != now.get(k)}


def _return_freed_heap():
    """Gives the heap that reading the epoch's order freed back to the system.
    A shuffled epoch of N samples passes through a few N-sized temporaries
    (torch's randperm and its list of ints, the flat order): glibc keeps freed
    heap below its trim threshold, which rises to 64 MiB as blocks that large
    come and go, so it would stay the loader's own for the life of the
    process (figures: docs/dataloader.md). Elsewhere than glibc: nothing to do."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            _malloc_trim = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim = None  # libc's malloc_trim once looked up; False where there is none


class _Refused(ValueError):
    """A checkpoint that iter() cannot resume. One the user can mend in place
    (a sampler's set_epoch) stays loaded for the next iter(); one of a dataset
    since changed is dropped, and the next iter() starts a new epoch."""

    def __init__(self, why, kept):
        super().__init__(why + (" (the checkpoint stays loaded: the next iter() tries it again)"
                                if kept else
                                " (the checkpoint is dropped: the next iter() starts a new epoch)"))
        self.kept = kept


def _state_tensor(text):
    """A generator's state from a record's base64 text."""
    torch = _torch()
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def _pickled(keys):
    """A batch's sampler keys as the table of epochs' batches holds them."""
    try:
        return pickle.dumps(keys, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # noqa: BLE001 -- whatever a key's pickling raises
        raise TypeError(f"the sampler gave a key that cannot be pickled ({type(e).__name__}: "
                        f"{e}), in the batch {keys!r}: stoker hands a key that is not an int "
                        "to the workers pickled, at any num_workers (0 too), so it must "
                        "pickle") from e


def _index_key(key):
    """`key` as an int, for the native path (stoker's source takes ints)."""
    try:
        return operator.index(key)
    except TypeError:
        raise TypeError(f"the sampler gave key {key!r}, not an int: the native pipeline reads "
                        "samples by index (pass native=False to give the keys to the dataset's "
                        "own __getitem__)") from None


def _digest(flat, offsets, keys=()):
    """What a resume checks: the epoch's batches, hashed."""
    import numpy as np
    # Hashed in place: the same bytes as the int64 array's tobytes().
    h = hashlib.sha256(np.ascontiguousarray(flat, dtype=np.int64))
    h.update(np.ascontiguousarray(offsets, dtype=np.int64))
    for blob in keys:
        h.update(blob)
    return h.hexdigest()[:32]


class _Run:
    """What a DataLoader made to run its batches: the engine, the worker
    processes and their zygote, the thread workers, worker_kind="auto"'s
    trial. The loader makes it; its
    iterators get it instead of reading the loader's attributes."""

    def __init__(self, options, plan, native):
        self.options = options
        self.plan = plan
        self.native = native  # the native path's _native.Plan, or None: the Python path
        self.pid = os.getpid()
        self.closed = False
        self.engine = None
        self.zygote_pid = None
        self.workers = None  # process workers (kinds "processes" and "auto")
        self.threads = None  # thread workers (kinds "threads" and "auto"), or num_workers=0's
        self.parts = None    # a sharded stream's batches made so far on thread workers
        self.kinds = None    # worker_kind="auto": both kinds' workers
        self.trial = None
        self.cluster = None         # cluster=...: the remote slots' _remote.Cluster
        self.remote_threads = None  # and their ThreadWorkers (REMOTE_MAGIC batches)
        # Closed at the exit too when only an iterator holds it (its loader gone).
        _exit.close_at_exit(self)

    @classmethod
    def start(cls, options, plan, job, native=None):
        """Forks the zygote (before stoker starts any thread for this loader),
        then makes the thread workers and the engine; closes what it made on
        an error. With a `native` plan, none of them: the engine's threads
        make the batches with stoker's source and transform."""
        run = cls(options, plan, native)
        try:
            if native is not None:
                run._start_engine(_stoker.native_batch_kind(
                    native.source, native.transform._impl, plan.table, native.max_batch))
            else:
                run._start_engine(run._start_remote(run._start_workers(job), job))
        except BaseException:
            run.close()
            raise
        return run

    def _start_workers(self, job):
        """Makes the workers of the kind asked for; returns the engine's worker kind."""
        options = self.options
        if options.processes:
            fd, self.zygote_pid = _workers.start_zygote(job, options.multiprocessing_context)
            self.workers = _stoker.ProcessWorkers(fd, self.zygote_pid, self.plan.table,
                                                  options.persistent_workers)
            if (options.pin_memory or options.device is not None) \
                    and _torch().cuda.is_available():
                # Segments page-locked once each: batches from processes are pinned
                # where the workers wrote them, with no pinned copy per batch.
                self.workers.pin()
        if options.threads:
            # At num_workers=0 the consumer's thread makes the batches: its
            # generators are the user's, and get their state back after each.
            if options.workers == 0:
                run = functools.partial(_run_batch_keeping_rng, job)
            else:
                if options.shards is not None:
                    self.parts = _shards.Parts()
                run = functools.partial(_run_batch, job, parts=self.parts)
            self.threads = _stoker.ThreadWorkers(run, self.plan.table)
        if self.workers is not None and self.threads is not None:
            self.kinds = _stoker.WorkerKinds(self.workers, self.threads,
                                             remake_failed=options.shards is None)
            return self.kinds.as_kind()
        return (self.threads if self.workers is None else self.workers).as_kind()

    def _start_remote(self, kind, job):
        """With a cluster: `kind` beside remote slots (after the zygote's fork,
        which must not copy the Dask client's threads and sockets)."""
        options = self.options
        if options.cluster is None:
            return kind
        slots = _stoker.RemoteSlots()
        self.cluster = _remote.Cluster(options.cluster, options.cluster_security,
                                       options.remote_timeout, job, slots)
        self.remote_threads = _stoker.ThreadWorkers(self.cluster.run, self.plan.table,
                                                    remote=True)
        return _stoker.local_first(kind, self.remote_threads, slots)

    def _start_engine(self, kind):
        """The engine over the user's batches: they are its items, made by `kind`."""
        options = self.options
        tuner = _stoker.TunerOptions(
            memory_budget_bytes=options.memory_budget_bytes,
            memory_budget_name="option 'memory_budget_bytes'", max_workers=options.max_workers,
            interval_s=options.tune_interval, trace_path=options.trace_path,
            initial_workers=options.initial_workers, remote_min=options.remote_min)
        # The user's batches are the engine's items, one to an engine batch, in
        # plan order; the engine's policy handles the failed samples they carry.
        self.engine = _stoker.Loader(_stoker.LoaderOptions(
            kind=kind, batch_size=_ENGINE_BATCH, shuffle=False, workers=options.workers,
            prefetch_batches=options.prefetch_batches, on_error=_error_policy(options.on_error),
            ordered=options.in_order, tuner=tuner))
        if self.cluster is not None:
            self.cluster.follow(self.engine)
        if self.kinds is not None:
            self.trial = _KindTrial(self.engine, self.kinds,
                                    "worker_init_fn needs worker processes"
                                    if options.worker_init_fn is not None else None)

    def kind(self):
        """What makes the batches now."""
        if self.options.workers == 0:
            return "none (num_workers=0)"
        if self.native is not None:
            return "native"
        return self.options.worker_kind if self.kinds is None else self.kinds.kind

    def in_forked_child(self):
        return os.getpid() != self.pid

    def check_usable(self):
        """RuntimeError in a child forked since the loader was made (the
        engine's words for it); ValueError once closed."""
        if self.in_forked_child():
            raise RuntimeError(
                f"this stoker loader was made in process {self.pid} and cannot be used in a "
                f"forked child (pid {os.getpid()}); make a new loader in the child")
        if self.closed:
            raise _iterable.closed_error()

    def close(self):
        """Stops the workers, the engine and the zygote; idempotent. The
        processes are ended whatever interrupts it (Ctrl-C included)."""
        if self.closed:
            return
        self.closed = True
        if self.in_forked_child():
            return  # everything here is the parent's
        if self.engine is not None and self.options.trace_path:
            _stats.flush_trace(self.engine, self.options.trace_path)
        try:
            self._stop()
        finally:
            if self.closed:  # not a close refused from inside next()
                self._end_processes()

    def __del__(self):
        # Its loader's close() does this; here, a run whose loader never got
        # it (Ctrl-C between its start and the assignment).
        try:
            self.close()
        except Exception:  # noqa: BLE001 -- nothing to tell at collection
            pass

    def _stop(self):
        if self.workers is not None:
            self.workers.shutdown()
        if self.cluster is not None:
            self.cluster.cancel()  # remote slots waiting on a task return
        if self.engine is not None:
            self.plan.table.shutdown()
            try:
                self.engine.close()
            except ValueError:  # from inside its own next(): a later close() finishes
                self.closed = False
                raise
        for threads in (self.threads, self.remote_threads):
            if threads is not None:
                threads.close()  # a batch running on their threads stops at its next sample
        if self.cluster is not None:
            self.cluster.close()

    def _end_processes(self):
        try:
            if self.workers is not None:
                self.workers.close()
        finally:
            if self.zygote_pid is not None:
                _workers.end_zygote(self.zygote_pid)


_END = object()  # what _Iterator._produce gives at the end of the epoch


class _Raised:
    """What a worker thread's batch raised that is not a sample's failure
    (SystemExit): carried through the engine and raised by next() on the
    consumer's thread, as torch raises it."""

    def __init__(self, error):
        self.error = error


def _run_batch_keeping_rng(job, epoch, batch, indices, seed, keys=None):
    """_run_batch on the consumer's thread, whose generators (Python's,
    numpy's, torch's) are left as they were: the seeding per batch is the
    loader's business, the training loop's draws are the user's."""
    import random
    import numpy as np
    torch = _torch()
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        return _run_batch(job, epoch, batch, indices, seed, keys, consumer=True)
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])


def _run_batch(job, epoch, batch, indices, seed, keys=None, consumer=False, parts=None):
    """_workers.run_batch on this process's threads (thread workers, or the
    consumer's at num_workers=0, where Ctrl-C and SystemExit propagate: the
    engine gives the batch back and next() raises them)."""
    try:
        return _workers.run_batch(job, epoch, batch, indices, seed, keys, consumer, parts)
    except BaseException as e:  # noqa: BLE001 -- raised by next(); C++ cannot carry it
        if consumer and not isinstance(e, Exception):
            raise
        return _Raised(e), None


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

    def __init__(self, engine, kinds, fixed_reason=None):
        self._engine = engine
        self._kinds = kinds
        self.phase = "processes"  # then "threads", then "done"
        self.reason = "measuring processes"
        self.figures = {}
        self._phase_start = None
        self._window = None       # (start time, metrics at start, batches, loop seconds)
        # The phase's measured sums from runs before (a dataset changed between
        # epochs makes the run anew): batches, loop s, elapsed s, CPU s, wait s.
        self._sums = [0, 0.0, 0.0, 0.0, 0.0]
        if fixed_reason is not None:
            self.phase, self.reason = "done", f"processes: {fixed_reason}"

    def report(self):
        self._threads_failed()
        return {"chosen": self._kinds.kind if self.phase == "done" else None,
                "reason": self.reason, "figures": dict(self.figures)}

    def _threads_failed(self):
        """Ends the trial where a batch failed on threads (WorkerKinds chose
        processes for good then, and made it again there, a stream's shard
        apart): a dataset bound to the thread that made it fails every one."""
        why = self._kinds.threads_failed
        if self.phase == "done" or not why:
            return
        again = "; it was made again on processes" if self._kinds.remake_failed else ""
        self.phase = "done"
        self.reason = (f"processes: a batch failed on threads ({why.splitlines()[0][:300]})"
                       + again)

    def observe(self, kind, interval, now):
        """The consumer took a batch made by `kind`, `interval` s after its last one."""
        self._threads_failed()
        if self.phase == "done":
            return
        if self._phase_start is None:
            self._phase_start = now
        if kind != self.phase or now - self._phase_start < self.WARMUP_S:
            return
        if self._window is None:
            self._window = (now, self._engine.metrics(), 0, 0.0)
            return
        start, metrics, batches, loop_s = self._window
        batches, loop_s = batches + 1, loop_s + interval
        self._window = (start, metrics, batches, loop_s)
        if now - start + self._sums[2] >= self.WINDOW_S and \
                batches + self._sums[0] >= self.MIN_BATCHES:
            self._close_window(now)

    def _measured(self, now):
        """The phase's sums with the open window's, read from the engine now."""
        start, before, batches, loop_s = self._window
        after = self._engine.metrics()

        def delta(key):
            return (after[key] - before[key]) / 1e9

        got = (batches, loop_s, now - start, delta("cpu_ns"), delta("consumer_wait_ns"))
        return [a + b for a, b in zip(self._sums, got)]

    def suspend(self):
        """Its run is about to close: the open window's figures are read
        from the engine while it lives (kept for carry_to)."""
        if self._window is not None:
            self._sums = self._measured(time.perf_counter())
            self._window = None

    def carry_to(self, trial):
        """A run made anew (the dataset changed): `trial`, the new run's, goes
        on from this one's phase, figures and measured sums (suspend()); the
        start-up of each run is then part of what the kind costs, so no
        warm-up again."""
        if trial.phase == "done":
            return  # fixed: worker_init_fn needs processes
        trial.phase, trial.reason, trial.figures = self.phase, self.reason, dict(self.figures)
        trial._sums = list(self._sums)
        if self.phase == "done":
            trial._kinds.set(self._kinds.kind, True)
            return
        if self.phase == "threads":
            trial._kinds.set("threads", False)
        # Measured from the new run's start: its first batch counts.
        trial._phase_start = float("-inf")
        trial._window = (time.perf_counter(), trial._engine.metrics(), 0, 0.0)

    def _close_window(self, now):
        batches, loop_s, elapsed, cpu, wait = self._measured(now)
        self.figures[self.phase] = {
            "batches_per_s": batches / loop_s,
            "stall_fraction": _stoker.stall_fraction(wait, elapsed),
            "worker_cpu_s_per_batch": cpu / batches,  # worker threads', their processes' included
            "workers": self._engine.workers,
        }
        self._window = None
        self._sums = [0, 0.0, 0.0, 0.0, 0.0]
        self._phase_start = now
        if self.phase == "processes":
            self.phase, self.reason = "threads", "measuring threads"
            self._kinds.set("threads", False)
            return
        chosen, self.reason = self._choose(self.figures["processes"], self.figures["threads"])
        self.phase = "done"
        self._kinds.set(chosen, True)

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


def _to_device(payload, device, moved=None):
    """`payload` with its tensors copied to `device` (non-blocking, on the
    current stream), each copy appended to `moved`; walked as torch's
    pin_memory walks a batch (mappings, namedtuples, sequences), and
    dataclasses field by field. Objects of other types are left as they are."""
    torch = _torch()
    if isinstance(payload, torch.Tensor):
        payload = payload.to(device, non_blocking=True)
        if moved is not None:
            moved.append(payload)
        return payload
    if isinstance(payload, (str, bytes)):
        return payload
    if isinstance(payload, collections.abc.Mapping):
        items = {k: _to_device(v, device, moved) for k, v in payload.items()}
        try:
            return type(payload)(items)
        except TypeError:  # a mapping that cannot be made from a dict, as torch's falls back
            return items
    if isinstance(payload, tuple) and hasattr(payload, "_fields"):  # a namedtuple
        return type(payload)(*(_to_device(v, device, moved) for v in payload))
    if isinstance(payload, collections.abc.Sequence):
        items = [_to_device(v, device, moved) for v in payload]
        try:
            return type(payload)(items)
        except TypeError:
            return items
    if dataclasses.is_dataclass(payload) and not isinstance(payload, type):
        return dataclasses.replace(payload, **{
            f.name: _to_device(getattr(payload, f.name), device, moved)
            for f in dataclasses.fields(payload) if f.init})
    return payload


class _DeviceAhead:
    """device=...: each batch is copied to the device on a stream of its own as
    soon as it is made, up to `budget` bytes ahead of the consumer (one batch
    at least, besides the one handed over), while the consumer works on the batch before. Handing one over
    makes the consumer's current stream wait for its copy's event (no host
    sync); the host batch is let go only once its copy's event has completed,
    since its shared memory is then reused. A failure met while copying ahead
    is raised after the batches before it, so the order is the loader's.
    `produce` (the next host batch) and `ready_now` (whether one can be had
    without waiting) are its iterator's, given at each call (held, they would
    make a cycle that only the garbage collector frees). `taken()` says where
    the iterator stood after each batch it produced; a checkpoint is taken
    where it stood after the last one handed over (`handed_state`), not
    after those copied ahead."""

    def __init__(self, device, budget):
        torch = _torch()
        self._device, self._budget = device, budget
        cuda = device.type == "cuda"
        self._stream = torch.cuda.Stream(device) if cuda else None
        # (batch on the device, its device tensors, event, bytes, host batch, the
        # iterator's state after it)
        self._queue = collections.deque()
        self._bytes = 0
        self._copying = []                 # (event, host batch) handed over, copy maybe running
        self._pending = None               # raised once the batches before it are handed over
        self.handed_state = None           # the state after the last batch handed over

    def ahead(self):
        """Whether batches (or an error) were taken from the iterator and not
        yet handed over."""
        return bool(self._queue) or self._pending is not None

    def next(self, produce, ready_now, taken):
        torch = _torch()
        self._let_go()
        if not self._queue:
            if self._pending is not None:
                pending, self._pending = self._pending, None
                raise pending
            self._send(produce(), taken())
        while self._pending is None and (len(self._queue) < 2 or self._bytes < self._budget) \
                and ready_now():
            try:
                self._send(produce(), taken())
            except Exception as e:  # noqa: BLE001 -- StopIteration and DataError included
                self._pending = e
        batch, moved, event, size, host, self.handed_state = self._queue.popleft()
        self._bytes -= size
        if event is not None:
            current = torch.cuda.current_stream(self._device)
            current.wait_event(event)
            for t in moved:
                t.record_stream(current)
            self._copying.append((event, host))
        return batch

    def _send(self, host, state):
        torch = _torch()
        moved = []
        if self._stream is None:
            batch, event = _to_device(host, self._device, moved), None
        else:
            with torch.cuda.stream(self._stream):
                batch = _to_device(host, self._device, moved)
                event = torch.cuda.Event()
                event.record(self._stream)
        size = sum(t.numel() * t.element_size() for t in moved)
        self._queue.append((batch, moved, event, size, host, state))
        self._bytes += size

    def _let_go(self):
        self._copying = [(event, host) for event, host in self._copying if not event.query()]

    def __del__(self):
        # Host batches go back to the workers now: their copies must be done.
        for event in [q[2] for q in self._queue] + [e for e, _ in self._copying]:
            if event is not None:
                event.synchronize()


class _Iterator:
    """An epoch from the engine, whoever makes its batches. The engine's
    policy reports failed samples (a DataError or ResourceError naming each,
    then the rest of their batch) or skips them."""

    def __init__(self, run, epoch, owner, batches, skip=0, draws=None):
        self.run = run
        self._batches = batches  # its epoch's, as the sampler gave them
        # A sharded stream's item is a shard's batches, handed out one by one.
        self._pending = collections.deque()
        self._failed = None    # a shard's error, raised once the batches it made are handed out
        self._item = None      # the engine item they come from
        self._taken = 0        # of its batches, how many were handed out
        # (item, batches of it already handed out) before the engine delivers
        # it: a resume's, or those taken early from its worker (PART); or 0.
        self._skip = skip
        self._head = None      # (items delivered, the item the engine delivers next)
        self._got_item = None  # the engine item of the last payload
        self._sharded = run.options.shards is not None
        self._shape = (run.options.batch_size, run.options.drop_last)
        # Weakly: the run, not the loader, lives while its iterator does (as
        # `for b in DataLoader(...)` needs), and a loader dropped with its
        # iterator frees its workers at once, not at the next garbage collection.
        self._owner = weakref.ref(owner)
        self._dataset = owner.dataset
        self.epoch = epoch
        self.done = False      # finished, or ended by a newer iterator, set_epoch, a resume
        self._ended_by = None  # what ended it before its epoch's end
        self.finished = False  # reached the end of its epoch
        self.position = 0      # engine items taken (a sharded stream's: shards)
        self.handed = 0        # batches handed out
        self._draws = draws    # the user's generator kept where torch's would be
        self._ahead = None     # device=...: batches copied ahead
        # When the last batch was handed out, from iter() on: the kind trial
        # times the loop, an epoch's first batch too (the epoch's start is the kind's cost).
        self._last = time.perf_counter()
        # What each batch reads, looked up once.
        options = run.options
        self._engine, self._threads, self._workers = run.engine, run.threads, run.workers
        self._remote, self._cluster = run.remote_threads, run.cluster
        self._parts = run.parts
        self._native = run.native
        self._trial, self._timeout, self._device = run.trial, options.timeout, options.device
        self._pin = options.pin_memory and options.device is None
        # At num_workers=0 a batch is made when asked for: none ahead (as torch).
        self._lookahead = options.workers != 0
        # A shard's batches may be taken as its worker makes them.
        self._early = (self._sharded and self._lookahead and options.in_order and
                       (self._workers is not None or self._parts is not None))

    def __iter__(self):
        return self

    def __len__(self):
        # torch's: len(loader), the order's len() (not what it gave), or an
        # IterableDataset's (not its shards').
        owner = self._owner()
        if owner is not None:
            return len(owner)
        return _shards.approximate_len(self._dataset, *self._shape) if self._sharded \
            else self._batches

    def end(self, by):
        """The loader moved on (`by` says how): an iterator not at its epoch's
        end raises at its next use instead of ending as if the epoch had."""
        if not self.finished:
            self._ended_by = by
        self.done = True
        self._pending.clear()  # a shard's batches not handed out: their segment is let go

    def __next__(self):
        try:
            return self._next()
        except (_stoker.Cancelled, ValueError):
            if _exit.ends_quietly() and self.run.closed:
                raise SystemExit from None  # the exit closed it under this thread (_exit)
            raise

    def _next(self):
        self.run.check_usable()
        if self._device is None:
            return self._next_host()
        if self._ahead is None:
            self._ahead = _DeviceAhead(self._device, self.run.options.device_budget)
        return self._ahead.next(self._next_host, self._ready_now, self._taken_state)

    def _taken_state(self):
        """(engine state, open item) now: what a checkpoint after the batch
        just produced holds."""
        return self._engine.state(), (self.open_item() if not self.done else None)

    def checkpoint_state(self):
        """(engine state, open item) after the last batch handed to the user
        where batches were copied to the device ahead of it; else None (the
        iterator's own state is the user's)."""
        ahead = self._ahead
        if ahead is None or not ahead.ahead() or ahead.handed_state is None:
            return None
        return ahead.handed_state

    def _ready_now(self):
        """A batch can be had without waiting (device look-ahead only takes those)."""
        return self._lookahead and self._engine.wait_ready(0)

    def _next_host(self):
        if self.done:
            if self._ended_by is None:
                raise StopIteration
            try:  # len(self) would count as the user's len() (_warn_past_len)
                of = f" of its {self._batches}" if not self._sharded else \
                    f" of its {_shards.approximate_len(self._dataset, *self._shape)}"
            except TypeError:  # a sharded stream without __len__
                of = ""
            raise RuntimeError(
                f"this iterator's epoch {self.epoch} was ended by {self._ended_by} on the same "
                f"stoker.DataLoader after {self.handed}{of} batches: a loader runs one epoch at "
                "a time (drop or finish an iterator before starting another)")
        while True:
            if self._pending:
                self._taken += 1
                return self._hand(self._pending.popleft(), self._taken - 1)
            if self._failed is not None:
                error, self._failed = self._failed, None
                raise error
            if self._early and (early := self._early_part()) is not None:
                return self._hand(*early)
            payload = self._produce()
            if payload is _END:
                self._reached_end()
                raise StopIteration
            if isinstance(payload, _shards.Batches):
                self._open(payload)
            elif payload is not _workers.NO_SAMPLE:  # every sample of the batch failed
                return self._finish(payload)

    def _reached_end(self):
        """Its epoch ended: the next call raises StopIteration."""
        self.finished = self.done = True
        if self._draws is not None:
            self._draws.follow(math.inf)
        if self._sharded:
            self._warn_small_shards()

    def _warn_small_shards(self):
        """Once per loader: an epoch of far more batches than len() says, as
        shards smaller than batch_size give (a batch never spans two shards)."""
        owner = self._owner()
        batch_size = self._shape[0]
        if owner is None or batch_size is None or owner.__dict__.get("_small_shards_told"):
            return
        try:
            said = _shards.approximate_len(self._dataset, *self._shape)
        except TypeError:  # a dataset without len(): nothing said to compare with
            return
        if self.handed > 2 * said + 1:
            owner._small_shards_told = True
            warnings.warn(
                f"stoker.DataLoader: this epoch gave {self.handed} batches where len(loader) says "
                f"{said}: the dataset's shards are small beside batch_size={batch_size}, and a "
                "batch never spans two shards (each shard's last batch is short). Fewer, larger "
                "shards, or a smaller batch_size, give full batches.", stacklevel=3)

    def _open(self, batches):
        """A shard's batches, less those a resumed checkpoint had taken."""
        item, taken = self._got_item, 0
        if self._skip and self._skip[0] == item:
            taken, self._skip = self._skip[1], 0
        self._item, self._taken = item, taken
        self._pending.extend(batches[taken:])

    def open_item(self):
        """(engine item, batches handed out) of the shard whose batches are
        being handed out, or None between shards."""
        return (self._item, self._taken) if self._pending else (self._skip or None)

    def _early_part(self):
        """While the engine has no item ready: (the next batch, its number in
        its shard) of the shard it delivers next, once that shard's worker
        has made it (_part; a batch may be None, as a collate_fn's); None
        once an item (or the epoch's end) is ready. Its wait is the
        engine's, so the tuner counts it as the consumer's."""
        engine = self._engine
        deadline = None if self._timeout <= 0 else time.monotonic() + self._timeout
        wait = 0.0
        while not engine.wait_ready(wait):
            wait = _PART_POLL_S
            item = self._head_item()
            taken = self._skip[1] if self._skip and self._skip[0] == item else 0
            batch = None if item is None else self._part(item, taken)
            if batch is not None:
                self._skip = (item, taken + 1)
                return batch[0], taken
            if deadline is not None and time.monotonic() >= deadline:
                raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds")
        return None

    def _part(self, item, taken):
        """Batch `taken` of shard `item` as (batch,) if its worker made it: a
        thread's as it is, a process's (PART) viewed in the segment it is
        still writing."""
        if self._parts is not None and (made := self._parts.take((self.epoch, item), taken)):
            return made
        workers = self._workers
        descriptor = None if workers is None else workers.part(self.epoch, item, taken)
        if descriptor is None:
            return None
        try:  # held: its segment stays out of the pool while the batch lives
            view = workers.view_part(descriptor)
        except ValueError:  # the shard failed meanwhile: its segment went back
            return None
        return (_workers.read_batch(view, int(descriptor[_PROCESS.meta_offset]),
                                    int(descriptor[_PROCESS.meta_length])),)

    def _head_item(self):
        """The engine item delivered next (in order: the first not delivered),
        or None once the engine's epoch moved on."""
        if self._head is None or self._head[0] != self.position:
            state = self._engine.state()
            item = state["position"] if state["epoch"] == self.epoch else None
            self._head = (self.position, item)
        return self._head[1]

    def _hand(self, batch, number):
        """A shard's batch `number`, taken: one whose collate_fn raised (a
        FailedBatch, counted as taken all the same) raises its error here."""
        if type(batch) is _shards.FailedBatch:
            name = self.run.options.shards.names[batch.position]
            error = _errors.failed_batch_error(
                f"epoch {self.epoch}: shard {name!r}: batch {number} of the shard: "
                f"{batch.reason}", batch)
            error.shard, error.key = name, _shards.key_of(name)
            raise error
        return self._finish(batch)

    def _finish(self, payload):
        self.handed += 1
        if self._sharded:
            self._warn_past_len()
        if self._pin:
            torch = _torch()
            if torch.cuda.is_available():
                from torch.utils.data._utils.pin_memory import pin_memory
                payload = pin_memory(payload, self.run.options.pin_memory_device or None)
        return payload

    def _warn_past_len(self):
        """As torch's iterator over an IterableDataset once len(loader) was
        asked: a warning at each batch past the dataset's len()."""
        owner = self._owner()
        told = None if owner is None else owner._IterableDataset_len_called
        if told is not None and self.handed > told:
            warnings.warn(
                f"Length of IterableDataset {self._dataset} was reported to be {told} "
                f"(when accessing len(dataloader)), but {self.handed} samples have been fetched. "
                + ("For multiprocessing data-loading, this could be caused by not properly "
                   "configuring the IterableDataset replica at each worker."
                   if self.run.options.workers != 0 else ""))

    def _produce(self):
        engine = self._engine
        if self._cluster is not None:
            self._cluster.refresh()  # the slots it offers, for the tuner
        if self._timeout > 0 and not engine.wait_ready(self._timeout):
            raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds")
        try:
            got = engine.next()  # raises the failures of the next batch, once
        except (_stoker.DataError, RuntimeError) as e:
            if isinstance(e, _stoker.DataError) and engine.epoch != self.epoch:
                # It ended the epoch (every sample skipped: "delivered
                # nothing"); the call after it ends the loop, as torch's would.
                self._reached_end()
            if not isinstance(e, _stoker.DataError) and (
                    type(e) is not RuntimeError or getattr(e, "_sample", None) is None):
                raise  # a ResourceError, a Cancelled, or a RuntimeError of no worker's exception
            # As the sample's own type (an OSError for a file stoker decoded).
            error = _errors.native_sample_error(e) if self._native is not None else \
                _errors.sample_error(e, (self._threads, self._remote))
            if error is None:
                raise
            if self._sharded:  # its index is the shard's position in the rank's list
                _shards.name_failure(error, self.run.options.shards.names)
                if not self.done:
                    # The batches the shard made before it failed come first, as
                    # they are read (torch's order), whether or not some were
                    # taken early: the engine delivers them next.
                    self._failed = error
                    payload = self._produce()
                    if payload is _END:  # none: the error now, the end after it
                        self._failed = None
                        self._reached_end()
                        raise error
                    return payload
            raise error  # chained to the sample's exception, its __cause__
        if got is None:
            return _END
        descriptor = got[0][0]
        if self._sharded:
            self._got_item = int(got[1][0])  # a kind's label is its item
        self.position += 1
        if self._draws is not None:
            self._draws.follow(self.position)
        if self.position == 1:
            self.run.plan.give_ahead(self.epoch + 1)  # the workers may start on it early
        if self._native is not None:
            return _native.read_batch(descriptor, self._native)
        magic = int(descriptor[_THREAD.magic])
        threads = magic == _PROTOCOL.THREAD_MAGIC
        if magic == _PROTOCOL.REMOTE_MAGIC:
            if self._sharded:  # a shard a local worker handed over was read again remotely
                key = (self.epoch, self._got_item)
                if self._parts is not None:
                    self._parts.end(key)
                if self._workers is not None:
                    self._workers.forgo(*key)
            payload, _ = self._remote.take(descriptor)
            return payload
        if threads:
            payload, _ = self._threads.take(descriptor)
            if isinstance(payload, _Raised):
                raise payload.error
        else:
            payload = _workers.read_batch(self._workers.view(descriptor),
                                          int(descriptor[_PROCESS.meta_offset]),
                                          int(descriptor[_PROCESS.meta_length]))
        if self._trial is not None:
            now = time.perf_counter()
            self._trial.observe("threads" if threads else "processes", now - self._last, now)
            self._last = now
        return payload
