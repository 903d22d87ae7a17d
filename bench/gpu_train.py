#!/usr/bin/env python3
"""A ResNet-50 training loop on one GPU, fed by stoker or by PyTorch's
DataLoader, side by side in one run.

Both read the built-in data set (or --data) with the usual training pipeline
(RandomResizedCrop 224 + flip + normalise, float32) in batches of 64, and
run the same training step (ResNet-50, SGD, bf16 autocast).

- PyTorch: torchvision ImageFolder in a DataLoader(pin_memory=True) at each
  --torch-workers count; its best samples/s is the reference. Batches go to
  the GPU with .cuda(non_blocking=True) on the training stream.
- stoker: stoker.Loader(device="cuda", workers="auto"): the copy runs on
  stoker's own stream and the training stream waits on its event.

For each: samples/s over the measured steps, the GPU's mean utilisation
(NVML, sampled every 100 ms over the same steps) and the copy time the
training stream spends per step, from CUDA events recorded around the hand
over once the batch is on the host (so the host waiting for data does not
count): the DataLoader's copy runs on the training stream, so this is its
whole copy; stoker's stream copies ahead, so this is what is left of it.
"overlap" is 1 - stoker's time / the DataLoader's time for the same bytes.

Needs PyTorch with CUDA and a GPU: without them it says so and exits 2.
Usage: python3 bench/gpu_train.py [--data DIR] [--steps 60] [--warmup 15]
       [--torch-workers 4,8,12,16] [--json]
"""

import argparse
import json
import sys
import time

from proc_memory import Poller

BATCH = 64
SIZE = 224


def _require_cuda():
    try:
        import torch
    except ImportError:
        sys.exit("bench/gpu_train.py needs PyTorch with CUDA and a GPU: torch is not installed")
    if not torch.cuda.is_available():
        why = "was built without CUDA" if torch.version.cuda is None else "sees no GPU"
        print(f"bench/gpu_train.py needs PyTorch with CUDA and a GPU: torch {torch.__version__} "
              f"{why}", file=sys.stderr)
        sys.exit(2)
    return torch


class GpuUtilisation(Poller):
    """Mean NVML utilisation of GPU `index` while running (a thread polls)."""

    def __init__(self, index):
        super().__init__(0.1)
        import stoker._stoker as s
        self._sample = lambda: s.gpu_usage(pcie=False)
        self._index = index
        self._values = []

    def poll(self):
        usage = self._sample()
        if not isinstance(usage, str) and self._index < len(usage):
            self._values.append(usage[self._index]["utilization_percent"])

    def restart(self):
        self._values = []

    def mean(self):
        return sum(self._values) / len(self._values) if self._values else None


# Each yields, per step, a function that hands the next batch to the GPU:
# called between two CUDA events once the batch is ready on the host.
def _torch_batches(torch, data, workers):
    import torchvision
    import torchvision.transforms as T

    tf = T.Compose([T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    dataset = torchvision.datasets.ImageFolder(data, transform=tf)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True, drop_last=True,
                                         num_workers=workers, pin_memory=True,
                                         persistent_workers=workers > 0)
    while True:  # epochs, for as many steps as asked
        for images, labels in loader:  # on the host, pinned
            yield lambda im=images, lb=labels: (im.cuda(non_blocking=True),
                                                lb.cuda(non_blocking=True))


def _stoker_batches(torch, data):
    import stoker

    loader = stoker.Loader(data, batch_size=BATCH, drop_last=True,
                           transforms=stoker.transforms.train(SIZE), workers="auto",
                           device="cuda")

    def hand_over():  # (images, labels) on the GPU, or None at an epoch's end
        return next(loader, None)

    while True:
        # Wait on the host first (as the DataLoader's next() does), so that the
        # events in run() time only the hand-over on the GPU.
        loader._impl.wait_ready(3600)
        yield hand_over


def run(torch, name, batches, steps, warmup):
    import torchvision

    device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(0)
    model = torchvision.models.resnet50(num_classes=1000).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    copy_ms = []
    with GpuUtilisation(device.index) as util:
        for step in range(warmup + steps):
            if step == warmup:
                torch.cuda.synchronize()
                util.restart()
                started = time.perf_counter()
            hand_over = next(batches)
            before = torch.cuda.Event(enable_timing=True)
            after = torch.cuda.Event(enable_timing=True)
            before.record()
            got = hand_over()
            after.record()
            if got is None:  # stoker's epoch ended: that step does not count
                continue
            images, labels = got
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = loss_fn(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step >= warmup:
                copy_ms.append((before, after))
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - started
    batches.close()  # ends the loader and its workers before the next configuration runs
    per_step = [b.elapsed_time(a) for b, a in copy_ms]
    return {"name": name, "samples_per_s": len(copy_ms) * BATCH / elapsed,
            "gpu_util_percent": util.mean(),
            "copy_ms_per_step": sum(per_step) / max(len(per_step), 1)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=None, help="JPEG class folders (default: the built-in set)")
    p.add_argument("--steps", type=int, default=60, help="measured training steps per loader")
    p.add_argument("--warmup", type=int, default=15, help="steps before measuring")
    p.add_argument("--torch-workers", default="4,8,12,16",
                   help="DataLoader num_workers to try; the best is the reference")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    a = p.parse_args()
    torch = _require_cuda()
    import stoker

    data = a.data or stoker.default_dataset()
    torch.backends.cudnn.benchmark = True
    results = []
    for w in (int(x) for x in a.torch_workers.split(",")):
        results.append(run(torch, f"DataLoader(num_workers={w}, pin_memory=True)",
                           _torch_batches(torch, data, w), a.steps, a.warmup))
    best = max(results, key=lambda r: r["samples_per_s"])
    mine = run(torch, 'stoker.Loader(device="cuda", workers="auto")',
               _stoker_batches(torch, data), a.steps, a.warmup)
    results.append(mine)
    overlap = (1 - mine["copy_ms_per_step"] / best["copy_ms_per_step"]
               if best["copy_ms_per_step"] > 0 else None)
    summary = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
               "results": results, "best_torch": best["name"],
               "samples_per_s_ratio": mine["samples_per_s"] / best["samples_per_s"],
               "copy_overlap": overlap}
    if a.json:
        print(json.dumps(summary, indent=2))
        return
    print(f"ResNet-50 training, batch {BATCH}, on {summary['gpu']} (torch {torch.__version__})")
    for r in results:
        util = "n/a" if r["gpu_util_percent"] is None else f"{r['gpu_util_percent']:.0f} %"
        print(f"  {r['name']:<46} {r['samples_per_s']:8.0f} samples/s  GPU {util:>5}  "
              f"copy on the training stream {r['copy_ms_per_step']:.2f} ms/step")
    print(f"stoker / best DataLoader ({best['name']}): "
          f"{summary['samples_per_s_ratio']:.2f}x samples/s; copy overlap "
          + ("n/a" if overlap is None else f"{overlap * 100:.0f} %"))


if __name__ == "__main__":
    main()
