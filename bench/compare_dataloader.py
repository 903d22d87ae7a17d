#!/usr/bin/env python3
"""stoker.DataLoader vs torch.utils.data.DataLoader on the same Python Dataset.

stoker.DataLoader is a drop-in for torch's DataLoader that runs any map-style
Dataset on worker processes whose number it tunes while the loop runs. Both
loaders get the same Dataset class here, and one run prints, side by side and
as ratios:

A. Throughput. torchvision's ImageFolder over the built-in data set with
   RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize (PIL
   decode in the workers), batch 64, shuffle=True, a loop that only takes the
   batches. torch runs at every num_workers in 0..2*CPUs and its best is the
   reference; stoker runs with num_workers="auto". Per configuration:
   samples/s from making the loader to its last batch (what an epoch costs;
   the reference and the ratios use it), samples/s from the first batch on
   (start-up left out, as bench/compare_python.py does, but flattered by the
   batches prefetched during start-up, the more the more workers), CPU time
   per sample, the time from making the loader to its first batch, and the
   time until the rate over the last second first reaches 95 % of torch's
   best rate ("never" in runs too short to hold a second of it). For stoker:
   its rate / torch's best, and the workers it ended at. --epochs N weighs
   start-up less.
B. Stall under a training step. The same pipeline, but the loop sleeps 200 ms
   per batch, for 40 batches, all in one epoch (the folder repeats when it
   holds fewer). Stall = time waiting in next() / total time, the first
   batch (worker start-up) left out. Per configuration, with the workers
   stoker used; "workers needed" is the smallest torch num_workers whose
   stall is under 1 %.
C. Per-batch overhead and start-up. A Dataset returning torch.tensor(index),
   20000 samples, batch 64, num_workers 1 and 2 on both loaders: batches/s
   from the first batch on, and stoker/torch. Start-up, the median of 3 fresh
   loaders: from iter() to the first batch, and from making the loader to the
   first batch (stoker may start its worker processes when it is made).
D. Memory during A: peak PSS (and RSS) of the whole process tree -- the child
   and its workers -- for torch at its best num_workers and stoker auto, and
   how much each grew above the interpreter with torch imported.

Each configuration runs in a fresh child process watched by
bench/proc_memory.py, so that its memory is its own. On a busy machine
throughput follows whatever CPU the others leave: read the ratios of one run.

Usage: /usr/bin/python3 bench/compare_dataloader.py [--data DIR] [--epochs 1]
       [--torch-workers 0,1,2,3,4] [--sections A,B,C,D] [--limit N]
       [--step-batches 40] [--threads] [--json]
A quick look (about a minute on 2 idle cores):
       --limit 256 --torch-workers 0,2 --step-batches 8
Default data: the built-in data set (stoker.default_dataset(), made on first
use); stoker must then be importable (build/release/python on the path).
Without stoker.DataLoader its rows say "stoker.DataLoader not available".
"""

import argparse
import json
import os
import statistics
import sys
import time
import warnings

import torch

from proc_memory import run_measured

BATCH = 64
SIZE = 224
STEP_S = 0.2  # B's training step
STALL_OK = 0.01  # B: "keeps up" means a stall under 1 %
WINDOW_S = 1.0  # A: the sliding window of the time-to-95 % rate
TARGET = 0.95  # A: share of torch's best rate that counts as "reached"
TRIVIAL_SAMPLES = 20000  # C
OVERHEAD_WORKERS = (1, 2)  # C
STARTUP_REPEATS = 3  # C
STATS_EVERY_S = 0.25  # how often the loop asks stoker for its worker count
NOT_AVAILABLE = "stoker.DataLoader not available"


# --- the child: one configuration --------------------------------------------


