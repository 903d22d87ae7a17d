#!/usr/bin/env python3
"""Does training on DCT-scaled JPEG decodes cost accuracy?

Trains the same small CNN on the built-in data set twice per seed: once with
stoker.transforms.train(..., dct_scaling=True) (libjpeg decodes at 1/2, 1/4,
1/8 scale when that still covers the crop) and once with exact full-size
decoding; everything else is shared (initial weights, batch order, crops and
flips come from the same seed). Validation always uses the exact eval
transform. Prints each seed's accuracy, the paired difference and its 95 %
interval, and whether that interval lies inside +-margin (equivalence shown)
or not (then exact decoding must stay the default for train too).

The data: the built-in data set's 2000 JPEGs. Image i is cut from
photograph i % P (P = 33 installed photographs here); its folder's class is
(i % P) % 10, so a class holds 3-4 photographs. Here each image is labelled
with its photograph (i % P, P counted as make-dataset counts it): a harder
P-class task, telling photographs apart from random crops of them. Every 5th
image is held out.
The resolution is low (default 48 px) to fit a CPU; there DCT
scaling is used for most samples, so this is the setting where it can
matter most.

    PYTHONPATH=build/release/python /usr/bin/python3 bench/dct_accuracy.py \
        --seeds 5 --epochs 4
"""

import argparse
import glob
import math
import os
import statistics
import tempfile
import time

import torch
import torch.nn as nn

import stoker

# Two-sided 95 % Student t quantiles for n - 1 degrees of freedom.
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


def photograph_count(photos="/usr/share/wallpapers"):
    """How many photographs make-dataset cuts from: the largest .jpg/.png of
    each <theme>/contents/images*/ folder."""
    folders = glob.glob(os.path.join(photos, "*", "contents", "images*", ""))
    return sum(any(f.lower().endswith((".jpg", ".jpeg", ".png")) for f in os.listdir(d))
               for d in folders)


def split_lists(root, folder):
    """Writes train.txt / val.txt (path<TAB>photograph) with every 5th image
    held out; image i (from its name, <class>_<i>.jpg) came from photograph i % P."""
    source = stoker.ImageFolder(root)
    photos = photograph_count()
    lines = {"train": [], "val": []}
    for n in range(len(source)):
        key = source.key(n)
        i = int(os.path.splitext(os.path.basename(key))[0].rsplit("_", 1)[1])
        lines["val" if i % 5 == 0 else "train"].append(f"{key}\t{i % photos}\n")
    paths = {}
    for name, rows in lines.items():
        paths[name] = os.path.join(folder, name + ".txt")
        with open(paths[name], "w") as f:
            f.writelines(rows)
    return paths, photos


def small_cnn(classes, width):
    layers, c_in = [], 3
    for c_out in (width, 2 * width, 4 * width, 8 * width):
        layers += [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out),
                   nn.ReLU(inplace=True), nn.MaxPool2d(2)]
        c_in = c_out
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, classes))


def accuracy(model, loader):
    model.eval()
    right = total = 0
    with torch.no_grad():
        for x, y in loader:
            right += (model(x).argmax(1) == y).sum().item()
            total += len(y)
    return right / total


def train_once(lists, classes, seed, dct, a):
    torch.manual_seed(seed)
    model = small_cnn(classes, a.width)
    train = stoker.Loader(stoker.FileList(lists["train"]), batch_size=a.batch_size, seed=seed,
                          transforms=stoker.transforms.train(a.size, dct_scaling=dct),
                          workers=a.workers)
    val = stoker.Loader(stoker.FileList(lists["val"]), batch_size=100, shuffle=False,
                        transforms=stoker.transforms.eval(a.size), workers=a.workers)
    steps = a.epochs * len(train)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=a.lr, total_steps=steps)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(a.epochs):
        model.train()
        train.set_epoch(epoch)
        for x, y in train:
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()
            sched.step()
    return accuracy(model, val)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--size", type=int, default=48, help="train/eval output side, px")
    p.add_argument("--width", type=int, default=16, help="channels of the first conv")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--margin", type=float, default=1.0,
                   help="equivalence margin, accuracy percentage points")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    root = stoker.default_dataset(quiet=True)
    print(f"data: {root}; {a.seeds} seeds x {a.epochs} epochs at {a.size} px, CNN width "
          f"{a.width}; machine shared with other jobs, so times are rough", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        lists, classes = split_lists(root, tmp)
        results = {True: [], False: []}
        for seed in range(a.seeds):
            for dct in (True, False):
                t0 = time.time()
                acc = train_once(lists, classes, seed, dct, a)
                results[dct].append(acc)
                print(f"seed {seed}  dct_scaling={str(dct):5}  val accuracy {100 * acc:5.1f} %  "
                      f"({time.time() - t0:.0f} s)", flush=True)
    diffs = [100 * (s - e) for s, e in zip(results[True], results[False])]
    for dct in (True, False):
        accs = [100 * x for x in results[dct]]
        spread = statistics.stdev(accs) if len(accs) > 1 else float("nan")
        print(f"dct_scaling={str(dct):5}  mean {statistics.mean(accs):5.1f} %  sd {spread:.1f}")
    mean = statistics.mean(diffs)
    if len(diffs) > 1:
        half = T95.get(len(diffs) - 1, 2.0) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    else:
        half = float("inf")
    low, high = mean - half, mean + half
    print(f"paired difference (DCT-scaled - exact): {mean:+.1f} pp, 95 % interval "
          f"[{low:+.1f}, {high:+.1f}] pp")
    if -a.margin <= low and high <= a.margin:
        print(f"verdict: equal within +-{a.margin} pp; DCT scaling may stay the train default")
    else:
        print(f"verdict: equality within +-{a.margin} pp NOT shown; exact decoding is the "
              "default for train")


if __name__ == "__main__":
    main()
