#!/usr/bin/env python3
"""stoker vs PyTorch's DataLoader from Python, side by side in one run.

Both read the same JPEG folder and apply the usual training pipeline --
ImageFolder + RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor +
Normalize -- in batches of 64, with a consumer that only takes the batches
(the loader's own throughput). PyTorch runs at every num_workers in 0..4 and
its best is the reference; stoker runs with workers="auto" (the tuner), with
a fixed count equal to the CPUs, and with that count and a prefetch of 2
batches (its defaults hold 4: more memory, no more speed here).

Each configuration runs in a fresh child process, so that its memory is its
own: peak memory is the whole process tree (the child and its DataLoader
worker processes), sampled every 50 ms from /proc by bench/proc_memory.py --
both the sum of RSS (what `top` adds up; it counts pages shared between
forked workers once per worker) and the sum of PSS (shared pages divided among
their sharers: the memory really used). The interpreter with torch imported
is part of both; its size before the loader starts is shown as "base". CPU
time per sample (the child and its workers, less the interpreter's start) is
the figure to trust on a busy machine, where throughput follows whatever CPU
the others leave.

Usage: /usr/bin/python3 bench/compare_python.py [--data DIR] [--epochs 1]
       [--torch-workers 0,1,2,3,4] [--stoker auto,2,2:2] [--json]
Default data: the built-in data set (stoker.default_dataset(), made on first use).
"""

import argparse
import json
import os
import sys
import time

from proc_memory import run_measured

BATCH = 64
SIZE = 224


# --- the child: one configuration --------------------------------------------


