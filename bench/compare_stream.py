#!/usr/bin/env python3
"""A sharded stream on stoker.DataLoader against torch's DataLoader, side by side in one run.

The stream: WebDataset-style tar shards of JPEGs (--per-shard images each),
read shard by shard, each image decoded with PIL, RandomResizedCrop(224) +
RandomHorizontalFlip + PILToTensor (uint8), batch 64. One dataset class, a
stoker.ShardedIterable, run by
  torch           torch.utils.data.DataLoader over its __iter__ (which splits
                  the shards by get_worker_info()) at each --torch-workers,
                  persistent workers; its best the reference;
  stoker          stoker.DataLoader(num_workers="auto", shuffle=True): split
                  by shard on the live-resized pool.
Each in a fresh child process: the time to the first batch (from making the
loader), a warm-up (--warmup seconds), then the steady rate over --seconds;
the best torch count and stoker are measured twice and the better kept
(noisy machines). Then a resume: 5 batches at 2 workers, state_dict, the
rest from a new loader at 1 worker, checked to be exactly the rest; and an
epoch of batches of 16 resized to 1-3 workers at random after each batch:
the shards handed over mid-way, the epoch checked to be the same batches. Prints
images/s, the ratio stoker / torch best (goal >= 0.97x), the first batch
against torch's at 2 workers (goal: within it), and one JSON line on stderr.

Usage: PYTHONPATH=build/release/python bench/compare_stream.py [--shards DIR]
           [--seconds 10] [--warmup 4] [--torch-workers 1,2,3,4]
Without --shards: 2,000 images in 20 shards made once under the data cache.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import time

from epochs import Conditions, Endless, steady_rate

BATCH = 64
SIZE = 224


def make_shards(per_shard):
    import stoker
    root = os.path.join(os.path.dirname(stoker.default_dataset_path()),
                        f"stream-bench-{per_shard}")
    paths = sorted(glob.glob(root + "-shards/*.tar"))
    if not paths:
        report = stoker.make_dataset(root, images=2000, shards=2000 // per_shard)
        paths = sorted(report["shards"])
    return paths


def dataset(paths):
    import io

    from PIL import Image
    from torchvision import transforms as T

    import stoker
    crop = T.Compose([T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip(), T.PILToTensor()])

    def decode(image, label):
        return crop(Image.open(io.BytesIO(image)).convert("RGB")), label

    return stoker.TarStream(paths, transform=decode)


def child(kind, paths, workers, seconds, warmup):
    """Runs in a fresh process; prints one JSON object."""
    import torch
    import stoker
    stoker.DataLoader  # imported before the clock, as torch's DataLoader is with torch
    t0 = time.perf_counter()
    ds = dataset(paths)
    if kind == "torch":
        loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, num_workers=workers,
                                             persistent_workers=workers > 0)
    else:
        loader = stoker.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers="auto")
    batches = Endless(loader)
    next(batches)
    first = time.perf_counter() - t0

    def samples_of(batch):
        images, _ = batch
        assert images.shape[1:] == (3, SIZE, SIZE) and images.dtype == torch.uint8
        return images.shape[0]

    rate = steady_rate(batches, seconds, warmup, samples_of)
    json.dump({"kind": kind, "workers": workers, "samples_per_s": rate,
               "first_batch_s": first, "epoch_restarts": batches.epochs,
               "workers_at_end": None if kind == "torch" else loader.stats()["workers"]},
              sys.stdout)
    print()


def measure(a, paths, kind, workers=0):
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", kind,
                          "--child-workers", str(workers), "--seconds", str(a.seconds),
                          "--warmup", str(a.warmup), "--paths", json.dumps(paths)],
                         check=True, capture_output=True, text=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    print(f"  ({kind} {workers if kind == 'torch' else 'auto'}: "
          f"{result['samples_per_s']:,.0f} images/s, first batch {result['first_batch_s']:.2f} s)",
          file=sys.stderr, flush=True)
    return result


def better(a, b):
    return a if a["samples_per_s"] >= b["samples_per_s"] else b


def keys(batch):
    """A batch's labels and its pixels' sum: the same batch, or another."""
    return batch[1].tolist(), int(batch[0].sum())


def seeded(paths, workers, batch=BATCH):
    import torch

    import stoker
    return stoker.DataLoader(dataset(paths), batch_size=batch, shuffle=True, num_workers=workers,
                             generator=torch.Generator().manual_seed(3))


def resume(paths, whole):
    """(exactly the rest, batches after the checkpoint) for a checkpoint
    taken at 2 workers after 5 batches and resumed at 1 worker; `whole`:
    the epoch's keys() read through."""
    with seeded(paths, 2) as dl:
        it = iter(dl)
        head = [keys(next(it)) for _ in range(5)]
        state = dl.state_dict()
    with seeded(paths, 1) as dl:
        dl.load_state_dict(state)
        rest = [keys(b) for b in dl]
    return head + rest == whole, len(rest)


