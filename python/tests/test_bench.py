"""stoker.bench: a num_workers sweep of a DataLoader over the user's dataset,
shown as `stoker bench` shows its own, ending with the line to paste for the
loader measured."""

import os
import shutil
import tempfile

import pytest
import torch

import stoker
import stoker._bench


class Squares(torch.utils.data.Dataset):
    """48 small samples (an image-like tensor and a label)."""

    def __len__(self):
        return 48

    def __getitem__(self, i):
        return torch.full((3, 8, 8), float(i)), i


def _table_rows(table):
    lines = table.splitlines()
    assert lines[0].split() == ["workers", "samples/s", "stall"]
    return [line.split() for line in lines[1:] if line.strip()]


def test_sweep_prints_the_table_marks_the_best_and_ends_with_the_line(tmp_path, capsys):
    plot = tmp_path / "sweep.svg"
    r = stoker.bench(Squares(), batch_size=4, num_workers=[0, 1, 2], seconds=0.2,
                     plot=str(plot), gpus=0)
    assert [p["num_workers"] for p in r["points"]] == [0, 1, 2]
    assert all(p["samples_per_s"] > 0 and p["batches"] > 0 for p in r["points"])
    best = r["best"]
    assert [p["best"] for p in r["points"]].count(True) == 1 and best["best"]
    # `stoker bench`'s rule: the fewest workers within 3 % of the fastest.
    top = max(p["samples_per_s"] for p in r["points"])
    assert best["num_workers"] == min(p["num_workers"] for p in r["points"]
                                      if p["samples_per_s"] * 1.03 >= top)
    # It names what it measured: the loader and the data.
    assert r["loader"] == "torch.utils.data.DataLoader" and r["data"] == "Squares (48 samples)"

    rows = _table_rows(r["table"])
    assert [int(row[0]) for row in rows] == [0, 1, 2]
    marked = [int(row[0]) for row in rows if row[-2:] == ["<-", "best"]]
    assert marked == [best["num_workers"]]

    n = best["num_workers"]
    d = r["dataloader"]
    assert d["num_workers"] == n and d["pin_memory"] is False
    assert d["prefetch_factor"] == (2 if n > 0 else None)  # torch's default, what ran
    assert d["line"] == (f"DataLoader(num_workers={n}, prefetch_factor=2, pin_memory=False, "
                         "persistent_workers=True)" if n > 0 else
                         "DataLoader(num_workers=0, pin_memory=False, persistent_workers=False)")
    assert d["rules"][0].startswith(f"num_workers={n}: the sweep's best count (")
    # It names the loader and the data it measured.
    assert d["loader"] == "torch.utils.data.DataLoader" and d["measured"] is True
    assert d["basis"] == "measured on Squares (48 samples), batch 4, by this sweep"

    out = capsys.readouterr().out
    assert out.startswith("stoker.bench: torch.utils.data.DataLoader over Squares (48 samples), "
                          "batch 4\n")
    assert r["table"].rstrip("\n") in out
    heading = ("For torch.utils.data.DataLoader (measured on Squares (48 samples), batch 4, by "
               "this sweep), paste:")
    tail = out[out.index(heading):].splitlines()
    assert tail[1].strip() == d["line"]
    assert [line.strip() for line in tail[2:2 + len(d["rules"])]] == d["rules"]
    assert tail[2 + len(d["rules"])].strip() == d["note"]
    assert out.rstrip("\n").endswith(d["text"].rstrip("\n"))

    svg = plot.read_text()
    assert r["plot"] == str(plot) and svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    assert "static sweep" in svg and "tuned:" not in svg


def test_the_recommended_count_is_stoker_benchs_rule():
    # One rule for `stoker bench` and stoker.bench (RecommendedSweepPoint):
    # the fewest workers within 3 % of the highest samples/s, in any order.
    rows = [(4, 395.0, 0.0), (0, 100.0, 0.5), (3, 400.0, 0.0), (2, 390.0, 0.01)]
    assert stoker._stoker.recommended_workers(rows) == 2
    assert stoker._stoker.recommended_workers([(1, 100.0, 0.0), (2, 200.0, 0.0)]) == 2
    with pytest.raises(ValueError, match="at least one point"):
        stoker._stoker.recommended_workers([])


