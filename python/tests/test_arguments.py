"""Wrong argument types and values raise TypeError / ValueError naming the
argument, in Python, before anything reaches the C++ side: never pybind11's
list of overloads, never a silent conversion (int("8"), int(8.7)), never a
crash."""

import numpy as np
import pytest

import stoker


def _source():
    return stoker.Synthetic(size=8, shape=(4,))


def _raises(error, name, call):
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    assert name in message, message
    assert "incompatible" not in message, message


@pytest.mark.parametrize("name, value, error", [
    ("seed", -1, ValueError),
    ("seed", 2**64, ValueError),
    ("seed", 1.5, TypeError),
    ("seed", "3", TypeError),
    ("batch_size", "8", TypeError),
    ("batch_size", 8.7, TypeError),
    ("batch_size", True, TypeError),
    ("batch_size", 0, ValueError),
    ("batch_size", 2**63, ValueError),
    ("tune_interval", float("nan"), ValueError),
    ("tune_interval", float("inf"), ValueError),
    ("tune_interval", 0, ValueError),
    ("tune_interval", -0.5, ValueError),
    ("tune_interval", "0.2", TypeError),
    ("max_workers", -1, ValueError),
    ("max_workers", 0, ValueError),
    ("max_workers", 2**40, ValueError),
    ("max_workers", "2", TypeError),
    ("workers", -2, ValueError),
    ("workers", 2**40, ValueError),
    ("workers", "many", ValueError),
    ("workers", 2.0, TypeError),
    ("prefetch", 0, ValueError),
    ("prefetch", 2**40, ValueError),
    ("prefetch", 1.5, TypeError),
    ("prefetch_bytes", -1, ValueError),
    ("prefetch_bytes", 2**64, ValueError),
    ("memory_budget", -1, ValueError),
    ("memory_budget", 0, ValueError),
    ("memory_budget", 1e9, TypeError),
    ("start_epoch", -1, ValueError),
    ("start_epoch", "1", TypeError),
    ("shuffle", "no", TypeError),
    ("drop_last", None, TypeError),
    ("ordered", 1.0, TypeError),
    ("trace_path", 3, TypeError),
    ("rank", "0", TypeError),
    ("world_size", 1.0, TypeError),
])
def test_bad_loader_argument_is_named(name, value, error):
    kwargs = {name: value}
    if name in ("rank", "world_size"):
        kwargs = {"rank": 0, "world_size": 1, **kwargs}
    _raises(error, name, lambda: stoker.Loader(_source(), **kwargs))


def test_integers_of_any_kind_and_the_edges_of_each_range_are_accepted():
    loader = stoker.Loader(_source(), batch_size=np.int64(4), seed=2**64 - 1, workers=np.int32(1),
                           prefetch=np.uint8(2), prefetch_bytes=2**64 - 1, shuffle=np.bool_(True),
                           start_epoch=np.int16(3), memory_budget=2**40,
                           output="numpy")
    assert loader.batch_size == 4 and loader.epoch == 3
    assert sum(len(y) for _, y in loader) == 8
    loader.set_epoch(np.int64(5))
    assert loader.epoch == 5
    auto = stoker.Loader(_source(), batch_size=4, tune_interval=np.float32(0.5),
                         max_workers=np.int64(4), output="numpy")
    assert sum(len(y) for _, y in auto) == 8


@pytest.mark.parametrize("option", [{"max_workers": 4}, {"trace_path": "trace.jsonl"},
                                    {"tune_interval": 5.0}])
def test_a_tuner_option_with_a_fixed_worker_count_is_refused_not_ignored(tmp_path, option):
    option = {k: (str(tmp_path / v) if k == "trace_path" else v) for k, v in option.items()}
    name = next(iter(option))
    with pytest.raises(ValueError, match=f"{name} is the tuner's.*workers=2"):
        stoker.Loader(_source(), batch_size=4, workers=2, **option)
    with pytest.raises(ValueError, match=f"{name} is the tuner's.*num_workers=0"):
        stoker.DataLoader(list(range(8)), batch_size=4, num_workers=0, **option)
    stoker.DataLoader(list(range(8)), batch_size=4, num_workers="auto", **option).close()


