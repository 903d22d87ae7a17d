"""Checkpoints carry the plan they belong to: a loader resumes one of its own
plan with any worker count, and refuses another plan's, naming the field.
stoker.DataLoader's keep the state of a sampler that has state_dict()."""

import io
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

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


# -- stoker.DataLoader: samplers with state of their own ----------------------


class Indexed(torch.utils.data.Dataset):
    def __len__(self):
        return 22

    def __getitem__(self, i):
        return i


class Rotating(torch.utils.data.Sampler):
    """An order that turns by 7 at each __iter__ (its state: the calls so far)."""

    def __init__(self):
        self.calls = 0

    def __len__(self):
        return 22

    def __iter__(self):
        self.calls += 1
        return iter([(self.calls * 7 + i) % 22 for i in range(22)])


class StatefulRotating(Rotating):
    """Rotating with torchdata's state_dict()/load_state_dict()."""

    def state_dict(self):
        return {"calls": self.calls}

    def load_state_dict(self, state):
        self.calls = state["calls"]


class StatefulRotatingBatches(StatefulRotating):
    """A batch sampler: Rotating's order in batches of 4."""

    def __len__(self):
        return 6

    def __iter__(self):
        order = list(super().__iter__())
        return iter([order[i:i + 4] for i in range(0, 22, 4)])


def _stateful_loader(cls, kind, workers):
    """A loader over a new `kind` order; `cls` is torch's DataLoader or stoker's."""
    extra = {"num_workers": workers} if workers else {}
    if kind == "batch_sampler":
        return cls(Indexed(), batch_sampler=StatefulRotatingBatches(), **extra)
    if kind == "batch_sampler.sampler":  # torch's BatchSampler over the user's sampler
        batches = torch.utils.data.BatchSampler(StatefulRotating(), 4, drop_last=False)
        return cls(Indexed(), batch_sampler=batches, **extra)
    return cls(Indexed(), batch_size=4, sampler=(Rotating if kind == "stateless" else
                                                 StatefulRotating)(), **extra)


def _torch_epochs(kind, epochs=2, workers=0):
    # With workers, torch's iterator calls an order's __iter__ twice an epoch.
    dl = _stateful_loader(torch.utils.data.DataLoader, kind, workers)
    return [[b.tolist() for b in dl] for _ in range(epochs)]


def _saved_and_loaded(state):
    """`state` through torch.save and torch.load, as a checkpoint file takes it."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _checkpoint_in_second_epoch(kind, workers=0, taken=2):
    """The state after one whole epoch and `taken` batches of the next, the
    batches of both: a sampler made anew would give that epoch another order."""
    with _stateful_loader(stoker.DataLoader, kind, workers) as dl:
        first = [b.tolist() for b in dl]
        it = iter(dl)
        head = [next(it).tolist() for _ in range(taken)]
        return _saved_and_loaded(dl.state_dict()), [first, head]


_STATEFUL_RESUME = textwrap.dedent("""
    import json, sys, torch
    sys.path.insert(0, {tests!r})
    import test_checkpoint as t
    kind, workers, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if sys.argv[4] == "take":
        state, _ = t._checkpoint_in_second_epoch(kind, workers)
        torch.save(state, path)
    else:
        with t._stateful_loader(t.stoker.DataLoader, kind, workers) as dl:
            dl.load_state_dict(torch.load(path, weights_only=True))
            print(json.dumps([b.tolist() for b in dl]))
