"""Checks of the public API's arguments, made before anything reaches _stoker.

Each check names the argument and what it takes: a wrong type is a TypeError,
a value out of range a ValueError. Without them pybind11 answers with its list
of overloads ("incompatible function arguments"), and int() / float() would
take "8", 8.7 or True without a word.
"""

import math
import numbers
import operator
import os

import numpy

from . import _stoker

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
UINT64_MAX = 2**64 - 1


def _describe(value):
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def integer(name, value, low, high):
    """``value`` as an int in [low, high]: an int or any integer type with
    __index__ (numpy, torch); not a bool, a float or a string."""
    if isinstance(value, (bool, numpy.bool_)):
        raise TypeError(f"{name} must be an int, got {_describe(value)}")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {_describe(value)}") from None
    if number < low:
        raise ValueError(f"{name} must be an int >= {low}, got {number}")
    if number > high:
        raise ValueError(f"{name} must be an int <= {high}, got {number}")
    return number


def optional_integer(name, value, low, high):
    """None, or ``value`` as by integer()."""
    return None if value is None else integer(name, value, low, high)


def integers(name, values, low, high):
    """``values`` (any iterable, not a string) as a list of ints in [low, high]."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{name} must be a sequence of ints, got {_describe(values)}")
    return [integer(f"{name}[{i}]", v, low, high) for i, v in enumerate(values)]


def real(name, value, above=None, at_least=None):
    """``value`` as a float: an int or a float (numpy's too), not a bool or a
    string. With a bound it must also be finite and > ``above`` or >=
    ``at_least``; without one, its range is the C++ side's to check."""
    if isinstance(value, (bool, numpy.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {_describe(value)}")
    number = float(value)
    if above is not None and not (math.isfinite(number) and number > above):
        raise ValueError(f"{name} must be a finite number > {above}, got {number}")
    if at_least is not None and not (math.isfinite(number) and number >= at_least):
        raise ValueError(f"{name} must be a finite number >= {at_least}, got {number}")
    return number


def reals(name, values, count):
    """``values`` as a list of exactly ``count`` floats, as by real()."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise TypeError(f"{name} must be {count} numbers, got {_describe(values)}")
    if len(values) != count:
        raise ValueError(f"{name} must be {count} numbers, got {len(values)}: {values!r}")
    return [real(f"{name}[{i}]", v) for i, v in enumerate(values)]


def boolean(name, value):
    """``value`` as a bool: True, False or a numpy bool, nothing truthy."""
    if isinstance(value, (bool, numpy.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {_describe(value)}")


ON_ERROR = ("raise", "skip")


def on_error(value):
    """``value`` as an error policy: "raise" or "skip" (stoker.Loader and
    stoker.DataLoader's ``on_error``)."""
    if value not in ON_ERROR:
        raise ValueError(f"on_error must be 'raise' or 'skip', got {value!r}")
    return value


def tune_interval(value):
    """The tuner's interval in seconds: ``value`` (> 0), or the engine's
    default (TunerOptions) for None."""
    if value is None:
        from . import _stoker
        return _stoker.TunerOptions().interval_s
    return real("tune_interval", value, above=0)


def tuner_only(workers_name, workers, **options):
    """Refuses tuner options (trace_path, max_workers, tune_interval) given with a fixed
    worker count `workers` (None: "auto"), where no tuner runs and they
    would be ignored."""
    if workers is None or isinstance(workers, str):  # "auto" (other strings are refused)
        return
    for name, value in options.items():
        if value:
            raise ValueError(f"{name} is the tuner's, which runs only with {workers_name}='auto': "
                             f"with {workers_name}={workers!r} it would be ignored")


def optional_path(name, value):
    """None, or ``value`` (str, bytes or os.PathLike) as a str; an empty one
    is refused (an unset variable: it would write nothing, unsaid), as the
    command line refuses one."""
    if value is None:
        return None
    if not isinstance(value, (str, bytes, os.PathLike)):
        raise TypeError(f"{name} must be a path (str, bytes or os.PathLike), got "
                        f"{_describe(value)}")
    path = os.fsdecode(value)
    if not path:
        raise ValueError(f"{name} must be a path, got an empty one (an unset variable?); "
                         "None for none")
    return path


# The checkpoint's integer fields and their C++ types' largest values, and
# its boolean fields: where the epoch stands and the plan it belongs to.
_STATE_COUNTS = {"seed": UINT64_MAX, "epoch": _stoker.MAX_EPOCH, "position": INT64[1],
                 "num_samples": INT64[1], "batch_size": INT64[1], "rank": INT32[1],
                 "world_size": INT32[1]}
_STATE_FLAGS = ("shuffle", "drop_last", "pad_shards")


def loader_state(state):
    """A checkpoint from Loader.state_dict() as plain JSON-ready values, or an
    error naming what is wrong with it: TypeError when it is not a mapping,
    ValueError for a key it should not have or a value of the wrong kind (an
    integer >= 0, a list of them for "beyond", True or False for the plan's
    flags). A missing key is the C++ side's to refuse (LoaderStateFromJson
    names it), and so is a plan that differs from the loader's (Restore)."""
    if not hasattr(state, "keys") or not hasattr(state, "__getitem__"):
        raise TypeError(f"state must be a dict from Loader.state_dict(), got {_describe(state)}")
    known = (*_STATE_COUNTS, "beyond", *_STATE_FLAGS)
    unknown = [k for k in state.keys() if k not in known]
    if unknown:
        raise ValueError(f"state has keys a Loader.state_dict() does not: "
                         f"{', '.join(repr(k) for k in unknown)} (it has "
                         f"{', '.join(repr(k) for k in known)})")

    # A checkpoint's content is a value: wrong types in it are ValueErrors.
    def checked(check, key, *args):
        try:
            return check(f"state's {key!r}", *args)
        except TypeError as e:
            raise ValueError(str(e)) from None

    plain = {k: checked(integer, k, state[k], 0, high)
             for k, high in _STATE_COUNTS.items() if k in state}
    plain.update({k: checked(boolean, k, state[k]) for k in _STATE_FLAGS if k in state})
    if "beyond" in state:
        beyond = state["beyond"]
        if isinstance(beyond, (str, bytes)) or not hasattr(beyond, "__iter__"):
            raise ValueError(f"state's 'beyond' must be a list of batch numbers, got "
                             f"{_describe(beyond)}")
        plain["beyond"] = [checked(integer, "beyond", b, 0, INT64[1]) for b in beyond]
    return plain


class Remade:
    """Pickles as the call that made it (the C++ half does not pickle): a
    cluster's worker opens the same source, or builds the same transform."""

    def __new__(cls, *args, **kwargs):
        made = super().__new__(cls)
        made._made_with = (args, kwargs)
        return made

    def __reduce__(self):
        args, kwargs = self._made_with
        return _remake, (type(self), args, kwargs)


def _remake(cls, args, kwargs):
    return cls(*args, **kwargs)
