"""The figures that stats() shows, defined once for stoker.Loader,
stoker.DataLoader, stoker.bench and worker_kind="auto"'s trial."""

import time
import warnings
import weakref

from . import _stoker


def flush_trace(engine, path):
    """At close: the tuner's decisions written to `path` (trace_path), or a
    RuntimeWarning naming it and why when they could not all be (a full
    disk): a record lost is said, never silent, and never fails the close."""
    try:
        engine.flush_trace()
    except (OSError, RuntimeError) as e:
        warnings.warn(f"stoker: the tuner's trace {path} is incomplete: {e}", RuntimeWarning,
                      stacklevel=3)


def rates(samples, wait_s, elapsed_s):
    """{"samples_per_s", "stall_fraction"} of a stretch of `elapsed_s` seconds
    in which the consumer took `samples` and waited `wait_s` for them."""
    return {"samples_per_s": samples / elapsed_s if elapsed_s > 0 else 0.0,
            "stall_fraction": _stoker.stall_fraction(wait_s, elapsed_s)}


def consumer_seconds(counters):
    """(waited, elapsed): the consumer's seconds inside next() and in all,
    from the engine's metrics (since its first next()) or their "recent"
    part (over its last seconds)."""
    wait = counters["consumer_wait_ns"] / 1e9
    return wait, wait + counters["consumer_step_ns"] / 1e9


def consumer_rates(metrics, samples):
    """The consumer's figures from the engine's metrics, `samples` naming the
    counter of the user's samples:

    "samples_per_s" and "stall_fraction": recent, over the consumer's last
    RECENT_WINDOW_S (5) seconds up to its latest next() (the engine's
    metrics["recent"]); "window_s": the seconds those span (less for a
    younger loader, more when next() calls are further apart);
    "samples_per_s_since_start" and "stall_fraction_since_start": averaged
    since its first next()."""
    recent = metrics["recent"]
    wait, elapsed = consumer_seconds(recent)
    since = rates(metrics[samples], *consumer_seconds(metrics))
    return {**rates(recent[samples], wait, elapsed), "window_s": elapsed,
            "samples_per_s_since_start": since["samples_per_s"],
            "stall_fraction_since_start": since["stall_fraction"]}


def gpu(pcie):
    """{"gpu": every GPU's use (NVML; with `pcie` its PCIe throughput too),
    "gpu_note": ""}, or {"gpu": None, "gpu_note": why there is none}."""
    usage = _stoker.gpu_usage(pcie=bool(pcie))
    if isinstance(usage, str):
        return {"gpu": None, "gpu_note": usage}
    return {"gpu": usage, "gpu_note": ""}


# Worker growth past both of these (per worker) gets the copy-on-read advice:
# enough to matter, and a fair part of what a worker could copy (the
# zygote's anonymous memory, which holds the dataset). A worker reading a
# list of small dicts by key copies about 40 % of the list's heap (the dicts'
# pages, not their values'); 10 % leaves room for the rest of the heap.
ADVICE_GROWTH_BYTES = 64 << 20
ADVICE_GROWTH_FRACTION = 0.10

_growth = weakref.WeakKeyDictionary()  # a DataLoader's _Run -> its _Growth


class _Growth:
    """What worker_growth keeps between stats() calls for one set of worker
    processes: their items done when it was first seen, then the memory they
    held once each had reported it (their second item)."""

    __slots__ = ("pids", "items_seen", "base", "since", "inherited")

    def __init__(self, pids, items):
        self.pids = pids
        self.items_seen = items
        self.base = None
        self.since = 0.0
        self.inherited = None


def worker_growth(run, metrics, segment_bytes):
    """{"worker_growth_bytes", "advice"} of a DataLoader's worker processes:
    how much their unique memory grew since stats() first saw them measured,
    and past ADVICE_GROWTH_* per worker, the copy-on-read advice ("" else).

    Reads the engine's figures only: metrics' worker_bytes (each measured
    worker's unique memory plus its share of the `segment_bytes`) and its
    items done per worker; the zygote's size once, when growth passes 64 MiB.
    A worker reports its memory from its second item on, so the baseline is
    taken once every worker has made two items since the processes were
    last seen to change (a fork, a replacement, a resize)."""
    if run.workers is None or run.kind() != "processes":
        return {"worker_growth_bytes": 0, "advice": ""}
    pids = frozenset(run.workers.pids())
    items = {w["id"]: w["samples"] for w in metrics["workers"]}
    g = _growth.get(run)
    if g is None or g.pids != pids:
        g = _growth[run] = _Growth(pids, items)
    share = segment_bytes // max(1, len(pids))
    unique = max(0, metrics["worker_bytes"] - len(items) * share)
    if g.base is None:
        if not pids or any(done < g.items_seen.get(i, 0) + 2 for i, done in items.items()):
            return {"worker_growth_bytes": 0, "advice": ""}
        g.base, g.since = unique, time.monotonic()
    grown = max(0, unique - g.base)
    return {"worker_growth_bytes": grown, "advice": _growth_advice(g, run, grown)}


def _growth_advice(g, run, grown):
    per_worker = grown // max(1, len(g.pids))
    if per_worker < ADVICE_GROWTH_BYTES:
        return ""
    if g.inherited is None:
        g.inherited = _resident_anonymous_bytes(run.zygote_pid)
    if per_worker < ADVICE_GROWTH_FRACTION * g.inherited:
        return ""
    return (f"workers' memory grew by {grown >> 20} MiB in {time.monotonic() - g.since:.0f} s "
            f"({per_worker >> 20} MiB per worker): a dataset holding many Python objects is "
            "copied page by page as workers touch them (copy-on-read); wrap such lists in "
            "stoker.SharedList (docs/dataloader.md#copy-on-read)")


def _resident_anonymous_bytes(pid):
    """RssAnon of process `pid` (its heap: what a process forked from it may
    copy), 0 where unknown."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
