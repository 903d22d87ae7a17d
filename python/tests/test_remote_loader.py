"""stoker.Loader (the native pipeline) with remote slots on a Dask cluster
(cluster=): a real dask-scheduler and dask-worker processes on 127.0.0.1,
started and stopped by the fixtures in conftest.py.

Each test reads through a loader with one local worker at most and
remote_min=1 (a remote slot in use whatever the tuner says), and compares
what it got, batch for batch, with a loader without a cluster or workers and
the same seed: a sample is made from (seed, epoch, index) wherever it is
made, so the bytes are identical. No test asserts a time.
"""

import itertools
import os
import shutil
import signal
import time
import warnings

import numpy as np
import pytest

pytest.importorskip("distributed")
import stoker  # noqa: E402
from conftest import CLASSES, write_tree  # noqa: E402

BATCH = 8
SEED = 77
TRANSFORM = stoker.transforms.train(32, layout="uint8_chw")
# How long a test reads epochs waiting for remote batches (an epoch of the
# small tree takes milliseconds; the first remote task, a second or so).
WAIT_S = 30.0


def epochs_within(seconds=WAIT_S):
    """0, 1, 2, ... for `seconds`."""
    deadline = time.monotonic() + seconds
    return itertools.takewhile(lambda _: time.monotonic() < deadline, itertools.count())


def local(source, **options):
    return stoker.Loader(source, batch_size=BATCH, seed=SEED, transforms=TRANSFORM, workers=0,
                         output="numpy", **options)


def remote(source, cluster, **options):
    return stoker.Loader(source, batch_size=BATCH, seed=SEED, transforms=TRANSFORM,
                         workers="auto", max_workers=1, remote_min=1, cluster=cluster,
                         tune_interval=0.05, output="numpy", **options)


def epoch_of(loader):
    return [(images.copy(), labels.copy()) for images, labels in loader]


def reference(source, epoch):
    with local(source) as loader:
        loader.set_epoch(epoch)
        return epoch_of(loader)


def assert_same_epoch(got, want):
    assert len(got) == len(want)
    for k, ((gi, gl), (wi, wl)) in enumerate(zip(got, want)):
        assert np.array_equal(gl, wl), f"batch {k}: other samples"
        assert np.array_equal(gi, wi), f"batch {k}: other bytes"


def epochs_until_remote(loader, source, more=1):
    """Reads epochs (each checked against the reference) until the cluster
    made some batches, then `more`; returns the remote stats."""
    for epoch in epochs_within():
        assert_same_epoch(epoch_of(loader), reference(source, epoch))
        stats = loader.stats()["remote"]
        if stats["batches"] > 0:
            more -= 1
            if more < 0:
                return stats
    raise AssertionError(f"no remote batch in {WAIT_S} s: {loader.stats()['remote']}")


@pytest.mark.timeout(120)
def test_remote_samples_are_the_local_ones_exactly_once(shared_dask_cluster, image_tree):
    with remote(image_tree, shared_dask_cluster.address) as loader:
        stats = epochs_until_remote(loader, image_tree)
        made = loader.stats()["metrics"]["remote_samples_produced"]
    assert stats["capacity"] == 2  # two workers of one thread: one slot each
    assert stats["lost"] is None and stats["retries"] == 0
    assert stats["peak"] >= 1 and stats["bytes_per_s"] >= 0
    assert made > 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_bad_file_made_remotely_is_named_as_a_local_one_is(shared_dask_cluster, tmp_path,
                                                            on_error):
    root = write_tree(str(tmp_path / "tree"))
    bad = os.path.join(root, "bee", "broken.jpg")
    with open(bad, "wb") as f:
        f.write(b"\xff\xd8\xff\xe0 not a jpeg")
    with local(root, on_error="skip") as loader:
        loader.set_epoch(0)
        epoch_of(loader)
        want = loader.skipped()
    assert [s["key"] for s in want] == [bad]
    # What a cluster's worker sends back for it: its position, code and message.
    source = stoker.ImageFolder(root)
    index = [source.key(i) for i in range(len(source))].index(bad)
    samples, labels, failures = stoker._stoker.make_samples(
        source._impl, TRANSFORM._impl, SEED, 0, [index - 1, index], 2**62)
    assert len(samples) == 2 * int(np.prod(TRANSFORM.shape)) and len(labels) == 2
    assert [p for p, _, _ in failures] == [1] and failures[0][2] in want[0]["reason"]
    with remote(root, shared_dask_cluster.address, on_error=on_error) as loader:
        for epoch in epochs_within():
            errors, before = [], loader.stats()["remote"]["batches"]
            it = iter(loader)
            while True:
                try:
                    next(it)
                except StopIteration:
                    break
                except stoker.DataError as e:
                    errors.append(str(e))
            remote_made = loader.stats()["remote"]["batches"] > before
            skipped = [s for s in loader.skipped() if s["epoch"] == epoch]
            if on_error == "raise":
                assert len(errors) == 1 and bad in errors[0], errors
            else:
                assert not errors
                assert [(s["index"], s["key"]) for s in skipped] == \
                    [(w["index"], w["key"]) for w in want]
            if remote_made:
                break
        assert remote_made, f"no remote batch: {loader.stats()['remote']}, {loader.decisions()[-3:]}"