def test_batches_bound_each_point_and_samples_follow_the_collate_fn():
    def as_dict(items):
        xs, ys = zip(*items)
        return {"images": torch.stack(xs), "labels": torch.tensor(ys)}

    r = stoker.bench(Squares(), batch_size=4, collate_fn=as_dict, num_workers=[0, 1],
                     batches=5, seconds=60, gpus=0, quiet=True)
    for p in r["points"]:
        assert p["batches"] == 5 and p["samples"] == 20, p


def test_samples_are_counted_by_the_plan_whatever_the_collate_fn_makes():
    # A collate_fn that keeps the samples as a list: 16 a batch, not the
    # first sample's first dimension (3) or its length (2). The epoch's last
    # batch holds what is left (48 = 2 x 20 + 8).
    r = stoker.bench(Squares(), batch_size=20, collate_fn=lambda items: items, num_workers=[0],
                     batches=3, seconds=60, gpus=0, quiet=True, shuffle=False)
    assert r["points"][0]["samples"] == 20 + 8 + 20  # after the first batch, left out


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(40))


@pytest.mark.parametrize("kind", ["torch", "stoker"])
def test_a_stream_is_swept_in_its_own_order(kind):
    # shuffle=True was forced, which torch refuses for an IterableDataset.
    r = stoker.bench(Stream(), batch_size=4, num_workers=[0, 1], batches=3, seconds=60, gpus=0,
                     quiet=True, kind=kind)
    assert [p["samples"] for p in r["points"]] == [12, 12]


def test_a_failed_sweep_leaves_no_plot_and_a_fifo_is_refused_at_once(tmp_path):
    plot = tmp_path / "sweep.svg"
    with pytest.raises(ValueError, match="no batch"):
        stoker.bench(torch.utils.data.TensorDataset(torch.zeros(3, 2)), batch_size=4,
                     drop_last=True, num_workers=[0], gpus=0, quiet=True, plot=plot)
    assert not plot.exists()
    os.mkfifo(tmp_path / "fifo.svg")  # no reader: opening it to write would wait for one
    with pytest.raises(OSError, match="not a regular file"):
        stoker.bench(Broken(), num_workers=[0], gpus=0, plot=tmp_path / "fifo.svg")


def test_a_sampler_of_the_users_is_passed_on():
    sampler = torch.utils.data.SequentialSampler(range(12))
    r = stoker.bench(Squares(), batch_size=4, sampler=sampler, num_workers=[0], batches=3,
                     seconds=60, gpus=0, quiet=True)
    assert r["points"][0]["samples"] == 12


def test_stoker_dataloader_can_be_the_thing_measured(capsys):
    # Issue 23: a count measured on stoker.DataLoader was pasted as a line
    # for torch's DataLoader. It is stoker.DataLoader's, and says so.
    r = stoker.bench(Squares(), batch_size=6, num_workers=[0, 1], seconds=0.2, kind="stoker",
                     gpus=0)
    assert [p["num_workers"] for p in r["points"]] == [0, 1]
    assert r["loader"] == "stoker.DataLoader"
    d = r["dataloader"]
    n = r["best"]["num_workers"]
    assert d["loader"] == "stoker.DataLoader" and d["measured"] is True
    assert d["line"] == f"stoker.DataLoader(num_workers={n}, pin_memory=False)"
    assert d["prefetch_factor"] is None and d["persistent_workers"] is None
    assert "measured with stoker.DataLoader; the fewest workers within 3 %" in d["rules"][0]
    assert d["basis"] == "measured on Squares (48 samples), batch 6, by this sweep"
    out = capsys.readouterr().out
    assert out.startswith("stoker.bench: stoker.DataLoader over Squares (48 samples), batch 6\n")
    assert "torch.utils.data.DataLoader, paste" not in out and "\n  DataLoader(" not in out
    assert ("For stoker.DataLoader (measured on Squares (48 samples), batch 6, by this sweep), "
            "paste:\n  " + d["line"]) in out


