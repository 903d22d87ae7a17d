#!/usr/bin/env python3
"""The tuner on a real FUSE store: stoker bench's static sweep vs `stoker run --workers auto`.

Mounts bench/slowfs over a data folder: each open takes --open-ms of service
and the server serves at most --slots requests at once (first come, first
served), like a network or FUSE store (issue 15: 8 ms opens, the best static
count 21 workers, the tuner at 128, 0.74x the best static rate). Then, side by
side in one run, with the same pipeline options apart from --workers:

  static  stoker bench --data MOUNT --sweep 1,2,4,8,12,16,24,32
          --point-seconds P --json: samples/s at each count (after a 0.5 s
          warm-up; the best three measured twice, the best once more after
          bench's own tuned run, which is shown too);
  tuned   --rounds x stoker run --data MOUNT --workers auto --seconds S
          --step-ms 0 --quiet --json --trace FILE: each round's settled
          rate over its last 2/3: the lesser of delivered and produced (its
          JSON timeline, as stoker's SettledRate; the whole
          run's rate from a stoker without one, start-up included).

Prints the best static count and rate, the knee (the fewest workers within
3 % of the best), each round's settled rate, workers at the end and at most,
the time to 95 % of the best and the last decision, then tuned / best (the
rounds' mean) against the goal >= 0.97: PASS or FAIL, and one JSON line with
the figures on stderr.

--smoke: mount, list the top folder, read one file through the mount and
compare its bytes with the source's, unmount.

Usage: bench/compare_fuse.py [--data DIR] [--open-ms 8] [--read-ms 0]
           [--slots 8] [--overload F] [--drift F] [--drift-s P] [--jitter P] [--rounds 3] [--seconds 30] [--point-seconds 4]
           [--sweep 1,2,4,8,12,16,24,32] [--batch-size 64] [--out DIR]
           [--build build/release] [--smoke]
A quick look: --rounds 1 --seconds 15 --point-seconds 2 (about 2 minutes).
Default data: the built-in data set (`stoker make-dataset` makes it if missing).
Exit codes: 0 done (PASS or FAIL printed), 1 a command failed, 2 FUSE cannot
mount here (no /dev/fuse, no fusermount3, no permission, slowfs not built).
The mount is always unmounted (fusermount3 -u), on errors and Ctrl-C too.
"""
import argparse
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

GOAL = 0.97  # tuned / best static
KNEE = 0.03  # the knee: the fewest workers within 3 % of the best
MOUNT_WAIT_S = 10


class CannotMount(Exception):
    """FUSE is not usable here: the message says why (exit code 2)."""


# --- the mount -----------------------------------------------------------------

def fuse_usable(slowfs):
    """Raises CannotMount when slowfs, /dev/fuse or fusermount3 is missing."""
    if not os.access(slowfs, os.X_OK):
        raise CannotMount(f"{slowfs} is not built: configure with libfuse3-dev installed "
                          "(scripts/setup.sh), then build the slowfs target")
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as e:
        why = "missing (no FUSE in this kernel or container)" if e.errno == errno.ENOENT else \
            e.strerror
        raise CannotMount(f"/dev/fuse: {why}") from None
    if shutil.which("fusermount3") is None:
        raise CannotMount("fusermount3 not found (Debian package fuse3)")


def mounted(path):
    """Whether a file system is mounted at `path`, a dead FUSE server's too
    (os.path.ismount says no to those: their stat fails)."""
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == path for line in f)


class SlowMount:
    """slowfs over `src` at a fresh mount point, in the foreground of its own
    session (Ctrl-C here reaches this script, which unmounts it in order)."""

    def __init__(self, slowfs, src, open_ms, read_ms, slots, shape=()):
        # shape: slowfs's store-shape flags (--overload F, --drift F,
        # --drift-s P, --jitter P), passed through.
        self.cmd = [slowfs, src, None, "--open-ms", str(open_ms), "--read-ms", str(read_ms),
                    "--slots", str(slots), *shape, "-f"]
        self.path = None
        self.proc = None
        self.log = None

    def __enter__(self):
        self.path = os.path.realpath(tempfile.mkdtemp(prefix="stoker-slowfs-"))
        self.cmd[2] = self.path
        self.log = tempfile.TemporaryFile(mode="w+")
        try:
            self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=self.log,
                                         start_new_session=True)
            deadline = time.monotonic() + MOUNT_WAIT_S
            while not mounted(self.path):
                if self.proc.poll() is not None:
                    raise CannotMount(f"slowfs exited with {self.proc.returncode}: "
                                      f"{self.output() or 'no message'}")
                if time.monotonic() > deadline:
                    raise CannotMount(f"slowfs did not mount {self.path} within {MOUNT_WAIT_S} s")
                time.sleep(0.05)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def output(self):
        self.log.seek(0)
        return self.log.read().strip()

    def __exit__(self, *exc):
        if self.path and mounted(self.path):
            # -z (lazy) when something still holds a file there.
            if subprocess.run(["fusermount3", "-u", self.path], capture_output=True).returncode:
                subprocess.run(["fusermount3", "-uz", self.path], capture_output=True)
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.terminate()  # slowfs unmounts itself on SIGTERM
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        if self.path and not mounted(self.path):
            os.rmdir(self.path)
        elif self.path:
            print(f"compare_fuse: could not unmount {self.path}: fusermount3 -u it",
                  file=sys.stderr)
        if self.log is not None:
            self.log.close()
        return False


