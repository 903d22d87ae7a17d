#!/usr/bin/env python3
"""Copy-on-read: the memory a list of Python objects costs forked workers.

A dataset holding N Python objects in a list (torch issue #13246): each
forked worker that reads an object writes its reference count, so the
kernel copies its page into the worker, and over an epoch the process tree
grows by about the list per worker. stoker.SharedList keeps the items
pickled in one buffer that no read writes to (docs/dataloader.md,
"Copy-on-read").

One epoch (shuffled, batch --batch-size, num_workers=2, persistent workers)
over a dataset whose __getitem__ reads item i of its list, four ways: torch's
DataLoader and stoker.DataLoader, each over a plain list and a SharedList of
the same items (--kind dicts: {"path": str, "label": int}; strings: str),
and over a range (no objects: what the loader itself grows by).
Each runs in a fresh child process (bench/proc_memory.py runs it), which
reads the PSS of its whole process tree (itself, its workers, stoker's
zygote) before iter() and after the epoch's last batch, with the workers
still alive. Printed: that growth, in all and without file pages (Pss_File:
libraries, whose PSS moves with other processes on the machine), the
epoch's time, SharedList's packing time, and each non-file growth / torch's
plain-list one (the issue's target for SharedList: at most 5 %); then
stoker.DataLoader's own figure of it, stats()["worker_growth_bytes"], and
its advice.
"""

import argparse
import json
import os
import resource
import sys
import time

from proc_memory import run_measured, tree_fields

# Pss_File apart: the pages of shared libraries (libtorch's hundreds of MiB)
# are divided among every process on the machine that maps them, so other
# users' processes move it; anonymous and shared memory are this tree's alone.
FIELDS = ("Pss", "Pss_File")
# "range": the control, a dataset of the same length that holds no objects:
# what the loader itself grows by over an epoch.
CONFIGS = (("torch", "list"), ("torch", "SharedList"), ("torch", "range"),
           ("stoker", "list"), ("stoker", "SharedList"), ("stoker", "range"))


def items(n, kind):
    """N small Python objects, as a dataset's index of files would hold them, one
    at a time."""
    for i in range(n):
        path = f"/data/train/class_{i % 1000:04d}/image_{i:08d}.jpg"
        yield path if kind == "strings" else {"path": path, "label": i % 1000}


def run_one(args):
    """The child: one configuration, JSON lines on stdout."""
    import torch
    import stoker

    class Rows(torch.utils.data.Dataset):
        def __init__(self, rows):
            self.rows = rows

        def __len__(self):
            return len(self.rows)

        def __getitem__(self, i):
            row = self.rows[i]
            if container == "range":
                return row % 1000
            return len(row) if args.kind == "strings" else row["label"]

    loader_name, container = args.one.split(",")
    t = time.perf_counter()
    if container == "range":
        rows = range(args.items)
    elif container == "list":
        rows = list(items(args.items, args.kind))
    else:  # packed as made: no list of them is made and freed (docs/dataloader.md)
        rows = stoker.SharedList(items(args.items, args.kind))
    build_s = time.perf_counter() - t
    make = stoker.DataLoader if loader_name == "stoker" else torch.utils.data.DataLoader
    loader = make(Rows(rows), batch_size=args.batch_size, shuffle=True, num_workers=2,
                  persistent_workers=True)
    time.sleep(0.5)  # stoker's zygote and workers start when the loader is made
    before = tree_fields(os.getpid(), FIELDS)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"event": "base", "cpu_s": usage.ru_utime + usage.ru_stime}), flush=True)
    t = time.perf_counter()
    samples, stats = 0, {}
    for b, batch in enumerate(loader):
        samples += len(batch)
        if loader_name == "stoker" and b % 20 == 0:  # as a training loop logs it
            stats = loader.stats(gpu=False)
    epoch_s = time.perf_counter() - t
    after = tree_fields(os.getpid(), FIELDS)  # the workers are still alive (persistent)
    print(json.dumps({"event": "done", "samples": samples, "before": before,
                      "after": after, "epoch_s": epoch_s, "build_s": build_s,
                      "growth_figure": stats.get("worker_growth_bytes"),
                      "advice": stats.get("advice")}), flush=True)
    del loader


def mib(b):
    return f"{b / (1 << 20):8.1f}"


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", type=int, default=1_000_000, help="objects in the list")
    p.add_argument("--kind", choices=("dicts", "strings"), default="dicts")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # the child's configuration
    args = p.parse_args()
    if args.one:
        return run_one(args)

    print(f"{args.items:,} {args.kind}, one shuffled epoch, batch {args.batch_size}, "
          "num_workers=2, persistent workers. Growth of the process tree's PSS over the "
          "epoch, MiB: all of it, and without Pss_File (libraries, which other processes "
          "share); the ratio is of the latter")
    print(f"{'loader':8} {'container':11} {'PSS':>8} {'non-file':>8} {'epoch s':>8} "
          f"{'pack s':>7} {'/ torch list':>12}")
    results = {}
    for loader_name, container in CONFIGS:
        argv = [sys.executable, __file__, "--one", f"{loader_name},{container}",
                "--items", str(args.items), "--kind", args.kind,
                "--batch-size", str(args.batch_size)]
        r = run_measured(argv)
        done = [e for e in r["events"] if e["event"] == "done"]
        if r["returncode"] != 0 or not done:
            print(f"{loader_name:8} {container:11} failed (exit {r['returncode']})")
            continue
        d = done[0]
        grown = {f: d["after"][f] - d["before"][f] for f in FIELDS}
        own = grown["Pss"] - grown["Pss_File"]
        results[(loader_name, container)] = (own, d)
        reference = results.get(("torch", "list"), (0, None))[0]
        ratio = f"{own / reference:12.1%}" if reference > 0 else f"{'-':>12}"
        pack = f"{d['build_s']:7.2f}" if container == "SharedList" else f"{'-':>7}"
        print(f"{loader_name:8} {container:11} {mib(grown['Pss'])} {mib(own)} "
              f"{d['epoch_s']:8.2f} {pack} {ratio}", flush=True)
    for loader_name in ("torch", "stoker"):
        got = {c: results[(n, c)][0] for n, c in results if n == loader_name}
        if {"list", "SharedList", "range"} <= got.keys() and got["list"] > got["range"]:
            print(f"{loader_name}: above the range's growth, SharedList "
                  f"{mib(got['SharedList'] - got['range']).strip()} MiB vs list "
                  f"{mib(got['list'] - got['range']).strip()} MiB: "
                  f"{(got['SharedList'] - got['range']) / (got['list'] - got['range']):.1%}")
    for (loader_name, container), (_, d) in results.items():
        if d["growth_figure"] is not None and container != "range":
            print(f"stoker.DataLoader over a {container}: stats() (called every 20 batches) "
                  f"at the last call: worker_growth_bytes {mib(d['growth_figure']).strip()} "
                  f"MiB, advice: {d['advice'] or '(none)'}")


if __name__ == "__main__":
    sys.exit(main())
