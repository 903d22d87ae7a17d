"""bench/compare_remote.py's dataset, in a module of its own so that Dask
workers (bench/ on their PYTHONPATH) unpickle it by reference: torchvision's
ImageFolder with RandomResizedCrop(224) + RandomHorizontalFlip +
PILToTensor (PIL decode; uint8 CHW tensors, normalised on the consumer),
each sample also carrying its index, so that a run can check that every
sample came exactly once. `repeat` lists the folder that many times (sample
i is image i % len(folder)): a longer epoch from the same files."""

import torch
import torchvision
import torchvision.transforms as T

SIZE = 224


class IndexedImages(torch.utils.data.Dataset):
    def __init__(self, root, repeat=1):
        tf = T.Compose([T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip(), T.PILToTensor()])
        self.folder = torchvision.datasets.ImageFolder(root, transform=tf)
        self.repeat = repeat

    def __len__(self):
        return self.repeat * len(self.folder)

    def __getitem__(self, i):
        image, label = self.folder[i % len(self.folder)]
        return image, label, i
