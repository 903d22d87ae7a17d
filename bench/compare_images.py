#!/usr/bin/env python3
"""Image pipeline, side by side in one run: stoker vs the physical limit vs PyTorch.

All three work on the same JPEG folder:
  physical limit  single-thread libjpeg-turbo full decode of the files, already
                  in memory (bench/image_bench's BM_FullDecode, best of 3
                  repetitions, CPU-time rate), x the cores this process may use;
  torch           DataLoader(ImageFolder) with RandomResizedCrop(224) +
                  RandomHorizontalFlip + ToTensor + Normalize(ImageNet), batch
                  64, shuffled, num_workers swept (persistent when > 0), run
                  under Debian's /usr/bin/python3 (python3-torch, -torchvision);
  stoker          `stoker run`, the same transforms, float32 CHW, batch 64,
                  with 2 workers and with workers=auto; steady rate: a
                  1.5 s run subtracted from a 1.5 s + --seconds one.
Each side's best setting is measured twice and the better kept (noisy machines).
Prints images/s of each and the ratios stoker / limit (goal >= 90 %) and
stoker / best torch (goal >= 6x), then one JSON line with the figures on stderr.

Usage: bench/compare_images.py [--data DIR] [--build build/release]
           [--seconds 8] [--torch-workers 0,1,2,3,4] [--python /usr/bin/python3]
Without --data: the built-in data set (`stoker make-dataset` without OUT makes
it if missing and prints its path).
"""
import argparse
import json
import os
import subprocess
import sys
import time

from epochs import Conditions, Endless

BATCH = 64
SIZE = 224


def jpegs_under(root):
    n, size = 0, 0
    for d, _, files in os.walk(root):
        for f in files:
            if f.lower().endswith((".jpg", ".jpeg")):
                n += 1
                size += os.path.getsize(os.path.join(d, f))
    return n, size


# --- torch: one num_workers setting per child process ------------------------

def torch_child(data, workers, seconds):
    """Runs inside /usr/bin/python3; prints one JSON object on stdout."""
    import torch
    from torch.utils.data import DataLoader
    from torchvision import datasets, transforms

    tf = transforms.Compose([
        transforms.RandomResizedCrop(SIZE),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    ])
    ds = datasets.ImageFolder(data, tf)
    loader = DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=workers,
                        persistent_workers=workers > 0)
    epochs = Endless(loader)
    next_batch = epochs.__next__

    # Warm-up: workers started, first batches through, imports and caches hot.
    for _ in range(max(3, 2 * workers + 2)):
        next_batch()
    # Batches come back in order, round-robin over the workers: ending on a
    # multiple of the worker count means each worker did whole batches in the
    # timed window, so its phase at the start does not bias the rate.
    period = max(1, workers)
    samples, batches, start = 0, 0, time.perf_counter()
    while time.perf_counter() - start < seconds or batches % period:
        images, _ = next_batch()
        assert images.dtype == torch.float32 and images.shape[1:] == (3, SIZE, SIZE)
        samples += images.shape[0]
        batches += 1
    elapsed = time.perf_counter() - start
    json.dump({"workers": workers, "samples": samples, "seconds": elapsed,
               "samples_per_s": samples / elapsed, "epoch_restarts": epochs.epochs,
               "torch": torch.__version__}, sys.stdout)
    print()


