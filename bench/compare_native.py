#!/usr/bin/env python3
"""An unchanged torchvision script on stoker.DataLoader's native path, side by side in one run.

The script: torchvision's ImageFolder with RandomResizedCrop(224) +
RandomHorizontalFlip + ToTensor + Normalize(ImageNet), batch 64, shuffled.
Run by
  torch           torch.utils.data.DataLoader at each --torch-workers
                  (persistent workers), its best the reference;
  stoker.DataLoader  the same script with the import swapped,
                  num_workers="auto": recognised and run natively
                  (stats()["pipeline"] is checked to say "native");
  stoker.Loader   stoker's own pipeline on the same folder,
                  stoker.transforms.train(224), workers="auto".
Each in a fresh child process: a warm-up (--warmup seconds), then the steady
rate over --seconds; each side's best setting is measured twice and the
better kept (noisy machines). Prints images/s and the ratios
stoker.DataLoader / torch best (goal >= 4x) and stoker.DataLoader /
stoker.Loader (goal >= 0.9x).
Then fidelity: the eval Compose (Resize 256, CenterCrop 224, ToTensor,
Normalize), shuffle=False, --eval-batches batches of stoker.DataLoader
against torch's DataLoader: the largest difference in uint8 levels (goal
<= 1) and whether the labels are equal. One JSON line with the figures on
stderr.

Usage: PYTHONPATH=build/release/python bench/compare_native.py [--data DIR]
           [--seconds 8] [--warmup 3] [--torch-workers 0,1,2,3,4]
Without --data: the built-in data set (stoker.default_dataset()).
"""
import argparse
import json
import os
import subprocess
import sys

from epochs import Conditions, Endless, steady_rate

BATCH = 64
SIZE = 224
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def train_compose():
    from torchvision import transforms as T
    return T.Compose([T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize(MEAN, STD)])


def make_loader(kind, data, workers):
    import torch
    import torchvision
    if kind == "torch":
        dataset = torchvision.datasets.ImageFolder(data, train_compose())
        return torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True,
                                           num_workers=workers, persistent_workers=workers > 0)
    import stoker
    if kind == "stoker-dataloader":
        dataset = torchvision.datasets.ImageFolder(data, train_compose())
        loader = stoker.DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers="auto")
        if loader.stats()["pipeline"] != "native":
            raise SystemExit("not native: " + loader.stats()["pipeline_reason"])
        return loader
    return stoker.Loader(stoker.ImageFolder(data), batch_size=BATCH, shuffle=True,
                         transforms=stoker.transforms.train(SIZE), workers="auto")


def child(kind, data, workers, seconds, warmup):
    """Runs in a fresh process; prints one JSON object."""
    loader = make_loader(kind, data, workers)
    batches = Endless(loader, loader.set_epoch if kind == "stoker-loader" else None)

    def samples_of(batch):
        images, _ = batch
        assert images.shape[1:] == (3, SIZE, SIZE)
        return images.shape[0]

    rate = steady_rate(batches, seconds, warmup, samples_of)
    workers_now = None
    if kind != "torch":
        workers_now = loader.stats()["workers"]
    json.dump({"kind": kind, "workers": workers, "samples_per_s": rate,
               "workers_at_end": workers_now, "epoch_restarts": batches.epochs}, sys.stdout)
    print()


def measure(a, data, kind, workers=0):
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", kind,
                          "--child-workers", str(workers), "--data", data,
                          "--seconds", str(a.seconds), "--warmup", str(a.warmup)],
                         check=True, capture_output=True, text=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    print(f"  ({kind} {workers if kind == 'torch' else 'auto'}: "
          f"{result['samples_per_s']:,.0f} images/s)", file=sys.stderr, flush=True)
    return result


def better(a, b):
    return a if a["samples_per_s"] >= b["samples_per_s"] else b


