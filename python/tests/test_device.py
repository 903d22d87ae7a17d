"""pin_memory and device: the arguments, the error without CUDA, and (with
the fake CUDA runtime the C++ tests build, tests/testing/fake_cudart.cc)
page-locked buffers and device batches read through __cuda_array_interface__."""

import ctypes

import numpy as np
import pytest

import stoker
from stoker import _stoker


def _torch_with_cuda():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def test_device_arguments_are_checked():
    src = stoker.Synthetic(size=16, shape=(4,))
    with pytest.raises(ValueError, match="device must be"):
        stoker.Loader(src, batch_size=4, device="tpu")
    with pytest.raises(TypeError, match="device must be"):
        stoker.Loader(src, batch_size=4, device=True)
    with pytest.raises(TypeError, match="pin_memory"):
        stoker.Loader(src, batch_size=4, pin_memory="yes")
    loader = stoker.Loader(src, batch_size=4, workers=1, device="cpu")
    assert loader.device is None


@pytest.mark.skipif(_torch_with_cuda(), reason="torch has CUDA here")
def test_a_device_without_cuda_in_torch_is_a_clear_error():
    pytest.importorskip("torch")
    src = stoker.Synthetic(size=16, shape=(4,))
    for device in ("cuda", "cuda:0", 0):
        with pytest.raises(RuntimeError, match=r"device=.*PyTorch .*(without CUDA|sees no GPU)"):
            stoker.Loader(src, batch_size=4, workers=1, device=device)


def test_pin_memory_without_a_cuda_runtime_pins_nothing_and_says_why(monkeypatch):
    # As torch's DataLoader; it was an error, so a script written for a GPU
    # failed on a machine without one.
    monkeypatch.setenv("STOKER_CUDART", "/nonexistent/libcudart.so")
    with pytest.warns(RuntimeWarning, match=r"pin_memory=True\): .*/nonexistent/libcudart.so.*"
                      "not page-locked"):
        loader = stoker.Loader(stoker.Synthetic(size=16, shape=(4,)), batch_size=4,
                               pin_memory=True, output="numpy")
    with loader:
        assert sum(len(labels) for _, labels in loader) == 16
        assert loader.stats()["metrics"]["pinned_buffers"] == 0


def test_pinned_buffers_are_registered_once(fake_cudart):
    before = fake_cudart.fake_cudart_get(b"registrations")
    loader = stoker.Loader(stoker.Synthetic(size=64, shape=(8,)), batch_size=4, workers=2,
                           pin_memory=True, output="numpy")
    for _ in range(2):
        assert sum(len(labels) for _, labels in loader) == 64
    pinned = loader.stats()["metrics"]["pinned_buffers"]
    assert 0 < pinned < 16
    assert fake_cudart.fake_cudart_get(b"registrations") - before == pinned


def test_registration_refused_names_pin_memory(fake_cudart):
    fake_cudart.fake_cudart_set(b"refuse_register", 1)
    with pytest.raises(RuntimeError, match=r"option 'pin_memory'.*cudaHostRegister"):
        stoker.Loader(stoker.Synthetic(size=16, shape=(4,)), batch_size=4, pin_memory=True)
    # A runtime without a driver says "driver version is insufficient": it
    # says what that means too.
    fake_cudart.fake_cudart_set(b"refuse_register", 35)
    with pytest.raises(RuntimeError, match=r"error 35\): no NVIDIA GPU and driver"):
        stoker.Loader(stoker.Synthetic(size=16, shape=(4,)), batch_size=4, pin_memory=True)
    fake_cudart.fake_cudart_set(b"refuse_register", 0)