def test_default_counts_run_from_zero_to_twice_the_cpus(monkeypatch):
    monkeypatch.setattr(stoker._bench, "_cores", lambda: 1)
    r = stoker.bench(Squares(), batch_size=8, batches=1, gpus=0, quiet=True)
    assert [p["num_workers"] for p in r["points"]] == [0, 1, 2]


class Broken(Squares):
    def __getitem__(self, i):
        raise AssertionError("the sweep must not start")


def test_bad_arguments_fail_before_the_sweep(tmp_path):
    with pytest.raises(ValueError, match="kind"):
        stoker.bench(Broken(), kind="jax")
    with pytest.raises(ValueError, match="num_workers: worker count 1 is listed twice"):
        stoker.bench(Broken(), num_workers=[1, 1])
    with pytest.raises(ValueError, match="num_workers: list at least one"):
        stoker.bench(Broken(), num_workers=[])
    with pytest.raises(ValueError, match="seconds"):
        stoker.bench(Broken(), num_workers=[0], seconds=0)
    with pytest.raises(TypeError, match="num_workers"):
        stoker.bench(Broken(), num_workers=["two"])
    with pytest.raises(OSError, match="missing"):
        stoker.bench(Broken(), num_workers=[0], plot=tmp_path / "missing" / "sweep.svg", gpus=0)


def test_a_plot_whose_folder_takes_no_new_file_is_refused_before_the_sweep():
    # The plot is written beside and renamed over the file: a file the user may
    # write in a folder that takes no new file passed the check, then failed
    # after the whole sweep. Root writes anywhere: the check runs as nobody.
    folder = tempfile.mkdtemp(prefix="stoker-plot-")
    plot = os.path.join(folder, "sweep.svg")
    try:
        with open(plot, "w") as f:
            f.write("old")
        os.chmod(plot, 0o666)
        os.chmod(folder, 0o555)
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                if os.geteuid() == 0:
                    os.setgroups([])
                    os.setgid(65534)
                    os.setuid(65534)
                stoker.bench(Broken(), num_workers=[0], gpus=0, quiet=True, plot=plot)
                code = 1
            except OSError as e:
                code = 0 if f"cannot write plot {plot}: create a file beside it" in str(e) else 2
            except BaseException:
                code = 4  # the sweep started (Broken), or something else failed
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "1: accepted, 2: other error, 4: swept"
        with open(plot) as f:
            assert f.read() == "old"
    finally:
        os.chmod(folder, 0o755)
        shutil.rmtree(folder)


def test_a_stoker_source_is_pointed_to_stoker_bench():
    # It failed inside torch's loader: "'Synthetic' object is not subscriptable".
    with pytest.raises(TypeError, match=r"got a stoker source \(Synthetic\); its sweep is "
                                        "`stoker bench --data PATH`"):
        stoker.bench(stoker.Synthetic(size=8, shape=(2,)), num_workers=[0], gpus=0)


def test_a_dataset_without_batches_is_named():
    with pytest.raises(ValueError, match=r"the dataset \(TensorDataset\) is empty"):
        stoker.bench(torch.utils.data.TensorDataset(torch.zeros(0, 2)), num_workers=[0], gpus=0)
    with pytest.raises(ValueError, match="no batch"):
        stoker.bench(torch.utils.data.TensorDataset(torch.zeros(3, 2)), batch_size=4,
                     drop_last=True, num_workers=[0], gpus=0, quiet=True)


def test_a_count_is_measured_after_its_first_round_of_batches():
    # Each worker's first batch was begun when the loader started: counted
    # after the first one arrives, they would credit the measurement with
    # work done before it (many workers on a slow store read high).
    batches = [torch.zeros(n) for n in (1, 2, 3, 4, 5, 6)]  # batch i has i + 1 samples
    samples, taken, _, _ = stoker._bench._measure(batches, 1, 2, 10.0, 0.0, warm_batches=3)
    assert (samples, taken) == (4 + 5, 2)
    # An epoch shorter than the warm-up: the measurement starts the next one.
    samples, taken, _, _ = stoker._bench._measure(batches[:2], 1, 1, 10.0, 0.0, warm_batches=3)
    assert (samples, taken) == (1, 1)


