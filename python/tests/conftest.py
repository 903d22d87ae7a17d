"""Shared fixtures: small image trees written with Pillow in a temp folder."""

import os

import numpy as np
import pytest

import stoker  # noqa: F401 -- fail the whole run at once when the module is missing

# The tests' tuned loaders share a node registry of their own, not the
# machine's (where a training job or another test run would count them).
if "STOKER_NODE_REGISTRY" not in os.environ:
    import atexit
    import shutil
    import tempfile
    _registry_dir = tempfile.mkdtemp(prefix="stoker-tests-")
    atexit.register(shutil.rmtree, _registry_dir, True)
    os.environ["STOKER_NODE_REGISTRY"] = os.path.join(_registry_dir, "node-registry")

Image = pytest.importorskip("PIL.Image")

CLASSES = ("ant", "bee", "cat")


def _picture(rng, height, width):
    # Smooth gradients plus a little noise: like a photo, JPEG-friendly, and
    # sensitive to crop position and flips.
    yy, xx = np.mgrid[0:height, 0:width]
    img = np.stack([xx * 255 // width, yy * 255 // height, (xx + yy) * 255 // (height + width)], -1)
    img = img + rng.integers(0, 40, (height, width, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def write_tree(root, per_class=6, seed=0):
    """root/<class>/... with JPEGs of several sizes, a grayscale JPEG, an RGBA
    PNG and a nested folder per class. Returns root."""
    rng = np.random.default_rng(seed)
    for c, name in enumerate(CLASSES):
        folder = os.path.join(root, name)
        os.makedirs(os.path.join(folder, "nested"))
        for i in range(per_class):
            img = _picture(rng, 40 + 9 * i + c, 90 - 6 * i)
            sub = "nested" if i % 3 == 2 else ""
            Image.fromarray(img).save(os.path.join(folder, sub, f"img{i:02d}.jpg"), quality=90)
        img = _picture(rng, 57, 43)
        Image.fromarray(img[:, :, 0]).save(os.path.join(folder, "gray.jpg"))
        rgba = np.concatenate([img, img[:, :, :1]], -1)
        Image.fromarray(rgba).save(os.path.join(folder, "alpha.png"))
    return root


@pytest.fixture(scope="session")
def image_tree(tmp_path_factory):
    return write_tree(str(tmp_path_factory.mktemp("tree")))


@pytest.fixture
def fresh_tree(tmp_path):
    """A tree a test may damage."""
    return write_tree(str(tmp_path / "tree"), per_class=3)