@pytest.mark.parametrize("epoch, error", [(-1, ValueError), ("2", TypeError), (1.5, TypeError),
                                          (None, TypeError)])
def test_bad_epoch_is_named(epoch, error):
    loader = stoker.Loader(_source(), batch_size=4)
    _raises(error, "epoch", lambda: loader.set_epoch(epoch))


@pytest.mark.parametrize("state, error, words", [
    (None, TypeError, "state"),
    ([1, 2], TypeError, "state"),
    ("seed=3", TypeError, "state"),
    ({"seed": 3, "epoch": 0, "position": 0, "junk": 1}, ValueError, "'junk'"),
    ({"seed": 3, "epoch": 0, "position": 0, 7: 1}, ValueError, "7"),
    ({"seed": object(), "epoch": 0, "position": 0}, ValueError, "'seed'"),
    ({"seed": 3, "epoch": float("nan"), "position": 0}, ValueError, "'epoch'"),
    ({"seed": 3, "epoch": 0, "position": 1.5}, ValueError, "'position'"),
    ({"seed": 3, "epoch": 0, "position": True}, ValueError, "'position'"),
    ({"seed": 3, "epoch": -1, "position": 0}, ValueError, "'epoch'"),
    ({"seed": 3, "epoch": 0, "position": 2**64}, ValueError, "'position'"),
    ({"seed": 3, "epoch": 0}, ValueError, "'position'"),
    ({"seed": 3, "epoch": 0, "position": 0, "beyond": "x"}, ValueError, "'beyond'"),
    ({"seed": 3, "epoch": 0, "position": 0, "beyond": [1, "a"]}, ValueError, "'beyond'"),
    ({"seed": 3, "epoch": 0, "position": 0, "beyond": [None]}, ValueError, "'beyond'"),
])
def test_garbage_state_dict_is_refused_naming_what_is_wrong(state, error, words):
    loader = stoker.Loader(_source(), batch_size=4, seed=3)
    _raises(error, words, lambda: loader.load_state_dict(state))
    # The loader is untouched and still works.
    assert loader.epoch == 0 and sum(len(y) for _, y in loader) == 8


def test_state_dict_with_numpy_integers_loads():
    loader = stoker.Loader(_source(), batch_size=2, seed=3, output="numpy")
    it = iter(loader)
    next(it)
    state = {k: (np.bool_(v) if isinstance(v, bool) else
                 np.int64(v) if isinstance(v, int) else [np.uint32(b) for b in v])
             for k, v in loader.state_dict().items()}
    other = stoker.Loader(_source(), batch_size=2, seed=3, output="numpy")
    other.load_state_dict(state)
    assert sum(len(y) for _, y in other) == 6


