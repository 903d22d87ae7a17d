#!/usr/bin/env python3
"""Two builds of stoker side by side in one run: before/after a change.

Alternates the two builds round by round on the same machine (these machines
are noisy: the ratio of medians is the figure, not the absolute rates):
engine overhead (trivial samples, batch 64, 2 workers: engine_bench) and the
JPEG training pipeline (`stoker run`, 2 workers and workers=auto, on the
built-in data set). Usage:
  bench/compare_trees.py BEFORE_BUILD AFTER_BUILD [--rounds 3] [--seconds 4]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_engine import stoker_batches_per_s  # noqa: E402
from compare_images import stoker_steady  # noqa: E402


def builtin_data(build):
    exe = os.path.join(build, "tools", "cli", "stoker")
    return subprocess.run([exe, "make-dataset"], check=True, capture_output=True,
                          text=True).stdout.strip().splitlines()[-1].split()[-1]


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=4.0)
    a = p.parse_args()
    data = builtin_data(a.after)
    cases = {
        "engine overhead, batches/s": lambda b: stoker_batches_per_s(b, a.seconds, 2),
        "JPEG pipeline, 2 workers, samples/s":
            lambda b: stoker_steady(b, data, 2, a.seconds)["samples_per_s"],
        "JPEG pipeline, workers=auto, samples/s":
            lambda b: stoker_steady(b, data, "auto", a.seconds)["samples_per_s"],
    }
    results = {name: {"before": [], "after": []} for name in cases}
    for r in range(a.rounds):
        for name, run in cases.items():
            order = ("before", "after") if r % 2 == 0 else ("after", "before")
            for which in order:
                results[name][which].append(run(getattr(a, which)))
    for name, v in results.items():
        b, f = statistics.median(v["before"]), statistics.median(v["after"])
        print(f"{name:42} before {b:12,.0f}  after {f:12,.0f}  after/before {f / b:5.2f}"
              f"  (rounds: {', '.join(f'{x:,.0f}' for x in v['before'])} | "
              f"{', '.join(f'{x:,.0f}' for x in v['after'])})")
    json.dump(results, sys.stderr)
    print(file=sys.stderr)


if __name__ == "__main__":
    main()
