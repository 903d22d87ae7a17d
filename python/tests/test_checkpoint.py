"""Checkpoints carry the plan they belong to: a loader resumes one of its own
plan with any worker count, and refuses another plan's, naming the field."""

import numpy as np
import pytest

import stoker


def _loader(size=40, batch_size=4, workers=2, shuffle=True, world_size=1):
    # num_classes=size makes each sample's label its index.
    return stoker.Loader(stoker.Synthetic(size=size, shape=(2,), num_classes=size),
                         batch_size=batch_size, shuffle=shuffle, seed=5, workers=workers,
                         rank=0, world_size=world_size, output="numpy")


def _labels(batches):
    return [int(label) for _, labels in batches for label in labels]


def _checkpoint_after(loader, batches):
    it = iter(loader)
    head = [next(it) for _ in range(batches)]
    return loader.state_dict(), _labels(head)


def test_the_checkpoint_describes_the_plan():
    state, _ = _checkpoint_after(_loader(), 3)
    assert state == {"seed": 5, "epoch": 0, "position": 3, "beyond": [], "num_samples": 40,
                     "batch_size": 4, "shuffle": True, "drop_last": False, "rank": 0,
                     "world_size": 1, "pad_shards": True}


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_the_same_plan_with_another_worker_count_resumes_with_exactly_the_rest(workers):
    reference = _labels(_loader(workers=2))
    state, head = _checkpoint_after(_loader(workers=2), 3)
    resumed = _loader(workers=workers)
    resumed.load_state_dict(state)
    assert head + _labels(resumed) == reference


@pytest.mark.parametrize("field, settings, ours, theirs", [
    ("batch_size", {"batch_size": 8}, "8", "4"),
    ("shuffle", {"shuffle": False}, "false", "true"),
    ("world_size", {"world_size": 2}, "2", "1"),
    ("num_samples", {"size": 41}, "41", "40"),
])
def test_a_checkpoint_of_another_plan_is_refused_naming_the_field(field, settings, ours, theirs):
    state, _ = _checkpoint_after(_loader(), 3)
    other = _loader(**settings)
    with pytest.raises(ValueError) as e:
        other.load_state_dict(state)
    assert str(e.value) == f"checkpoint's {field} {theirs} differs from this loader's {ours}"
    # Refused: nothing changed, the whole epoch comes, once.
    assert sorted(_labels(other)) == sorted(_labels(_loader(**settings)))


def test_a_checkpoint_without_the_plan_is_refused_naming_what_is_missing():
    state, _ = _checkpoint_after(_loader(), 1)
    del state["batch_size"]
    with pytest.raises(ValueError, match="'batch_size'"):
        _loader().load_state_dict(state)
    state, _ = _checkpoint_after(_loader(), 1)
    state["shuffle"] = 1
    with pytest.raises(ValueError, match="'shuffle'"):
        _loader().load_state_dict(state)
    state["shuffle"] = np.bool_(True)  # numpy's bools are bools
    _loader().load_state_dict(state)
