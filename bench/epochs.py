"""What the Python benchmarks share: batches across epochs, a steady rate."""

import os
import time


class Endless:
    """The batches of `loader`, epoch after epoch: at each epoch's end a new
    iter(), after `on_epoch(epochs so far)` when given (a set_epoch)."""

    def __init__(self, loader, on_epoch=None):
        self.loader, self.on_epoch = loader, on_epoch
        self.it, self.epochs = iter(loader), 0

    def __iter__(self):
        return self

    def __next__(self):
        while True:
            try:
                return next(self.it)
            except StopIteration:
                self.epochs += 1
                if self.on_epoch is not None:
                    self.on_epoch(self.epochs)
                self.it = iter(self.loader)


def steady_rate(batches, seconds, warmup, samples_of):
    """Samples/s of `batches` (an Endless) over `seconds`, after `warmup`
    seconds; `samples_of(batch)` counts a batch (and may check it)."""
    start = time.perf_counter()
    while time.perf_counter() - start < warmup:
        next(batches)
    samples, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        samples += samples_of(next(batches))
    return samples / (time.perf_counter() - start)


class Conditions:
    """What a side-by-side run ran under: usable cores, the load average
    before and after, the wall time; made when the run starts."""

    def __init__(self):
        self.cores = len(os.sched_getaffinity(0))
        self.load_before, self.load_after = os.getloadavg()[0], None
        self.t0 = time.perf_counter()

    def end(self):
        self.load_after = os.getloadavg()[0]

    def line(self, seconds):
        return (f"{self.cores} cores usable; load average {self.load_before:.2f} before, "
                f"{self.load_after:.2f} after; {seconds:g} s per setting, "
                f"{time.perf_counter() - self.t0:.0f} s in all")

    def fields(self):
        return {"cores": self.cores, "loadavg_before": self.load_before,
                "loadavg_after": self.load_after}
