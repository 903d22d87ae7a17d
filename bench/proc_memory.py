"""Run a benchmark configuration in a child process and watch its memory.

Shared by the bench/compare_*.py scripts that run each configuration in a
fresh child, so that its memory is its own. Memory is that of the whole
process tree (the child and every process it starts, e.g. DataLoader
workers), read from /proc/PID/smaps_rollup every 50 ms: the sum of RSS (what
`top` adds up; it counts pages shared between forked workers once per worker)
and the sum of PSS (shared pages divided among their sharers: the memory
really used).

The child speaks one JSON object per line on stdout, each with an "event".
One with "event": "base" and "cpu_s" (the child's CPU time so far) marks the
baseline: the tree's memory is read at that moment, and its CPU time is left
out of the total.
"""

import json
import os
import resource
import subprocess
import sys
import threading


def tree_pids(pid):
    """`pid` and all its descendants (those alive now)."""
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass  # exited meanwhile
    return pids


def tree_fields(pid, fields):
    """{field: sum over `pid` and its descendants} of /proc/PID/smaps_rollup
    fields (e.g. "Pss", "Pss_File"), in bytes; 0 for a field the kernel lacks."""
    sums = dict.fromkeys(fields, 0)
    for p in tree_pids(pid):
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    name, _, value = line.partition(":")
                    if name in sums:
                        sums[name] += int(value.split()[0]) * 1024
        except OSError:
            pass  # exited meanwhile
    return sums


def tree_memory(pid):
    """(sum of RSS, sum of PSS) of `pid` and its descendants, in bytes."""
    sums = tree_fields(pid, ("Rss", "Pss"))
    return sums["Rss"], sums["Pss"]


class Poller:
    """Calls self.poll() on a thread every interval_s from __enter__ to __exit__."""

    def __init__(self, interval_s):
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.interval_s)

    def poll(self):
        raise NotImplementedError

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


class PeakMemory(Poller):
    """Samples tree_memory(pid) from __enter__ to __exit__ and keeps the
    peaks in `rss` and `pss` (bytes)."""

    def __init__(self, pid, interval_s=0.05):
        super().__init__(interval_s)
        self.pid = pid
        self.rss = self.pss = 0

    def poll(self):
        rss, pss = tree_memory(self.pid)
        self.rss, self.pss = max(self.rss, rss), max(self.pss, pss)


def run_measured(argv):
    """Runs `argv` to its end while watching its process tree. Returns a dict:
    "returncode", "events" (the child's JSON lines, in order), "peak_rss",
    "peak_pss", "base_rss", "base_pss" (bytes; base is 0 without a "base"
    event) and "cpu_s" (CPU time of the child and the descendants it reaped,
    less its CPU time at the "base" event). The child's stderr passes through."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    events, base, base_cpu = [], (0, 0), 0.0
    with PeakMemory(proc.pid) as peak:
        for line in proc.stdout:
            if not line.startswith("{"):
                sys.stderr.write(line)  # a stray print from a library: shown, not parsed
                continue
            event = json.loads(line)
            if event.get("event") == "base":
                base = tree_memory(proc.pid)
                base_cpu = event["cpu_s"]
            events.append(event)
        proc.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime) - base_cpu
    return {"returncode": proc.returncode, "events": events, "peak_rss": peak.rss,
            "peak_pss": peak.pss, "base_rss": base[0], "base_pss": base[1], "cpu_s": cpu}
