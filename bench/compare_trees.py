#!/usr/bin/env python3
"""Two builds of stoker side by side in one run: before/after a change.

Alternates the two builds round by round on the same machine (these machines
are noisy: the ratio of medians is the figure, not the absolute rates):
engine overhead (trivial samples, batch 64, 2 workers: engine_bench), the
JPEG training pipeline (`stoker run`, 2 workers and workers=auto, on the
built-in data set), and stoker.DataLoader from each build's Python package
(BUILD/python): per-batch overhead on trivial samples at 1 and 2 workers
(compare_dataloader.py's section C) and the steady rate of worker processes
and threads on a GIL-releasing dataset (compare_worker_kinds.py). Usage:
  bench/compare_trees.py BEFORE_BUILD AFTER_BUILD [--rounds 3] [--seconds 4]
                         [--only engine,jpeg,dataloader]
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

BENCH = os.path.dirname(os.path.abspath(__file__))


def python_child(build, args):
    """The last JSON line a bench script's child prints, run with BUILD's
    Python package first on the path."""
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.abspath(build), "python"))
    done = subprocess.run([sys.executable, *args], env=env, stdout=subprocess.PIPE, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def dataloader_batches_per_s(build, workers):
    """stoker.DataLoader on trivial samples (torch.tensor(index), batch 64):
    batches per second after the first (compare_dataloader.py, section C)."""
    row = python_child(build, [os.path.join(BENCH, "compare_dataloader.py"), "--child", "C",
                               "stoker", str(workers), "--data", "unused"])
    span = row["arrived"][-1] - row["arrived"][0]
    return (len(row["sizes"]) - 1) / span


def worker_kind_steady(build, kind, data, seconds):
    """stoker.DataLoader's steady samples/s on the GIL-releasing dataset
    (compare_worker_kinds.py), worker_kind `kind`, after half the run."""
    row = python_child(build, [os.path.join(BENCH, "compare_worker_kinds.py"),
                               "--child-dataset", "gil-free", "--child-kind", f"stoker-{kind}",
                               "--seconds", str(seconds), "--skip", str(seconds / 2),
                               "--batch", "64", "--data", data])
    return row["steady_per_s"]


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
    p.add_argument("--only", default="engine,jpeg,dataloader")
    a = p.parse_args()
    data = builtin_data(a.after)
    groups = {
        "engine": {"engine overhead, batches/s": lambda b: stoker_batches_per_s(b, a.seconds, 2)},
        "jpeg": {
            "JPEG pipeline, 2 workers, samples/s":
                lambda b: stoker_steady(b, data, 2, a.seconds)["samples_per_s"],
            "JPEG pipeline, workers=auto, samples/s":
                lambda b: stoker_steady(b, data, "auto", a.seconds)["samples_per_s"],
        },
        "dataloader": {
            "DataLoader per batch, 1 worker, batches/s": lambda b: dataloader_batches_per_s(b, 1),
            "DataLoader per batch, 2 workers, batches/s":
                lambda b: dataloader_batches_per_s(b, 2),
            "DataLoader processes, GIL-free, samples/s":
                lambda b: worker_kind_steady(b, "processes", data, 2 * a.seconds),
            "DataLoader threads, GIL-free, samples/s":
                lambda b: worker_kind_steady(b, "threads", data, 2 * a.seconds),
        },
    }
    cases = {}
    for group in a.only.split(","):
        if group not in groups:
            p.error(f"--only takes {', '.join(groups)}; got {group!r}")
        cases.update(groups[group])
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
