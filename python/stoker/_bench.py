"""stoker.bench: `stoker bench` for your own PyTorch dataset. Sweeps
torch.utils.data.DataLoader (or stoker.DataLoader) over num_workers, prints
samples/s per count in `stoker bench`'s table, and ends with the line to
paste for the loader it measured, in the advisor's words (LoaderArgs)."""

import contextlib
import os
import time
import warnings

from . import _args, _stats, _stoker


_EPOCH_END = object()


def _cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover -- not Linux
        return os.cpu_count() or 1


def _planned_sizes(loader):
    """The samples in each batch of an epoch, (full batches, batch size,
    the last's size), where the loader's plan says them: a map-style
    dataset batched by torch's BatchSampler over a sampler with a len().
    Else None (a stream, a batch_sampler of the user's, a stoker loader that
    skips bad samples: its batches hold fewer)."""
    import torch.utils.data as data
    batcher = getattr(loader, "batch_sampler", None)
    if type(batcher) is not data.BatchSampler or isinstance(
            getattr(loader, "dataset", None), data.IterableDataset):
        return None
    if getattr(getattr(loader, "_options", None), "on_error", None) == "skip":
        return None
    try:
        n = len(batcher.sampler)
    except TypeError:
        return None
    size = batcher.batch_size
    return n // size, size, 0 if batcher.drop_last else n % size