@pytest.mark.parametrize("name, call, error", [
    ("seed", lambda: stoker.Synthetic(seed=-1), ValueError),
    ("size", lambda: stoker.Synthetic(size="8"), TypeError),
    ("shape[1]", lambda: stoker.Synthetic(shape=(3, "a")), TypeError),
    ("cpu_cost_us", lambda: stoker.Synthetic(cpu_cost_us=float("nan")), ValueError),
    ("read_latency_us", lambda: stoker.Synthetic(read_latency_us=1e300), ValueError),
    ("fail_indices[0]", lambda: stoker.Synthetic(fail_indices=[1.5]), TypeError),
    # Refused, not wrapped to 4 bytes a record, a negative epoch, or never failing.
    ("more bytes than a 64-bit size holds", lambda: stoker.Synthetic(shape=(2**62 + 1, 4)),
     ValueError),
    ("shape (4294967296, 4294967296) of uint8 is more bytes",
     lambda: stoker.Synthetic(shape=(2**32, 2**32)), ValueError),
    ("synthetic shape () has no dimension", lambda: stoker.Synthetic(shape=()), ValueError),
    ("fail index 10 is not in [0, 10)", lambda: stoker.Synthetic(size=10, fail_indices=[10]),
     ValueError),
    ("workers must be an int <= 128", lambda: stoker.Loader(_source(), workers=500), ValueError),
    ("start_epoch must be an int <= 4611686018427387904",
     lambda: stoker.Loader(_source(), start_epoch=2**63 - 1), ValueError),
    ("epoch must be an int <= 4611686018427387904",
     lambda: stoker.Loader(_source()).set_epoch(2**63 - 1), ValueError),
    ("size", lambda: stoker.transforms.Image(size="224"), TypeError),
    ("size", lambda: stoker.transforms.Image(size=2**40), ValueError),
    ("size", lambda: stoker.transforms.Image(size=(1, 2, 3)), ValueError),
    ("max_pixels", lambda: stoker.transforms.Image(max_pixels=2**70), ValueError),
    ("mean", lambda: stoker.transforms.Image(mean=(1, 2)), ValueError),
    ("scale[0]", lambda: stoker.transforms.Image(scale=("a", 1)), TypeError),
    ("resize", lambda: stoker.transforms.eval(224, resize=2**40), ValueError),
    ("dct_scaling", lambda: stoker.transforms.train(224, dct_scaling="yes"), TypeError),
    ("trace_path must be a path, got an empty one",
     lambda: stoker.Loader(_source(), trace_path=""), ValueError),
    # Named as the options are, not the engine's fields (height, scale_max,
    # flip_probability), and a whole number in full.
    ("image transform: size[0] (height) = 0, expected 1..65535",
     lambda: stoker.transforms.eval(0), ValueError),
    ("image transform: flip = 1.5", lambda: stoker.transforms.train(flip=1.5), ValueError),
    ("image transform: scale[1] = 2, expected in [scale[0], 1]",
     lambda: stoker.transforms.train(scale=(0.5, 2)), ValueError),
    ("image transform: resize = 1000000000,",
     lambda: stoker.transforms.eval(224, resize=10**9), ValueError),
    # Another mode's geometry did nothing, unsaid.
    ("flip is an option of mode='train' only; mode='eval' does nothing with it",
     lambda: stoker.transforms.eval(224, flip=1.0), ValueError),
    ("scale is an option of mode='train'", lambda: stoker.transforms.eval(224, scale=(0.1, 0.2)),
     ValueError),
    ("ratio", lambda: stoker.transforms.Image("eval", ratio=(1, 1)), ValueError),
    ("flip_before_crop", lambda: stoker.transforms.eval(224, flip_before_crop=True), ValueError),
    ("resize is an option of mode='eval' only", lambda: stoker.transforms.train(224, resize=300),
     ValueError),
    ("shape[0]", lambda: stoker.transforms.Raw((2.5,)), TypeError),
    ("seed", lambda: stoker.make_dataset("unused", seed=-1), ValueError),
    ("images", lambda: stoker.make_dataset("unused", images=2**70), ValueError),
])
def test_bad_source_transform_and_dataset_argument_is_named(name, call, error):
    _raises(error, name, call)


def test_probe_describes_a_data_path_that_exists_and_names_one_that_does_not(tmp_path):
    facts = stoker.probe(tmp_path)
    assert facts["cpu"] and facts["storage"] is not None
    # A pattern: its storage is its shards' once one exists (before: a pattern
    # naming nothing was described as if it were there).
    pattern = tmp_path / "shard-{000..003}.tar"
    with pytest.raises(FileNotFoundError, match="shard-"):
        stoker.probe(pattern)
    (tmp_path / "shard-002.tar").write_bytes(b"")
    assert stoker.probe(pattern)["storage"] is not None
    with pytest.raises(FileNotFoundError, match="missing"):  # as `stoker probe --data` refuses it
        stoker.probe(tmp_path / "missing")
