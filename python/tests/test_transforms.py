"""Images and labels match torchvision's pipeline on the same files."""

import numpy as np
import pytest
import torch
import torchvision
import torchvision.transforms as T

import stoker

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
# One uint8 level after normalisation is 1 / 255 / 0.225 ~ 0.0174. torchvision
# rounds the resized image to uint8 before ToTensor; stoker keeps floats.
ONE_LEVEL = 1 / 255 / min(STD)


def _all(loader):
    xs, ys = zip(*loader)
    return torch.cat(xs), torch.cat(ys)


def test_eval_matches_torchvision(image_tree):
    reference = torchvision.datasets.ImageFolder(
        image_tree, transform=T.Compose([T.Resize(36), T.CenterCrop(32), T.ToTensor(),
                                         T.Normalize(MEAN, STD)]))
    expected = torch.stack([reference[i][0] for i in range(len(reference))])
    loader = stoker.Loader(image_tree, batch_size=8, shuffle=False,
                           transforms=stoker.transforms.eval(32, resize=36), workers=2)
    images, labels = _all(loader)
    assert images.shape == expected.shape == (len(reference), 3, 32, 32)
    assert images.dtype == torch.float32 and labels.dtype == torch.int64
    diff = (images - expected).abs()
    assert diff.max().item() < 1.5 * ONE_LEVEL
    assert diff.mean().item() < 0.5 * ONE_LEVEL


def test_labels_and_order_match_image_folder(image_tree):
    reference = torchvision.datasets.ImageFolder(image_tree)
    source = stoker.ImageFolder(image_tree)
    assert source.classes == reference.classes
    assert [source.key(i) for i in range(len(source))] == [p for p, _ in reference.samples]
    loader = stoker.Loader(source, batch_size=5, shuffle=False, transforms=stoker.transforms.eval(16))
    _, labels = _all(loader)
    assert labels.tolist() == reference.targets


def test_train_shapes_and_value_ranges(image_tree):
    loader = stoker.Loader(image_tree, batch_size=7, transforms=stoker.transforms.train(24),
                           workers=2, seed=3)
    images, labels = _all(loader)
    assert images.shape == (len(loader.source), 3, 24, 24)
    assert images.dtype == torch.float32
    low = torch.tensor([-m / s for m, s in zip(MEAN, STD)]).view(1, 3, 1, 1)
    high = torch.tensor([(1 - m) / s for m, s in zip(MEAN, STD)]).view(1, 3, 1, 1)
    assert bool(((images >= low - 1e-5) & (images <= high + 1e-5)).all())
    assert sorted(labels.tolist()) == sorted(torchvision.datasets.ImageFolder(image_tree).targets)


def test_train_crop_statistics_follow_torchvision(image_tree):
    # Not bit-equal (different random streams), but the same distribution:
    # per-channel means over many random crops agree with torchvision's.
    tv = T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize(MEAN, STD)])
    reference = torchvision.datasets.ImageFolder(image_tree, transform=tv)
    torch.manual_seed(0)
    expected = torch.stack([reference[i % len(reference)][0] for i in range(8 * len(reference))])
    loader = stoker.Loader(image_tree, batch_size=64, transforms=stoker.transforms.train(24))
    got = []
    for epoch in range(8):
        loader.set_epoch(epoch)
        got.extend(x for x, _ in loader)
    got = torch.cat(got)
    assert got.shape == expected.shape
    assert torch.allclose(got.mean(dim=(0, 2, 3)), expected.mean(dim=(0, 2, 3)), atol=0.1)
    assert torch.allclose(got.std(dim=(0, 2, 3)), expected.std(dim=(0, 2, 3)), atol=0.1)


@pytest.mark.parametrize("layout,shape", [("uint8_hwc", (20, 24, 3)), ("uint8_chw", (3, 20, 24))])
def test_uint8_layouts(image_tree, layout, shape):
    loader = stoker.Loader(image_tree, batch_size=4, shuffle=False, output="numpy",
                           transforms=stoker.transforms.eval((20, 24), layout=layout))
    images, labels = next(iter(loader))
    assert isinstance(images, np.ndarray) and images.dtype == np.uint8
    assert images.shape == (4,) + shape
    assert labels.dtype == np.int64