def _batch_samples(batch, batch_size):
    """Samples in a batch whatever the collate_fn made, where the plan does
    not say: a list or tuple of batch_size, or of samples that are tuples,
    lists or dicts (a collate_fn that keeps the samples, as detection's
    does), else the length of a tensor or array, or of the first field of a
    tuple, list or dict; else batch_size."""
    if isinstance(batch, (tuple, list)) and (
            len(batch) == batch_size or (batch and isinstance(batch[0], (tuple, list, dict)))):
        return len(batch)
    first = batch
    if isinstance(first, dict) and first:
        first = next(iter(first.values()))
    elif isinstance(first, (tuple, list)) and first:
        first = first[0]
    shape = getattr(first, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    if isinstance(first, (list, tuple)):
        return len(first)
    return batch_size


def _measure(loader, batch_size, batches, seconds, step_s, warm_batches=1):
    """Takes `warm_batches` batches unmeasured (worker start and the first
    round: each worker's first batch was begun at the start, so counting
    those after the first would credit the measurement with work done
    before it), then batches until `batches`, or until `seconds` have passed
    and the batches taken are whole rounds of `warm_batches` (workers that
    each make a batch deliver them in bursts: a window that closed at the
    first batch after `seconds` counted one batch of each round, so that a
    store slower than `seconds` a batch read alike at every count), starting
    new epochs as needed. Returns (samples, batches, seconds, seconds waited
    in next())."""
    planned = _planned_sizes(loader)
    it = iter(loader)
    try:
        next(it)
    except StopIteration:
        raise ValueError("stoker.bench: the DataLoader gave no batch (an empty dataset, or "
                         "drop_last with fewer samples than batch_size)") from None
    at = 1  # the batch's place in its epoch
    for _ in range(warm_batches - 1):
        try:
            next(it)
            at += 1
        except StopIteration:
            it, at = iter(loader), 0
    samples = taken = 0
    waited = 0.0
    start = time.perf_counter()
    elapsed = 0.0
    while (batches is None or taken < batches) and (elapsed < seconds or taken % warm_batches):
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            it, at = iter(loader), 0  # the next epoch; its first fill counts as waiting
            batch = _EPOCH_END
        waited += time.perf_counter() - t0
        if batch is not _EPOCH_END:
            if planned is None:
                samples += _batch_samples(batch, batch_size)
            else:
                full, size, last = planned
                samples += size if at < full else last
            at += 1
            taken += 1
            if step_s > 0:
                time.sleep(step_s)
        elapsed = time.perf_counter() - start
    del it
    return samples, taken, elapsed, waited


def _make_loader(kind, dataset, batch_size, collate_fn, workers, prefetch_factor, options):
    kwargs = dict(options, num_workers=workers)
    # Shuffled as in training, unless a sampler of the user's says the order.
    if "batch_sampler" not in kwargs:
        kwargs["batch_size"] = batch_size
        import torch.utils.data
        if "sampler" not in kwargs and not isinstance(dataset, torch.utils.data.IterableDataset):
            kwargs.setdefault("shuffle", True)  # a stream has its own order
    if collate_fn is not None:
        kwargs["collate_fn"] = collate_fn
    if kind == "stoker":
        from ._dataloader import DataLoader
        return DataLoader(dataset, **kwargs)
    import torch.utils.data
    if workers > 0:
        kwargs.setdefault("prefetch_factor", prefetch_factor)
        kwargs.setdefault("persistent_workers", True)  # a new epoch does not fork again
    return torch.utils.data.DataLoader(dataset, **kwargs)


def _counts(num_workers):
    """The worker counts to sweep: ``num_workers`` (one or a list), by
    default 0 to twice the CPUs this process may use."""
    if num_workers is None:
        num_workers = list(range(0, 2 * _cores() + 1))
    elif not isinstance(num_workers, (str, bytes)) and not hasattr(num_workers, "__iter__"):
        num_workers = [num_workers]
    counts = _args.integers("num_workers", num_workers, 0, _stoker.MAX_WORKERS)
    try:
        _stoker.check_sweep_counts(counts)
    except ValueError as e:
        raise ValueError(f"num_workers: {e}") from None
    return counts


def _size(dataset):
    """' (N samples)' for a dataset with a length, else ''."""
    try:
        return f" ({len(dataset)} samples)"
    except TypeError:
        return ""


def _check_writable(plot):
    """Fails before the sweep, as `stoker bench --plot` does (one rule, the
    engine's). True when this made the file (removed again if the sweep fails)."""
    return _stoker.check_replaceable(os.fspath(plot), "stoker.bench: cannot write plot")


def _point(loader, workers, batch_size, batches, seconds, step_s):
    """One row of the sweep: `loader` (with `workers` workers) measured."""
    with warnings.catch_warnings():
        # The sweep passes the CPU count on purpose: torch's warning that it
        # does would repeat at every such count.
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        samples, taken, elapsed, waited = _measure(loader, batch_size, batches, seconds, step_s,
                                                   max(1, workers))
    # stoker.DataLoader with on_error="skip": the rate counts what was delivered.
    skipped = (getattr(loader, "stats", lambda: {})() or {}).get("samples_skipped") or 0
    return {"num_workers": workers, **_stats.rates(samples, waited, elapsed),
            "samples": samples, "batches": taken, "seconds": elapsed, "skipped": skipped,
            "best": False}


def bench(dataset, batch_size=64, collate_fn=None, num_workers=None, batches=None, seconds=2.0,
          *, kind="torch", step_ms=0.0, prefetch_factor=2, plot=None, gpus=None, quiet=False,
          **loader_options):
    """Measures samples/s of a DataLoader over ``dataset`` for each count in
    ``num_workers`` (default 0, 1, ... 2 x the CPUs this process may use),
    prints the table `stoker bench` prints, marks the best by its rule (the
    fewest workers within 3 % of the highest samples/s), and ends with the
    line to paste for the loader it measured and no other (kind="torch":
    ``DataLoader(num_workers=..., prefetch_factor=..., ...)``, kind="stoker":
    ``stoker.DataLoader(num_workers=..., ...)``), naming the loader and the
    data measured, and the rule behind each argument.

    Each count gets a fresh loader; its first round of batches (one per
    worker: start-up, first fill) is not measured, then it runs for ``seconds`` or ``batches``
    batches, whichever comes first, a step of ``step_ms`` after each batch
    (a stand-in for the training step; 0: as fast as batches come). Stall is
    the share of that time spent waiting in next().

    ``kind``: "torch" measures torch.utils.data.DataLoader (workers kept
    between epochs, ``prefetch_factor`` batches each), "stoker" measures
    stoker.DataLoader with the same fixed counts. Other keyword arguments
    (``shuffle``, ``pin_memory``, ``drop_last``, ...) go to the loader.
    ``plot``: write the sweep's SVG (`stoker bench --plot`'s left panel)
    there. ``gpus``: the device count for pin_memory's rule (default: NVML's).

    Returns a dict: "loader" (the loader measured:
    "torch.utils.data.DataLoader" or "stoker.DataLoader"), "data" (the
    dataset measured, as the text names it: its type and length), "points"
    (one per count: num_workers, samples_per_s, stall_fraction, samples,
    batches, seconds, skipped (stoker.DataLoader's on_error="skip"), best),
    "skipped" (their sum, also said after the table), "best" (the recommended point), "dataloader" (the answer for the loader measured: "loader" (its
    name), "measured" (True), "basis" (the data measured), num_workers,
    prefetch_factor and persistent_workers (torch's; None for
    stoker.DataLoader), pin_memory, "line", "rules", "note", "text" (as
    printed)), "table" (the printed table) and "plot" (the path written, or
    None).
    """
    if kind not in ("torch", "stoker"):
        raise ValueError(f"kind must be 'torch' or 'stoker', got {kind!r}")
    from ._sources import Source
    if isinstance(dataset, Source):  # torch's loader would say "not subscriptable"
        raise TypeError(f"stoker.bench measures a torch Dataset through a DataLoader, got a "
                        f"stoker source ({type(dataset).__name__}); its sweep is "
                        "`stoker bench --data PATH` (stoker's own pipeline)")
    batch_size = _args.integer("batch_size", batch_size, 1, _args.INT64[1])
    counts = _counts(num_workers)
    batches = _args.optional_integer("batches", batches, 1, _args.INT64[1])
    seconds = _args.real("seconds", seconds, above=0)
    step_s = _args.real("step_ms", step_ms, at_least=0) / 1000
    prefetch_factor = _args.integer("prefetch_factor", prefetch_factor, 1, _args.INT32[1])
    try:
        empty = len(dataset) == 0  # torch's sampler would say num_samples=0
    except TypeError:
        empty = False
    if empty:
        raise ValueError(f"stoker.bench: the dataset ({type(dataset).__name__}) is empty")
    plot = _args.optional_path("plot", plot)
    made_plot = plot is not None and _check_writable(plot)
    try:
        return _sweep(dataset, batch_size, collate_fn, counts, batches, seconds, step_ms, step_s,
                      kind, prefetch_factor, plot, gpus, quiet, loader_options)
    except BaseException:
        if made_plot:  # a failed sweep leaves no empty plot
            with contextlib.suppress(OSError):
                if os.path.getsize(plot) == 0:
                    os.unlink(plot)
        raise


def _sweep(dataset, batch_size, collate_fn, counts, batches, seconds, step_ms, step_s, kind,
           prefetch_factor, plot, gpus, quiet, loader_options):
    """bench() once its arguments are checked."""
    if gpus is None:
        gpus = len(_stoker.probe(None, True).get("gpus") or [])
    gpus = _args.integer("gpus", gpus, 0, _args.INT32[1])

    what = "torch.utils.data.DataLoader" if kind == "torch" else "stoker.DataLoader"
    data = f"{type(dataset).__name__}{_size(dataset)}"
    say = (lambda line: None) if quiet else (lambda line: print(line, flush=True))
    say(f"stoker.bench: {what} over {data}, batch {batch_size}"
        + (f", step {step_ms} ms" if step_s > 0 else ""))
    points = []
    for workers in counts:
        say(f"  measuring num_workers={workers} ...")
        with warnings.catch_warnings():
            # The sweep passes the CPU count on purpose (torch warns as it is made).
            warnings.filterwarnings("ignore", message="This DataLoader will create")
            loader = _make_loader(kind, dataset, batch_size, collate_fn, workers,
                                  prefetch_factor, loader_options)
        try:
            points.append(_point(loader, workers, batch_size, batches, seconds, step_s))
        finally:
            # Its processes end now, not beside the next count's (torch's
            # loader has no close(): its iterator, gone, ended them).
            getattr(loader, "close", lambda: None)()
            del loader
    rows = [(p["num_workers"], p["samples_per_s"], p["stall_fraction"]) for p in points]
    # `stoker bench`'s rule, not one of our own: the fewest workers within
    # noise of the fastest.
    recommended = _stoker.recommended_workers(rows)
    best = next(p for p in points if p["num_workers"] == recommended)
    best["best"] = True
    table = _stoker.sweep_table(rows, best["num_workers"])
    # What the best count ran with: torch keeps prefetch_factor batches per
    # worker in flight, stoker.DataLoader its default depth (each of its
    # engine's items a whole batch).
    if kind == "torch":
        in_flight = best["num_workers"] * prefetch_factor
    else:
        from ._dataloader import _ENGINE_BATCH
        in_flight = _stoker.default_prefetch(best["num_workers"], _ENGINE_BATCH)
    args = _stoker.loader_args_from_sweep(
        kind, data, batch_size, best["num_workers"], best["samples_per_s"],
        best["stall_fraction"], in_flight, gpus)
    if plot is not None:
        _stoker.write_sweep_svg(rows, best["num_workers"],
                                f"stoker.bench: {what}, {type(dataset).__name__}", plot)
    say("\n" + table.rstrip("\n"))
    skipped = sum(p["skipped"] for p in points)
    if skipped:
        say(f"skipped {skipped} samples (on_error='skip'): the rates count the samples "
            "delivered, not those skipped")
    if plot is not None:
        say(f"plot written to {plot}")
    say("\n" + args["text"].rstrip("\n"))
    return {"loader": what, "data": data, "points": points, "best": best, "dataloader": args,
            "table": table, "plot": plot, "skipped": skipped}
