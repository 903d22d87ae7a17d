"""A failed sample's error as stoker.DataLoader raises it: a stoker.DataError
that is also of the sample's own exception type (``except OSError`` catches a
truncated image, as with torch), chained to the original exception, with the
sample's ``index``, ``key`` and ``worker``.

The engine raises a plain DataError naming the sample; its bindings add the
fields and ``_sample`` (python/src/errors.cc, from the status's
SampleErrorDetail): the pickled exception from a worker process, or the
ticket of a thread-made batch whose outcome holds the exception object until
the batch is taken. ``sample_error`` makes the exception to raise instead.
"""

import pickle

from ._stoker import DataError


class WorkerTraceback(Exception):
    """Stands for a worker's exception that could not be brought over (it
    does not pickle, or its type does not import here): its text is the
    worker's traceback, as concurrent.futures' _RemoteTraceback."""

    def __str__(self):
        return self.args[0]


def sample_error(error, threads):
    """The exception to raise for `error`, a DataError from the engine (or a
    RuntimeError: worker_init_fn raised), or None when it carries no
    exception of a worker's. `threads`: the loader's
    ThreadWorkers (its thread workers', its remote slots'), None where it has
    none. Never raises."""
    sample = getattr(error, "_sample", None)
    if sample is None:
        return None
    pickled, trace, ticket, failure = sample
    kind, cause = None, None
    try:
        if ticket is not None:
            # Tickets are unique across a process's ThreadWorkers: one of them holds it.
            for holder in threads:
                if holder is not None and cause is None:
                    cause = holder.failure_cause(ticket, failure)
            kind = None if cause is None else type(cause)
        elif pickled is not None:
            kind, cause = pickle.loads(pickled)
    except Exception:  # noqa: BLE001 -- a type that does not import here: the stand-in
        kind, cause = None, None
    return _raised_as(error, kind, cause, trace)


def failed_batch_error(message, failed):
    """The exception to raise for a sharded stream's batch whose collate_fn
    raised (`failed`, a _shards.FailedBatch): a DataError saying `message`
    and the worker's traceback, of the exception's own type and chained to
    it, as sample_error makes one for a map-style batch. Never raises."""
    kind, cause = type(failed.error), failed.error
    if cause is None:  # made in another process: pickled, if it could be
        try:
            kind, cause = pickle.loads(failed.pickled) if failed.pickled else (None, None)
        except Exception:  # noqa: BLE001 -- as sample_error
            kind, cause = None, None
    return batch_error(message, kind, cause, failed.trace)


def batch_error(message, kind, cause, trace):
    """The exception to raise for a batch whose collate_fn raised `cause`
    (of type `kind`; None where it could not be brought over): a DataError
    saying `message` and the worker's `trace` (empty: none), of that type
    and chained to it. Never raises."""
    if trace:
        message += "\n\nIn the worker:\n" + trace
    error = DataError(message)
    error.code = "data error"  # the engine's code for a failed batch
    return _raised_as(error, kind, cause, trace)


def _raised_as(error, kind, cause, trace):
    """`error` (the engine's, or one like it) as the instance of `kind` to
    raise, chained to `cause` (a stand-in holding `trace` where that is None)."""
    if cause is None and trace:
        cause = WorkerTraceback(trace)
    try:
        made = _instance(kind, error)
    except Exception:  # noqa: BLE001 -- whatever a user's type does: a plain DataError
        made = None
    if made is None:
        made = _fields(_engine_type(error)(*error.args), error)
    if isinstance(made, OSError) and isinstance(cause, OSError):
        made.errno = cause.errno  # as torch's own error has it (a filename would replace str())
    made.__cause__ = cause
    made.__suppress_context__ = True  # the engine's plain error says nothing more
    return made


def _engine_type(error):
    """The stoker type `error` is raised as: DataError, or RuntimeError."""
    return DataError if isinstance(error, DataError) else RuntimeError


def native_sample_error(error):
    """The exception to raise for `error`, a DataError from the engine naming
    a sample that stoker's native path read and decoded, or None when it
    names none: a DataError that is also an OSError, as PIL's errors for a
    file it cannot read or decode are (UnidentifiedImageError, a truncated
    file), so ``except OSError`` catches it on either path. Never raises."""
    if getattr(error, "_sample", None) is None:
        return None
    try:
        made = _instance(getattr(type(error), "_sample_type", OSError), error)
    except Exception:  # noqa: BLE001 -- as sample_error
        made = None
    if made is None:
        made = _fields(DataError(*error.args), error)
    made.__suppress_context__ = True
    return made


def data_error_of(kind):
    """The DataError that is also `kind` (FileNotFoundError, OSError), for a
    sample of stoker's own source whose failure has that type's code (the
    bindings raise it so: python/src/errors.cc); None where none can be."""
    return _combined(kind)


def _fields(made, error):
    """`made` with `error`'s fields."""
    made.code = getattr(error, "code", None)
    for name in ("index", "key", "worker"):  # a RuntimeError from pickle has none yet
        setattr(made, name, getattr(error, name, None))
    if isinstance(made, OSError) and getattr(error, "errno", None) is not None:
        made.errno = error.errno  # the system call's (errors.cc)
    return made


_COMBINED = {}  # (an exception type, the engine's) -> the two combined, or None: none can be


def _combined(kind, base=DataError):
    """A subclass of `base` (DataError; RuntimeError for worker_init_fn's
    error) that is also `kind`, made once per pair; None where none can be
    (a layout or MRO conflict, a type that is no exception). May raise, for
    a type that is odd enough."""
    if (kind, base) in _COMBINED:
        return _COMBINED[kind, base]
    combined = None
    if isinstance(kind, type) and issubclass(kind, Exception):
        bases = (kind,) if issubclass(kind, base) else (base, kind)
        try:
            combined = type(f"{base.__name__}[{kind.__name__}]", bases, {
                "__module__": "stoker",
                "__qualname__": f"{base.__name__}[{kind.__qualname__}]",
                "__doc__": base.__doc__,
                # The engine's message, not what the type's own methods make of
                # its fields (never set: its __init__ is not run).
                "__str__": BaseException.__str__, "__repr__": BaseException.__repr__,
                "__reduce__": _reduce, "_sample_type": kind, "_engine_type": base})
        except TypeError:  # a layout conflict (built-in types with fields of their own)
            combined = None
    _COMBINED[kind, base] = combined
    return combined


def _instance(kind, error):
    """`error` (its message and fields) as an instance of the combined type
    of `kind`, or None where it cannot be made. May raise, for a type that is
    odd enough."""
    combined = None if kind is None else _combined(kind, _engine_type(error))
    if combined is None:
        return None
    # Its own __new__ (OSError's, a user's), not DataError's; never its
    # __init__, which may want other arguments.
    try:
        made = kind.__new__(combined, *error.args)
    except TypeError:  # a __new__ that wants other arguments
        return None
    if not isinstance(made, combined):
        return None
    made.args = error.args
    return _fields(made, error)


def _reduce(self):
    """Pickles as its type, message and fields (rebuilt by _rebuild)."""
    return _rebuild, (self._sample_type, self.args, self._engine_type), dict(vars(self))


def _rebuild(kind, args, base=DataError):
    error = base(*args)
    try:
        made = _instance(kind, error)
    except Exception:  # noqa: BLE001 -- as sample_error
        made = None
    return error if made is None else made