def test_transform_options_as_dict(image_tree):
    loader = stoker.Loader(image_tree, batch_size=2, transforms={"mode": "eval", "size": 16})
    images, _ = next(iter(loader))
    assert images.shape == (2, 3, 16, 16)


def test_bad_transform_options_raise_value_error():
    with pytest.raises(ValueError, match="resize"):
        stoker.transforms.eval(224, resize=-1)
    with pytest.raises(ValueError, match="resize"):
        stoker.transforms.eval(224, resize=(0, 0))  # not the default Resize
    assert stoker.transforms.eval(224, resize=100).shape == (3, 224, 224)  # padded, as torchvision
    # A large size's default resize (size * 256 / 224) stays within the largest
    # side: it blamed resize, which the user never set.
    assert stoker.transforms.eval(60000).shape == (3, 60000, 60000)
    with pytest.raises(ValueError):
        stoker.transforms.Image("sideways")
    with pytest.raises(ValueError, match="interpolation"):
        stoker.transforms.eval(224, interpolation="nearest")


def test_bicubic_is_an_option_that_pickles():
    import pickle
    t = stoker.transforms.train(32, interpolation="bicubic")
    assert "bicubic" in repr(t) and "bicubic" in repr(pickle.loads(pickle.dumps(t)))
    assert "bicubic" not in repr(stoker.transforms.train(32))


def test_eval_on_photographs_with_and_without_dct_scaling(tmp_path):
    # Photograph-sized JPEGs: here DCT-scaled decoding (opt-in) kicks in,
    # which is close to torchvision but not within one level everywhere.
    out = str(tmp_path / "photos")
    stoker.make_dataset(out, images=6, classes=2, seed=2)
    reference = torchvision.datasets.ImageFolder(
        out, transform=T.Compose([T.Resize(73), T.CenterCrop(64), T.ToTensor(),
                                  T.Normalize(MEAN, STD)]))
    expected = torch.stack([reference[i][0] for i in range(len(reference))])
    for dct, max_levels, mean_levels in ((False, 1.5, 0.5), (True, None, 1.0)):
        loader = stoker.Loader(out, batch_size=6, shuffle=False, transforms=stoker.transforms.eval(
            64, resize=73, dct_scaling=dct))
        images, _ = next(iter(loader))
        diff = (images - expected).abs()
        if max_levels is not None:
            assert diff.max().item() < max_levels * ONE_LEVEL
        assert diff.mean().item() < mean_levels * ONE_LEVEL, dct


def _bmp_folder(root):
    """One class of two BMP images (formats stoker's own decoders do not read)."""
    from PIL import Image
    (root / "c").mkdir(parents=True)
    rng = np.random.default_rng(4)
    for i in range(2):
        Image.fromarray(rng.integers(0, 256, (20, 30, 3), dtype=np.uint8)).save(
            root / "c" / f"{i}.bmp")
    return root


def _pil_rgb(data):
    import io
    from PIL import Image
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def test_decode_other_decodes_what_stoker_does_not_and_refuses_other_dtypes(tmp_path):
    root = _bmp_folder(tmp_path / "bmp")
    expected = torch.stack([torch.from_numpy(_pil_rgb((root / "c" / f"{i}.bmp").read_bytes()))
                            for i in range(2)])
    uint8 = stoker.transforms.eval(16, resize=0, layout="uint8_hwc", decode_other=_pil_rgb)
    with stoker.Loader(root, batch_size=2, shuffle=False, transforms=uint8) as loader:
        images, _ = next(iter(loader))
    assert torch.equal(images, expected[:, 2:18, 7:23])  # the centre 16 x 16
    # Another dtype's values were cast: [0, 1] floats came out black, 300 as 44.
    for made, said in [(lambda b: _pil_rgb(b) / 255.0, "gave float64 values; it must give "
                        "uint8 RGB values (0-255)"),
                       (lambda b: _pil_rgb(b).astype(np.int32) + 300, "gave int32 values"),
                       (lambda b: None, "gave NoneType, not a (height, width, 3) uint8 array")]:
        transform = stoker.transforms.eval(16, resize=0, layout="uint8_hwc", decode_other=made)
        with stoker.Loader(root, batch_size=2, shuffle=False, transforms=transform) as loader:
            with pytest.raises(stoker.DataError, match="0.bmp") as raised:
                next(iter(loader))
        assert said in str(raised.value)
