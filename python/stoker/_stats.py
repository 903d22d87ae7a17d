"""The figures that stats() shows, defined once for stoker.Loader,
stoker.DataLoader, stoker.bench and worker_kind="auto"'s trial."""

from . import _stoker


def rates(samples, wait_s, elapsed_s):
    """{"samples_per_s", "stall_fraction"} of a stretch of `elapsed_s` seconds
    in which the consumer took `samples` and waited `wait_s` for them."""
    return {"samples_per_s": samples / elapsed_s if elapsed_s > 0 else 0.0,
            "stall_fraction": _stoker.stall_fraction(wait_s, elapsed_s)}


def consumer_seconds(metrics):
    """(waited, elapsed): the consumer's seconds inside next() and in all,
    since its first next(), from the engine's metrics."""
    wait = metrics["consumer_wait_ns"] / 1e9
    return wait, wait + metrics["consumer_step_ns"] / 1e9


def gpu(pcie):
    """{"gpu": every GPU's use (NVML; with `pcie` its PCIe throughput too),
    "gpu_note": ""}, or {"gpu": None, "gpu_note": why there is none}."""
    usage = _stoker.gpu_usage(pcie=bool(pcie))
    if isinstance(usage, str):
        return {"gpu": None, "gpu_note": usage}
    return {"gpu": usage, "gpu_note": ""}