def _torch_loader(data, workers, seed):
    import torch
    import torchvision
    import torchvision.transforms as T

    tf = T.Compose([T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    dataset = torchvision.datasets.ImageFolder(data, transform=tf)
    g = torch.Generator()
    g.manual_seed(seed)
    return torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=workers,
                                       generator=g, persistent_workers=workers > 0)


def _stoker_loader(data, config, seed):
    import stoker

    # "auto", "W" (fixed workers) or "W:P" (fixed workers, prefetch P batches)
    workers, _, prefetch = str(config).partition(":")
    return stoker.Loader(stoker.ImageFolder(data), batch_size=BATCH, seed=seed,
                         transforms=stoker.transforms.train(SIZE),
                         workers="auto" if workers == "auto" else int(workers),
                         prefetch=int(prefetch) if prefetch else None)


def run_child(kind, workers, data, epochs):
    import warnings

    import torch  # both sides import it: the same base

    # DataLoader warns when num_workers passes its suggestion; the sweep does that on purpose.
    warnings.filterwarnings("ignore", message="This DataLoader will create")

    torch.set_num_threads(1)  # the consumer does no math; keep intra-op threads out
    print(json.dumps({"event": "base", "cpu_s": sum(os.times()[:2])}), flush=True)
    made = time.perf_counter()
    loader = (_torch_loader if kind == "torch" else _stoker_loader)(data, workers, 0)
    samples, first = 0, None
    for epoch in range(epochs):
        if kind == "stoker":
            loader.set_epoch(epoch)
        for images, labels in loader:
            if first is None:
                first = time.perf_counter()
                first_samples = len(labels)
            samples += len(labels)
            assert images.shape[1:] == (3, SIZE, SIZE) and images.dtype == torch.float32
    end = time.perf_counter()
    result = {
        "event": "done",
        "samples": samples,
        "seconds": end - made,
        "first_batch_s": first - made,
        # Steady rate: from the first batch on (worker start-up left out).
        "samples_per_s": (samples - first_samples) / (end - first),
    }
    if kind == "stoker":
        stats = loader.stats()
        result["workers_final"] = stats["workers"]
        result["stall_fraction"] = stats["stall_fraction_since_start"]  # the whole run's
        result["tuner"] = stats["tuner"]
        result["decisions"] = [
            {k: d[k] for k in ("t_s", "workers_before", "workers_after", "reason")}
            for d in loader.decisions()
        ]
    del loader  # torch: joins (and so reaps) its worker processes, whose CPU time then counts
    print(json.dumps(result), flush=True)


# --- the parent: runs the children and watches their memory ---------------------


def run_config(kind, workers, data, epochs):
    run = run_measured([sys.executable, __file__, "--child", kind, str(workers), "--data", data,
                        "--epochs", str(epochs)])
    result = next((e for e in run["events"] if e["event"] == "done"), None)
    if run["returncode"] != 0 or result is None:
        raise SystemExit(f"{kind} workers={workers} failed (exit {run['returncode']})")
    result.update(kind=kind, workers=workers, peak_rss=run["peak_rss"], peak_pss=run["peak_pss"],
                  base_rss=run["base_rss"], base_pss=run["base_pss"],
                  cpu_ms_per_sample=1e3 * run["cpu_s"] / result["samples"])
    return result


def _label(r):
    workers, _, prefetch = str(r["workers"]).partition(":")
    return f"{r['kind']} workers={workers}" + (f" prefetch={prefetch}" if prefetch else "")


def _mib(b):
    return f"{b / 2**20:7.0f}"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=None, help="JPEG class folders (default: the built-in data set)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--torch-workers", default="0,1,2,3,4")
    p.add_argument("--stoker", default=None,
                   help="comma-separated stoker configurations: 'auto', W (workers) or W:P "
                        "(workers, prefetch batches); default 'auto,C,C:2' for C CPUs")
    p.add_argument("--json", action="store_true")
    p.add_argument("--child", nargs=2, metavar=("KIND", "WORKERS"), help=argparse.SUPPRESS)
    a = p.parse_args()

    if a.child:
        kind, config = a.child
        run_child(kind, config if kind == "stoker" else int(config), a.data, a.epochs)
        return

    import stoker

    data = a.data or stoker.default_dataset()
    cpus = len(os.sched_getaffinity(0))
    stoker_workers = (a.stoker.split(",") if a.stoker else ["auto", str(cpus), f"{cpus}:2"])
    results = []
    for w in stoker_workers:
        results.append(run_config("stoker", w, data, a.epochs))
    for w in a.torch_workers.split(","):
        results.append(run_config("torch", int(w), data, a.epochs))

    best_torch = max((r for r in results if r["kind"] == "torch"), key=lambda r: r["samples_per_s"])
    stoker_runs = [r for r in results if r["kind"] == "stoker"]
    if a.json:
        print(json.dumps({"data": data, "cpus": cpus, "results": results,
                          "best_torch_workers": best_torch["workers"]}, indent=2))
        return

    n = len(stoker.ImageFolder(data))
    print(f"{n} JPEGs in {data}; RandomResizedCrop({SIZE}) + flip + ToTensor + Normalize, "
          f"batch {BATCH}, {a.epochs} epoch(s), {cpus} CPUs")
    print(f"{'loader':<22}{'samples/s':>10}{'CPU ms/sample':>14}{'1st batch s':>12}"
          f"{'peak RSS MiB':>13}{'peak PSS MiB':>13}{'base PSS':>9}")
    for r in results:
        name = _label(r)
        if r["kind"] == "stoker" and r["workers"] == "auto":
            name += f"->{r['workers_final']}"
        print(f"{name:<22}{r['samples_per_s']:10.1f}{r['cpu_ms_per_sample']:14.2f}"
              f"{r['first_batch_s']:12.2f}"
              f"{_mib(r['peak_rss']):>13}{_mib(r['peak_pss']):>13}{_mib(r['base_pss']):>9}")
    print(f"\nreference: torch DataLoader at its best num_workers={best_torch['workers']}")
    for r in stoker_runs:
        print(f"{_label(r)}: "
              f"{r['samples_per_s'] / best_torch['samples_per_s']:.2f}x the throughput "
              f"({best_torch['cpu_ms_per_sample'] / r['cpu_ms_per_sample']:.2f}x less CPU per sample), "
              f"peak memory {r['peak_rss'] / best_torch['peak_rss']:.2f}x (RSS sum), "
              f"{r['peak_pss'] / best_torch['peak_pss']:.2f}x (PSS sum); "
              f"above base: {(r['peak_pss'] - r['base_pss']) / 2**20:.0f} MiB vs "
              f"{(best_torch['peak_pss'] - best_torch['base_pss']) / 2**20:.0f} MiB")
    auto = next((r for r in stoker_runs if r["workers"] == "auto"), None)
    if auto and auto.get("decisions"):
        print("\nwhat the tuner decided:")
        for d in auto["decisions"]:
            print(f"  {d['t_s']:6.2f} s  workers {d['workers_before']} -> {d['workers_after']}: "
                  f"{d['reason']}")


if __name__ == "__main__":
    main()
