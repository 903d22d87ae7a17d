#!/usr/bin/env python3
"""stoker.DataLoader and stoker.Loader with and without remote workers on a
Dask cluster (issue 24's measurement), side by side in one run, on a small training node
emulated on one machine: this process (the training loop, and the loader's
local workers, which it forks) is confined to one CPU (--train-cpu, 0), and a
dask-scheduler and one dask-worker (--nthreads 1, no nanny) are started on
another (--worker-cpu, 1), reached over loopback. On a machine with more
cores, --worker-cpu 2,3,4 starts a worker on each of those CPUs and
--scheduler-cpu 1 gives the scheduler its own (default: the first worker
CPU). The cluster is started and stopped by python/tests/dask_cluster.py,
the tests' own fixture.

The dataset (bench/indexed_images.py): torchvision's ImageFolder with PIL
decode, RandomResizedCrop(224), RandomHorizontalFlip and PILToTensor (uint8
tensors, as a remote worker should ship them), batch 64, shuffle=True with a
seeded generator, each sample with its index.

1. Throughput: one epoch (the folder listed --repeat times, so that the
   tuner's first seconds do not dominate) with num_workers="auto" and cluster=ADDRESS against
   the same loader without a cluster: samples/s from iter() to the last batch
   for each, the ratio (issue 24 asks >= 1.6x; the median over --rounds
   pairs, each in the other order than the one before), and whether every
   sample came exactly once. The files are read once first, so that no
   loader pays for a cold page cache.
2. A 400 ms training step (consumer-bound): --step-batches batches through
   the loader with the cluster; stats()["remote"]["peak"] (asked: 0, the
   remote worker is never borrowed) and the stall (waiting in next() / total,
   first batch left out).
3. The remote worker killed with SIGKILL mid-epoch (--kill-after-s into the
   epoch, once a remote batch has come), and a new one started on the same
   CPU: the epoch (the folder listed --repeat times) must complete exactly
   once; prints the rate over the --window seconds before the kill, and over
   each 1 s after the new worker registered, and when the rate was back
   (a second at >= 90 % of the rate before the kill; asked: within 5 s).

4. The native pipeline: stoker.Loader(workers="auto") over the same folder
   (train 224, uint8 CHW output, batch 64), --native-epochs epochs, with
   cluster=ADDRESS against without: samples/s from the first next() to the
   last batch for each, the ratio (issue 24 asks >= 1.5x; the median over
   --rounds pairs, alternating the order), and whether each epoch held every
   sample exactly once.
5. A slow remote worker: the worker runs --slow-share of the time (stopped
   and continued every 100 ms: a node whose CPU quota or neighbours leave it
   that share), and stoker.DataLoader as in section 1 with cluster=ADDRESS
   against without: the ratio (asked: >= 0.95x, a slow worker costs the
   consumer nothing), its lagged batches (made locally instead), and
   whether every sample came exactly once.

Usage: /usr/bin/python3 bench/compare_remote.py [--data DIR] [--sections 1,2,3,4,5]
       [--rounds 3] [--step-batches 20] [--repeat 4] [--kill-after-s 4]
       [--native-epochs 3] [--slow-share 0.1] [--json]
stoker must be importable (build/release/python on PYTHONPATH); default data:
the built-in data set (stoker.default_dataset(), made on first use).
"""

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
BATCH = 64
STEP_S = 0.4
SEED = 0
BACK = 0.9  # section 3: "back" = a second at this share of the rate before the kill


def dask_cluster_module():
    # One fixture for tests and benchmarks: python/tests/dask_cluster.py.
    sys.path.insert(0, os.path.join(REPO, "python", "tests"))
    import dask_cluster

    return dask_cluster


