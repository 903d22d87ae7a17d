#!/usr/bin/env python3
"""stoker.DataLoader vs torch's DataLoader on samples that wait (I/O-like).

Each sample sleeps --wait-ms (a read from a slow store) and is a small
tensor, so what a loader delivers is set by how many batches it keeps in
flight: one a worker leaves workers idle. Both loaders run the same dataset
at the same fixed num_workers, one after the other in this run, and
stoker.DataLoader also with num_workers="auto"; prints batches/s of each and
stoker / torch.

usage: bench/compare_waiting.py [--wait-ms 5] [--batch-size 1] [--workers 4,8,16]
       [--seconds 10] [--json]
"""

import argparse
import json
import sys
import time
import warnings

import torch
import torch.utils.data

import stoker


class Waiting(torch.utils.data.Dataset):
    def __init__(self, wait_s, n=1_000_000):
        self.wait_s, self.n = wait_s, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.wait_s)
        return torch.full((16,), float(i))


def rate(make, workers, a):
    """Batches/s over --seconds after the first batch, and the loader's stats if any."""
    loader = make(Waiting(a.wait_ms / 1e3), batch_size=a.batch_size, num_workers=workers,
                  persistent_workers=True)
    it = iter(loader)
    next(it)
    start, n = time.monotonic(), 0
    while time.monotonic() - start < a.seconds:
        next(it)
        n += 1
    out = n / (time.monotonic() - start)
    stats = loader.stats(gpu=False) if hasattr(loader, "stats") else None
    del it
    getattr(loader, "close", lambda: None)()
    return out, stats


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--wait-ms", type=float, default=5.0)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--workers", default="4,8,16")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    rows = []
    for w in [int(x) for x in a.workers.split(",")]:
        theirs, _ = rate(torch.utils.data.DataLoader, w, a)
        ours, stats = rate(stoker.DataLoader, w, a)
        rows.append({"num_workers": w, "torch": theirs, "stoker": ours,
                     "stoker_prefetch_batches": stats["prefetch_batches"]})
        print(f"num_workers={w}: torch {theirs:.0f} batches/s, stoker {ours:.0f} "
              f"({stats['prefetch_batches']} in flight): {ours / theirs:.2f}x", file=sys.stderr,
              flush=True)
    auto, stats = rate(stoker.DataLoader, "auto", a)
    best = max(rows, key=lambda r: r["torch"])
    print(f"stoker num_workers=\"auto\": {auto:.0f} batches/s at {stats['workers']} workers: "
          f"{auto / best['torch']:.2f}x torch's best ({best['torch']:.0f} at "
          f"{best['num_workers']})", file=sys.stderr, flush=True)
    if a.json:
        json.dump({"wait_ms": a.wait_ms, "batch_size": a.batch_size, "rows": rows,
                   "auto": auto, "auto_workers": stats["workers"]}, sys.stdout, indent=1)
        print()


if __name__ == "__main__":
    main()