class IndexDataset(torch.utils.data.Dataset):
    """C's trivial samples: the loader's own cost per batch is all there is."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        return torch.tensor(index)


def image_dataset(data, limit):
    import torchvision
    import torchvision.transforms as T

    tf = T.Compose([T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    dataset = torchvision.datasets.ImageFolder(data, transform=tf)
    if limit and limit < len(dataset):
        # Spread over the whole folder, so that every class keeps its share.
        spread = [i * len(dataset) // limit for i in range(limit)]
        dataset = torch.utils.data.Subset(dataset, spread)
    return dataset


def make_loader(kind, dataset, workers, shuffle):
    g = torch.Generator()
    g.manual_seed(0)
    if kind == "torch":
        # Persistent workers: what a user who tuned torch for several epochs would set.
        return torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=shuffle,
                                           num_workers=workers, generator=g,
                                           persistent_workers=workers > 0)
    import stoker

    # "stoker-threads": the same loader on thread workers (worker_kind="threads").
    # native=False: this bench measures the Python path (PIL in the workers);
    # bench/compare_native.py measures the native one on the same pipeline.
    return stoker.DataLoader(dataset, batch_size=BATCH, shuffle=shuffle, num_workers=workers,
                             generator=g, native=False,
                             worker_kind="threads" if kind == "stoker-threads" else "processes")


def close_loader(loader):
    # stoker stops its workers in close(). torch has none: its workers are
    # joined (and so reaped, their CPU time then counts) when the caller drops
    # the last reference to the loader and its iterator.
    if hasattr(loader, "close"):
        loader.close()


def _batch_len(batch):
    # (images, labels) from ImageFolder; one tensor from IndexDataset.
    return len(batch[-1]) if isinstance(batch, (list, tuple)) else len(batch)


def timed_loop(loader, made, epochs, max_batches=None, step_s=0.0, on_batch=None):
    """Runs the training loop: `epochs` epochs, or fewer when `max_batches`
    batches come first, sleeping `step_s` after each batch. Returns per-batch arrival
    times (seconds since `made`), waits in next() and sizes, the end, and the
    worker counts stoker reported along the way as [seconds, workers].
    `on_batch(batch, seconds since made)` sees each batch as it comes."""
    arrived, waited, sizes, workers_trace = [], [], [], []
    polled = -STATS_EVERY_S
    for _ in range(epochs):
        it = iter(loader)
        while max_batches is None or len(sizes) < max_batches:
            asked = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            got = time.perf_counter()
            arrived.append(got - made)
            waited.append(got - asked)
            sizes.append(_batch_len(batch))
            if on_batch:
                on_batch(batch, got - made)
            del batch  # let its memory go back before the step, as a training loop would
            if hasattr(loader, "stats") and got - made - polled >= STATS_EVERY_S:
                polled = got - made
                workers = loader.stats()["workers"]
                if not workers_trace or workers_trace[-1][1] != workers:
                    workers_trace.append([round(polled, 3), workers])
            if step_s:
                time.sleep(step_s)
        del it
    return {"arrived": arrived, "waited": waited, "sizes": sizes,
            "end_s": time.perf_counter() - made, "workers_trace": workers_trace}


def _stoker_report(loader):
    if not hasattr(loader, "stats"):
        return {}
    stats = loader.stats()
    # The whole run's figures, as the loop measured its own (stats()'s plain
    # samples_per_s and stall_fraction cover its last 5 s only).
    report = {"stats": {k: stats.get(k) for k in ("workers", "stall_fraction_since_start",
                                                  "samples_per_s_since_start")}}
    trace = getattr(loader, "tuner_trace", None)
    if trace:
        report["decisions"] = [{k: d.get(k) for k in ("t_s", "workers_before", "workers_after",
                                                      "reason")} for d in trace()]
    return report


def measure_images(kind, workers, dataset, epochs, max_batches=None, step_s=0.0):
    made = time.perf_counter()
    loader = make_loader(kind, dataset, workers, shuffle=True)
    result = timed_loop(loader, made, epochs, max_batches, step_s)
    result.update(_stoker_report(loader))
    close_loader(loader)
    return result


def measure_overhead(kind, workers, samples):
    dataset = IndexDataset(samples)
    from_iter, from_made = [], []
    for _ in range(STARTUP_REPEATS):
        made = time.perf_counter()
        loader = make_loader(kind, dataset, workers, shuffle=False)
        begun = time.perf_counter()
        it = iter(loader)
        next(it)
        got = time.perf_counter()
        from_iter.append(got - begun)
        from_made.append(got - made)
        del it
        close_loader(loader)
        del loader  # torch: its workers go now, not while the next loader starts
    made = time.perf_counter()
    loader = make_loader(kind, dataset, workers, shuffle=False)
    result = timed_loop(loader, made, epochs=1)
    close_loader(loader)
    result.update(startup_iter_s=statistics.median(from_iter),
                  startup_made_s=statistics.median(from_made))
    return result


def run_child(section, kind, workers, a):
    # DataLoader warns when num_workers passes its suggestion; the sweep does that on purpose.
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    torch.set_num_threads(1)  # the loop does no math; keep intra-op threads out
    print(json.dumps({"event": "base", "cpu_s": sum(os.times()[:2])}), flush=True)
    if section == "C":
        samples = min(a.limit, TRIVIAL_SAMPLES) if a.limit else TRIVIAL_SAMPLES
        result = measure_overhead(kind, workers, samples)
    else:
        dataset = image_dataset(a.data, a.limit)
        if section == "A":
            result = measure_images(kind, workers, dataset, epochs=a.epochs)
        else:
            # Each epoch starts like a fresh loader (torch refills its prefetch
            # only then), and B leaves start-up out: the folder repeats as often
            # as B's batches need, so that they all fall in one epoch.
            repeats = -(-a.step_batches * BATCH // len(dataset))
            repeated = torch.utils.data.ConcatDataset([dataset] * repeats)
            result = measure_images(kind, workers, repeated, epochs=1,
                                    max_batches=a.step_batches, step_s=STEP_S)
        result["epoch_samples"] = len(dataset)
    result["event"] = "done"
    print(json.dumps(result), flush=True)


# --- the parent: runs the children and compares ------------------------------


def stoker_dataloader_missing():
    """None when stoker.DataLoader can be used, else why not."""
    try:
        import stoker
    except ImportError as e:
        return f"stoker does not import: {e}"
    return None if hasattr(stoker, "DataLoader") else "this stoker has no DataLoader yet"


def run_config(section, kind, workers, a, missing):
    row = {"section": section, "kind": kind, "workers": workers}
    if kind.startswith("stoker") and missing:
        row["error"] = NOT_AVAILABLE
        return row
    print(f"running {section}: {kind} num_workers={workers}", file=sys.stderr, flush=True)
    run = run_measured([sys.executable, os.path.abspath(__file__), "--child", section, kind,
                        str(workers), "--data", a.data, "--epochs", str(a.epochs),
                        "--limit", str(a.limit or 0), "--step-batches", str(a.step_batches)])
    done = next((e for e in run["events"] if e["event"] == "done"), None)
    if run["returncode"] != 0 or done is None or not done["sizes"]:
        row["error"] = f"failed (exit {run['returncode']}; its error is above, on stderr)"
        return row
    row.update(done)
    for key in ("peak_rss", "peak_pss", "base_rss", "base_pss"):
        row[key] = run[key]
    row["cpu_ms_per_sample"] = 1e3 * run["cpu_s"] / sum(done["sizes"])
    return row


def run_rate(row):
    """Samples per second from making the loader to its last batch."""
    return sum(row["sizes"]) / row["arrived"][-1]


def rate_after_first(row, unit_samples=True):
    """Samples (or batches) per second from the first batch on: start-up left
    out, but not the work done during it -- the workers also fill their
    prefetch then, and the burst of ready batches after the first flatters
    the loaders with more workers, the more so the shorter the run."""
    span = row["arrived"][-1] - row["arrived"][0]
    if span <= 0:
        return float("nan")
    done = sum(row["sizes"][1:]) if unit_samples else len(row["sizes"]) - 1
    return done / span


def time_to_rate(row, rate):
    """The first batch arrival (seconds since the loader was made) at which the
    batches that arrived within the last WINDOW_S carry `rate` samples/s;
    None if it never does."""
    arrived, sizes = row["arrived"], row["sizes"]
    first, in_window = 0, 0
    for i, t in enumerate(arrived):
        in_window += sizes[i]
        while arrived[first] <= t - WINDOW_S:
            in_window -= sizes[first]
            first += 1
        if in_window >= rate * WINDOW_S:
            return t
    return None


def stall(row):
    """Time waiting in next() / total, both from the first batch on."""
    total = row["end_s"] - row["arrived"][0]
    return sum(row["waited"][1:]) / total if total > 0 else float("nan")


def workers_used(row):
    """(at the end, the most) for stoker; the fixed count for torch."""
    if row["kind"] == "torch":
        return row["workers"], row["workers"]
    counts = [w for _, w in row["workers_trace"]]
    final = row.get("stats", {}).get("workers", counts[-1] if counts else None)
    return final, max(counts + [final]) if final is not None else None


def label(row):
    return f"{row['kind']} num_workers={row['workers']}"


def _mib(b):
    return b / 2**20


def _seconds(s):
    return "never" if s is None else f"{s:.2f}"


def summarise_a(rows):
    ok_torch = [r for r in rows if r["kind"] == "torch" and "error" not in r]
    for r in rows:
        if "error" not in r:
            r["samples_per_s"] = run_rate(r)
            r["after_first_per_s"] = rate_after_first(r)
            r["first_batch_s"] = r["arrived"][0]
    best = max(ok_torch, key=lambda r: r["samples_per_s"], default=None)
    for r in rows:
        if "error" not in r and best:
            r["time_to_95_s"] = time_to_rate(r, TARGET * best["samples_per_s"])
    auto = next((r for r in rows if r["kind"] == "stoker"), None)
    summary = {"best_torch_workers": best and best["workers"],
               "best_torch_samples_per_s": best and best["samples_per_s"]}
    if auto and "error" not in auto and best:
        summary.update(auto_vs_best=auto["samples_per_s"] / best["samples_per_s"],
                       auto_time_to_95_s=auto["time_to_95_s"],
                       auto_workers_end=workers_used(auto)[0])
    return best, auto, summary


def print_a(rows, best, auto, cpus, a):
    r0 = next((r for r in rows if "error" not in r), None)
    n = r0["epoch_samples"] if r0 else "?"
    print(f"A. throughput: {n} JPEGs, ImageFolder + RandomResizedCrop({SIZE}) + flip + ToTensor "
          f"+ Normalize, batch {BATCH}, shuffle, {a.epochs} epoch(s), {cpus} CPUs")
    print(f"  {'':<24}{'samples/s':>10}{'after 1st':>11}")
    print(f"  {'loader':<24}{'':>10}{'batch':>11}{'CPU ms/sample':>15}{'1st batch s':>13}"
          f"{'95% of best at s':>18}{'workers at end':>16}")
    for r in rows:
        if "error" in r:
            print(f"  {label(r):<24}{r['error']}")
            continue
        print(f"  {label(r):<24}{r['samples_per_s']:10.1f}{r['after_first_per_s']:11.1f}"
              f"{r['cpu_ms_per_sample']:15.2f}{r['first_batch_s']:13.2f}"
              f"{_seconds(r.get('time_to_95_s')):>18}{workers_used(r)[0]!s:>16}")
    if not best:
        print("  no torch run finished: nothing to compare with")
        return
    print(f"  reference: torch at its best, num_workers={best['workers']}: "
          f"{best['samples_per_s']:.1f} samples/s")
    if auto and "error" not in auto:
        reached = auto["time_to_95_s"]
        print(f"  stoker auto / torch best: {auto['samples_per_s'] / best['samples_per_s']:.2f}x "
              f"the throughput, {auto['cpu_ms_per_sample'] / best['cpu_ms_per_sample']:.2f}x "
              f"the CPU per sample; 95 % of torch's best rate (over {WINDOW_S:.0f} s) "
              f"{'never reached' if reached is None else f'after {reached:.2f} s'}; ended at "
              f"{workers_used(auto)[0]} workers (trace [s, workers]: {auto['workers_trace']})")
    elif auto:
        print(f"  stoker auto / torch best: {auto['error']}")


def summarise_b(rows, best_a):
    for r in rows:
        if "error" not in r:
            r["stall"] = stall(r)
            r["first_wait_s"] = r["waited"][0]
    torch_rows = [r for r in rows if r["kind"] == "torch" and "error" not in r]
    needed = min((r["workers"] for r in torch_rows if r["stall"] < STALL_OK), default=None)
    # Torch's best static count: A's best throughput when A ran, else the least stall here.
    ref = next((r for r in torch_rows if best_a and r["workers"] == best_a["workers"]), None)
    ref_why = "A's best"
    if ref is None:
        ref = min(torch_rows, key=lambda r: (r["stall"], r["workers"]), default=None)
        ref_why = "least stall here"
    auto = next((r for r in rows if r["kind"] == "stoker"), None)
    summary = {"torch_workers_needed": needed, "torch_reference_workers": ref and ref["workers"],
               "torch_reference_stall": ref and ref["stall"]}
    if auto and "error" not in auto:
        final, most = workers_used(auto)
        summary.update(auto_stall=auto["stall"], auto_workers_end=final, auto_workers_max=most)
    return needed, ref, ref_why, auto, summary


def print_b(rows, needed, ref, ref_why, auto, a, torch_workers):
    print(f"\nB. stall under a {STEP_S * 1e3:.0f} ms step, {a.step_batches} batches: time waiting "
          f"in next() / total, first batch left out")
    print(f"  {'loader':<24}{'stall %':>8}{'1st wait s':>12}{'workers (end/max)':>18}"
          f"{'own stall %':>12}")
    for r in rows:
        if "error" in r:
            print(f"  {label(r):<24}{r['error']}")
            continue
        final, most = workers_used(r)
        own = r.get("stats", {}).get("stall_fraction_since_start")
        print(f"  {label(r):<24}{100 * r['stall']:8.2f}{r['first_wait_s']:12.2f}"
              f"{f'{final}/{most}':>18}{'-' if own is None else f'{100 * own:.2f}':>12}")
    swept = ",".join(str(w) for w in torch_workers)
    print(f"  workers needed (smallest torch num_workers with stall < {100 * STALL_OK:.0f} %): "
          f"{needed if needed is not None else f'none of {swept}'}")
    if auto and "error" not in auto and ref:
        final, most = workers_used(auto)
        print(f"  stoker auto: stall {100 * auto['stall']:.2f} % with {final} workers at the end "
              f"({most} at most) vs torch at num_workers={ref['workers']} ({ref_why}): "
              f"{100 * ref['stall']:.2f} %")
    elif auto and "error" in auto:
        print(f"  stoker auto: {auto['error']}")


def summarise_c(rows):
    for r in rows:
        if "error" not in r:
            # Start-up has its own columns; over 20000 samples the burst after it is small.
            r["batches_per_s"] = rate_after_first(r, unit_samples=False)
    pairs = {}
    for w in OVERHEAD_WORKERS:
        t = next((r for r in rows if r["kind"] == "torch" and r["workers"] == w), None)
        s = next((r for r in rows if r["kind"] == "stoker" and r["workers"] == w), None)
        if t and s and "error" not in t and "error" not in s:
            pairs[w] = {"batches_per_s": s["batches_per_s"] / t["batches_per_s"],
                        "startup_iter": s["startup_iter_s"] / t["startup_iter_s"],
                        "startup_made": s["startup_made_s"] / t["startup_made_s"]}
    return {"stoker_over_torch": pairs}


def print_c(rows, summary):
    r0 = next((r for r in rows if "error" not in r), None)
    n = sum(r0["sizes"]) if r0 else "?"
    print(f"\nC. per-batch overhead: {n} samples of torch.tensor(index), batch {BATCH}; "
          f"start-up: median of {STARTUP_REPEATS} fresh loaders")
    print(f"  {'loader':<24}{'batches/s':>10}{'iter->1st ms':>13}{'made->1st ms':>13}")
    for r in rows:
        if "error" in r:
            print(f"  {label(r):<24}{r['error']}")
            continue
        print(f"  {label(r):<24}{r['batches_per_s']:10.1f}{1e3 * r['startup_iter_s']:13.1f}"
              f"{1e3 * r['startup_made_s']:13.1f}")
    for w, ratio in summary["stoker_over_torch"].items():
        print(f"  stoker / torch at num_workers={w}: {ratio['batches_per_s']:.2f}x the batches/s; "
              f"start-up {ratio['startup_iter']:.2f}x (from iter), "
              f"{ratio['startup_made']:.2f}x (from making the loader)")


def summarise_d(best, auto):
    if not best:
        return {}
    summary = {"torch_workers": best["workers"], "torch_peak_pss_mib": _mib(best["peak_pss"]),
               "torch_above_base_mib": _mib(best["peak_pss"] - best["base_pss"])}
    if auto and "error" not in auto:
        summary.update(auto_peak_pss_mib=_mib(auto["peak_pss"]),
                       auto_above_base_mib=_mib(auto["peak_pss"] - auto["base_pss"]),
                       pss_ratio=auto["peak_pss"] / best["peak_pss"],
                       rss_ratio=auto["peak_rss"] / best["peak_rss"])
    return summary


def print_d(best, auto, summary):
    print("\nD. memory during A: peak of the whole process tree (child + workers)")
    print(f"  {'loader':<24}{'peak PSS MiB':>13}{'peak RSS MiB':>13}{'base PSS MiB':>13}")
    for r in (best, auto):
        if r is None:
            continue
        if "error" in r:
            print(f"  {label(r):<24}{r['error']}")
            continue
        print(f"  {label(r):<24}{_mib(r['peak_pss']):13.0f}{_mib(r['peak_rss']):13.0f}"
              f"{_mib(r['base_pss']):13.0f}")
    if "pss_ratio" in summary:
        print(f"  stoker auto / torch best: {summary['pss_ratio']:.2f}x the peak PSS "
              f"({summary['rss_ratio']:.2f}x the RSS sum); above base: "
              f"{summary['auto_above_base_mib']:.0f} MiB vs "
              f"{summary['torch_above_base_mib']:.0f} MiB")


def _public(row):
    # The per-batch lists are the raw material; the JSON keeps what was made of them.
    return {k: v for k, v in row.items() if k not in ("arrived", "waited", "sizes", "event")}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=None, help="ImageFolder tree (default: the built-in data set)")
    p.add_argument("--epochs", type=int, default=1, help="A's epochs")
    p.add_argument("--torch-workers", default=None,
                   help="comma-separated num_workers for torch in A and B (default 0..2*CPUs)")
    p.add_argument("--sections", default="A,B,C,D")
    p.add_argument("--limit", type=int, default=0,
                   help="at most N samples per epoch (images, and C's trivial samples); 0: all")
    p.add_argument("--step-batches", type=int, default=40, help="B's batches")
    p.add_argument("--json", action="store_true", help="machine-readable results on stdout")
    p.add_argument("--threads", action="store_true",
                   help="A also runs stoker with worker_kind='threads' (its own row)")
    p.add_argument("--child", nargs=3, metavar=("SECTION", "KIND", "WORKERS"),
                   help=argparse.SUPPRESS)
    a = p.parse_args()

    if a.child:
        section, kind, workers = a.child
        run_child(section, kind, workers if workers == "auto" else int(workers), a)
        return

    sections = {s.strip().upper() for s in a.sections.split(",") if s.strip()}
    if not sections <= set("ABCD"):
        p.error(f"--sections takes A, B, C, D; got {a.sections!r}")
    cpus = len(os.sched_getaffinity(0))
    torch_workers = ([int(w) for w in a.torch_workers.split(",")] if a.torch_workers
                     else list(range(2 * cpus + 1)))
    missing = stoker_dataloader_missing()
    if a.data is None:
        try:
            import stoker
        except ImportError as e:
            p.error(f"stoker does not import ({e}): pass --data DIR, or put "
                    "build/release/python on PYTHONPATH for the built-in data set")
        a.data = stoker.default_dataset()

    out = {"data": a.data, "cpus": cpus, "stoker": missing or "available", "sections": {}}
    a_rows = b_rows = c_rows = []
    best = auto = None
    if sections & {"A", "D"}:  # D is measured during A's runs
        a_rows = [run_config("A", "torch", w, a, missing) for w in torch_workers]
        a_rows.append(run_config("A", "stoker", "auto", a, missing))
        if a.threads:  # a row of its own: the comparisons below stay processes'
            a_rows.append(run_config("A", "stoker-threads", "auto", a, missing))
        best, auto, summary_a = summarise_a(a_rows)
        if "A" in sections:
            out["sections"]["A"] = {"summary": summary_a, "rows": [_public(r) for r in a_rows]}
    if "B" in sections:
        b_rows = [run_config("B", "torch", w, a, missing) for w in torch_workers]
        b_rows.append(run_config("B", "stoker", "auto", a, missing))
        needed, ref, ref_why, b_auto, summary_b = summarise_b(b_rows, best)
        out["sections"]["B"] = {"summary": summary_b, "rows": [_public(r) for r in b_rows]}
    if "C" in sections:
        c_rows = [run_config("C", kind, w, a, missing)
                  for kind in ("torch", "stoker") for w in OVERHEAD_WORKERS]
        summary_c = summarise_c(c_rows)
        out["sections"]["C"] = {"summary": summary_c, "rows": [_public(r) for r in c_rows]}
    if "D" in sections:
        summary_d = summarise_d(best, auto)
        out["sections"]["D"] = {"summary": summary_d}

    if a.json:
        print(json.dumps(out, indent=2))
        return
    print(f"stoker.DataLoader vs torch.utils.data.DataLoader on {a.data}")
    if missing:
        print(f"{NOT_AVAILABLE}: {missing}")
    if "A" in sections:
        print_a(a_rows, best, auto, cpus, a)
    if "B" in sections:
        print_b(b_rows, needed, ref, ref_why, b_auto, a, torch_workers)
    if "C" in sections:
        print_c(c_rows, summary_c)
    if "D" in sections:
        print_d(best, auto, summary_d)


if __name__ == "__main__":
    main()