def start_cluster(folder, scheduler_cpu, worker_cpus):
    """A scheduler on `scheduler_cpu` and a worker on each of `worker_cpus`,
    with the workers' imports (torch, torchvision, this dataset) done before
    they register."""
    import stoker

    stoker_root = os.path.dirname(os.path.dirname(os.path.abspath(stoker.__file__)))
    cluster = dask_cluster_module().DaskCluster(
        folder, workers=0, pythonpath=[stoker_root, HERE], preload=["indexed_images"],
        cpus={scheduler_cpu}).start()
    try:
        for cpu in worker_cpus:
            cluster.add_worker(cpus={cpu})
    except BaseException:
        cluster.close(check=False)
        raise
    return cluster


def make_loader(dataset, cluster=None):
    import stoker
    import torch

    g = torch.Generator()
    g.manual_seed(SEED)
    options = {} if cluster is None else {"cluster": cluster}
    return stoker.DataLoader(dataset, batch_size=BATCH, shuffle=True, generator=g,
                             num_workers="auto", **options)


def run_epoch(loader, step_s=0.0, max_batches=None, on_batch=None, start=None):
    """One epoch (or its first `max_batches`) through compare_dataloader's
    timed loop: arrival times since `start` (a perf_counter reading; default:
    now, just before iter()), waits in next(), batch sizes, and the indices
    seen. `on_batch(seconds, loader)` is called after each batch."""
    from compare_dataloader import timed_loop

    indices = []

    def seen(batch, t):
        indices.extend(batch[2].tolist())
        if on_batch:
            on_batch(t, loader)

    made = time.perf_counter() if start is None else start
    run = timed_loop(loader, made, 1, max_batches, step_s, on_batch=seen)
    run["indices"] = indices
    return run


def warm_page_cache(root):
    for folder, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                while f.read(1 << 20):
                    pass


def exactly_once(indices, n):
    return sorted(indices) == list(range(n))


def rate_between(run, t0, t1):
    """Samples/s of the batches that arrived in [t0, t1)."""
    if t1 <= t0:
        return float("nan")
    return sum(s for t, s in zip(run["arrived"], run["sizes"]) if t0 <= t < t1) / (t1 - t0)


def remote_stats(loader):
    remote = loader.stats().get("remote") or {}
    return {k: remote.get(k) for k in ("workers", "peak", "batches", "bytes_per_s", "capacity",
                                       "retries", "lagged", "lost")}


# --- the sections --------------------------------------------------------------------