# --- the measurements ----------------------------------------------------------

def stoker_json(cmd):
    """Runs a stoker command that prints JSON; exits 1 with its message if it fails."""
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)}\n  failed with {out.returncode}: "
                 f"{(out.stdout + out.stderr).strip()[-2000:]}")
    return json.loads(out.stdout)


def mean_rate(timeline, from_s, to_s, key="samples_per_s"):
    """Samples/s over the timeline points that end in (from_s, to_s], each
    weighted by its interval (what stoker's MeanRate does)."""
    samples = seconds = 0.0
    prev = 0.0
    for p in timeline:
        if from_s < p["t_s"] <= to_s:
            dt = p["t_s"] - prev
            samples += p.get(key, p["samples_per_s"]) * dt
            seconds += dt
        prev = p["t_s"]
    return samples / seconds if seconds > 0 else None


def settled_rate(timeline, from_s, to_s):
    """The lesser of delivered and produced samples/s (stoker's
    SettledRate): batches part-filled before the stretch read high."""
    rates = [mean_rate(timeline, from_s, to_s, k) for k in ("samples_per_s", "produced_per_s")]
    return None if None in rates else min(rates)


def window_rate(timeline, from_s, to_s):
    """Delivered samples/s, or produced where the consumer caught up on
    batches filled before the window (stoker's WindowRate)."""
    delivered = mean_rate(timeline, from_s, to_s)
    produced = mean_rate(timeline, from_s, to_s, "produced_per_s")
    if delivered is None or produced is None:
        return None
    return produced if delivered > 1.2 * produced else delivered


def seconds_to(timeline, rate):
    """The first time a 1 s window reaches `rate`; None if never."""
    for p in timeline:
        if p["t_s"] >= 1.0 and (window_rate(timeline, p["t_s"] - 1.0, p["t_s"]) or 0) >= rate:
            return p["t_s"]
    return None


def settled(run):
    """(rate over the last 2/3 of the run, where it comes from)."""
    timeline = run.get("timeline")
    if timeline:
        rate = settled_rate(timeline, run["seconds"] / 3, run["seconds"])
        if rate is not None:
            return rate, "last 2/3"
    return run["samples_per_s"], "whole run"


def last_decision(trace_path):
    try:
        with open(trace_path) as f:
            lines = [line for line in f if line.strip()]
    except FileNotFoundError:
        return None
    return json.loads(lines[-1]) if lines else None


def knee(sweep, best_rate):
    return min(p["workers"] for p in sweep if p["samples_per_s"] >= (1 - KNEE) * best_rate)


# --- the two modes -------------------------------------------------------------

def first_sample(src):
    """The first file under `src` in name order, hidden ones (.stoker-complete) left out."""
    for root, dirs, files in os.walk(src):
        dirs.sort()
        for f in sorted(files):
            if not f.startswith("."):
                return os.path.join(root, f)
    return None


def smoke(mount, src):
    """Lists the mount, reads one file through it and compares it with the source."""
    names = sorted(os.listdir(mount.path))
    if names != sorted(os.listdir(src)):
        sys.exit(f"smoke: {mount.path} lists {names[:5]}..., {src} does not")
    first = first_sample(src)
    if first is None:
        sys.exit(f"smoke: no file under {src}")
    rel = os.path.relpath(first, src)
    t0 = time.perf_counter()
    with open(os.path.join(mount.path, rel), "rb") as f:
        opened_ms = (time.perf_counter() - t0) * 1e3
        through = f.read()
    with open(os.path.join(src, rel), "rb") as f:
        direct = f.read()
    if through != direct:
        sys.exit(f"smoke: {rel}: {len(through)} bytes through the mount differ from the "
                 f"source's {len(direct)}")
    print(f"smoke: OK: {mount.path} lists the {len(names)} entries of {src}; {rel}: "
          f"{len(through)} bytes, the same as the source's; its open took {opened_ms:.1f} ms")


