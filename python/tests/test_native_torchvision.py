"""stoker.DataLoader's native path: a torchvision ImageFolder with a Compose
stoker knows runs in the C++ engine with torchvision's samples, order, labels
and (within 1/255) pixels; random steps draw from torchvision's
distributions; anything else runs the Python path and says why."""

import io
import math
import os
import struct
import zlib

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from torchvision.datasets import DatasetFolder, ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS, default_loader

import stoker

Image = pytest.importorskip("PIL.Image")

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
# float32 normalisation and its inverse leave a few 1e-5 of a level.
SLACK_LEVELS = 1e-3


def _picture(rng, height, width):
    yy, xx = np.mgrid[0:height, 0:width]
    img = np.stack([xx * 255 // width, yy * 255 // height, (xx + yy) * 255 // (height + width)], -1)
    img = img + rng.integers(0, 60, (height, width, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def _write_folder(root, per_class=5, seed=1):
    """root/<class>/ with JPEGs of several sizes and aspects (some smaller than
    the outputs, so both up- and downscaling), a grayscale JPEG and an RGBA PNG."""
    rng = np.random.default_rng(seed)
    for c, name in enumerate(("ant", "bee", "cat")):
        folder = os.path.join(root, name)
        os.makedirs(folder)
        for i in range(per_class):
            h, w = 50 + 37 * i + 3 * c, 170 - 23 * i
            Image.fromarray(_picture(rng, h, w)).save(os.path.join(folder, f"img{i}.jpg"),
                                                      quality=92)
        img = _picture(rng, 81, 67)
        Image.fromarray(img[:, :, 0]).save(os.path.join(folder, "gray.jpg"))
        rgba = np.concatenate([img, img[:, :, :1]], -1)
        Image.fromarray(rgba).save(os.path.join(folder, "alpha.png"))
    return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return _write_folder(str(tmp_path_factory.mktemp("native")))


def _torch_batches(dataset, **kwargs):
    return list(torch.utils.data.DataLoader(dataset, num_workers=0, **kwargs))


def _levels(got, expected, normalised):
    """max |got - expected| per image, in uint8 levels."""
    diff = (got.double() - expected.double()).abs()
    if normalised:
        diff = diff * torch.tensor(STD, dtype=torch.float64).view(1, 3, 1, 1)
    if got.dtype.is_floating_point:
        diff = diff * 255
    return diff.flatten(1).amax(1)


EVAL_PIPELINES = {
    "resize-int-crop-normalize": (
        [T.Resize(72), T.CenterCrop(64), T.ToTensor(), T.Normalize(MEAN, STD)], True),
    "resize-int-crop-pair": ([T.Resize(72), T.CenterCrop((64, 48)), T.ToTensor()], False),
    "resize-pair-crop": ([T.Resize((60, 80)), T.CenterCrop(56), T.ToTensor()], False),
    "resize-pair-alone-normalize": (
        [T.Resize((60, 80)), T.ToTensor(), T.Normalize(MEAN, STD)], True),
    "resize-seq1-crop": ([T.Resize([70]), T.CenterCrop(70), T.ToTensor()], False),
    "piltotensor-uint8": ([T.Resize(72), T.CenterCrop(64), T.PILToTensor()], False),
    "bicubic-resize-int-crop-normalize": (
        [T.Resize(72, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(64),
         T.ToTensor(), T.Normalize(MEAN, STD)], True),
    "bicubic-resize-pair-piltotensor": (
        [T.Resize((60, 80), interpolation=T.InterpolationMode.BICUBIC), T.PILToTensor()], False),
    # CenterCrop larger than the image (or the resized image) pads with zeros.
    "center-alone-normalize": ([T.CenterCrop(96), T.ToTensor(), T.Normalize(MEAN, STD)], True),
    "center-alone-pair-uint8": ([T.CenterCrop((64, 120)), T.PILToTensor()], False),
    "crop-past-resize": ([T.Resize(40), T.CenterCrop((48, 44)), T.ToTensor()], False),
    "bicubic-crop-past-resize-pair": (
        [T.Resize((40, 30), interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(36),
         T.ToTensor(), T.Normalize(MEAN, STD)], True),
    "piltotensor-convert-normalize": (
        [T.Resize(72), T.CenterCrop(64), T.PILToTensor(), T.ConvertImageDtype(torch.float32),
         T.Normalize(MEAN, STD)], True),
}


@pytest.mark.parametrize("name", sorted(EVAL_PIPELINES))
def test_eval_pipelines_give_torchvisions_batches(folder, name):
    steps, normalised = EVAL_PIPELINES[name]
    dataset = ImageFolder(folder, transform=T.Compose(steps))
    expected = _torch_batches(dataset, batch_size=4)
    with stoker.DataLoader(dataset, batch_size=4, num_workers=2) as loader:
        assert loader.stats()["pipeline"] == "native", loader.stats()["pipeline_reason"]
        got = list(loader)
    assert len(got) == len(expected)
    for (images, labels), (want_images, want_labels) in zip(got, expected):
        assert isinstance(got[0], list)  # as default_collate gives it
        assert images.dtype == want_images.dtype and images.shape == want_images.shape
        assert labels.dtype == want_labels.dtype and labels.tolist() == want_labels.tolist()
        worst = _levels(images, want_images, normalised)
        assert worst.max().item() <= 1 + SLACK_LEVELS, (name, worst.tolist())


def _noise_folder(root, sizes, low):
    """root/a/ with a PNG of random pixels in [low, 256) for each (w, h) of `sizes`."""
    (root / "a").mkdir(parents=True)
    rng = np.random.default_rng(4)
    for w, h in sizes:
        pixels = rng.integers(low, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / "a" / f"{w}x{h}.png")
    return str(root)


def _native_within_a_level(root, steps):
    """Asserts that the native path gives torch's batch of every image under root."""
    dataset = ImageFolder(root, transform=T.Compose(steps + [T.PILToTensor()]))
    want = _torch_batches(dataset, batch_size=len(dataset))
    with stoker.DataLoader(dataset, batch_size=len(dataset), num_workers=0) as loader:
        got = list(loader)
        assert loader.stats()["pipeline"] == "native"
    worst = _levels(got[0][0], want[0][0], False)
    assert worst.max().item() <= 1, (steps, worst.tolist())


def test_a_centre_crop_one_to_three_pixels_larger_pads_as_torchvision(tmp_path):
    # torchvision pads (crop - size) // 2 zeros before the image and the rest
    # after: a crop one pixel larger has its zero column (or row) after it.
    sizes = [(19, 20), (18, 20), (17, 20), (20, 19), (20, 18), (20, 17)]
    root = _noise_folder(tmp_path / "pad", sizes, low=64)  # no zeros of their own
    _native_within_a_level(root, [T.CenterCrop(20)])
    _native_within_a_level(root, [T.Resize((19, 18)), T.CenterCrop((20, 21))])


def test_shuffled_order_is_torchs_for_the_same_generator(folder):
    dataset = ImageFolder(folder, transform=T.Compose([T.Resize(40), T.CenterCrop(32),
                                                       T.ToTensor()]))
    expected = _torch_batches(dataset, batch_size=5, shuffle=True,
                              generator=torch.Generator().manual_seed(7), drop_last=True)
    loader = stoker.DataLoader(dataset, batch_size=5, shuffle=True, drop_last=True,
                               generator=torch.Generator().manual_seed(7), num_workers=1)
    got = list(loader)
    assert loader.stats()["pipeline"] == "native"
    assert [b[1].tolist() for b in got] == [b[1].tolist() for b in expected]
    for (images, _), (want, _) in zip(got, expected):
        assert _levels(images, want, False).max().item() <= 1 + SLACK_LEVELS


def test_bicubic_random_resized_crop_runs_natively(folder):
    dataset = ImageFolder(folder, transform=T.Compose([
        T.RandomResizedCrop(48, interpolation=T.InterpolationMode.BICUBIC),
        T.RandomHorizontalFlip(), T.ToTensor()]))
    with stoker.DataLoader(dataset, batch_size=4, num_workers=1) as loader:
        assert loader.stats()["pipeline"] == "native", loader.stats()["pipeline_reason"]
        images, _ = next(iter(loader))
    assert images.shape == (4, 3, 48, 48)
    assert images.min().item() >= 0.0 and images.max().item() <= 1.0  # clamped


def test_a_flip_before_random_resized_crop_gives_torchvisions_centre_fallback(tmp_path):
    # A ratio range the images lie outside: get_params takes its centre box,
    # of the flipped image when the flip comes first, whose mirror is a pixel
    # right of the original's centre box where the spare width is odd (101).
    root = _noise_folder(tmp_path / "rrc", [(101, 80), (100, 80), (64, 40)], low=0)
    crop = dict(size=(20, 8), scale=(1, 1), ratio=(0.1, 0.2))
    _native_within_a_level(root, [T.RandomHorizontalFlip(1.0), T.RandomResizedCrop(**crop)])
    _native_within_a_level(root, [T.RandomResizedCrop(**crop), T.RandomHorizontalFlip(1.0)])


TRAIN = [T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.ToTensor(),
         T.Normalize(MEAN, STD)]


def test_train_compose_runs_natively_the_same_for_any_worker_count(folder):
    dataset = ImageFolder(folder, transform=T.Compose(TRAIN))
    runs = []
    for workers in (0, 1, 3):
        torch.manual_seed(3)
        loader = stoker.DataLoader(dataset, batch_size=4, shuffle=True, num_workers=workers)
        stats = loader.stats()
        assert stats["pipeline"] == "native" and stats["pipeline_reason"] == ""
        assert "RandomResizedCrop" in stats["pipeline_steps"]
        runs.append([list(loader), list(loader)])  # two epochs
        loader.close()
    torch.manual_seed(3)
    order = [b[1].tolist() for b in _torch_batches(dataset, batch_size=4, shuffle=True)]
    for run in runs:
        assert [b[1].tolist() for b in run[0]] == order
        assert run[0][0][0].shape == (4, 3, 48, 48) and run[0][0][0].dtype == torch.float32
        for epoch in range(2):
            for (a, la), (b, lb) in zip(run[epoch], runs[0][epoch]):
                assert torch.equal(a, b) and torch.equal(la, lb)
    # Each epoch draws anew.
    assert not torch.equal(runs[0][0][0][0], runs[0][1][0][0])


def test_batch_sampler_drop_last_and_a_checkpoint_work_natively(folder):
    dataset = ImageFolder(folder, transform=T.Compose(TRAIN))
    sampler = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(dataset), 6,
                                            drop_last=True)
    loader = stoker.DataLoader(dataset, batch_sampler=sampler, num_workers=2)
    assert loader.stats()["pipeline"] == "native"
    full = list(loader)
    assert len(full) == len(dataset) // 6 and all(len(b[1]) == 6 for b in full)
    # Resume after two batches in a new loader with another worker count.
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    expected = list(it)
    loader.close()
    again = stoker.DataLoader(dataset, batch_sampler=sampler, num_workers=0)
    again.load_state_dict(state)
    rest = list(again)
    assert len(rest) == len(expected) == len(full) - 2
    for (a, la), (b, lb) in zip(rest, expected):
        assert torch.equal(la, lb) and torch.equal(a, b)


def test_a_batch_sampler_without_a_batch_size_runs_python(folder):
    dataset = ImageFolder(folder, transform=T.Compose(TRAIN))
    loader = stoker.DataLoader(dataset, batch_sampler=[[0, 1], [2, 3, 4]], num_workers=0)
    assert loader.stats()["pipeline"] == "python"
    assert "batch_sampler" in loader.stats()["pipeline_reason"]
    assert [len(b[1]) for b in loader] == [2, 3]


def test_datasetfolder_with_torchvisions_loader_runs_natively(folder):
    dataset = DatasetFolder(folder, default_loader, extensions=IMG_EXTENSIONS,
                            transform=T.Compose([T.Resize((32, 32)), T.PILToTensor()]))
    loader = stoker.DataLoader(dataset, batch_size=8, num_workers=1)
    assert loader.stats()["pipeline"] == "native"
    got = torch.cat([b[1] for b in loader]).tolist()
    assert got == dataset.targets


# -- random steps draw from torchvision's distributions ----------------------

def _gradient_folder(root, copies):
    """`copies` PNGs of 256x256 whose red is the column and green the row: a
    crop's box can be read back from the resampled output."""
    yy, xx = np.mgrid[0:256, 0:256]
    img = np.stack([xx, yy, np.zeros_like(xx)], -1).astype(np.uint8)
    os.makedirs(os.path.join(root, "only"))
    for i in range(copies):
        Image.fromarray(img).save(os.path.join(root, "only", f"g{i:03d}.png"))
    return root


def _boxes(images, size):
    """(width, height, flipped) of each sample's crop, from the gradients:
    over the interior, output column j holds x0 + (j + 0.5) * w / size - 0.5."""
    j = torch.arange(8, size - 8, dtype=torch.float64) + 0.5
    out = []
    for img in images.double() * 255:
        red = img[0, size // 2, 8:size - 8]
        green = img[1, 8:size - 8, size // 2]
        slope_x = float(np.polyfit(j.numpy(), red.numpy(), 1)[0])
        slope_y = float(np.polyfit(j.numpy(), green.numpy(), 1)[0])
        out.append((round(abs(slope_x) * size), round(slope_y * size), slope_x < 0))
    return out


def _ks(a, b):
    """The two-sample Kolmogorov-Smirnov statistic."""
    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    return float(np.max(np.abs(np.searchsorted(a, grid, side="right") / len(a) -
                               np.searchsorted(b, grid, side="right") / len(b))))


@pytest.mark.parametrize("scale, ratio, p", [((0.08, 1.0), (3 / 4, 4 / 3), 0.5),
                                             ((0.3, 0.7), (0.5, 2.0), 0.2)])
def test_random_resized_crop_and_flip_follow_torchvisions_distributions(tmp_path, scale, ratio,
                                                                         p):
    size, copies, epochs = 64, 50, 40
    dataset = ImageFolder(_gradient_folder(str(tmp_path), copies),
                          transform=T.Compose([T.RandomResizedCrop(size, scale, ratio),
                                               T.RandomHorizontalFlip(p), T.ToTensor()]))
    loader = stoker.DataLoader(dataset, batch_size=copies, shuffle=True, num_workers=2,
                               generator=torch.Generator().manual_seed(11))
    assert loader.stats()["pipeline"] == "native"
    boxes = [box for _ in range(epochs) for images, _ in loader for box in _boxes(images, size)]
    assert len(boxes) == copies * epochs
    # torchvision's own sampler, many draws.
    torch.manual_seed(0)
    image = Image.new("RGB", (256, 256))
    theirs = [T.RandomResizedCrop.get_params(image, list(scale), list(ratio))
              for _ in range(20000)]
    area = 256.0 * 256.0
    mine_scale = np.array([w * h / area for w, h, _ in boxes])
    mine_ratio = np.array([math.log(w / h) for w, h, _ in boxes])
    their_scale = np.array([w * h / area for _, _, h, w in theirs])
    their_ratio = np.array([math.log(w / h) for _, _, h, w in theirs])
    # Histograms over the ranges, and the KS statistic (alpha = 0.001).
    critical = 1.95 * math.sqrt((len(boxes) + len(theirs)) / (len(boxes) * len(theirs)))
    for mine, their, bins in ((mine_scale, their_scale, np.linspace(scale[0], scale[1], 11)),
                              (mine_ratio, their_ratio,
                               np.linspace(math.log(ratio[0]), math.log(ratio[1]), 11))):
        h_mine = np.histogram(mine, bins)[0] / len(mine)
        h_their = np.histogram(their, bins)[0] / len(their)
        assert np.abs(h_mine - h_their).max() < 0.03, (h_mine, h_their)
        assert _ks(mine, their) < critical
    flips = np.mean([f for _, _, f in boxes])
    assert abs(flips - p) < 4.5 * math.sqrt(p * (1 - p) / len(boxes)), flips


# -- anything else runs the Python path, and says why ------------------------

class _Sub(ImageFolder):
    def __getitem__(self, i):
        return super().__getitem__(i)


def _custom_loader(path):
    return default_loader(path)


def _collate(batch):
    return torch.utils.data.default_collate(batch)


FALLBACKS = {
    "ColorJitter": (dict(transform=T.Compose([T.RandomResizedCrop(32), T.ColorJitter(0.4),
                                              T.ToTensor()])),
                    {}, "transform step ColorJitter is not native"),
    "Lambda": (dict(transform=T.Compose([T.Resize((32, 32)), T.Lambda(lambda x: x),
                                         T.ToTensor()])),
               {}, "transform step Lambda is not native"),
    "nearest": (dict(transform=T.Compose([
        T.RandomResizedCrop(32, interpolation=T.InterpolationMode.NEAREST), T.ToTensor()])),
        {}, "RandomResizedCrop interpolation nearest is not native"),
    "max_size": (dict(transform=T.Compose([T.Resize(32, max_size=40), T.CenterCrop(32),
                                           T.ToTensor()])),
                 {}, "Resize max_size=40 is not native"),
    "resize-int-alone": (dict(transform=T.Compose([T.Resize(32), T.ToTensor()])), {},
                         "Resize(32) without CenterCrop"),
    "no-tensor": (dict(transform=T.Compose([T.Resize((32, 32))])), {},
                  "no ToTensor or PILToTensor"),
    "no-transform": (dict(), {}, "the dataset has no transform"),
    "normalize-uint8": (dict(transform=T.Compose([T.Resize((32, 32)), T.PILToTensor(),
                                                  T.Normalize(MEAN, STD)])), {},
                        "Normalize of a tensor that is not float"),
    "resize-after-tensor": (dict(transform=T.Compose([T.ToTensor(), T.Resize((32, 32))])), {},
                            "Resize after the image became a tensor"),
    "flip-with-eval": (dict(transform=T.Compose([T.Resize((32, 32)), T.RandomHorizontalFlip(),
                                                 T.ToTensor()])), {},
                       "RandomHorizontalFlip with Resize or CenterCrop"),
    "subclassed-step": (dict(transform=T.Compose([type("MyResize", (T.Resize,), {})((32, 32)),
                                                  T.ToTensor()])), {},
                        "transform step MyResize is not native"),
    "target_transform": (dict(transform=T.Compose([T.Resize((32, 32)), T.ToTensor()]),
                              target_transform=int), {}, "target_transform int runs Python"),
    "collate_fn": (dict(transform=T.Compose([T.Resize((32, 32)), T.ToTensor()])),
                   dict(collate_fn=_collate), "collate_fn _collate is not torch's"),
    "native=False": (dict(transform=T.Compose([T.Resize((32, 32)), T.ToTensor()])),
                     dict(native=False), "native=False"),
    "unbatched": (dict(transform=T.Compose([T.Resize((32, 32)), T.ToTensor()])),
                  dict(batch_size=None), "batch_size=None"),
    # PIL refuses or rounds a float size where stoker truncated it.
    "float-center-crop": (dict(transform=T.Compose([T.CenterCrop((20.6, 20.6)),
                                                    T.PILToTensor()])), {},
                          "CenterCrop size (20.6, 20.6) is not of ints"),
    "float-resize": (dict(transform=T.Compose([T.Resize((30.6, 30)), T.ToTensor()])), {},
                     "Resize size (30.6, 30) is not of ints"),
}


@pytest.mark.parametrize("name", sorted(FALLBACKS))
def test_what_is_not_native_runs_python_and_says_why(folder, name):
    dataset_kwargs, loader_kwargs, reason = FALLBACKS[name]
    dataset = ImageFolder(folder, **dataset_kwargs)
    loader_kwargs = dict(dict(batch_size=4, num_workers=0), **loader_kwargs)
    with stoker.DataLoader(dataset, **loader_kwargs) as loader:
        stats = loader.stats()
        assert stats["pipeline"] == "python"
        assert reason in stats["pipeline_reason"], stats["pipeline_reason"]
        # The Python path runs it as today (where torchvision can batch it).
        if "transform" in dataset_kwargs and name not in (
                "no-tensor", "resize-int-alone", "center-alone",
                "normalize-uint8", "float-resize"):  # PIL refuses a float size
            next(iter(loader))


@pytest.mark.parametrize("make, reason", [
    (lambda root, t: _Sub(root, transform=t), "is a subclass of torchvision's DatasetFolder"),
    (lambda root, t: ImageFolder(root, transform=t, loader=_custom_loader),
     "loader _custom_loader is not torchvision's default_loader"),
    (lambda root, t: torch.utils.data.Subset(_Sub(root, transform=t), [0, 1, 2]),
     "is a subclass of torchvision's DatasetFolder"),
    (lambda root, t: torch.utils.data.ConcatDataset([ImageFolder(root, transform=t)] * 2),
     "dataset ConcatDataset is not torchvision's ImageFolder"),
])
def test_datasets_stoker_cannot_see_through_run_python(folder, make, reason):
    dataset = make(folder, T.Compose([T.Resize((32, 32)), T.ToTensor()]))
    with stoker.DataLoader(dataset, batch_size=2, num_workers=0) as loader:
        assert loader.stats()["pipeline"] == "python"
        assert reason in loader.stats()["pipeline_reason"]
        images, _ = next(iter(loader))
        assert images.shape == (2, 3, 32, 32)


def _labels_plus_100(self, index):
    path, target = self.samples[index]
    return self.transform(self.loader(path)), target + 100


def _normalize_times_10(self, tensor):
    return (tensor - 0.5) * 10


@pytest.mark.parametrize("patched, reason", [
    ((ImageFolder, "__getitem__", _labels_plus_100),
     "ImageFolder.__getitem__ is _labels_plus_100, not torchvision's own"),
    ((T.Normalize, "forward", _normalize_times_10),
     "transform step Normalize's forward is _normalize_times_10, not torchvision's own"),
])
def test_a_class_patched_by_the_script_runs_the_python_path(folder, monkeypatch, patched, reason):
    # Only instances and module functions were looked at: with a class's
    # method patched, the native path gave torchvision's own samples.
    monkeypatch.setattr(*patched)
    dataset = ImageFolder(folder, transform=T.Compose([T.CenterCrop(16), T.ToTensor(),
                                                       T.Normalize([0.5] * 3, [0.2] * 3)]))
    want = _torch_batches(dataset, batch_size=8)
    with stoker.DataLoader(dataset, batch_size=8, num_workers=0) as loader:
        got = list(loader)
        assert loader.stats()["pipeline"] == "python"
        assert reason in loader.stats()["pipeline_reason"], loader.stats()["pipeline_reason"]
    assert all(torch.equal(g[0], w[0]) and torch.equal(g[1], w[1]) for g, w in zip(got, want))


def _gray_loader(path):
    with open(path, "rb") as f:
        return Image.open(f).convert("L").convert("RGB")


_PILS_OPEN = Image.open


def _gray_open(fp, *args, **kwargs):
    return _PILS_OPEN(fp, *args, **kwargs).convert("L")


@pytest.mark.parametrize("patched, reason", [
    ("pil_loader", "torchvision.datasets.folder.pil_loader is _gray_loader, not torchvision's own"),
    ("loader=pil_loader", "loader _gray_loader is not torchvision's default_loader"),
    ("Image.open", "PIL.Image.open is _gray_open, not PIL's own"),
])
def test_a_patched_image_loader_runs_python_as_torch_calls_it(folder, monkeypatch, patched,
                                                               reason):
    # default_loader looks up folder.pil_loader, and it PIL.Image.open, at
    # each call: a script that patches either changes torch's samples.
    import torchvision.datasets.folder as tv_folder
    if patched == "Image.open":
        monkeypatch.setattr(Image, "open", _gray_open)
    else:
        monkeypatch.setattr(tv_folder, "pil_loader", _gray_loader)
    load = tv_folder.pil_loader if patched == "loader=pil_loader" else default_loader
    dataset = ImageFolder(folder, transform=T.Compose([T.CenterCrop(16), T.PILToTensor()]),
                          loader=load)
    want = _torch_batches(dataset, batch_size=8)
    with stoker.DataLoader(dataset, batch_size=8, num_workers=0) as loader:
        got = list(loader)
        assert loader.stats()["pipeline"] == "python"
        assert reason in loader.stats()["pipeline_reason"], loader.stats()["pipeline_reason"]
    assert all(torch.equal(g[0], w[0]) for g, w in zip(got, want))
    assert (got[0][0][:, 0] == got[0][0][:, 1]).all()  # gray: the patch ran


def test_a_label_past_int64_runs_python_and_fails_at_its_batch_as_torchs(folder):
    # Before, pybind11 refused the whole source with a repr of every sample.
    dataset = ImageFolder(folder, transform=T.Compose([T.Resize((16, 16)), T.PILToTensor()]))
    path = dataset.samples[5][0]
    dataset.samples[5] = (path, 2**64)
    with pytest.raises(RuntimeError, match="Overflow when unpacking long"):
        _torch_batches(dataset, batch_size=4)
    with stoker.DataLoader(dataset, batch_size=4, num_workers=0) as loader:
        assert loader.stats()["pipeline"] == "python"
        assert (f"label {2**64} of {path!r} does not fit in int64" in
                loader.stats()["pipeline_reason"])
        it = iter(loader)
        next(it)
        with pytest.raises(RuntimeError, match="Overflow when unpacking long"):
            next(it)


@pytest.mark.parametrize("kind, native", [(np.int32, False), (np.int64, True), (int, True)])
def test_labels_keep_the_type_default_collate_gives_them(folder, kind, native):
    dataset = ImageFolder(folder, transform=T.Compose([T.Resize((16, 16)), T.PILToTensor()]))
    dataset.samples = [(path, kind(label)) for path, label in dataset.samples]
    want = _torch_batches(dataset, batch_size=4)
    with stoker.DataLoader(dataset, batch_size=4, num_workers=0) as loader:
        got = list(loader)
        assert (loader.stats()["pipeline"] == "native") == native
    assert [g[1].dtype for g in got] == [w[1].dtype for w in want]
    assert all(torch.equal(g[1], w[1]) for g, w in zip(got, want))


def test_other_image_formats_run_python(tmp_path):
    root = _write_folder(str(tmp_path / "bmp"), per_class=2)
    Image.fromarray(np.zeros((20, 20, 3), np.uint8)).save(os.path.join(root, "ant", "z.bmp"))
    dataset = ImageFolder(root, transform=T.Compose([T.Resize((16, 16)), T.ToTensor()]))
    with stoker.DataLoader(dataset, batch_size=2, num_workers=0) as loader:
        assert loader.stats()["pipeline"] == "python"
        assert "z.bmp' is not .jpg, .jpeg or .png" in loader.stats()["pipeline_reason"]


def test_png_bit_depths_and_colour_types_decode_as_pil_does(tmp_path):
    # 16-bit gray is PIL's mode "I", whose RGB clamps each value to 255 (not
    # its high byte, as 16-bit RGB keeps): the native decoder gives the same.
    root = tmp_path / "png"
    (root / "a").mkdir(parents=True)
    rng = np.random.default_rng(3)
    Image.fromarray(rng.integers(0, 65536, (30, 40)).astype(np.uint16)).save(root / "a" / "g16.png")
    Image.fromarray(rng.integers(0, 300, (30, 40)).astype(np.uint16)).save(root / "a" / "low.png")
    Image.fromarray(rng.integers(0, 256, (30, 40), dtype=np.uint8)).save(root / "a" / "g8.png")
    Image.fromarray(rng.integers(0, 256, (30, 40), dtype=np.uint8)).convert("1").save(
        root / "a" / "g1.png")
    Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)).convert("P").save(
        root / "a" / "pal.png")
    Image.fromarray(rng.integers(0, 256, (30, 40, 2), dtype=np.uint8), "LA").save(
        root / "a" / "la.png")
    dataset = ImageFolder(str(root), transform=T.Compose([T.CenterCrop(28), T.PILToTensor()]))
    want = _torch_batches(dataset, batch_size=8)
    with stoker.DataLoader(dataset, batch_size=8, num_workers=1) as loader:
        got = list(loader)
        assert loader.stats()["pipeline"] == "native"
    for (path, _), g, w in zip(dataset.samples, got[0][0], want[0][0]):
        assert torch.equal(g, w), path


def test_pils_load_truncated_images_runs_python_as_torchvision_reads(tmp_path, monkeypatch):
    # A training script that lets PIL decode files cut short gets them
    # decoded, as with torch, not refused by stoker's decoder.
    from PIL import ImageFile
    root = _write_folder(str(tmp_path / "cut"), per_class=2)
    cut = os.path.join(root, "bee", "img1.jpg")
    with open(cut, "rb") as f:
        data = f.read()
    with open(cut, "wb") as f:
        f.write(data[:len(data) * 2 // 3])
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    dataset = ImageFolder(root, transform=T.Compose([T.CenterCrop(16), T.PILToTensor()]))
    want = _torch_batches(dataset, batch_size=4)
    with stoker.DataLoader(dataset, batch_size=4, num_workers=1) as loader:
        assert loader.stats()["pipeline"] == "python"
        assert "LOAD_TRUNCATED_IMAGES" in loader.stats()["pipeline_reason"]
        got = list(loader)
    assert all(torch.equal(g[0], w[0]) and torch.equal(g[1], w[1]) for g, w in zip(got, want))


def test_pils_pixel_limit_is_the_native_paths(tmp_path, monkeypatch):
    # PIL opens an image of up to twice Image.MAX_IMAGE_PIXELS (past it:
    # DecompressionBombError); None lifts the limit. The native path follows.
    import warnings
    root = tmp_path / "big"
    (root / "a").mkdir(parents=True)
    Image.fromarray(np.full((30, 40, 3), 90, np.uint8)).save(root / "a" / "big.png")
    dataset = ImageFolder(str(root), transform=T.Compose([T.CenterCrop(16), T.PILToTensor()]))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 1,200 pixels: a warning for PIL
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        want = _torch_batches(dataset, batch_size=1)
    with stoker.DataLoader(dataset, batch_size=1, num_workers=0) as loader:
        assert loader.stats()["pipeline"] == "native"
        assert torch.equal(list(loader)[0][0], want[0][0])
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 500)  # past twice: refused by both
    with pytest.raises(Image.DecompressionBombError):
        _torch_batches(dataset, batch_size=1)
    with stoker.DataLoader(dataset, batch_size=1, num_workers=0) as loader:
        with pytest.raises(stoker.ResourceError, match="more than max_pixels = 1000"):
            list(loader)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    with stoker.DataLoader(dataset, batch_size=1, num_workers=0) as loader:
        assert torch.equal(list(loader)[0][0], want[0][0])


def _png_chunk(kind, data, crc_flip=0):
    crc = zlib.crc32(kind + data) ^ crc_flip
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def _damaged_files_pil_reads(root):
    """Files with damage PIL decodes anyway, in root/a: JPEGs whose scan data
    is cut short and closed by EOI or holds a bad Huffman code (libjpeg only
    warns), a PNG whose image data has bad CRCs (never checked by Pillow) and
    a palette PNG with indices past its PLTE (the grey of their value)."""
    rng = np.random.default_rng(5)
    os.makedirs(os.path.join(root, "a"))
    for name, progressive in (("base", False), ("prog", True)):
        buf = io.BytesIO()
        Image.fromarray(_picture(rng, 64, 80)).save(buf, "JPEG", quality=90,
                                                    progressive=progressive)
        data = buf.getvalue()
        mid = (data.find(b"\xff\xda") + len(data)) // 2
        with open(os.path.join(root, "a", f"{name}_cut.jpg"), "wb") as f:
            f.write(data[:mid] + b"\xff\xd9")
        with open(os.path.join(root, "a", f"{name}_huffman.jpg"), "wb") as f:
            f.write(data[:mid] + b"\xff\x00" * 20 + data[mid + 40:])
    buf = io.BytesIO()
    Image.fromarray(_picture(rng, 40, 50)).save(buf, "PNG")
    data = buf.getvalue()
    idat = data.find(b"IDAT") - 4
    end = idat + 12 + struct.unpack(">I", data[idat:idat + 4])[0]
    with open(os.path.join(root, "a", "idat_crc.png"), "wb") as f:
        f.write(data[:end - 1] + bytes([data[end - 1] ^ 0xFF]) + data[end:])
    raw = b"".join(b"\x00" + bytes(range(y * 16, y * 16 + 16)) for y in range(16))
    with open(os.path.join(root, "a", "short_palette.png"), "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n"
                + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", 16, 16, 8, 3, 0, 0, 0))
                + _png_chunk(b"PLTE", bytes([255, 0, 0, 0, 255, 0]))
                + _png_chunk(b"IDAT", zlib.compress(raw)) + _png_chunk(b"IEND", b""))


def test_damaged_files_pil_decodes_give_torchvisions_samples_natively(tmp_path):
    # torchvision's sample is what PIL makes of such a file: the native path
    # gives the same pixels, not an error nor black for the palette's grey.
    root = str(tmp_path / "damaged")
    _damaged_files_pil_reads(root)
    dataset = ImageFolder(root, transform=T.Compose([T.CenterCrop(40), T.PILToTensor()]))
    want = _torch_batches(dataset, batch_size=1)
    with stoker.DataLoader(dataset, batch_size=1, num_workers=1) as loader:
        assert loader.stats()["pipeline"] == "native"
        got = list(loader)
    assert len(got) == len(want) == 6
    for (path, _), g, w in zip(dataset.samples, got, want):
        assert torch.equal(g[0], w[0]), os.path.basename(path)


def test_a_bad_crc_before_the_png_image_data_fails_natively_as_in_pil(tmp_path):
    root = tmp_path / "crc"
    (root / "a").mkdir(parents=True)
    buf = io.BytesIO()
    Image.fromarray(np.full((20, 20, 3), 90, np.uint8)).save(buf, "PNG")
    data = buf.getvalue()
    gama = _png_chunk(b"gAMA", struct.pack(">I", 45455), crc_flip=1)
    (root / "a" / "gama.png").write_bytes(data[:33] + gama + data[33:])  # after IHDR
    dataset = ImageFolder(str(root), transform=T.Compose([T.CenterCrop(16), T.PILToTensor()]))
    with pytest.raises(OSError):  # PIL: UnidentifiedImageError
        _torch_batches(dataset, batch_size=1)
    with stoker.DataLoader(dataset, batch_size=1, num_workers=0) as loader:
        assert loader.stats()["pipeline"] == "native"
        with pytest.raises(stoker.DataError, match="gAMA: CRC error"):
            list(loader)


def test_a_batch_sampler_giving_more_than_its_batch_size_runs_natively(folder):
    class Bucketing:  # batch_size says what it mostly gives, not the most
        batch_size = 2

        def __iter__(self):
            return iter([[0, 1, 2], [3], [4, 1, 5, 6, 7]])

        def __len__(self):
            return 3

    dataset = ImageFolder(folder, transform=T.Compose([T.CenterCrop(24), T.PILToTensor()]))
    want = _torch_batches(dataset, batch_sampler=Bucketing())
    with stoker.DataLoader(dataset, batch_sampler=Bucketing(), num_workers=1) as loader:
        for _ in range(2):  # the second epoch in the run made with room for five
            got = list(loader)
            assert [g[0].shape[0] for g in got] == [3, 1, 5]
            assert all(torch.equal(g[0], w[0]) and torch.equal(g[1], w[1])
                       for g, w in zip(got, want))
        assert loader.stats()["pipeline"] == "native" and loader._remade == 1


class _WithAnEmptyBatch:
    batch_size = 4

    def __iter__(self):
        return iter([[0, 1], [], [2, 3]])

    def __len__(self):
        return 3


@pytest.mark.parametrize("native", [True, False])
def test_an_empty_batch_raises_as_default_collate_does_then_the_rest_arrives(folder, native):
    # The native path dropped it: an epoch one batch short of len(loader), silently.
    dataset = ImageFolder(folder, transform=T.Compose([T.CenterCrop(24), T.PILToTensor()]))
    with pytest.raises(IndexError):
        _torch_batches(dataset, batch_sampler=_WithAnEmptyBatch())
    with stoker.DataLoader(dataset, batch_sampler=_WithAnEmptyBatch(), num_workers=1,
                           native=native) as loader:
        assert loader.stats()["pipeline"] == ("native" if native else "python")
        assert len(loader) == 3
        it = iter(loader)
        assert next(it)[1].tolist() == dataset.targets[0:2]
        with pytest.raises(IndexError, match=r"^batch 1 of epoch 0: collate_fn raised "
                                             r"IndexError: list index out of range") as raised:
            next(it)
        assert isinstance(raised.value, stoker.DataError)
        assert isinstance(raised.value.__cause__, IndexError)
        assert next(it)[1].tolist() == dataset.targets[2:4]
        with pytest.raises(StopIteration):
            next(it)


def test_a_batch_size_past_the_data_sets_end_holds_room_for_what_the_sampler_gives(folder):
    # 100,000 samples of 224x224 would be 60 GB of room; an epoch gives 21.
    dataset = ImageFolder(folder, transform=T.Compose([T.Resize((224, 224)), T.ToTensor()]))
    want = _torch_batches(dataset, batch_size=100_000)
    with stoker.DataLoader(dataset, batch_size=100_000, num_workers=1,
                           memory_budget_bytes=1 << 30) as loader:
        got = list(loader)
        assert loader.stats()["pipeline"] == "native"
    assert len(got) == 1 and torch.equal(got[0][1], want[0][1])
    assert (got[0][0] - want[0][0]).abs().max() <= 1 / 255 + 1e-6
    # A batch over the budget is named as a batch, not as batch_size 1 of the engine's items.
    with pytest.raises(ValueError, match=r"^one batch takes 6\.9 MiB; a loader needs room for "
                                         r"three .* memory budget of 9\.5 MiB"):
        stoker.DataLoader(dataset, batch_size=12, num_workers=1, memory_budget_bytes=10_000_000)


def test_negative_sampler_keys_index_from_the_end_natively_as_torch_does(folder):
    # ImageFolder.samples is a list: torch reads key -1 as its last sample.
    # Before, the native path failed those samples ("index -1 is out of range").
    dataset = ImageFolder(folder, transform=T.Compose([T.CenterCrop(24), T.PILToTensor()]))
    sampler = [-1, -2, 0, -len(dataset)]
    want = _torch_batches(dataset, batch_size=2, sampler=sampler)
    with stoker.DataLoader(dataset, batch_size=2, sampler=sampler, num_workers=1) as loader:
        got = list(loader)
        assert loader.stats()["pipeline"] == "native"
    assert len(got) == len(want)
    assert all(torch.equal(g[0], w[0]) and torch.equal(g[1], w[1]) for g, w in zip(got, want))
    # A key past either end is torch's IndexError on both paths (the native
    # one raised DataError[OSError], which `except IndexError` missed).
    for key in (len(dataset), -len(dataset) - 1):
        for native in (True, False):
            with stoker.DataLoader(dataset, batch_size=2, sampler=[0, key], num_workers=0,
                                   native=native) as loader:
                with pytest.raises(IndexError) as raised:
                    list(loader)
                assert loader.stats()["pipeline"] == ("native" if native else "python")
            assert isinstance(raised.value, stoker.DataError) and raised.value.index == key
    with stoker.DataLoader(dataset, batch_size=2, sampler=[0, len(dataset), 1], num_workers=0,
                           on_error="skip") as loader:
        labels = torch.cat([labels for _, labels in loader]).tolist()
    assert labels == [dataset.targets[0], dataset.targets[1]]  # the one past the end skipped


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sample_picked_twice_in_a_batch_gets_two_crops_natively(folder, workers):
    # A sampler with replacement (class balancing, repeated augmentation)
    # picks one image several times in a batch; under torch each pick is its
    # own crop and flip. The native path gave every pick the same pixels.
    dataset = ImageFolder(folder, transform=T.Compose(TRAIN))
    sampler = [0] * 6 + [-len(dataset), 1]  # -len is key 0 too
    runs = []
    for _ in range(2):
        torch.manual_seed(5)
        with stoker.DataLoader(dataset, batch_size=8, sampler=sampler,
                               num_workers=workers) as loader:
            runs.append(next(iter(loader))[0])
            assert loader.stats()["pipeline"] == "native"
    crops = {runs[0][i].numpy().tobytes() for i in range(7)}
    assert len(crops) == 7
    assert torch.equal(runs[0], runs[1])  # the same seed, the same draws


def test_subsets_of_an_image_folder_run_natively(folder):
    # random_split's Subsets (and a Subset of one) are seen through: the same
    # samples, in the Subset's order, as torch's loader gives them.
    dataset = ImageFolder(folder, transform=T.Compose([T.Resize(40), T.CenterCrop(32),
                                                       T.PILToTensor()]))
    train, val = torch.utils.data.random_split(dataset, [0.75, 0.25],
                                               generator=torch.Generator().manual_seed(0))
    nested = torch.utils.data.Subset(train, [5, 0, 3, 3])
    for subset in (train, val, nested):
        want = _torch_batches(subset, batch_size=4)
        with stoker.DataLoader(subset, batch_size=4, num_workers=1) as loader:
            got = list(loader)
            assert loader.stats()["pipeline"] == "native"
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert torch.equal(g[1], w[1]) and bool((_levels(g[0], w[0], False) <= 1).all())


# -- a file named .jpg holding another format: through PIL, as torchvision --

def test_a_file_named_jpeg_holding_another_format_gives_torchvisions_pixels(tmp_path):
    rng = np.random.default_rng(4)
    root = tmp_path / "misnamed"
    (root / "c").mkdir(parents=True)
    for i, fmt in enumerate(["JPEG", "GIF", "BMP", "WEBP", "TIFF", "PNG"]):
        Image.fromarray(_picture(rng, 40 + i, 50)).save(root / "c" / f"{i}.jpg", format=fmt)
    for steps in ([T.Resize(32), T.CenterCrop(32), T.ToTensor()],
                  [T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.PILToTensor()]):
        dataset = ImageFolder(str(root), transform=T.Compose(steps))
        with stoker.DataLoader(dataset, batch_size=3, num_workers=2) as loader:
            assert loader.stats()["pipeline"] == "native", loader.stats()["pipeline_reason"]
            got = list(loader)
        assert [len(b[1]) for b in got] == [3, 3]
        if isinstance(steps[0], T.Resize):  # random crops: the shapes alone
            expected = _torch_batches(dataset, batch_size=3)
            for (images, _), (want, _) in zip(got, expected):
                assert _levels(images, want, False).max() <= 1 + SLACK_LEVELS


# -- a bad file: as the Python path ------------------------------------------

@pytest.fixture
def bad_folder(tmp_path):
    root = _write_folder(str(tmp_path / "bad"), per_class=3)
    bad = os.path.join(root, "bee", "img1.jpg")
    with open(bad, "wb") as f:
        f.write(b"this is not a JPEG at all")
    return root, bad


@pytest.mark.parametrize("native", [True, False])
def test_a_bad_file_raises_naming_it_then_the_rest_arrives(bad_folder, native):
    root, bad = bad_folder
    dataset = ImageFolder(root, transform=T.Compose([T.Resize((24, 24)), T.ToTensor()]))
    index = [p for p, _ in dataset.samples].index(bad)
    loader = stoker.DataLoader(dataset, batch_size=4, num_workers=0, native=native)
    assert loader.stats()["pipeline"] == ("native" if native else "python")
    it = iter(loader)
    got = []
    with pytest.raises(stoker.DataError) as raised:
        while True:
            got.append(next(it))
    assert isinstance(raised.value, OSError)  # as PIL's error is
    assert bad in str(raised.value)
    assert raised.value.index == index
    got.extend(it)  # the batch's other samples, then the rest
    labels = torch.cat([b[1] for b in got]).tolist()
    assert labels == [t for i, t in enumerate(dataset.targets) if i != index]


@pytest.mark.parametrize("native", [True, False])
def test_a_bad_file_is_skipped_and_recorded(bad_folder, native):
    root, bad = bad_folder
    dataset = ImageFolder(root, transform=T.Compose([T.Resize((24, 24)), T.ToTensor()]))
    index = [p for p, _ in dataset.samples].index(bad)
    with stoker.DataLoader(dataset, batch_size=4, num_workers=2, on_error="skip",
                           native=native) as loader:
        labels = torch.cat([b[1] for b in loader]).tolist()
        skipped = loader.skipped()
    assert labels == [t for i, t in enumerate(dataset.targets) if i != index]
    assert [s["index"] for s in skipped] == [index]



@pytest.mark.parametrize("native", [True, False])
def test_a_files_system_error_keeps_its_errno_and_its_type(tmp_path, native):
    # The native path raised a plain OSError with no errno for any failed
    # open (torch: PermissionError for EACCES, errno 13); a symbolic link to
    # itself is the case root can make (ELOOP, a plain OSError in torch too).
    import errno
    root = _write_folder(str(tmp_path / "data"), per_class=1)
    os.symlink("loop.jpg", os.path.join(root, "ant", "loop.jpg"))
    dataset = ImageFolder(root, transform=T.Compose([T.CenterCrop(16), T.PILToTensor()]))
    with pytest.raises(OSError) as theirs:
        _torch_batches(dataset, batch_size=len(dataset))
    with stoker.DataLoader(dataset, batch_size=len(dataset), num_workers=1,
                           native=native) as loader:
        with pytest.raises(OSError) as ours:
            next(iter(loader))
        assert loader.stats()["pipeline"] == ("native" if native else "python")
    assert theirs.value.errno == ours.value.errno == errno.ELOOP
    assert type(ours.value).__mro__[1:].count(type(theirs.value)) == 1
    assert "loop.jpg" in str(ours.value)