def paired(a, measure):
    """--rounds local/cluster pairs of measure(kind) rows: each round in the
    other order than the one before (the first run's processes may still be
    leaving), so that the median ratio favours neither."""
    kinds = ["local", "cluster"]
    rows = {k: [] for k in kinds}
    for r in range(a.rounds):
        for kind in kinds if r % 2 == 0 else kinds[::-1]:
            rows[kind].append(measure(kind))
    ratios = [c["samples_per_s"] / l["samples_per_s"]
              for l, c in zip(rows["local"], rows["cluster"])]
    return {"rounds": rows, "ratio": sorted(ratios)[len(ratios) // 2], "ratios": ratios,
            "exactly_once": all(r["exactly_once"] for rs in rows.values() for r in rs)}


def throughput(a, dataset, address):
    def measure(kind):
        loader = make_loader(dataset, address if kind == "cluster" else None)
        run = run_epoch(loader)
        row = {"samples_per_s": sum(run["sizes"]) / run["arrived"][-1],
               "first_batch_s": run["arrived"][0],
               "exactly_once": exactly_once(run["indices"], len(dataset)),
               "workers": loader.stats()["workers"]}
        if kind == "cluster":
            row["remote"] = remote_stats(loader)
        loader.close()
        return row

    return {"samples": len(dataset), **paired(a, measure)}


def consumer_bound(a, dataset, address):
    loader = make_loader(dataset, address)
    run = run_epoch(loader, step_s=STEP_S, max_batches=a.step_batches)
    remote = remote_stats(loader)
    workers = loader.stats()["workers"]
    loader.close()
    total = run["end_s"] - run["arrived"][0]
    return {"step_s": STEP_S, "batches": len(run["sizes"]), "remote": remote,
            "local_workers": workers,
            "stall": sum(run["waited"][1:]) / total if total > 0 else float("nan")}


def kill_mid_epoch(a, dataset, cluster):
    events = {}

    def replace():
        try:
            name = cluster.worker_names[0]
            events["killed_s"] = time.perf_counter() - events["start"]
            cluster.kill_worker(name)
            cluster.add_worker(cpus={a.worker_cpus[0]})
            events["joined_s"] = time.perf_counter() - events["start"]
        except BaseException as e:  # reported, not lost on this thread
            events["error"] = repr(e)

    # The new worker takes seconds to start: on a thread, while the loop goes on.
    replacer = threading.Thread(target=replace)

    def on_batch(t, loader):
        if replacer.ident is None and t >= a.kill_after_s and loader.stats()["remote"]["batches"]:
            replacer.start()

    loader = make_loader(dataset, cluster.address)
    events["start"] = time.perf_counter()
    run = run_epoch(loader, on_batch=on_batch, start=events["start"])
    if replacer.ident is not None:
        replacer.join()
    remote = remote_stats(loader)
    loader.close()
    out = {"samples": len(dataset), "exactly_once": exactly_once(run["indices"], len(dataset)),
           "epoch_s": run["end_s"], "remote": remote}
    if "error" in events:
        out["error"] = events["error"]
    if "killed_s" not in events:
        out["error"] = out.get("error") or "the epoch ended before the kill (raise --repeat)"
        return out
    killed = events["killed_s"]
    out["killed_at_s"] = killed
    out["rate_before_kill"] = rate_between(run, max(0.0, killed - a.window), killed)
    joined = events.get("joined_s")
    if joined is None:
        return out
    out["joined_at_s"] = joined
    last = run["arrived"][-1]
    seconds = []
    t = joined
    while t + 1.0 <= last:
        seconds.append(rate_between(run, t, t + 1.0))
        t += 1.0
    out["rate_each_second_after_join"] = seconds
    back = next((k for k, r in enumerate(seconds) if r >= BACK * out["rate_before_kill"]), None)
    out["back_after_s"] = None if back is None else back + 1.0  # the end of that second
    return out


def slow_worker(a, dataset, cluster):
    """Section 5: section 1's pairs while the remote worker runs --slow-share
    of the time."""
    pid = cluster.pid(cluster.worker_names[-1])
    done = threading.Event()

    def throttle():
        while not done.is_set():
            os.kill(pid, signal.SIGSTOP)
            done.wait(0.1 * (1 - a.slow_share))
            os.kill(pid, signal.SIGCONT)
            done.wait(0.1 * a.slow_share)

    throttler = threading.Thread(target=throttle, daemon=True)
    throttler.start()
    try:
        out = throughput(a, dataset, cluster.address)
    finally:
        done.set()
        throttler.join()
        os.kill(pid, signal.SIGCONT)
    return {"slow_share": a.slow_share, **out}


# --- output -------------------------------------------------------------------------------


def native(a, data, address):
    """Section 4: stoker.Loader with and without the cluster."""
    import stoker

    transform = stoker.transforms.train(224, layout="uint8_chw")
    samples = len(stoker.ImageFolder(data))

    def measure(kind):
        options = {"cluster": address} if kind == "cluster" else {}
        loader = stoker.Loader(data, batch_size=BATCH, transforms=transform, seed=SEED,
                               output="numpy", **options)
        once = True
        start = time.perf_counter()
        for _ in range(a.native_epochs):
            once = once and sum(len(labels) for _, labels in loader) == samples
        elapsed = time.perf_counter() - start
        stats = loader.stats()
        row = {"samples_per_s": samples * a.native_epochs / elapsed, "exactly_once": once,
               "workers": stats["workers"]}
        if kind == "cluster":
            row["remote"] = remote_stats(loader)
            row["remote_share"] = (stats["metrics"]["remote_samples_produced"] /
                                   max(1, stats["metrics"]["samples_produced"] +
                                       stats["metrics"]["remote_samples_produced"]))
        loader.close()
        return row

    return {"samples": samples, "epochs": a.native_epochs, **paired(a, measure)}


def print_rounds(section, asked):
    for kind, rows in section["rounds"].items():
        for r in rows:
            extra = ""
            if "remote" in r:
                share = (f"remote share {100 * r['remote_share']:.0f} %  "
                         if "remote_share" in r else "")
                extra = f"  {share}remote: {r['remote']}"
            first = f"first batch {r['first_batch_s']:.2f} s  " if "first_batch_s" in r else ""
            print(f"  {kind:<8} {r['samples_per_s']:8.1f} samples/s  {first}local workers "
                  f"{r['workers']}  exactly once: {r['exactly_once']}{extra}")
    ratios = [round(x, 2) for x in section["ratios"]]
    print(f"  cluster / local: {section['ratio']:.2f}x (median of {ratios}; asked: "
          f">= {asked}x)")


def print_report(out, a):
    workers = ", ".join(str(c) for c in a.worker_cpus)
    print(f"stoker's loaders with and without a Dask cluster on {out['data']}: this process on "
          f"CPU {a.train_cpu}, the scheduler on CPU {a.scheduler_cpu}, a worker on each of CPU "
          f"{workers}, batch {BATCH}")
    one = out["sections"].get("1")
    if one:
        print(f"\n1. stoker.DataLoader, one epoch of {one['samples']} JPEGs "
              f"(RandomResizedCrop 224 + flip + PILToTensor), {a.rounds} round(s)")
        print_rounds(one, 1.6)
    two = out["sections"].get("2")
    if two:
        print(f"\n2. a {1e3 * two['step_s']:.0f} ms step, {two['batches']} batches: "
              f"stats()['remote']['peak'] = {two['remote']['peak']} (asked: 0), remote batches "
              f"{two['remote']['batches']}, local workers {two['local_workers']}, "
              f"stall {100 * two['stall']:.2f} %")
    three = out["sections"].get("3")
    if three:
        print(f"\n3. the remote worker SIGKILLed mid-epoch, a new one started: "
              f"{three['samples']} samples, exactly once: {three['exactly_once']}, "
              f"epoch {three['epoch_s']:.1f} s, remote {three['remote']}")
        if "error" in three:
            print(f"  {three['error']}")
        if "killed_at_s" in three:
            print(f"  killed at {three['killed_at_s']:.2f} s; rate over the {a.window:.0f} s "
                  f"before: {three['rate_before_kill']:.1f} samples/s")
        if "joined_at_s" in three:
            rates = ", ".join(f"{r:.0f}" for r in three["rate_each_second_after_join"])
            back = three["back_after_s"]
            print(f"  new worker registered at {three['joined_at_s']:.2f} s; samples/s over each "
                  f"second after: {rates}")
            print(f"  back to {100 * BACK:.0f} % of the rate before the kill: "
                  f"{'not within the epoch' if back is None else f'within {back:.0f} s'} "
                  f"(asked: within 5 s)")
    four = out["sections"].get("4")
    if four:
        print(f"\n4. stoker.Loader (native, train 224 uint8): {four['epochs']} epoch(s) of "
              f"{four['samples']} JPEGs, {a.rounds} round(s)")
        print_rounds(four, 1.5)
    five = out["sections"].get("5")
    if five:
        print(f"\n5. section 1 with the remote worker running {100 * five['slow_share']:.0f} % "
              f"of the time (stopped and continued every 100 ms), {a.rounds} round(s)")
        print_rounds(five, 0.95)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=None, help="ImageFolder tree (default: the built-in one)")
    p.add_argument("--sections", default="1,2,3,4,5")
    p.add_argument("--rounds", type=int, default=3,
                   help="section 1: local/cluster pairs (the ratio is their median)")
    p.add_argument("--step-batches", type=int, default=20, help="section 2's batches")
    p.add_argument("--repeat", type=int, default=4,
                   help="sections 1 and 3: the folder listed this many times in an epoch")
    p.add_argument("--kill-after-s", type=float, default=4.0, help="section 3: when to kill")
    p.add_argument("--window", type=float, default=2.0,
                   help="section 3: seconds before the kill the rate is measured over")
    p.add_argument("--native-epochs", type=int, default=3, help="section 4's epochs per run")
    p.add_argument("--slow-share", type=float, default=0.1,
                   help="section 5: the share of the time the remote worker runs")
    p.add_argument("--train-cpu", type=int, default=0)
    p.add_argument("--worker-cpu", default="1",
                   help="the CPUs of the Dask workers, one worker each (e.g. 2,3,4)")
    p.add_argument("--scheduler-cpu", type=int, default=None,
                   help="the scheduler's CPU (default: the first worker CPU)")
    p.add_argument("--json", action="store_true", help="machine-readable results on stdout")
    a = p.parse_args()
    sections = {s.strip() for s in a.sections.split(",") if s.strip()}
    if not sections <= {"1", "2", "3", "4", "5"}:
        p.error(f"--sections takes 1, 2, 3, 4, 5; got {a.sections!r}")
    if not 0 < a.slow_share < 1:
        p.error(f"--slow-share takes a share of the time between 0 and 1; got {a.slow_share}")
    try:
        a.worker_cpus = [int(c) for c in a.worker_cpu.split(",")]
    except ValueError:
        p.error(f"--worker-cpu takes CPU numbers separated by commas; got {a.worker_cpu!r}")
    if a.scheduler_cpu is None:
        a.scheduler_cpu = a.worker_cpus[0]
    allowed = os.sched_getaffinity(0)
    wanted = {a.train_cpu, a.scheduler_cpu, *a.worker_cpus}
    if a.train_cpu in {a.scheduler_cpu, *a.worker_cpus} or \
            len(set(a.worker_cpus)) != len(a.worker_cpus) or not wanted <= allowed:
        p.error(f"--train-cpu {a.train_cpu} must differ from --worker-cpu {a.worker_cpu} and "
                f"--scheduler-cpu, and --worker-cpu must not repeat a CPU; all must be CPUs this "
                f"process may use: {sorted(allowed)}")
    # Before any thread starts (torch's, stoker's): they inherit it.
    os.sched_setaffinity(0, {a.train_cpu})

    try:
        import stoker
    except ImportError as e:
        p.error(f"stoker does not import ({e}): put build/release/python on PYTHONPATH")
    import torch

    torch.set_num_threads(1)  # the loop does no math
    sys.path.insert(0, HERE)
    from indexed_images import IndexedImages

    data = a.data or stoker.default_dataset()
    warm_page_cache(data)  # the first loader measured must not pay for cold files
    out = {"data": data, "train_cpu": a.train_cpu, "scheduler_cpu": a.scheduler_cpu,
           "worker_cpus": a.worker_cpus, "sections": {}}
    with tempfile.TemporaryDirectory(prefix="stoker-remote-bench-") as tmp:
        cluster = start_cluster(os.path.join(tmp, "cluster"), a.scheduler_cpu, a.worker_cpus)
        try:
            if "1" in sections:
                out["sections"]["1"] = throughput(a, IndexedImages(data, a.repeat), cluster.address)
            if "2" in sections:
                out["sections"]["2"] = consumer_bound(a, IndexedImages(data), cluster.address)
            if "3" in sections:
                out["sections"]["3"] = kill_mid_epoch(a, IndexedImages(data, a.repeat), cluster)
            if "4" in sections:
                out["sections"]["4"] = native(a, data, cluster.address)
            if "5" in sections:
                out["sections"]["5"] = slow_worker(a, IndexedImages(data, a.repeat), cluster)
        finally:
            cluster.close()
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        print_report(out, a)


if __name__ == "__main__":
    main()
