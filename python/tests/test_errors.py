"""Failures become Python exceptions that name the sample and its file."""

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
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
