"""Ranks under torchrun's variables split each epoch exactly when asked to
(shard_from_env); without it every loader reads every sample."""

import json
import os
import subprocess
import sys

import pytest

import stoker

_CHILD = """
import json, stoker
source = stoker.Synthetic(size={size}, shape=(4,), num_classes=1 << 40)  # label == index
loader = stoker.Loader(source, batch_size=8, seed=5, output="numpy", workers=2,
                       **stoker.shard_from_env())
loader.set_epoch(3)
print(json.dumps({{"rank": loader.rank, "world": loader.world_size, "len": len(loader),
                   "indices": [int(i) for _, y in loader for i in y]}}))
"""


def _run_rank(rank, world, size, tmp_path):
    env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
           "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    env = {**os.environ, **env}
    out = subprocess.run([sys.executable, "-c", _CHILD.format(size=size)], env=env, cwd=tmp_path,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_two_torchrun_ranks_split_the_epoch_exactly(tmp_path):
    results = [_run_rank(r, 2, 200, tmp_path) for r in range(2)]
    assert [r["rank"] for r in results] == [0, 1] and results[0]["world"] == 2
    a, b = (set(r["indices"]) for r in results)
    assert len(results[0]["indices"]) == len(a) == 100 and len(b) == 100
    assert not a & b and a | b == set(range(200))
    assert results[0]["len"] == results[1]["len"] == 13


def test_uneven_split_pads_so_every_rank_has_the_same_count(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    source = stoker.Synthetic(size=100, shape=(4,), num_classes=1 << 40)
    seen = []
    lengths = []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        loader = stoker.Loader(source, batch_size=8, output="numpy", **stoker.shard_from_env())
        assert (loader.rank, loader.world_size) == (rank, 3)
        indices = [int(i) for _, y in loader for i in y]
        lengths.append(len(indices))
        seen.extend(indices)
    assert lengths == [34, 34, 34]
    assert set(seen) == set(range(100)) and len(seen) == 102


def test_the_environment_alone_shards_nothing(monkeypatch):
    # A rank-0-only validation loader must read the whole set (as torch's would).
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = stoker.Loader(stoker.Synthetic(size=10, shape=(4,)), batch_size=2)
    assert (loader.rank, loader.world_size) == (0, 1)
    assert len(loader) == 5


def test_explicit_ranks_override_the_environment(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = stoker.Loader(stoker.Synthetic(size=10, shape=(4,)), rank=0, world_size=1)
    assert (loader.rank, loader.world_size) == (0, 1)
    assert len(loader) == 1


def test_without_launcher_one_process(monkeypatch):
    for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(v, raising=False)
    facts = stoker.rank_facts()
    assert facts["launcher"] == "none" and facts["world_size"] == 1
    with pytest.raises(ValueError):
        stoker.Loader(stoker.Synthetic(size=10, shape=(4,)), rank=2, world_size=2)


@pytest.mark.parametrize("env, named", [({"WORLD_SIZE": "4"}, "$RANK is not set"),
                                        ({"WORLD_SIZE": "4", "RANK": "x"}, "$RANK: 'x'"),
                                        ({"WORLD_SIZE": "4", "RANK": "4"}, "$RANK 4 is not below"),
                                        ({"RANK": "1"}, "$WORLD_SIZE is not set")])
def test_a_launchers_rank_that_is_missing_or_malformed_is_named_not_taken_as_rank_0(
        monkeypatch, env, named):
    # Taken as rank 0, every process would read the same part of the data.
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=named.replace("$", r"\$")):
        stoker.shard_from_env()

    class Lines(stoker.ShardedIterable):  # a stream splits by the same variables
        def shards(self): return ["a", "b"]
        def iter_shard(self, shard): yield shard
    with pytest.raises(ValueError, match=named.replace("$", r"\$")):
        list(stoker.DataLoader(Lines(), batch_size=1, num_workers=0))