""")


def _in_new_process(tmp_path, *args):
    script = tmp_path / "stateful_resume.py"
    script.write_text(_STATEFUL_RESUME.format(tests=os.path.dirname(__file__)))
    done = subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("kind, taken_at, resumed_at", [
    ("sampler", 0, 2), ("sampler", 2, 0), ("batch_sampler", 2, 0)])
def test_a_stateful_sampler_resumes_in_a_new_process_with_exactly_the_rest(
        tmp_path, kind, taken_at, resumed_at):
    # The checkpoint holds the sampler's state_dict() from before the epoch's
    # iter(); the resume loads it, so the replayed iter() gives that epoch's
    # order (before: a sampler made anew gave the first epoch's, refused).
    import json
    path = tmp_path / "state.pt"
    _in_new_process(tmp_path, kind, taken_at, path, "take")
    rest = json.loads(_in_new_process(tmp_path, kind, resumed_at, path, "resume"))
    assert rest == _torch_epochs(kind, workers=taken_at)[1][2:]


@pytest.mark.parametrize("kind", ["sampler", "batch_sampler", "batch_sampler.sampler"])
def test_a_stateful_sampler_checkpointed_at_an_epochs_end_starts_the_next_epoch(kind):
    # The sampler's state from after that epoch's order: the next epoch's,
    # as in the run that went on (before: a sampler made anew gave the first).
    with _stateful_loader(stoker.DataLoader, kind, 0) as dl:
        [b.tolist() for b in dl]
        state = _saved_and_loaded(dl.state_dict())
    with _stateful_loader(stoker.DataLoader, kind, 0) as dl:
        dl.load_state_dict(state)
        # num_workers="auto" (the default): as torch's iterator with workers.
        assert [b.tolist() for b in dl] == _torch_epochs(kind, workers=1)[1]


def test_a_stateful_sampler_the_user_also_restores_resumes_with_the_rest():
    # Its state saved beside the loader's at the checkpoint (after the
    # epoch's iter()): the loader's, from before it, is the one iter() uses.
    with _stateful_loader(stoker.DataLoader, "sampler", 0) as dl:
        [b for b in dl]
        it = iter(dl)
        [next(it) for _ in range(2)]
        state = _saved_and_loaded({"loader": dl.state_dict(), "sampler": dl.sampler.state_dict()})
    with _stateful_loader(stoker.DataLoader, "sampler", 2) as dl:
        dl.sampler.load_state_dict(state["sampler"])
        dl.load_state_dict(state["loader"])
        assert [b.tolist() for b in dl] == _torch_epochs("sampler")[1][2:]


def test_a_sampler_keeping_state_without_state_dict_is_refused_with_advice_that_works():
    # The refusal says what to restore; done, the next iter() gives the rest
    # (before: "restore it before iter()", and no word of which state).
    state, _ = _checkpoint_in_second_epoch("stateless")
    with _stateful_loader(stoker.DataLoader, "stateless", 0) as dl:
        dl.load_state_dict(state)
        with pytest.raises(ValueError) as e:
            iter(dl)
        said = str(e.value)
        assert "Rotating" in said and "stays loaded" in said
        assert "give it state_dict() and load_state_dict()" in said
        assert "its state before that epoch's iter()" in said
        dl.sampler.calls = 1  # as before the second epoch's iter()
        assert [b.tolist() for b in dl] == _torch_epochs("stateless")[1][2:]


def test_a_state_without_the_samplers_state_loads_and_says_what_to_restore():
    # A checkpoint of an older stoker (the same "stoker.DataLoader/2", no
    # sampler_states): it loads, and the resume goes as it went then.
    state, _ = _checkpoint_in_second_epoch("sampler")
    assert state["format"] == "stoker.DataLoader/2"
    assert state["epoch_start"].pop("sampler_states") == {"sampler": {"calls": 1}}
    assert state["epoch_start"].pop("sampler_states_after") == {"sampler": {"calls": 2}}
    with _stateful_loader(stoker.DataLoader, "sampler", 0) as dl:
        dl.load_state_dict(state)
        with pytest.raises(ValueError, match="holds none of its state_dict"):
            iter(dl)
        assert dl.sampler.calls == 0  # the refused try set it back
        dl.sampler.load_state_dict({"calls": 1})
        assert [b.tolist() for b in dl] == _torch_epochs("sampler")[1][2:]


def test_a_samplers_state_this_loaders_sampler_cannot_load_is_refused_naming_it():
    state, _ = _checkpoint_in_second_epoch("batch_sampler.sampler")
    batches = torch.utils.data.BatchSampler(Rotating(), 4, drop_last=False)
    with stoker.DataLoader(Indexed(), batch_sampler=batches) as dl:
        with pytest.raises(ValueError, match="a state of the batch_sampler.sampler, which"):
            dl.load_state_dict(state)


class _Numbers(torch.utils.data.Dataset):
    def __len__(self):
        return 101

    def __getitem__(self, i):
        return i


def _distributed_checkpoint(batch_size):
    data = _Numbers()
    sampler = torch.utils.data.DistributedSampler(data, num_replicas=2, rank=0, seed=3)
    with stoker.DataLoader(data, batch_size=batch_size, sampler=sampler) as dl:
        sampler.set_epoch(1)
        it = iter(dl)
        next(it)
        return dl.state_dict()


@pytest.mark.parametrize("batch_size", [4, 32])  # 13 -> 9 batches; 2 -> 2
def test_a_resume_under_another_world_size_is_refused_naming_it_whatever_the_batch_count(
        batch_size):
    # Before: "resume with the dataset as it was then" (unchanged) at 4, and
    # "e.g. its set_epoch()" (called) at 32, the checkpoint then kept for ever.
    state = _distributed_checkpoint(batch_size)
    data = _Numbers()
    sampler = torch.utils.data.DistributedSampler(data, num_replicas=3, rank=0, seed=3)
    with stoker.DataLoader(data, batch_size=batch_size, sampler=sampler) as dl:
        sampler.set_epoch(1)
        dl.load_state_dict(state)
        with pytest.raises(ValueError) as e:
            iter(dl)
        said = str(e.value)
        assert "sampler.num_replicas 2 then, 3 now" in said and "dataset" not in said
        assert "the checkpoint is dropped" in said
        assert sorted(i for b in dl for i in b.tolist()) == sorted(sampler)  # a new epoch, whole


def test_a_resume_before_set_epoch_names_the_epoch_and_stays_loaded():
    state = _distributed_checkpoint(4)
    data = _Numbers()
    sampler = torch.utils.data.DistributedSampler(data, num_replicas=2, rank=0, seed=3)
    with stoker.DataLoader(data, batch_size=4, sampler=sampler) as dl:
        dl.load_state_dict(state)
        with pytest.raises(ValueError) as e:
            iter(dl)
        assert "sampler.epoch 1 then, 0 now" in str(e.value) and "stays loaded" in str(e.value)
        sampler.set_epoch(1)
        rest = [i for b in dl for i in b.tolist()]
        assert rest == list(sampler)[4:]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_checkpoint_after_set_epoch_cut_an_epoch_short_resumes_at_the_next_epoch(workers):
    # set_epoch() abandons the epoch in progress: the loader's next iter()
    # starts a new one. Its checkpoint still held the abandoned epoch at its
    # third batch, and a resume gave that epoch's other 28 samples instead.
    def make():
        generator = torch.Generator()
        generator.manual_seed(3)
        return stoker.DataLoader(_Numbers(), batch_size=4, shuffle=True, num_workers=workers,
                                 generator=generator)

    with make() as dl:
        it = iter(dl)
        for _ in range(3):
            next(it)
        dl.set_epoch(1)
        state = dl.state_dict()
        want = [b.tolist() for b in dl]
    with make() as dl:
        dl.load_state_dict(state)
        assert [b.tolist() for b in dl] == want
    assert sorted(i for b in want for i in b) == list(range(len(_Numbers())))


def test_a_state_in_mid_epoch_without_its_epochs_start_is_refused():
    # Edited or mixed: its engine at batch 3, no epoch start to replay. It
    # was taken, and the resume skipped 3 batches of an order drawn afresh:
    # 12 samples twice, 12 never.
    with stoker.DataLoader(_Numbers(), batch_size=4, shuffle=True) as dl:
        it = iter(dl)
        for _ in range(3):
            next(it)
        state = dl.state_dict()
        ended = dict(state, engine=dict(state["engine"], epoch=state["engine"]["epoch"] + 1))
    for bad, said in [(dict(state, epoch_start=None), "its epoch_start is none"),
                      (ended, "its epoch_start is epoch 0's")]:
        with stoker.DataLoader(_Numbers(), batch_size=4, shuffle=True) as dl:
            with pytest.raises(ValueError, match="engine stands at batch 3 of epoch") as e:
                dl.load_state_dict(bad)
            assert said in str(e.value)


def _taken_ahead(it, taken):
    """`taken` batches, then more until the device look-ahead holds batches
    the user has not had (the workers make them meanwhile)."""
    head = [next(it) for _ in range(taken)]
    while not it._ahead._queue:
        import time
        time.sleep(0.05)
        head.append(next(it))
    return head


@pytest.mark.parametrize("workers", [2, "auto"])
def test_batches_copied_ahead_to_the_device_are_not_in_the_checkpoint(gpu_stand_in, workers):

    def made():
        return stoker.DataLoader(list(range(40)), batch_size=2, num_workers=workers,
                                 device=gpu_stand_in, device_prefetch_bytes=1 << 20)
    with made() as dl:
        head = _taken_ahead(iter(dl), 3)
        state = dl.state_dict()
    assert state["engine"]["position"] == len(head)
    with made() as dl:
        dl.load_state_dict(state)
        rest = [b.tolist() for b in dl]
    assert [x for b in head for x in b.tolist()] + [x for b in rest for x in b] == list(range(40))
