"""How far stoker.DataLoader's native eval pipeline is from torch's DataLoader
on the same ImageFolder: Resize(256) + CenterCrop(224) + ToTensor with the
interpolation given, over the built-in data set (or --data), in uint8 levels.

    /usr/bin/python3 bench/native_fidelity.py --interpolation bicubic
"""

import argparse

import torch
import torchvision.transforms as T
from torchvision.datasets import ImageFolder

import stoker


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interpolation", choices=("bilinear", "bicubic"), default="bicubic")
    parser.add_argument("--data", help="an ImageFolder (default: the built-in data set)")
    parser.add_argument("--batch-size", type=int, default=50)
    args = parser.parse_args()
    root = args.data or stoker.default_dataset(quiet=True)
    mode = T.InterpolationMode(args.interpolation)
    dataset = ImageFolder(root, transform=T.Compose([
        T.Resize(256, interpolation=mode), T.CenterCrop(224), T.ToTensor()]))
    reference = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, num_workers=2)
    worst, batches = [], 0
    with stoker.DataLoader(dataset, batch_size=args.batch_size, num_workers=2) as loader:
        if loader.stats()["pipeline"] != "native":
            raise SystemExit(f"not native: {loader.stats()['pipeline_reason']}")
        for (got, labels), (want, want_labels) in zip(loader, reference):
            if labels.tolist() != want_labels.tolist():
                raise SystemExit(f"labels differ in batch {batches}")
            worst.append(((got.double() - want.double()).abs() * 255).flatten(1).amax(1))
            batches += 1
    worst = torch.cat(worst)
    print(f"{args.interpolation}: {len(worst)} images, {batches} batches, labels equal; "
          f"max {worst.max().item():.3f} levels; images over 1 level: "
          f"{int((worst > 1.001).sum())}, over 2: {int((worst > 2.001).sum())}; "
          f"mean per-image max {worst.mean().item():.3f}")


if __name__ == "__main__":
    main()
