"""Shared fixtures: small image trees written with Pillow in a temp folder, and
the fake CUDA runtime the C++ tests build (tests/testing/fake_cudart.cc)."""

import ctypes
import os

import numpy as np
import pytest

import stoker  # noqa: F401 -- fail the whole run at once when the module is missing
from stoker import _stoker

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


def _fake_cudart_path():
    # build/<preset>/python/stoker/_stoker*.so -> build/<preset>/tests/testing/
    build = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(_stoker.__file__))))
    path = os.path.join(build, "tests", "testing", "libstoker_fake_cudart.so")
    return path if os.path.exists(path) else None


@pytest.fixture
def fake_cudart(monkeypatch):
    path = _fake_cudart_path()
    if path is None:
        pytest.skip("the fake CUDA runtime (target stoker_fake_cudart) is not built")
    monkeypatch.setenv("STOKER_CUDART", path)
    lib = ctypes.CDLL(path)
    lib.fake_cudart_set.argtypes = [ctypes.c_char_p, ctypes.c_int64]
    lib.fake_cudart_get.argtypes = [ctypes.c_char_p]
    lib.fake_cudart_get.restype = ctypes.c_int64
    for knob, value in (("devices", 1), ("refuse_register", 0), ("malloc_budget", -1),
                        ("copy_delay_us", 0)):
        lib.fake_cudart_set(knob.encode(), value)
    return lib


@pytest.fixture
def gpu_stand_in(monkeypatch):
    """device="gpu-stand-in" for stoker.DataLoader on a torch without CUDA: its
    batches are copied ahead to a device as on a GPU (_DeviceAhead), to the
    CPU, without the CUDA stream and events."""
    torch = pytest.importorskip("torch")
    from stoker import _dataloader
    real = _dataloader._resolve_device
    monkeypatch.setattr(_dataloader, "_resolve_device", lambda device, t: (
        (None, torch.device("cpu")) if device == "gpu-stand-in" else real(device, t)))
    return "gpu-stand-in"


# --- a real Dask cluster on 127.0.0.1 (python/tests/dask_cluster.py) ---------

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def _start_dask_clusters(folder):
    """A function that starts DaskClusters in sub-folders of `folder`, and the
    list of those it started."""
    pytest.importorskip("distributed", reason="Dask's distributed (Debian's python3-distributed) "
                        "is not importable: no cluster to test remote workers with")
    import dask_cluster

    # The workers import the stoker this process imports, and the tests'
    # modules (their datasets unpickle by reference there).
    pythonpath = [os.path.dirname(os.path.dirname(os.path.abspath(stoker.__file__))), TESTS_DIR]
    started = []

    def start(workers=2, tls=False, env=None):
        sub = os.path.join(folder, f"dask-{len(started)}")
        files = dask_cluster.make_tls_files(os.path.join(sub, "tls")) if tls else None
        cluster = dask_cluster.DaskCluster(sub, workers=workers, pythonpath=pythonpath, tls=files,
                                           preload=["remote_datasets"], env=env)
        started.append(cluster)
        return cluster.start()

    return start, started


def _close_dask_clusters(started):
    # Every cluster is closed even when one of them left something behind.
    failures = []
    for cluster in started:
        try:
            cluster.close()
        except AssertionError as e:
            failures.append(str(e))
    assert not failures, failures


@pytest.fixture
def dask_cluster_factory(tmp_path):
    """start(workers=2, tls=False, env=None) -> a started DaskCluster (workers:
    a count, or {name: env}); at teardown each is stopped, and the test fails
    if a process or a port of it is left."""
    start, started = _start_dask_clusters(str(tmp_path))
    yield start
    _close_dask_clusters(started)


def _module_cluster(tmp_path_factory, **options):
    start, started = _start_dask_clusters(str(tmp_path_factory.mktemp("dask")))
    cluster = start(**options)
    yield cluster
    _close_dask_clusters(started)


@pytest.fixture(scope="module")
def shared_dask_cluster(tmp_path_factory):
    """A scheduler and two workers over tcp://, started once per module for
    the tests that leave it as they found it (kill nothing, stop nothing)."""
    yield from _module_cluster(tmp_path_factory)


@pytest.fixture(scope="module")
def dask_tls_cluster(tmp_path_factory):
    """A scheduler and one worker over tls:// with certificates made for the
    module; the client's Security is dask_tls_cluster.security(). Shared as
    shared_dask_cluster is."""
    yield from _module_cluster(tmp_path_factory, workers=1, tls=True)