@pytest.mark.timeout(120)
def test_a_checkpoint_taken_with_a_cluster_resumes_without_one(shared_dask_cluster,
                                                              image_tree):
    with remote(image_tree, shared_dask_cluster.address) as loader:
        epochs_until_remote(loader, image_tree, more=0)
        epoch = loader.epoch
        it = iter(loader)
        head = [(i.copy(), l.copy()) for i, l in (next(it), next(it))]
        state = loader.state_dict()
    with local(image_tree) as loader:
        loader.load_state_dict(state)
        rest = epoch_of(loader)
    assert_same_epoch(head + rest, reference(image_tree, epoch))


@pytest.mark.timeout(120)
def test_a_scheduler_that_goes_away_leaves_the_samples_to_local_workers(dask_cluster_factory,
                                                                       image_tree):
    cluster = dask_cluster_factory(workers=1)
    address = cluster.address
    with remote(image_tree, address) as loader:
        epochs_until_remote(loader, image_tree, more=0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cluster.stop_scheduler(signal.SIGKILL)
            # Every epoch whole while the loader finds out, and after.
            for _ in epochs_within():
                epoch = loader.epoch
                assert_same_epoch(epoch_of(loader), reference(image_tree, epoch))
                if loader.stats()["remote"]["lost"]:
                    break
            assert_same_epoch(epoch_of(loader), reference(image_tree, epoch + 1))
        stats = loader.stats()["remote"]
    assert isinstance(stats["lost"], str) and stats["lost"]
    assert any(address in str(w.message) for w in caught
               if issubclass(w.category, RuntimeWarning)), [str(w.message) for w in caught]


@pytest.mark.timeout(120)
def test_a_worker_that_joins_late_is_used_after_its_cold_start(dask_cluster_factory, image_tree):
    # A worker starting beside the training: its first tasks would run while
    # it imports torch and stoker. Before, two of them lagged against the
    # local workers' milliseconds and the worker was left out for a minute,
    # making nothing; now it gets tasks once a check has run there.
    cluster = dask_cluster_factory(workers=0)
    with remote(image_tree, cluster.address) as loader:
        assert_same_epoch(epoch_of(loader), reference(image_tree, 0))  # local: no worker yet
        cluster.add_worker(cold=True)
        loader.set_epoch(0)  # epochs_until_remote reads from epoch 0
        stats = epochs_until_remote(loader, image_tree)
    assert stats["lost"] is None and stats["retries"] == 0


def test_a_cluster_needs_workers_auto(shared_dask_cluster, image_tree):
    with pytest.raises(ValueError, match="workers='auto'"):
        stoker.Loader(image_tree, workers=2, cluster=shared_dask_cluster.address)
    with pytest.raises(ValueError, match="remote_min=1 needs a cluster"):
        stoker.Loader(image_tree, remote_min=1)
    # Named before any connection (Dask's refusal read as the scheduler out of reach).
    with pytest.raises(TypeError, match="cluster_security must be a distributed.Security"):
        stoker.Loader(image_tree, workers="auto", cluster=shared_dask_cluster.address,
                      cluster_security="x")


@pytest.mark.timeout(120)
def test_a_stopped_worker_lags_and_its_samples_are_made_locally(dask_cluster_factory,
                                                                image_tree):
    # The one worker is stopped (SIGSTOP) once it has made some batches: the
    # batch the consumer then waits for lags and is made locally (before: it
    # waited remote_timeout, 60 s, for each), and the worker gets no task
    # after a second one lagged.
    cluster = dask_cluster_factory(workers=1)
    name, = cluster.worker_names
    with remote(image_tree, cluster.address) as loader:
        epochs_until_remote(loader, image_tree, more=0)
        os.kill(cluster.pid(name), signal.SIGSTOP)
        try:
            for _ in epochs_within():  # each whole, until a second task lagged
                epoch = loader.epoch
                assert_same_epoch(epoch_of(loader), reference(image_tree, epoch))
                stats = loader.stats()["remote"]
                if stats["lagged"] >= 2:
                    break
            suspects = set(loader._cluster._suspects)
        finally:
            os.kill(cluster.pid(name), signal.SIGCONT)
    assert stats["lagged"] >= 2 and stats["lost"] is None
    assert suspects == {cluster.worker_address(name)}


@pytest.mark.timeout(120)
def test_a_worker_that_finds_the_data_changed_is_refused_naming_both_counts(
        dask_cluster_factory, fresh_tree):
    # A file added to the tree after the loader was made: a worker that
    # joins opens the tree again by its path and finds one sample more.
    # Before, its samples were other files under the same indices (other
    # pixels and labels), without a word.
    cluster = dask_cluster_factory(workers=0)
    source = stoker.ImageFolder(fresh_tree)
    count = len(source)
    with remote(source, cluster.address) as loader:
        shutil.copy(os.path.join(fresh_tree, CLASSES[0], "img00.jpg"),
                    os.path.join(fresh_tree, CLASSES[0], "img00a.jpg"))
        worker = cluster.worker_address(cluster.add_worker())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for epoch in epochs_within():
                assert_same_epoch(epoch_of(loader), reference(source, epoch))
                stats = loader.stats()["remote"]
                if stats["refused"]:
                    break
    assert list(stats["refused"]) == [worker], stats
    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert any(worker in m and f"{count + 1} samples" in m and str(count) in m for m in said), said
    assert stats["capacity"] == 0 and stats["lost"] is None
