"""stoker.transforms.eval(224), as shipped, gives torchvision's pixels on the
built-in data set: Resize(256) + CenterCrop(224) + ToTensor + Normalize on
PIL-decoded images, within one uint8 level (1/255) everywhere, with the
default bilinear resize and with bicubic."""

import pytest
import torch
import torchvision
import torchvision.transforms as T

import stoker

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
# float32 normalisation and its inverse leave a few 1e-5 of a level.
SLACK_LEVELS = 1e-3


@pytest.fixture(scope="module")
def builtin_data():
    return stoker.default_dataset(quiet=True)


def _levels(got, expected):
    """|got - expected| per image, in uint8 levels (undoing Normalize's std)."""
    std = torch.tensor(STD).view(1, 3, 1, 1)
    return ((got - expected).abs() * std * 255).flatten(1).amax(1)


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_default_eval_matches_torchvision_on_builtin_data(builtin_data, interpolation):
    reference = torchvision.datasets.ImageFolder(
        builtin_data,
        transform=T.Compose([T.Resize(256, interpolation=T.InterpolationMode(interpolation)),
                             T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)]))
    loader = stoker.Loader(builtin_data, batch_size=50, shuffle=False,
                           transforms=stoker.transforms.eval(224, interpolation=interpolation),
                           workers=2)
    worst, start = [], 0
    for images, labels in loader:
        expected = torch.stack([reference[start + i][0] for i in range(len(labels))])
        assert labels.tolist() == reference.targets[start:start + len(labels)]
        worst.append(_levels(images, expected))
        start += len(labels)
    assert start == len(reference) == 2000
    worst = torch.cat(worst)
    bad = [(reference.samples[i][0], round(worst[i].item(), 2))
           for i in torch.nonzero(worst > 1 + SLACK_LEVELS).flatten().tolist()]
    assert not bad, f"{len(bad)} of {start} images differ by more than 1/255: {bad[:5]}"
