"""The digest of what a dataset holds (python/stoker/_snapshot.py), which a
DataLoader compares at each iter() to make its workers anew for a dataset
changed between epochs, as torch's non-persistent workers see it."""

import array
import collections
import functools
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from stoker import _snapshot  # noqa: E402


class Step:
    def __init__(self, size):
        self.size = size


class Data:
    def __init__(self):
        self.samples = [(f"/data/{i}.jpg", i % 10) for i in range(100_000)]
        self.transform = [Step(224), Step(0.5)]
        self.options = {"level": 0, "scale": (0.08, 1.0)}
        self.table = np.arange(1_000_000)
        self.small = torch.zeros(4)
        self.fn = lambda x: x + 1
        # State that lives in C, where __dict__ does not show it.
        self.rng = random.Random(0)
        self.generator = torch.Generator().manual_seed(0)
        self.np_rng = np.random.default_rng(0)
        self.scale = functools.partial(pow, 2)
        self.codes = array.array("q", range(100))
        self.recent = collections.deque(range(100), maxlen=100)


def _changed(change):
    d = Data()
    before = _snapshot.digest(d)
    assert _snapshot.digest(d) == before  # the same dataset, the same digest
    change(d)
    return _snapshot.digest(d) != before


@pytest.mark.parametrize("change", [
    lambda d: setattr(d, "level", 1),                        # a new attribute
    lambda d: d.options.__setitem__("level", 2),             # a dict's value
    lambda d: setattr(d.transform[0], "size", 128),          # a step's field, in place
    lambda d: d.samples.append(("/data/new.jpg", 3)),        # a longer list
    lambda d: d.samples.__setitem__(0, ("/data/x.jpg", 1)),  # its first element
    lambda d: d.samples.__setitem__(5, ("/data/5.jpg", 7)),  # one the spread skips: a relabel
    lambda d: setattr(d, "table", np.arange(5)),             # another array
    lambda d: d.small.add_(1),                               # a small tensor's values
    lambda d: setattr(d, "fn", lambda x: x + 2),             # another function
    lambda d: d.rng.seed(1),                                 # set_epoch() reseeds in place
    lambda d: d.generator.manual_seed(1),
    lambda d: setattr(d.np_rng.bit_generator, "state",             # reseeded in place
                      np.random.default_rng(1).bit_generator.state),
    lambda d: setattr(d, "scale", functools.partial(pow, 3)),  # its __dict__ is empty
    lambda d: d.codes.__setitem__(50, -1),
    lambda d: d.recent.append(-1),
])
def test_what_a_training_loop_changes_changes_the_digest(change):
    assert _changed(change)


LEVEL = 1  # a curriculum level kept in a module global


def _scaled(i):
    return [i * LEVEL for _ in range(2)]  # read inside a comprehension: nested code


class Curriculum(torch.utils.data.Dataset):
    offset = 0  # or on the class

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return _scaled(i)[0] + Curriculum.offset


def test_module_state_the_datasets_code_reads_changes_the_digest():
    # torch's workers, forked at each iter(), see a global or a class
    # attribute changed between epochs: stoker makes its workers anew then.
    global LEVEL
    d = Curriculum()
    before = _snapshot.digest(d)
    assert _snapshot.digest(d) == before
    try:
        LEVEL = 10
        assert _snapshot.digest(d) != before
        LEVEL = 1
        assert _snapshot.digest(d) == before
        Curriculum.offset = 1000
        assert _snapshot.digest(d) != before
    finally:
        LEVEL, Curriculum.offset = 1, 0


def test_what_the_digest_does_not_look_at_is_said():
    # Inside an element of a large list of unhashable elements, between the
    # ones it looks at; bytes inside a large array: docs/dataloader.md says so.
    def relist(d):
        d.samples = [list(s) for s in d.samples]
    d = Data()
    relist(d)
    before = _snapshot.digest(d)
    d.samples[1][1] = 7
    assert _snapshot.digest(d) == before
    assert not _changed(lambda d: d.table.__setitem__(5, -1))


def test_odd_objects_digest_or_say_they_cannot():
    class Slotted:
        __slots__ = "value"

        def __init__(self):
            self.value = 3

    class Raising:
        @property
        def __dict__(self):
            raise RuntimeError("no fields for you")

    odd = Data()
    odd.__dict__[7] = "a key that is no str"
    odd.slotted = Slotted()
    odd.huge = 10 ** 5000
    odd.text = "x" * 10_000_000
    before = _snapshot.digest(odd)
    assert before is not None and _snapshot.digest(odd) == before
    odd.slotted.value = 4  # a slot's value is looked at
    assert _snapshot.digest(odd) != before
    assert _snapshot.digest(Raising()) is None  # cannot tell: the loader keeps its workers
