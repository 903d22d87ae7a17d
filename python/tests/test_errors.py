"""Failures become Python exceptions that name the sample and its file."""

import contextlib
import io
import json
import os
import pickle
import signal
import subprocess
import sys
import tarfile
import threading
import warnings

import pytest

import stoker
from draining import take_all


def _corrupt(tree):
    path = os.path.join(tree, "bee", "img01.jpg")
    with open(path, "r+b") as f:
        data = f.read()
        f.seek(0)
        f.write(data[:2] + b"\x00garbage" * 8)  # keeps the JPEG start marker
        f.truncate(len(data) // 3)
    return path


def test_corrupt_file_raises_data_error_naming_it(fresh_tree):
    path = _corrupt(fresh_tree)
    loader = stoker.Loader(fresh_tree, batch_size=4, shuffle=False,
                           transforms=stoker.transforms.eval(16), workers=2)
    delivered = 0
    with pytest.raises(stoker.DataError) as info:
        for _, labels in loader:
            delivered += len(labels)
    assert path in str(info.value)
    assert isinstance(info.value, ValueError)
    assert info.value.code == "data error"
    # The good samples of the failed batch come next; the epoch goes on.
    delivered += sum(len(y) for _, y in loader)
    assert delivered == len(loader.source) - 1


_LOAD_CUT_SHARD = """
import json, os, sys
import stoker
shard = sys.argv[1]
source = stoker.TarShards(shard)
os.truncate(shard, os.path.getsize(shard) // 2)  # after the source indexed it
loader = stoker.Loader(source, batch_size=4, shuffle=False, workers=2, on_error="skip",
                       transforms=stoker.transforms.eval(16), output="numpy")
delivered = sum(len(y) for _, y in loader)
print(json.dumps({"samples": len(source), "delivered": delivered, "skipped": loader.skipped()}))
"""


def test_shard_cut_short_while_loading_skips_the_lost_samples(image_tree, tmp_path):
    # A shard truncated after it was opened (rewritten in place, a full disk)
    # used to kill the process with SIGBUS, on_error="skip" or not. Now each
    # lost sample is a data error naming the shard and member. Run in a child
    # process, so that a crash fails this test rather than the whole run.
    shard = str(tmp_path / "cut.tar")
    with tarfile.open(shard, "w") as tar:
        for i, name in enumerate(sorted(os.listdir(os.path.join(image_tree, "ant")))):
            path = os.path.join(image_tree, "ant", name)
            if not os.path.isfile(path):
                continue
            tar.add(path, arcname=f"s{i:03d}" + os.path.splitext(name)[1])
            label = tarfile.TarInfo(f"s{i:03d}.cls")
            label.size = 1
            tar.addfile(label, io.BytesIO(b"0"))
    run = subprocess.run([sys.executable, "-c", _LOAD_CUT_SHARD, shard], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, f"exit {run.returncode}: {run.stderr[-2000:]}"
    result = json.loads(run.stdout)
    skipped = result["skipped"]
    assert skipped and result["delivered"] > 0
    assert result["delivered"] + len(skipped) == result["samples"]
    for record in skipped:
        assert record["key"].startswith(shard + ":s"), record
        assert "truncated" in record["reason"], record


def test_skip_policy_records_the_file(fresh_tree):
    path = _corrupt(fresh_tree)
    loader = stoker.Loader(fresh_tree, batch_size=4, transforms=stoker.transforms.eval(16),
                           on_error="skip")
    delivered = sum(len(y) for _, y in loader)
    assert delivered == len(loader.source) - 1
    (record,) = loader.skipped()
    assert record["key"] == path and record["epoch"] == 0
    assert "data error" in record["reason"]


def test_missing_file_raises_file_not_found(fresh_tree):
    source = stoker.ImageFolder(fresh_tree)
    gone = source.key(2)
    os.remove(gone)
    loader = stoker.Loader(source, batch_size=100, shuffle=False,
                           transforms=stoker.transforms.eval(16))
    with pytest.raises(FileNotFoundError, match=gone) as info:
        next(iter(loader))
    # A bad sample like any other: a DataError naming it, whatever its cause.
    assert isinstance(info.value, stoker.DataError)
    assert (info.value.index, info.value.key) == (2, gone)


def test_open_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        stoker.ImageFolder(str(tmp_path / "absent"))
    (tmp_path / "empty_class").mkdir()
    with pytest.raises(FileNotFoundError):
        stoker.ImageFolder(str(tmp_path))
    bad_list = tmp_path / "list.txt"
    bad_list.write_text("no-tab-here\n")
    with pytest.raises(ValueError, match="list.txt"):
        stoker.FileList(str(bad_list))


def test_synthetic_failures_name_the_index():
    source = stoker.Synthetic(size=32, shape=(8,), fail_indices=[5])
    loader = stoker.Loader(source, batch_size=8, shuffle=False)
    with pytest.raises(stoker.DataError, match="sample 5"):
        list(loader)


@contextlib.contextmanager
def _sigint_after(seconds):
    # Python's own Ctrl-C handler, whatever this process inherited: a shell
    # starts background jobs with SIGINT ignored, and Python then leaves it so.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)


def test_ctrl_c_interrupts_a_wait():
    # One worker, each read sleeping 1.5 s: the second next() waits, and a
    # SIGINT during that wait must end it with KeyboardInterrupt instead of
    # the batch. (Fixed workers: a tuned loader waits inside the engine and
    # hears Ctrl-C only when its batch arrives; see loader_bindings.cc.)
    source = stoker.Synthetic(size=4, shape=(8,), read_latency_us=1_500_000)
    loader = stoker.Loader(source, batch_size=1, workers=1, prefetch=1, shuffle=False)
    it = iter(loader)
    next(it)
    try:
        with _sigint_after(0.2), pytest.raises(KeyboardInterrupt):
            next(it)
        assert loader.stats()["metrics"]["batches_delivered"] == 1
        # Cleanly: the loader goes on where it was.
        _, labels = next(it)
        assert labels.tolist() == [1]
    finally:
        loader.close()


def test_ctrl_c_interrupts_a_batch_made_without_workers():
    # workers=0: next() makes the batch itself, 8 reads of 0.3 s. A SIGINT
    # ends it after the sample being read, and the next call makes the rest
    # of that very batch (before, the whole batch was made, then dropped as
    # KeyboardInterrupt left next()).
    source = stoker.Synthetic(size=16, shape=(8,), read_latency_us=300_000)
    loader = stoker.Loader(source, batch_size=8, workers=0, shuffle=False)
    it = iter(loader)
    try:
        with _sigint_after(0.2), pytest.raises(KeyboardInterrupt):
            next(it)
        metrics = loader.stats()["metrics"]
        assert metrics["batches_delivered"] == 0
        assert metrics["samples_produced"] < 8
        _, labels = next(it)
        assert labels.tolist() == list(range(8))
    finally:
        loader.close()


def test_json_keys_that_are_not_utf8_decode_like_os_fsdecode():
    from stoker import _stoker
    key = b"n\xff\xfe.jpg"
    (decoded, value), = _stoker._json_object_with_key(key).items()
    assert isinstance(decoded, str) and decoded == value == os.fsdecode(key)
    assert os.fsencode(decoded) == key


# --- the memory budget --------------------------------------------------------

def _huge_sparse_jpg(tree):
    """A 3 GiB file named like an image; sparse, so it costs no disk."""
    path = os.path.join(tree, sorted(os.listdir(tree))[0], "huge.jpg")
    with open(path, "wb") as f:
        f.truncate(3 << 30)
    return path


def test_a_file_over_the_memory_budget_is_skipped_unread_naming_the_cap(fresh_tree):
    path = _huge_sparse_jpg(fresh_tree)
    loader = stoker.Loader(fresh_tree, batch_size=4, transforms=stoker.transforms.eval(16),
                           workers=2, on_error="skip", memory_budget=64 << 20)
    delivered = sum(len(y) for _, y in loader)
    assert delivered == len(loader.source) - 1
    (record,) = loader.skipped()
    assert record["key"] == path
    assert "3.0 GiB" in record["reason"] and "per-sample cap" in record["reason"], record
    assert "memory budget of 64.0 MiB" in record["reason"], record


def test_a_file_over_the_memory_budget_raises_naming_it(fresh_tree):
    path = _huge_sparse_jpg(fresh_tree)
    loader = stoker.Loader(fresh_tree, batch_size=100, transforms=stoker.transforms.eval(16),
                           workers=1, memory_budget=64 << 20)
    with pytest.raises(stoker.ResourceError, match="per-sample cap") as e:
        next(iter(loader))
    assert path in str(e.value) and e.value.code == "resource exhausted"


def test_an_image_whose_decode_would_not_fit_is_skipped_from_its_header(fresh_tree):
    # A small JPEG whose frame header claims 9000 x 9000 (243 MB decoded).
    source = stoker.ImageFolder(fresh_tree)
    path = next(source.key(i) for i in range(len(source)) if source.key(i).endswith("img00.jpg"))
    data = bytearray(open(path, "rb").read())
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = (9000).to_bytes(2, "big") * 2
    with open(path, "wb") as f:
        f.write(data)
    loader = stoker.Loader(fresh_tree, batch_size=4, transforms=stoker.transforms.eval(16),
                           workers=2, on_error="skip", memory_budget=64 << 20)
    assert sum(len(y) for _, y in loader) == len(loader.source) - 1
    (record,) = loader.skipped()
    assert record["key"] == path and "9000x9000" in record["reason"], record


def test_a_batch_over_the_memory_budget_is_refused_when_the_loader_is_made(image_tree):
    with pytest.raises(ValueError, match="batch_size") as e:
        stoker.Loader(image_tree, batch_size=64, transforms=stoker.transforms.eval(224),
                      workers=2, memory_budget=16 << 20)
    assert "memory budget of 16.0 MiB" in str(e.value)
    # Exactly two batches: no room left for a worker's sample, every one of
    # which was then refused; it is refused here instead.
    source = stoker.Synthetic(size=40, shape=(1000,))  # 1,000-byte samples
    with pytest.raises(ValueError, match="and a sample more"):
        stoker.Loader(source, batch_size=4, workers=1, memory_budget=2 * 4000)
    loader = stoker.Loader(source, batch_size=4, workers=1, memory_budget=2 * 4000 + 1000,
                           output="numpy")
    assert sum(len(y) for _, y in loader) == 40


def test_a_batch_over_the_memory_budget_names_the_option_as_each_api_spells_it():
    source = stoker.Synthetic(size=40, shape=(1000,))
    with pytest.raises(ValueError) as e:
        stoker.Loader(source, batch_size=4, workers=1, memory_budget=8000)
    assert "option 'memory_budget' = 8000" in str(e.value)
    assert "memory_budget_bytes" not in str(e.value)
    pytest.importorskip("torch")
    with pytest.raises(ValueError, match="option 'memory_budget_bytes' = 50"):
        with stoker.DataLoader(list(range(8)), batch_size=4, memory_budget_bytes=50) as loader:
            next(iter(loader))


# --- a Python dataset's failed sample (stoker.DataLoader) ---------------------
#
# Raised as torch raises it, of the sample's own exception type (`except
# OSError` around the loop catches a truncated image), and a stoker.DataError
# naming the sample, chained to the original, with index, key and worker.

KINDS = ["processes", "threads", "zero"]


def _data_loader(dataset, kind, **options):
    pytest.importorskip("torch")
    workers = options.pop("num_workers", 1)
    workers = 0 if kind == "zero" else workers
    return stoker.DataLoader(dataset, num_workers=workers,
                             worker_kind="threads" if kind == "zero" else kind, **options)


class Raising:
    """Sample i is i, or raises what `errors[i]()` makes (kept in `raised[i]`)."""

    def __init__(self, n, errors):
        self.n, self.errors, self.raised = n, errors, {}

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i in self.errors:
            self.raised[i] = self.errors[i]()
            raise self.raised[i]
        return i


class NeedsTwo(Exception):
    """Its args do not fit its constructor: pickle cannot rebuild it."""

    def __init__(self, path, why):
        super().__init__(f"{path}: {why}")


class HoldsALock(Exception):
    """A field pickle refuses."""

    def __init__(self, message):
        super().__init__(message)
        self.lock = threading.Lock()


class TooBig(Exception):
    """Pickles to more than a message to the parent may hold."""

    def __init__(self, message):
        super().__init__(message)
        self.payload = b"x" * (1 << 17)


def _next_error(it):
    """What next(it) raises."""
    try:
        next(it)
    except Exception as e:  # noqa: BLE001 -- the test looks at it
        return e
    raise AssertionError("next() raised nothing")


@pytest.mark.parametrize("kind", KINDS)
def test_a_samples_error_is_a_data_error_of_its_own_type(kind):
    ds = Raising(12, {6: lambda: OSError("image file is truncated (3 bytes not processed)")})
    with _data_loader(ds, kind, batch_size=4) as dl:
        it = iter(dl)
        assert next(it).tolist() == [0, 1, 2, 3]
        try:
            next(it)
            raise AssertionError("no error for sample 6")
        except OSError as e:  # caught as torch users catch it
            error = e
        assert isinstance(error, stoker.DataError) and isinstance(error, ValueError)
        assert (error.index, error.key) == (6, None)
        assert error.worker == (None if kind == "zero" else 0)
        assert error.code == "data error"
        # The batch (and that its good samples come next: unlike torch's, the
        # batch is short), the sample, the exception, the traceback.
        text = str(error)
        assert text.startswith("batch 1 of epoch 0 (its 3 other samples come as the next batch): "
                               "sample 6: OSError: image file is truncated")
        assert "Traceback" in text and "__getitem__" in text
        # Chained to the original: itself in this process, a copy from a worker process.
        cause = error.__cause__
        assert type(cause) is OSError and cause.args == ds.errors[6]().args
        if kind != "processes":
            assert cause is ds.raised[6]
        # The batch's other samples come next, then the rest of the epoch.
        assert next(it).tolist() == [4, 5, 7]
        assert next(it).tolist() == [8, 9, 10, 11]


@pytest.mark.parametrize("kind", ["processes", "zero"])
def test_every_built_in_type_a_dataset_raises_combines(kind):
    from PIL import UnidentifiedImageError
    errors = [lambda: OSError(5, "Input/output error", "/data/a.jpg"),
              lambda: KeyError("label"),
              lambda: IndexError("list index out of range"),
              lambda: RuntimeError("no"),
              lambda: ValueError("bad value"),
              lambda: TypeError("bad type"),
              lambda: UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
              lambda: UnidentifiedImageError("cannot identify image file 'a.jpg'"),
              lambda: NeedsTwo("a.jpg", "broken")]
    ds = Raising(len(errors), dict(enumerate(errors)))
    with _data_loader(ds, kind, batch_size=1) as dl:
        it = iter(dl)
        for i, make in enumerate(errors):
            error, original = _next_error(it), make()
            assert isinstance(error, type(original)) and isinstance(error, stoker.DataError), i
            assert error.index == i
            assert str(error).startswith(f"batch {i} of epoch 0: sample {i}: "
                                         f"{type(original).__name__}: "), str(error)
            assert type(error.__cause__) is (type(original) if kind == "zero" or i != 8
                                             else stoker._errors.WorkerTraceback)
            if type(error.__cause__) is type(original):
                assert error.__cause__.args == original.args
            # A combined error pickles (logging, multiprocessing), as its type.
            back = pickle.loads(pickle.dumps(error))
            assert type(back) is type(error) and str(back) == str(error)
            assert (back.index, back.worker) == (error.index, error.worker)
        with pytest.raises(StopIteration):
            next(it)


@pytest.mark.parametrize("kind", KINDS)
def test_an_exception_that_does_not_pickle_still_names_its_sample(kind):
    class Local(Exception):  # its type does not pickle at all
        pass

    ds = Raising(4, {0: lambda: NeedsTwo("a.jpg", "broken"), 1: lambda: HoldsALock("locked"),
                     2: lambda: TooBig("big"), 3: lambda: Local("local")})
    with _data_loader(ds, kind, batch_size=1) as dl:
        it = iter(dl)
        for i, want in enumerate((NeedsTwo, HoldsALock, TooBig, Local)):
            error = _next_error(it)
            assert isinstance(error, stoker.DataError) and error.index == i
            assert error.worker == (None if kind == "zero" else 0)
            assert f"sample {i}: {want.__name__}: " in str(error)
            if kind != "processes":  # in this process: the original, whatever it holds
                assert isinstance(error, want) and error.__cause__ is ds.raised[i]
                continue
            # From a worker process: its type where pickle can name it, and a
            # stand-in holding the worker's traceback as its cause.
            assert isinstance(error, want) == (want is not Local)
            assert type(error.__cause__) is stoker._errors.WorkerTraceback
            assert str(error.__cause__).startswith("Traceback") and want.__name__ in str(
                error.__cause__)


@pytest.mark.parametrize("kind", KINDS)
def test_a_batch_with_several_failures_raises_the_first_ones_type(kind):
    ds = Raising(8, {5: lambda: KeyError("label"), 6: lambda: OSError("truncated")})
    with _data_loader(ds, kind, batch_size=4, num_workers=2) as dl:
        it = iter(dl)
        next(it)
        error = _next_error(it)
        assert isinstance(error, KeyError) and isinstance(error, stoker.DataError)
        assert not isinstance(error, OSError) and error.index == 5
        assert "2 samples failed" in str(error) and "sample 6" in str(error)
        if kind == "threads":
            assert error.worker in (0, 1)
        assert next(it).tolist() == [4, 7]


def _collate_raising(error):
    """A collate_fn that raises what `error(batch)` makes for a batch holding
    a multiple of 5 (None: collates as a list)."""
    def collate(batch):
        made = error(batch) if any(i % 5 == 0 for i in batch) else None
        if made is not None:
            raise made
        return list(batch)
    return collate


@pytest.mark.parametrize("kind", KINDS)
def test_a_collate_fns_error_is_a_data_error_of_its_own_type(kind):
    # torch re-raises a collate_fn's error as its type ("stack expects each
    # tensor to be equal size" is a RuntimeError): so does stoker, naming the batch.
    collate = _collate_raising(lambda batch: RuntimeError(f"stack expects equal size {batch}")
                               if batch[0] == 4 else None)
    with _data_loader(list(range(12)), kind, batch_size=4, collate_fn=collate) as dl:
        it = iter(dl)
        assert next(it) == [0, 1, 2, 3]
        error = _next_error(it)
        assert isinstance(error, RuntimeError) and isinstance(error, stoker.DataError)
        assert str(error).startswith("batch 1 of epoch 0: collate_fn raised RuntimeError: "
                                     "stack expects equal size [4, 5, 6, 7]")
        assert error.index is None and error.key is None
        assert error.worker == (None if kind == "zero" else 0)
        assert type(error.__cause__) is RuntimeError
        assert error.__cause__.args == ("stack expects equal size [4, 5, 6, 7]",)
        assert next(it) == [8, 9, 10, 11]  # the epoch goes on, as torch's does


@pytest.mark.parametrize("kind", KINDS)
def test_a_collate_error_that_does_not_pickle_is_a_plain_data_error(kind):
    class Local(Exception):  # its type does not pickle at all
        pass

    with _data_loader(list(range(5)), kind, batch_size=5, collate_fn=_collate_raising(
            lambda batch: Local("local"))) as dl:
        error = _next_error(iter(dl))
    assert type(error) is stoker.DataError and "collate_fn raised Local: local" in str(error)
    assert type(error.__cause__) is stoker._errors.WorkerTraceback
    assert "Local: local" in str(error.__cause__)


def test_a_collate_error_in_a_sharded_stream_is_of_its_own_type():
    class Shards(stoker.ShardedIterable):
        def shards(self):
            return ["a", "b"]

        def iter_shard(self, shard):
            return iter(range(5) if shard == "a" else range(6, 9))

    with stoker.DataLoader(Shards(), batch_size=5, num_workers=1,
                           collate_fn=_collate_raising(lambda b: KeyError("label"))) as dl:
        it = iter(dl)
        error = _next_error(it)
        assert isinstance(error, KeyError) and isinstance(error, stoker.DataError)
        assert str(error).startswith("epoch 0: shard 'a': batch 0 of the shard: "
                                     "collate_fn raised KeyError")
        assert (error.index, error.shard, error.key) == (None, "a", "a")
        assert next(it) == [6, 7, 8]


@pytest.mark.timeout(120)
def test_a_collate_error_made_on_a_remote_worker_is_of_its_own_type(shared_dask_cluster):
    pytest.importorskip("distributed")
    from remote_datasets import Seeded, collate_raising_where_made
    with stoker.DataLoader(Seeded(64, delay_s=0.005), batch_size=8, num_workers="auto",
                           max_workers=1, cluster=shared_dask_cluster.address, remote_min=1,
                           collate_fn=collate_raising_where_made) as dl:
        errors = take_all(dl)[1]
    assert len(errors) == 8  # every batch, each once
    assert all(isinstance(e, RuntimeError) and type(e.__cause__) is RuntimeError
               for e in errors)
    assert any("made on worker-" in str(e) for e in errors)  # some came from the cluster


def _remote_errors(dl, epochs):
    """`epochs` epochs through: the DataErrors raised on the way, and the batches."""
    errors, got = [], []
    for _ in range(epochs):
        batches, raised = take_all(dl)
        got += batches
        errors += raised
    return errors, got


@pytest.mark.timeout(120)
def test_a_remote_failure_that_does_not_travel_back_still_names_its_sample_and_keeps_the_cluster(
        shared_dask_cluster):
    # An exception that pickles but does not load back (its constructor's
    # args), and a batch that does not pickle at all: each fails that sample
    # or batch, as in a worker process, never the remote slots.
    pytest.importorskip("distributed")
    from remote_datasets import FailsAt, Seeded, collate_unpicklable_where_made
    with stoker.DataLoader(FailsAt(64, bad=37), batch_size=8, num_workers="auto",
                           max_workers=1, cluster=shared_dask_cluster.address,
                           remote_min=1) as dl:
        errors, got = _remote_errors(dl, epochs=2)
        remote = dl.stats()["remote"]
    assert len(errors) == 2 and all(e.index == 37 for e in errors)
    assert all("sample 37: TwoArgError: cannot read /data/37.jpg: code 5" in str(e)
               for e in errors)
    assert sorted(i for b in got for i in b["index"].tolist()) == sorted(
        [i for i in range(64) if i != 37] * 2)
    assert remote["lost"] is None and remote["batches"] > 0

    with stoker.DataLoader(Seeded(64, delay_s=0.005), batch_size=8, num_workers="auto",
                           max_workers=1, cluster=shared_dask_cluster.address, remote_min=1,
                           collate_fn=collate_unpicklable_where_made) as dl:
        errors, got = _remote_errors(dl, epochs=2)
        remote = dl.stats()["remote"]
    assert errors and all("the batch failed outside its samples: TypeError: cannot pickle" in
                          str(e) and isinstance(e, TypeError) for e in errors)
    assert len(errors) + len(got) == 16 and "lock" not in got[0]
    assert remote["lost"] is None and remote["batches"] == len(errors)


@pytest.mark.timeout(120)
def test_a_worker_init_fn_failing_on_the_cluster_is_the_users_error_not_the_clusters(
        shared_dask_cluster):
    # It was taken for stoker's own bug: the cluster dropped ("a remote task
    # failed outside its samples"), a warning the only sign.
    pytest.importorskip("distributed")
    from remote_datasets import Seeded, init_failing_where_made_remotely
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the cluster is not given up
        with stoker.DataLoader(Seeded(64, delay_s=0.005), batch_size=8, num_workers="auto",
                               max_workers=1, cluster=shared_dask_cluster.address,
                               remote_min=1,
                               worker_init_fn=init_failing_where_made_remotely) as dl:
            errors, got = _remote_errors(dl, epochs=2)
            remote = dl.stats()["remote"]
    assert errors and all("worker_init_fn failed on the cluster's worker: KeyError: 'no shard "
                          "for worker 0 here'" in str(e) and isinstance(e, KeyError)
                          for e in errors), errors
    assert len(errors) + len(got) == 16
    assert remote["lost"] is None and remote["batches"] == len(errors)


def _init_raising(worker_id):
    raise KeyError(f"no shard for worker {worker_id}")


def test_a_worker_init_fns_error_is_of_its_own_type():
    # torch re-raises what worker_init_fn raised as its type; stoker too, as
    # a RuntimeError (the worker could not start) that is also a KeyError.
    with stoker.DataLoader(list(range(8)), batch_size=4, num_workers=1,
                           worker_init_fn=_init_raising) as dl:
        error = _next_error(iter(dl))
    assert isinstance(error, KeyError) and isinstance(error, RuntimeError)
    assert not isinstance(error, stoker.DataError)
    assert "could not start: worker_init_fn raised KeyError: 'no shard for worker 0'" in str(error)
    assert "In the worker:" in str(error) and "_init_raising" in str(error)
    assert type(error.__cause__) is KeyError and error.index is None and error.worker == 0
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and str(back) == str(error)


def test_a_worker_that_dies_is_a_data_error_naming_its_sample_and_worker():
    ds = Raising(8, {3: lambda: os.kill(os.getpid(), signal.SIGSEGV)})
    with _data_loader(ds, "processes", batch_size=4) as dl:
        it = iter(dl)
        error = _next_error(it)
        assert type(error) is stoker.DataError and "killed by signal 11" in str(error)
        assert (error.index, error.key, error.worker, error.__cause__) == (3, None, 0, None)
        assert next(it).tolist() == [0, 1, 2]


@pytest.mark.parametrize("kind", KINDS)
def test_skip_and_what_is_not_the_samples_fault_are_unchanged(kind):
    ds = Raising(8, {2: lambda: OSError("truncated"), 5: lambda: MemoryError("out of memory")})
    with _data_loader(ds, kind, batch_size=4, on_error="skip") as dl:
        it = iter(dl)
        assert next(it).tolist() == [0, 1, 3]  # 2 skipped
        error = _next_error(it)  # 5: never skipped, a plain ResourceError
        assert type(error) is stoker.ResourceError and error.__cause__ is None
        assert "sample 5: MemoryError: out of memory (not the sample's fault" in str(error)
        assert next(it).tolist() == [4, 6, 7]
        [record] = dl.skipped()
        assert record == {"epoch": 0, "index": 2, "key": "",
                          "reason": record["reason"]}
        assert record["reason"].startswith("data error: OSError: truncated")


def _loop_going_on_after_errors(it, most=8):
    """What a loop that catches DataError and goes on sees, up to `most` calls."""
    seen = []
    for _ in range(most):
        try:
            seen.append(len(next(it)))
        except StopIteration:
            return seen + ["end"]
        except stoker.DataError as e:
            seen.append(str(e).split(":")[0])
    return seen


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
def test_an_epoch_whose_every_sample_is_skipped_ends_after_its_error(kind):
    # Its error ends the epoch, and the call after it ends the loop; before,
    # that call waited for ever for the next epoch's batches (the
    # DataLoader sets them at iter()).
    ds = Raising(6, {i: (lambda i=i: OSError(f"bad {i}")) for i in range(6)})
    with _data_loader(ds, kind, batch_size=2, on_error="skip") as dl:
        for epoch in range(2):
            assert _loop_going_on_after_errors(iter(dl)) == [
                f"epoch {epoch} delivered nothing", "end"]
        assert len(dl.skipped()) == 12


def test_a_loaders_pass_whose_every_sample_is_skipped_ends_after_its_error(tmp_path):
    # stoker.Loader, its own iterator: the call after the error ended no
    # pass, it started the next epoch (and a loop going on ran for ever).
    bad = tmp_path / "bad.jpg"
    bad.write_text("not an image\n")
    (tmp_path / "list.txt").write_text(f"{bad}\t0\n")
    loader = stoker.Loader(str(tmp_path / "list.txt"), batch_size=4, shuffle=False, workers=1,
                           output="numpy", on_error="skip",
                           transforms=stoker.transforms.eval(8))
    for epoch in range(2):
        assert _loop_going_on_after_errors(iter(loader)) == [
            f"epoch {epoch} delivered nothing", "end"]
    loader.set_epoch(5)
    assert _loop_going_on_after_errors(iter(loader)) == ["epoch 5 delivered nothing", "end"]
    loader.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_the_pass_after_an_epoch_that_skipped_every_sample_is_the_next_epoch(tmp_path, workers):
    # A `for` leaves at the epoch's error; the next `for` (a new pass) runs
    # the next epoch: it gave nothing and no error, and every epoch after it
    # was one behind the loop's count.
    bad = tmp_path / "bad.jpg"
    bad.write_text("not an image\n")
    (tmp_path / "list.txt").write_text(f"{bad}\t0\n")
    loader = stoker.Loader(str(tmp_path / "list.txt"), batch_size=4, shuffle=False,
                           workers=workers, output="numpy", on_error="skip",
                           transforms=stoker.transforms.eval(8))
    for epoch in range(3):
        with pytest.raises(stoker.DataError, match=f"epoch {epoch} delivered nothing"):
            for _ in loader:
                pass
    loader.close()


def test_an_exception_that_does_not_unpickle_here_gives_a_plain_data_error():
    from stoker import _errors
    engine = stoker.DataError("batch 0 of epoch 0: sample 3: Gone: away\n\nIn the worker:\nTb")
    engine.code, engine.index, engine.key, engine.worker = "data error", 3, None, 1
    engine._sample = (b"not a pickle", "Traceback (most recent call last): Gone", None, -1)
    error = _errors.sample_error(engine, None)
    assert type(error) is stoker.DataError and str(error) == str(engine)
    assert (error.code, error.index, error.key, error.worker) == ("data error", 3, None, 1)
    assert type(error.__cause__) is _errors.WorkerTraceback
    assert str(error.__cause__) == "Traceback (most recent call last): Gone"
    assert _errors.sample_error(stoker.DataError("not a sample's"), None) is None


def test_the_native_loaders_data_error_keeps_its_type():
    source = stoker.Synthetic(size=16, shape=(8,), fail_indices=[5])
    loader = stoker.Loader(source, batch_size=8, shuffle=False)
    with pytest.raises(ValueError) as info:  # as callers of stoker.Loader catch it
        list(loader)
    assert type(info.value) is stoker.DataError and info.value.__cause__ is None
    assert (info.value.index, info.value.worker) == (5, None)