def compare(a, exe, mount, out_dir):
    # Both commands read the same pipeline options; only --workers differs.
    pipeline = ["--data", mount.path, "--batch-size", str(a.batch_size)]
    print(f"  (static sweep {a.sweep}, {a.point_seconds:g} s a point ...)", file=sys.stderr,
          flush=True)
    bench = stoker_json([exe, "bench", *pipeline, "--sweep", a.sweep,
                         "--point-seconds", str(a.point_seconds),
                         "--tuned-seconds", str(a.seconds), "--no-gpus", "--json"])
    with open(os.path.join(out_dir, "bench.json"), "w") as f:
        json.dump(bench, f)
    best = bench["best_static"]
    rounds = []
    for i in range(a.rounds):
        print(f"  (tuned round {i + 1} of {a.rounds}, {a.seconds:g} s ...)", file=sys.stderr,
              flush=True)
        trace = os.path.join(out_dir, f"trace-{i + 1}.jsonl")
        run = stoker_json([exe, "run", *pipeline, "--workers", "auto", "--seconds", str(a.seconds),
                           "--step-ms", "0", "--quiet", "--json", "--trace", trace])
        with open(os.path.join(out_dir, f"run-{i + 1}.json"), "w") as f:
            json.dump(run, f)
        rate, over = settled(run)
        rounds.append({"samples_per_s": rate, "over": over,
                       "whole_run_samples_per_s": run["samples_per_s"],
                       "workers_final": run["workers_final"], "workers_max": run["workers_max"],
                       "seconds_to_95pct": seconds_to(run.get("timeline") or [],
                                                      0.95 * best["samples_per_s"]),
                       "last_decision": last_decision(trace)})
    return bench, rounds


