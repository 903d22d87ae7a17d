#!/usr/bin/env python3
"""stoker.DataLoader's worker kinds side by side: processes, threads, and
worker_kind="auto" (which measures both and keeps the faster), with torch's
DataLoader at num_workers = CPUs as a reference, on two datasets:

gil-free  samples stored zlib-compressed in memory (3x128x128 uint8 each);
          __getitem__ decompresses (zlib releases the GIL) and converts with
          torch ops (which release it too): the case threads are for.
images    torchvision's ImageFolder over the built-in data set with PIL decode,
          RandomResizedCrop(224), flip, ToTensor, Normalize: much of it holds
          the GIL, the case processes are for.

Every configuration runs the same loop (take batches, no step) for --seconds,
each in a fresh child process; the rate is counted after --skip seconds (the
auto kind's trial, about 6 s, and start-up left out) and over the whole run.
The CPU time is the child's and its workers'. auto's row says what it chose
and why; "auto / best kind" compares its steady rate with the faster of the
processes and threads rows of the same run.

Usage: /usr/bin/python3 bench/compare_worker_kinds.py [--datasets gil-free,images]
       [--seconds 20] [--skip 8] [--batch 64] [--data DIR] [--json]
"""

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
import zlib

import torch

KINDS = ("stoker-processes", "stoker-threads", "stoker-auto", "torch")


class GilFree(torch.utils.data.Dataset):
    """Compressed arrays: decompressing and converting release the GIL."""

    def __init__(self, n=2048, side=128):
        g = torch.Generator()
        g.manual_seed(0)
        base = torch.randint(0, 16, (3 * side * side,), dtype=torch.uint8, generator=g).numpy()
        self.blobs = [zlib.compress(bytes(base[i % 97:]) + bytes(base[:i % 97]), 6)
                      for i in range(n)]
        self.side = side

    def __len__(self):
        return len(self.blobs)

    def __getitem__(self, i):
        raw = zlib.decompress(self.blobs[i])
        x = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(3, self.side, self.side)
        return x.float().div_(255).sub_(0.5).div_(0.25), i % 10


def make_dataset(name, data):
    if name == "gil-free":
        return GilFree()
    import torchvision
    import torchvision.transforms as T

    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    return torchvision.datasets.ImageFolder(data, transform=tf)


def child(a):
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    torch.set_num_threads(1)
    dataset = make_dataset(a.child_dataset, a.data)
    g = torch.Generator()
    g.manual_seed(0)
    cpus = len(os.sched_getaffinity(0))
    t0 = time.perf_counter()
    if a.child_kind == "torch":
        loader = torch.utils.data.DataLoader(dataset, batch_size=a.batch, shuffle=True,
                                             num_workers=cpus, generator=g,
                                             persistent_workers=True)
    else:
        import stoker
        # native=False: the kinds of Python workers are what is compared.
        loader = stoker.DataLoader(dataset, batch_size=a.batch, shuffle=True, generator=g,
                                   worker_kind=a.child_kind.split("-")[1], native=False)
    samples = steady = 0
    while time.perf_counter() - t0 < a.seconds:
        for images, _ in loader:
            now = time.perf_counter() - t0
            samples += len(images)
            steady += len(images) if now >= a.skip else 0
            if now >= a.seconds:
                break
    end = time.perf_counter() - t0
    out = {"samples_per_s": samples / end, "steady_per_s": steady / max(end - a.skip, 1e-9)}
    if hasattr(loader, "stats"):
        stats = loader.stats()
        out["workers"] = stats["workers"]
        out["kind"] = stats["worker_kind"]
        if stats.get("kind_trial"):
            out["reason"] = stats["kind_trial"]["reason"]
        loader.close()
    else:
        out["workers"] = cpus
        del loader
    out["cpu_s"] = sum(os.times()[:4])  # with the reaped workers' (children's) time
    out["cpu_ms_per_sample"] = 1e3 * out["cpu_s"] / max(samples, 1)
    print(json.dumps(out), flush=True)


def run(dataset, kind, a):
    print(f"running {dataset}: {kind}", file=sys.stderr, flush=True)
    cmd = [sys.executable, os.path.abspath(__file__), "--child-dataset", dataset,
           "--child-kind", kind, "--seconds", str(a.seconds), "--skip", str(a.skip),
           "--batch", str(a.batch), "--data", a.data]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0 or not done.stdout.strip():
        return {"error": f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", default="gil-free,images")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--skip", type=float, default=8.0)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--data", default=None)
    p.add_argument("--json", action="store_true")
    p.add_argument("--child-dataset", help=argparse.SUPPRESS)
    p.add_argument("--child-kind", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.data is None:
        import stoker
        a.data = stoker.default_dataset()
    if a.child_kind:
        return child(a)
    if a.skip >= a.seconds:
        p.error("--skip must be less than --seconds")
    results = {}
    for dataset in [d.strip() for d in a.datasets.split(",") if d.strip()]:
        if dataset not in ("gil-free", "images"):
            p.error(f"--datasets takes gil-free and images, got {dataset!r}")
        results[dataset] = {kind: run(dataset, kind, a) for kind in KINDS}
    if a.json:
        print(json.dumps(results, indent=2))
        return
    for dataset, rows in results.items():
        print(f"\n{dataset} (batch {a.batch}, {a.seconds:g} s each, steady = after {a.skip:g} s)")
        print(f"{'loader':<18}{'workers':>8}{'samples/s':>11}{'steady/s':>10}{'CPU ms/sample':>15}")
        for kind, r in rows.items():
            if "error" in r:
                print(f"{kind:<18}{r['error']}")
                continue
            print(f"{kind:<18}{r['workers']:>8}{r['samples_per_s']:>11.0f}"
                  f"{r['steady_per_s']:>10.0f}{r['cpu_ms_per_sample']:>15.2f}")
        auto = rows["stoker-auto"]
        kinds = [rows[k] for k in ("stoker-processes", "stoker-threads") if "error" not in rows[k]]
        if "error" not in auto and kinds:
            best = max(r["steady_per_s"] for r in kinds)
            print(f"auto chose {auto['kind']}: {auto.get('reason', '')}")
            print(f"auto / best kind (steady): {auto['steady_per_s'] / best:.2f}x")
            if "error" not in rows["torch"]:
                print(f"auto / torch (steady): {auto['steady_per_s'] / rows['torch']['steady_per_s']:.2f}x")


if __name__ == "__main__":
    main()
