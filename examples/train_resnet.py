#!/usr/bin/env python3
"""Trains torchvision's ResNet-18 on the CPU for a few steps, fed by stoker.

The data is a class-per-folder JPEG tree (default: stoker's built-in
ImageNet-like data set, made on first use). stoker decodes, crops, flips and
normalises on its own worker threads -- how many, the tuner decides while the
model trains -- and hands each batch over as a torch tensor without a copy.
At the end it prints what the tuner decided, and why.

    /usr/bin/python3 examples/train_resnet.py [--steps 10] [--data DIR]

Under torchrun each rank reads its own share of every epoch (the loader is
given RANK and WORLD_SIZE by stoker.shard_from_env()), and the tuner divides
the CPUs among the ranks.
"""

import argparse
import time

import torch
import torchvision

import stoker


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="image folder (default: the built-in data set)")
    p.add_argument("--steps", type=int, default=10, help="optimiser steps")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--size", type=int, default=224, help="crop size")
    p.add_argument("--workers", default="auto", help="'auto' or a thread count")
    p.add_argument("--checkpoint", help="write model + loader state here at the end")
    a = p.parse_args()

    data = a.data or stoker.default_dataset()
    loader = stoker.Loader(
        stoker.ImageFolder(data),
        batch_size=a.batch_size,
        shuffle=True,
        seed=0,
        drop_last=True,
        transforms=stoker.transforms.train(a.size),
        workers=a.workers if a.workers == "auto" else int(a.workers),
        **stoker.shard_from_env(),
    )
    print(f"data: {len(loader.source)} images, {len(loader.classes)} classes in {data}")
    print(f"loader: {len(loader)} batches of {a.batch_size} per epoch, "
          f"rank {loader.rank} of {loader.world_size}")

    model = torchvision.models.resnet18(num_classes=len(loader.classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    criterion = torch.nn.CrossEntropyLoss()
    model.train()

    step, epoch = 0, 0
    start = time.perf_counter()
    while step < a.steps:
        loader.set_epoch(epoch)
        for images, labels in loader:
            loss = criterion(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            s = loader.stats()
            print(f"epoch {epoch} step {step:3d}  loss {loss.item():.3f}  "
                  f"{step * a.batch_size / (time.perf_counter() - start):6.1f} img/s  "
                  f"workers {s['workers']}  data stall {100 * s['stall_fraction']:4.1f} %",
                  flush=True)
            if step == a.steps:
                break
        epoch += 1

    stats = loader.stats()
    tuner = stats["tuner"]
    print("\nwhat the tuner decided")
    if tuner is None:
        print(f"  nothing: fixed at {stats['workers']} workers")
    else:
        print(f"  now: {tuner['workers']} workers, prefetch {tuner['prefetch_batches']} batches, "
              f"phase '{tuner['phase']}' (CPU budget {tuner['cpu_budget_workers']} workers, "
              f"memory budget {tuner['memory_budget_bytes'] / 2**30:.1f} GiB)")
        for d in loader.decisions():
            print(f"  {d['t_s']:6.2f} s  workers {d['workers_before']} -> {d['workers_after']}, "
                  f"prefetch {d['prefetch_before']} -> {d['prefetch_after']}: {d['reason']}")
        if not loader.decisions():
            print("  no change was needed")
    print(f"  the training loop waited for data {100 * stats['stall_fraction']:.1f} % of the time")

    if a.checkpoint:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "loader": loader.state_dict()}, a.checkpoint)
        print(f"checkpoint (model, optimiser, loader position) in {a.checkpoint}")


if __name__ == "__main__":
    main()