def report(a, data, bench, rounds, load_before, elapsed_s):
    best = bench["best_static"]
    best_rate = best["samples_per_s"]
    knee_workers = knee(bench["sweep"], best_rate)
    tuned = sum(r["samples_per_s"] for r in rounds) / len(rounds)
    ratio = tuned / best_rate
    # One open a sample: with unslowed reads the store's ceiling in samples/s.
    ceiling = a.slots * 1e3 / a.open_ms if a.slots and a.open_ms and not a.read_ms else None
    print(f"FUSE store: slowfs over {data}, opens {a.open_ms:g} ms, reads {a.read_ms:g} ms, "
          f"{a.slots or 'any number of'} at once"
          + (f" (at most {ceiling:,.0f} opens/s)" if ceiling else ""))
    print(f"batch {a.batch_size}; {len(os.sched_getaffinity(0))} cores usable; load average "
          f"{load_before:.2f} before, {os.getloadavg()[0]:.2f} after; {elapsed_s:.0f} s in all")
    print(f"static (stoker bench, {a.point_seconds:g} s a point):")
    for p in bench["sweep"]:
        mark = "  <- best" if p["workers"] == best["workers"] else ""
        mark += "  <- knee" if p["workers"] == knee_workers else ""
        print(f"  workers {p['workers']:>3}  {p['samples_per_s']:10,.0f} samples/s{mark}")
    print(f"  best: {best['workers']} workers, {best_rate:,.0f} samples/s (measured before and "
          f"after bench's tuned run); knee (within {KNEE:.0%}): {knee_workers} workers")
    if bench.get("tuned"):
        t = bench["tuned"]
        print(f"  bench's own tuned run: {t['samples_per_s']:,.0f} samples/s, "
              f"{bench['ratio']:.2f}x its best, workers {t['workers_final']} at the end, "
              f"{t['workers_max']} at most")
    print(f"tuned (stoker run --workers auto, {a.seconds:g} s a round):")
    for i, r in enumerate(rounds):
        reached = f"{r['seconds_to_95pct']:.1f} s" if r["seconds_to_95pct"] is not None \
            else "never"
        print(f"  round {i + 1}: {r['samples_per_s']:10,.0f} samples/s over the {r['over']} "
              f"({r['whole_run_samples_per_s']:,.0f} over the whole run), workers "
              f"{r['workers_final']} at the end, {r['workers_max']} at most; 95 % of the best "
              f"after {reached}")
        d = r["last_decision"]
        if d:
            print(f"           last decision at {d['t_s']:.1f} s: workers {d['workers_before']} "
                  f"-> {d['workers_after']}: {d['reason']}")
    verdict = "PASS" if ratio >= GOAL else "FAIL"
    print(f"tuned / best static: {ratio:.2f}   goal >= {GOAL}: {verdict}")
    if ceiling:
        print(f"tuned / the store's ceiling: {tuned / ceiling:.2f}")
        if best_rate > 1.01 * ceiling:  # beyond the measurement's noise
            print(f"  note: the best static point reads {best_rate / ceiling - 1:.1%} above the "
                  "ceiling: sweep points on a saturated store read high (a longer "
                  "--point-seconds dilutes it)")
    json.dump({"data": data, "open_ms": a.open_ms, "read_ms": a.read_ms, "slots": a.slots,
               "ceiling_samples_per_s": ceiling, "batch_size": a.batch_size, "point_seconds": a.point_seconds,
               "seconds": a.seconds, "sweep": bench["sweep"], "best_static": best,
               "knee_workers": knee_workers, "bench_tuned": bench.get("tuned") and {
                   k: v for k, v in bench["tuned"].items() if k != "timeline"},
               "rounds": [{k: v for k, v in r.items() if k != "last_decision"} for r in rounds],
               "tuned_samples_per_s": tuned, "ratio": ratio, "goal": GOAL, "pass": ratio >= GOAL},
              sys.stderr)
    print(file=sys.stderr)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.split("\n")[1:]))
    p.add_argument("--data", help="data folder to serve (default: the built-in data set)")
    p.add_argument("--open-ms", type=float, default=8.0, help="service time of each open")
    p.add_argument("--read-ms", type=float, default=0.0, help="service time of each read")
    p.add_argument("--slots", type=int, default=8, help="requests served at once (0: any)")
    p.add_argument("--overload", type=float, default=0.0,
                   help="store shape: past the slots, service grows by this per request waiting")
    p.add_argument("--drift", type=float, default=1.0,
                   help="store shape: service swings between 1x and this over --drift-s")
    p.add_argument("--drift-s", type=float, default=120.0, help="the drift's period, seconds")
    p.add_argument("--jitter", type=float, default=0.0,
                   help="store shape: this fraction of requests is 10-50x slower")
    p.add_argument("--rounds", type=int, default=3, help="tuned runs")
    p.add_argument("--seconds", type=float, default=30.0, help="seconds of each tuned run")
    p.add_argument("--point-seconds", type=float, default=4.0, help="seconds of a sweep point")
    p.add_argument("--sweep", default="1,2,4,8,12,16,24,32", help="static worker counts")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--out", help="keep bench.json, run-N.json and trace-N.jsonl here")
    p.add_argument("--build", default="build/release")
    p.add_argument("--smoke", action="store_true", help="mount, read one file, compare, unmount")
    a = p.parse_args()
    if a.rounds < 1 or a.seconds <= 0 or a.slots < 0 or a.open_ms < 0 or a.read_ms < 0:
        p.error("--rounds must be >= 1, --seconds > 0, --slots, --open-ms and --read-ms >= 0")

    exe = os.path.join(a.build, "tools", "cli", "stoker")
    slowfs = os.path.join(a.build, "bench", "slowfs")
    data = a.data
    if data is None:  # the built-in data set, made once where `stoker run` looks for it
        data = subprocess.run([exe, "make-dataset"], check=True, capture_output=True,
                              text=True).stdout.strip()
    data = os.path.abspath(data)
    if not os.path.isdir(data):
        sys.exit(f"--data {data}: not a folder")
    # The loaders leave the node registry alone: another stoker job on this
    # machine would otherwise split the CPU budget with them mid-measurement.
    os.environ.setdefault("STOKER_NODE_REGISTRY", "off")
    # SIGTERM unwinds like Ctrl-C, so that the mount is always unmounted.
    signal.signal(signal.SIGTERM, signal.default_int_handler)

    try:
        fuse_usable(slowfs)
        shape = ["--overload", str(a.overload), "--drift", str(a.drift), "--drift-s",
                 str(a.drift_s), "--jitter", str(a.jitter)]
        with SlowMount(slowfs, data, a.open_ms, a.read_ms, a.slots, shape) as mount:
            if a.smoke:
                smoke(mount, data)
                return 0
            load_before = os.getloadavg()[0]
            t0 = time.perf_counter()
            with tempfile.TemporaryDirectory(prefix="stoker-compare-fuse-") as tmp:
                out_dir = a.out or tmp
                os.makedirs(out_dir, exist_ok=True)
                bench, rounds = compare(a, exe, mount, out_dir)
            report(a, data, bench, rounds, load_before, time.perf_counter() - t0)
    except CannotMount as e:
        print(f"compare_fuse: FUSE cannot mount here: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("compare_fuse: interrupted; unmounted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