def test_device_batches_match_the_host_batches(fake_cudart):
    # The C++ loader, as stoker.Loader drives it with a device, on the fake
    # runtime; "device memory" is host memory there, so ctypes can read it.
    fake_cudart.cudaStreamCreateWithFlags.argtypes = [ctypes.POINTER(ctypes.c_void_p),
                                                      ctypes.c_uint]
    fake_cudart.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
    fake_cudart.cudaStreamDestroy.argtypes = [ctypes.c_void_p]
    fake_cudart.fake_cudart_set(b"copy_delay_us", 500)
    stream = ctypes.c_void_p()
    assert fake_cudart.cudaStreamCreateWithFlags(ctypes.byref(stream), 1) == 0
    src = stoker.Synthetic(size=40, shape=(3, 5), dtype="float32")
    host = stoker.Loader(src, batch_size=8, shuffle=False, workers=2, output="numpy")
    expected = [images.copy() for images, _ in host]
    kept = []
    loader = stoker.Loader(src, batch_size=8, shuffle=False, workers=2, output="numpy")
    impl = _stoker.Loader(_stoker.LoaderOptions(
        source=loader.source._impl, transform=loader.transform._impl, batch_size=8,
        shuffle=False, workers=2, device=0))
    for want in expected:
        images, labels = impl.next(stream.value)
        cai = images.__cuda_array_interface__
        assert cai["shape"] == want.shape and cai["typestr"] == want.dtype.str
        assert cai["version"] == 3 and cai["data"][0] != 0
        assert fake_cudart.cudaStreamSynchronize(stream) == 0  # the wait on the copy, then it
        got = np.frombuffer(ctypes.string_at(cai["data"][0], want.nbytes), dtype=want.dtype)
        np.testing.assert_array_equal(got.reshape(want.shape), want)
        kept.append(images)  # held: each keeps its own device buffer
    assert impl.next(stream.value) is None
    metrics = impl.metrics()
    assert metrics["device_copies"] - metrics["device_prefetched"] == len(expected)
    del kept, images  # before the stream they were waited on goes
    impl.close()
    fake_cudart.cudaStreamDestroy(stream)
    assert fake_cudart.fake_cudart_get(b"torn_copies") == 0


@pytest.mark.skipif(not _torch_with_cuda(), reason="needs torch with CUDA and a GPU")
def test_device_tensors_on_a_real_gpu():
    import torch
    src = stoker.Synthetic(size=64, shape=(3, 8, 8), dtype="float32")
    host = [images.clone() for images, _ in stoker.Loader(src, batch_size=16, shuffle=False,
                                                          workers=2)]
    loader = stoker.Loader(src, batch_size=16, shuffle=False, workers=2, device="cuda:0")
    for want, (images, labels) in zip(host, loader):
        assert images.device == torch.device("cuda", 0) and labels.device == images.device
        assert torch.equal(images.cpu(), want)


def test_stats_show_the_gpus_or_say_why_not(monkeypatch):
    # NVML is opened once per process: whichever way it went, stats says so.
    stats = stoker.Loader(stoker.Synthetic(size=8, shape=(4,)), batch_size=4, workers=1).stats()
    if stats["gpu"] is None:
        assert stats["gpu_note"].startswith("no GPU (")
    else:
        assert stats["gpu"] and all(0 <= g["utilization_percent"] <= 100 for g in stats["gpu"])
    assert "gpu" not in stoker.Loader(stoker.Synthetic(size=8, shape=(4,)), batch_size=4,
                                      workers=1).stats(gpu=False)
    pytest.importorskip("torch")
    for workers in (0, 1):
        with stoker.DataLoader(list(range(8)), batch_size=4, num_workers=workers) as dl:
            got = dl.stats()
            assert (got["gpu"] is None) == (stats["gpu"] is None)
            assert "gpu" not in dl.stats(gpu=False)


def test_a_batch_is_walked_to_the_device_as_torchs_pin_memory_walks_it():
    # Dataclasses, mappings and sequences of any type keep their type, each
    # tensor in them moved and counted; str, bytes and other objects stay.
    # A dtype stands in for the device: .to() takes either.
    torch = pytest.importorskip("torch")
    import collections
    import dataclasses
    from stoker._dataloader import _to_device

    @dataclasses.dataclass
    class Batch:
        images: object
        meta: object
        name: str = "b"

    Pair = collections.namedtuple("Pair", "a b")
    batch = Batch(images=torch.zeros(2, 3), meta=collections.OrderedDict(
        pair=Pair(torch.ones(2), [torch.ones(1), b"raw"]), other=range(3)), name="x")
    moved = []
    out = _to_device(batch, torch.float64, moved)
    assert type(out) is Batch and out.name == "x"
    assert out.images.dtype == torch.float64
    assert type(out.meta) is collections.OrderedDict
    assert type(out.meta["pair"]) is Pair and out.meta["pair"].a.dtype == torch.float64
    assert out.meta["pair"].b[0].dtype == torch.float64 and out.meta["pair"].b[1] == b"raw"
    assert list(out.meta["other"]) == [0, 1, 2]  # a range cannot be remade from a list
    assert len(moved) == 3