def handover(paths):
    """(shards handed over, the epoch's batches the same as read without
    resizes) for an epoch of batches of 16 (several to a shard) whose pool is
    resized between 1 and 3 workers at random after each batch: a worker
    that leaves mid-shard stops at its next batch, and another continues
    the shard (TarStream opens it at that offset)."""
    import random
    rng = random.Random(5)
    with seeded(paths, 2, 16) as dl:
        whole = [keys(b) for b in dl]
    with seeded(paths, 2, 16) as dl:
        got = []
        for batch in dl:
            got.append(keys(batch))
            dl._run.engine.resize(rng.randint(1, 3))
        return dl.stats()["handovers"], got == whole


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.split("\n")[1:]))
    p.add_argument("--shards", help="folder of .tar shards; default: made under the data cache")
    p.add_argument("--per-shard", type=int, default=100, help="images per shard when made")
    p.add_argument("--seconds", type=float, default=10.0, help="measured seconds per setting")
    p.add_argument("--warmup", type=float, default=4.0, help="seconds before measuring")
    p.add_argument("--torch-workers", default="1,2,3,4", help="num_workers to sweep")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-workers", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--paths", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child is not None:
        child(a.child, json.loads(a.paths), a.child_workers, a.seconds, a.warmup)
        return
    paths = sorted(glob.glob(os.path.join(a.shards, "*.tar"))) if a.shards else \
        make_shards(a.per_shard)
    run = Conditions()

    torch_workers = [int(w) for w in a.torch_workers.split(",") if w.strip()]
    torch_runs = {w: measure(a, paths, "torch", w) for w in torch_workers}
    best_w = max(torch_runs, key=lambda w: torch_runs[w]["samples_per_s"])
    ours = measure(a, paths, "stoker")
    torch_runs[best_w] = better(torch_runs[best_w], measure(a, paths, "torch", best_w))
    ours = better(ours, measure(a, paths, "stoker"))
    with seeded(paths, 2) as dl:
        whole = [keys(b) for b in dl]
    exact, rest_batches = resume(paths, whole)
    handed, same = handover(paths)
    run.end()

    tbest, rate = torch_runs[best_w]["samples_per_s"], ours["samples_per_s"]
    first_torch2 = torch_runs[2]["first_batch_s"] if 2 in torch_runs else None
    print(f"stream: {len(paths)} tar shards of JPEGs, PIL + RandomResizedCrop({SIZE}) + flip + "
          f"PILToTensor, batch {BATCH}")
    print(run.line(a.seconds))
    for w in torch_workers:
        mark = "  <- best" if w == best_w else ""
        r = torch_runs[w]
        print(f"  torch DataLoader, num_workers={w:<2}   {r['samples_per_s']:8,.0f} images/s"
              f"   first batch {r['first_batch_s']:.2f} s{mark}")
    print(f"  stoker.DataLoader, auto, by shard  {rate:8,.0f} images/s   first batch "
          f"{ours['first_batch_s']:.2f} s   (workers {ours['workers_at_end']} at the end)")
    print(f"  stoker / torch best                {rate / tbest:8.2f} x    goal >= 0.97 x")
    if first_torch2 is not None:
        print(f"  first batch, stoker / torch at 2   {ours['first_batch_s'] / first_torch2:8.2f} x"
              "    goal <= 1 x")
    print(f"  resume at 1 worker from a checkpoint at 2 after 5 batches: "
          f"{'exactly the rest' if exact else 'NOT the rest'} ({rest_batches} batches)")
    print(f"  batches of 16, resized to 1-3 workers at random after each: {handed} shards handed over "
          f"mid-way, the epoch {'the same batches' if same else 'NOT the same batches'}")
    json.dump({
        "shards": len(paths), "seconds": a.seconds, **run.fields(),
        "torch_images_per_s": {str(w): r["samples_per_s"] for w, r in torch_runs.items()},
        "torch_first_batch_s": {str(w): r["first_batch_s"] for w, r in torch_runs.items()},
        "torch_best_workers": best_w, "stoker_images_per_s": rate,
        "stoker_first_batch_s": ours["first_batch_s"], "stoker_vs_torch": rate / tbest,
        "resume_exact": exact, "handovers": handed, "resized_same": same}, sys.stderr)
    print(file=sys.stderr)


if __name__ == "__main__":
    main()