def fidelity(data, batches):
    """(largest difference in uint8 levels, labels equal) over `batches` eval batches."""
    import torch
    import torchvision
    from torchvision import transforms as T

    import stoker
    dataset = torchvision.datasets.ImageFolder(data, T.Compose([
        T.Resize(256), T.CenterCrop(SIZE), T.ToTensor(), T.Normalize(MEAN, STD)]))
    ours = stoker.DataLoader(dataset, batch_size=BATCH, shuffle=False, num_workers="auto")
    assert ours.stats()["pipeline"] == "native", ours.stats()["pipeline_reason"]
    theirs = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=False,
                                         num_workers=2)
    std = torch.tensor(STD).view(1, 3, 1, 1)
    worst, labels_equal, n = 0.0, True, 0
    for (a, la), (b, lb) in zip(ours, theirs):
        worst = max(worst, float(((a - b).abs() * std * 255).max()))
        labels_equal &= torch.equal(la, lb)
        n += 1
        if n == batches:
            break
    ours.close()
    return worst, labels_equal, n


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.split("\n")[1:]))
    p.add_argument("--data", help="image folder (OUT/<class>/*.jpg); default: the built-in one")
    p.add_argument("--seconds", type=float, default=8.0, help="measured seconds per setting")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds before measuring")
    p.add_argument("--torch-workers", default="0,1,2,3,4", help="num_workers to sweep")
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-workers", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child is not None:
        child(a.child, a.data, a.child_workers, a.seconds, a.warmup)
        return
    data = a.data
    if data is None:
        import stoker
        data = stoker.default_dataset(quiet=True)
    data = os.path.abspath(data)
    run = Conditions()

    torch_workers = [int(w) for w in a.torch_workers.split(",") if w.strip()]
    torch_runs = {w: measure(a, data, "torch", w) for w in torch_workers}
    best_w = max(torch_runs, key=lambda w: torch_runs[w]["samples_per_s"])
    dl = measure(a, data, "stoker-dataloader")
    sl = measure(a, data, "stoker-loader")
    # Again, each side's best.
    torch_runs[best_w] = better(torch_runs[best_w], measure(a, data, "torch", best_w))
    dl = better(dl, measure(a, data, "stoker-dataloader"))
    sl = better(sl, measure(a, data, "stoker-loader"))
    worst, labels_equal, eval_batches = fidelity(data, a.eval_batches)
    run.end()

    tbest = torch_runs[best_w]["samples_per_s"]
    rdl, rsl = dl["samples_per_s"], sl["samples_per_s"]
    print(f"torchvision script: ImageFolder + RandomResizedCrop({SIZE}) + flip + ToTensor + "
          f"Normalize, batch {BATCH}, shuffled")
    print(f"data: {data}; {run.line(a.seconds)}")
    for w in torch_workers:
        mark = "  <- best" if w == best_w else ""
        print(f"  torch DataLoader, num_workers={w:<2}       "
              f"{torch_runs[w]['samples_per_s']:8,.0f} images/s{mark}")
    print(f"  stoker.DataLoader, auto (native)       {rdl:8,.0f} images/s"
          f"   (workers {dl['workers_at_end']} at the end)")
    print(f"  stoker.Loader + transforms.train, auto {rsl:8,.0f} images/s"
          f"   (workers {sl['workers_at_end']} at the end)")
    print(f"  stoker.DataLoader / torch best         {rdl / tbest:8.2f} x    goal >= 4 x")
    print(f"  stoker.DataLoader / stoker.Loader      {rdl / rsl:8.2f} x    goal >= 0.9 x")
    print(f"  eval Compose, {eval_batches} batches: largest difference {worst:.3f} uint8 levels "
          f"(goal <= 1), labels {'equal' if labels_equal else 'DIFFER'}")
    json.dump({
        "data": data, "seconds": a.seconds, **run.fields(),
        "torch_images_per_s": {str(w): r["samples_per_s"] for w, r in torch_runs.items()},
        "torch_best_workers": best_w, "torch_best_images_per_s": tbest,
        "stoker_dataloader_images_per_s": rdl, "stoker_loader_images_per_s": rsl,
        "dataloader_vs_torch": rdl / tbest, "dataloader_vs_loader": rdl / rsl,
        "eval_max_levels": worst, "eval_labels_equal": labels_equal,
    }, sys.stderr)
    print(file=sys.stderr)


if __name__ == "__main__":
    main()