def torch_images_per_s(python, data, workers, seconds):
    out = subprocess.run(
        [python, os.path.abspath(__file__), "--torch-child", str(workers),
         "--data", data, "--seconds", str(seconds)],
        check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


# --- stoker ------------------------------------------------------------------

def stoker_run(build, data, workers, seconds):
    exe = os.path.join(build, "tools", "cli", "stoker")
    out = subprocess.run(
        [exe, "run", "--data", data, "--workers", str(workers), "--batch-size", str(BATCH),
         "--size", str(SIZE), "--layout", "float32-chw", "--step-ms", "0",
         "--seconds", str(seconds), "--json", "--quiet"],
        check=True, capture_output=True, text=True).stdout
    return json.loads(out)


STOKER_WARMUP_S = 1.5


def stoker_steady(build, data, workers, seconds):
    """`stoker run` counts from the loader's start (workers starting, first
    batches): the steady rate is the difference between a run of warm-up +
    `seconds` and one of the warm-up alone, the same way torch skips its
    warm-up batches."""
    short = stoker_run(build, data, workers, STOKER_WARMUP_S)
    long = stoker_run(build, data, workers, STOKER_WARMUP_S + seconds)
    rate = (long["samples"] - short["samples"]) / (long["seconds"] - short["seconds"])
    return dict(long, samples_per_s=rate, end_to_end_samples_per_s=long["samples_per_s"])


def better(a, b):
    return a if a["samples_per_s"] >= b["samples_per_s"] else b


# --- physical limit ----------------------------------------------------------

def decode_images_per_s_per_core(build, data):
    exe = os.path.join(build, "bench", "image_bench")
    env = dict(os.environ, STOKER_BENCH_DATA=data)
    out = subprocess.run(
        [exe, "--benchmark_filter=^BM_FullDecode(/|$)", "--benchmark_repetitions=3",
         "--benchmark_format=json"],
        check=True, capture_output=True, text=True, env=env).stdout
    runs = [b for b in json.loads(out)["benchmarks"] if b.get("run_type", "iteration") == "iteration"]
    if not runs or any("error_message" in b for b in runs):
        sys.exit(f"image_bench BM_FullDecode failed: {runs}")
    # items_per_second is per CPU second (the core's capacity, even when other
    # work shares it); the wall-clock rate goes into the JSON line for reference.
    best = max(runs, key=lambda b: b["items_per_second"])
    scale = {"ns": 1e9, "us": 1e6, "ms": 1e3, "s": 1.0}[best["time_unit"]]
    return best["items_per_second"], best["MP/s"], scale / best["real_time"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.split("\n")[1:]))
    p.add_argument("--data", help="JPEG folder (OUT/<class>/*.jpg); default: see below")
    p.add_argument("--build", default="build/release")
    p.add_argument("--seconds", type=float, default=8.0, help="measured seconds per setting")
    p.add_argument("--torch-workers", default="0,1,2,3,4", help="num_workers to sweep")
    p.add_argument("--python", default="/usr/bin/python3",
                   help="interpreter with Debian's torch and torchvision")
    p.add_argument("--torch-child", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args()

    if a.torch_child is not None:
        torch_child(a.data, a.torch_child, a.seconds)
        return

    data = a.data
    if data is None:  # the built-in data set, made once where `stoker run` looks for it
        data = subprocess.run([os.path.join(a.build, "tools", "cli", "stoker"), "make-dataset"],
                              check=True, capture_output=True, text=True).stdout.strip()
    data = os.path.abspath(data)
    run(a, data)


def run(a, data):
    n_images, n_bytes = jpegs_under(data)
    if n_images == 0:
        sys.exit(f"no JPEGs under {data}")
    run = Conditions()
    cores = run.cores
    torch_workers = [int(w) for w in a.torch_workers.split(",") if w.strip()]

    per_core, mp_per_s, per_core_wall = decode_images_per_s_per_core(a.build, data)
    limit = per_core * cores

    s2 = stoker_steady(a.build, data, 2, a.seconds)
    sauto = stoker_steady(a.build, data, "auto", a.seconds)
    torch = {}
    for w in torch_workers:
        torch[w] = torch_images_per_s(a.python, data, w, a.seconds)
        print(f"  (torch num_workers={w}: {torch[w]['samples_per_s']:,.0f} images/s)",
              file=sys.stderr, flush=True)
    best_w = max(torch, key=lambda w: torch[w]["samples_per_s"])
    # Again, each side's best: the machine is noisy, and this is fair to both.
    torch[best_w] = better(torch[best_w], torch_images_per_s(a.python, data, best_w, a.seconds))
    s2 = better(s2, stoker_steady(a.build, data, 2, a.seconds))
    sauto = better(sauto, stoker_steady(a.build, data, "auto", a.seconds))
    run.end()

    tbest = torch[best_w]["samples_per_s"]
    r2, rauto = s2["samples_per_s"], sauto["samples_per_s"]
    print(f"image pipeline: RandomResizedCrop({SIZE}) + flip + normalise, float32 CHW, "
          f"batch {BATCH}")
    print(f"data: {data} ({n_images} JPEGs, {n_bytes / n_images / 1024:.0f} KiB, "
          f"{mp_per_s / per_core:.2f} MP each on average)")
    print(run.line(a.seconds))
    print(f"  physical limit (full decode)   {limit:10,.0f} images/s"
          f"   ({per_core:,.0f}/s per core x {cores})")
    for w in torch_workers:
        mark = "  <- best" if w == best_w else ""
        print(f"  torch DataLoader, workers={w:<2}   {torch[w]['samples_per_s']:10,.0f} images/s{mark}")
    print(f"  stoker, workers=2              {r2:10,.0f} images/s"
          f"   ({s2['end_to_end_samples_per_s']:,.0f}/s counting start-up)")
    print(f"  stoker, workers=auto           {rauto:10,.0f} images/s"
          f"   ({sauto['end_to_end_samples_per_s']:,.0f}/s counting start-up;"
          f" workers {sauto['workers_final']} at the end, {sauto['workers_max']} at most)")
    print(f"  stoker(2) / physical limit     {r2 / limit:10.1%}      goal >= 90 %")
    print(f"  stoker(auto) / physical limit  {rauto / limit:10.1%}      goal >= 90 %")
    print(f"  stoker(2) / torch best         {r2 / tbest:10.1f} x    goal >= 6 x")
    print(f"  stoker(auto) / torch best      {rauto / tbest:10.1f} x    goal >= 6 x")
    json.dump({
        "data": data, "images": n_images, "seconds": a.seconds, **run.fields(),
        "decode_per_core_images_per_s": per_core,
        "decode_per_core_wall_clock_images_per_s": per_core_wall,
        "physical_limit_images_per_s": limit,
        "torch_images_per_s": {str(w): torch[w]["samples_per_s"] for w in torch_workers},
        "torch_best_workers": best_w, "torch_best_images_per_s": tbest,
        "stoker_2_images_per_s": r2, "stoker_auto_images_per_s": rauto,
        "stoker_2_end_to_end_images_per_s": s2["end_to_end_samples_per_s"],
        "stoker_auto_end_to_end_images_per_s": sauto["end_to_end_samples_per_s"],
        "stoker_auto_workers_final": sauto["workers_final"],
        "stoker_2_vs_limit": r2 / limit, "stoker_auto_vs_limit": rauto / limit,
        "stoker_2_vs_torch": r2 / tbest, "stoker_auto_vs_torch": rauto / tbest,
    }, sys.stderr)
    print(file=sys.stderr)


if __name__ == "__main__":
    main()