class _HalfBad(torch.utils.data.Dataset):
    def __len__(self):
        return 100

    def __getitem__(self, i):
        if i % 2:
            raise ValueError(f"bad sample {i}")
        return torch.tensor([i])


def test_skipped_samples_are_not_counted_as_measured():
    # Each batch of 2 holds one sample that arrives; before, bench counted 2.
    r = stoker.bench(_HalfBad(), batch_size=2, num_workers=[0], batches=10, kind="stoker",
                     on_error="skip", shuffle=False, quiet=True, gpus=0)
    point = r["points"][0]
    assert point["samples"] == point["batches"] > 0


def test_skipped_samples_are_said_with_the_table(capsys):
    # The rates count what was delivered: half the data set skipped was
    # nowhere in the table, the text or the result.
    r = stoker.bench(_HalfBad(), batch_size=2, num_workers=[0], batches=10, kind="stoker",
                     on_error="skip", shuffle=False, gpus=0)
    assert r["points"][0]["skipped"] >= 10 and r["skipped"] == r["points"][0]["skipped"]
    assert f"skipped {r['skipped']} samples (on_error='skip')" in capsys.readouterr().out
    clean = stoker.bench(Squares(), batch_size=4, num_workers=[0], batches=2, quiet=True, gpus=0)
    assert clean["skipped"] == 0 and clean["points"][0]["skipped"] == 0


class _SlowStore(torch.utils.data.Dataset):
    """A store slower than the measured window a batch: 25 ms a sample."""

    def __len__(self):
        return 256

    def __getitem__(self, i):
        import time
        time.sleep(0.025)
        return torch.tensor([i])


def test_workers_slower_than_the_window_a_batch_are_measured_in_whole_rounds():
    # Each worker makes a batch, so they arrive in bursts of one per worker:
    # the window closed at the first batch past `seconds` and counted one of
    # each burst. A batch here takes twice the window: one whole round of 4.
    r = stoker.bench(_SlowStore(), batch_size=16, num_workers=[4], seconds=0.2, gpus=0,
                     quiet=True)
    [four] = r["points"]
    assert four["batches"] >= 4 and four["batches"] % 4 == 0, four


def test_a_list_of_samples_is_counted_by_its_length_in_a_short_batch():
    # A collate_fn that keeps the samples (detection's): a stream's batch
    # short of batch_size was counted as its first sample's field count.
    class Shards(stoker.ShardedIterable):
        def shards(self):
            return [0, 1, 2]

        def iter_shard(self, shard):
            return ((torch.zeros(3, 4, 4), shard * 10 + k) for k in range(10))

    r = stoker.bench(Shards(), batch_size=64, collate_fn=lambda items: items, num_workers=[0],
                     batches=2, seconds=60, gpus=0, quiet=True, kind="stoker")
    assert r["points"][0]["samples"] == 20  # two batches of one shard's 10
    assert stoker._bench._batch_samples([(torch.zeros(3), 1)] * 7, 64) == 7


def test_a_sweep_leaves_no_process_behind_without_a_garbage_collection():
    # With the garbage collector off, as it may not run for long: before, each
    # count's loader kept its zygote and workers until bench returned and a
    # collection ran (14 processes after a sweep of 1 to 4 workers).
    import subprocess
    import sys
    import textwrap
    script = textwrap.dedent("""
        import gc, psutil, torch, stoker
        gc.disable()
        class Squares(torch.utils.data.Dataset):
            def __len__(self): return 48
            def __getitem__(self, i): return torch.full((3, 8, 8), float(i)), i
        stoker.bench(Squares(), batch_size=4, num_workers=[1, 2, 3], batches=6,
                     kind="stoker", quiet=True, gpus=0)
        print(len([p for p in psutil.Process().children(recursive=True) if p.is_running()
                   and p.status() != psutil.STATUS_ZOMBIE]))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "0", out.stdout
