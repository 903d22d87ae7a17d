"""Failures become Python exceptions that name the sample and its file."""

import os
import signal
import threading

import pytest

import stoker


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
    with pytest.raises(FileNotFoundError, match=gone):
        next(iter(loader))


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


def test_ctrl_c_interrupts_a_wait():
    # One worker, each read sleeping 1.5 s: the second next() waits, and a
    # SIGINT during that wait must end it with KeyboardInterrupt instead of
    # the batch. (Fixed workers: a tuned loader waits inside the engine and
    # hears Ctrl-C only when its batch arrives; see loader_bindings.cc.)
    # Python's own Ctrl-C handler, whatever this process inherited: a shell
    # starts background jobs with SIGINT ignored, and Python then leaves it so.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    source = stoker.Synthetic(size=4, shape=(8,), read_latency_us=1_500_000)
    loader = stoker.Loader(source, batch_size=1, workers=1, prefetch=1, shuffle=False)
    it = iter(loader)
    next(it)
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            next(it)
        assert loader.stats()["metrics"]["batches_delivered"] == 1
        # Cleanly: the loader goes on where it was.
        _, labels = next(it)
        assert labels.tolist() == [1]
    finally:
        timer.cancel()
        loader.close()
        signal.signal(signal.SIGINT, previous)
