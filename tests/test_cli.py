"""End-to-end tests of the stoker command: JSON keys, exit codes, messages.

Run by scripts/test.sh with pytest; STOKER_CLI names the binary (default:
build/release/tools/cli/stoker).
"""
import json
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = os.environ.get("STOKER_CLI", os.path.join(ROOT, "build", "release", "tools", "cli", "stoker"))


def stoker(*args, check=True):
    return subprocess.run([CLI, *args], capture_output=True, text=True, check=check, timeout=300)


def test_version_and_help():
    assert stoker("--version").stdout.startswith("stoker ")
    out = stoker("--help").stdout
    for sub in ("demo", "run", "bench", "probe", "advise", "make-dataset"):
        assert sub in out


def test_probe_json_has_the_stable_keys():
    j = json.loads(stoker("probe", "--json", "--no-gpus").stdout)
    for group, keys in {"cpu": ["logical", "physical_cores", "affinity", "quota_cores",
                                "budget_cores"],
                        "memory": ["total_bytes", "available_bytes", "cgroup_limit_bytes"],
                        "shm": ["size_bytes", "free_bytes"], "limits": ["nproc", "nofile"],
                        "ranks": ["rank", "world_size", "local_rank", "local_world_size"]}.items():
        for k in keys:
            assert k in j[group], f"{group}.{k}"
    assert "storage" in j and isinstance(j["gpus"], list)
    assert j["cpu"]["budget_cores"] >= 1


def test_advise_json():
    j = json.loads(stoker("advise", "--json", "--no-gpus", "--batch-size", "32").stdout)
    assert j["workers"] >= 1 and j["prefetch_batches"] >= 1
    assert all(r["name"] and r["outcome"] for r in j["rules"])


def test_run_json_summary(tmp_path):
    trace = tmp_path / "trace.jsonl"
    j = json.loads(stoker("run", "--synthetic", "--synthetic-size", "4000", "--synthetic-cpu-us",
                          "200", "--size", "16", "--seconds", "2", "--json", "--quiet",
                          "--trace", str(trace)).stdout)
    for k in ("samples", "seconds", "samples_per_s", "stall_fraction", "workers_final",
              "workers_max", "decisions", "peak_rss_bytes", "skipped"):
        assert k in j, k
    assert j["samples"] > 0 and j["workers_final"] >= 1 and j["skipped"] == 0
    lines = trace.read_text().splitlines() if trace.exists() else []
    assert len(lines) == j["decisions"]
    for line in lines:
        assert json.loads(line)["reason"]


def test_bench_json(tmp_path):
    plot = tmp_path / "plot.svg"
    j = json.loads(stoker("bench", "--synthetic", "--synthetic-size", "4000", "--size", "16",
                          "--synthetic-cpu-us", "100", "--sweep", "0,1,2", "--point-seconds",
                          "0.5", "--tuned-seconds", "2", "--json", "--plot", str(plot)).stdout)
    assert [p["workers"] for p in j["sweep"]] == [0, 1, 2]
    assert j["best_static"]["samples_per_s"] > 0
    for k in ("samples_per_s", "workers_final", "seconds_to_95pct"):
        assert k in j["tuned"]
    assert j["ratio"] > 0
    assert plot.read_text().startswith("<svg")


def _folder_with_a_bad_jpeg(tmp_path):
    good = tmp_path / "made"
    stoker("make-dataset", str(good), "--images", "6", "--classes", "2")
    data = tmp_path / "data"
    os.rename(good, data)
    bad = data / "n000" / "zz_broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 this is not a JPEG")
    return data, bad


def test_a_bad_file_under_raise_fails_naming_it(tmp_path):
    data, bad = _folder_with_a_bad_jpeg(tmp_path)
    r = stoker("run", "--data", str(data), "--batch-size", "2", "--epochs", "1", "--quiet",
               "--workers", "2", check=False)
    assert r.returncode != 0
    assert "zz_broken.jpg" in r.stderr


def test_a_bad_file_under_skip_is_recorded(tmp_path):
    data, bad = _folder_with_a_bad_jpeg(tmp_path)
    j = json.loads(stoker("run", "--data", str(data), "--batch-size", "2", "--epochs", "1",
                          "--quiet", "--on-error", "skip", "--json").stdout)
    assert j["skipped"] == 1 and j["samples"] == 6
    assert j["skipped_samples"][0]["key"].endswith("zz_broken.jpg")


def test_bad_options_name_the_option(tmp_path):
    r = stoker("run", "--synthetic", "--workers", "lots", "--seconds", "1", check=False)
    assert r.returncode != 0 and "--workers" in r.stderr
    r = stoker("run", "--data", str(tmp_path / "missing"), "--seconds", "1", check=False)
    assert r.returncode != 0 and "missing" in r.stderr
