"""What a dataset holds, as a digest: torch's DataLoader without persistent
workers forks them from the dataset as it is at each iter(), so a dataset
changed between epochs (a curriculum level, set_epoch(), a new transform)
reaches them. stoker's zygote holds the dataset as it was when the workers'
pool was made; the loader compares this digest at each iter() and makes the
pool anew when it differs.

The digest walks the dataset's object graph breadth first, at most
``BUDGET`` objects: attribute names and values, scalars by value, containers
by length and elements (large ones by a fixed sample of their elements,
and by the hash of all of them where every one hashes),
arrays and tensors by their memory (address, shape, dtype, strides; small
ones by their bytes; array.array too), functions by their code, defaults
and closure, torch's generators by their state, objects whose class says
how to pickle them (random.Random, functools.partial, numpy's generators,
whose state lives in C) by what they pickle to as well, and anything else
by its identity. The dataset's classes defined in its class's
module are walked by their attributes too, and that module's functions by
the module globals their code names (a curriculum level kept in a global or
a class attribute). What lies past the budget, or in an element of a large
container that the sample skips, or in the bytes of a large array, or in
another module's state, is not seen."""

import array
import collections
import functools
import hashlib
import types

BUDGET = 20_000  # objects walked at most
_SAMPLE = 64     # elements of a larger container that are looked at
_SMALL_BYTES = 4096  # arrays this small are digested by their bytes

_SCALARS = (bool, int, float, complex, str, bytes, bytearray, type(None), type(Ellipsis))


def digest(obj, budget=BUDGET):
    """A digest of `obj` and of what it holds, as far as `budget` objects;
    None when something in it cannot be looked at (whatever a user's object
    raises when its fields are read)."""
    try:
        return _digest(obj, budget)
    except Exception:  # noqa: BLE001 -- a digest that cannot be made tells nothing
        return None


def _digest(obj, budget):
    h = hashlib.blake2b(digest_size=16)
    home = getattr(type(obj), "__module__", None)  # the module whose state is followed
    queue = [obj, *(c for c in type(obj).__mro__ if _at_home(c, home))]
    seen = set()
    at = 0
    while at < len(queue) and at < budget:
        o = queue[at]
        at += 1
        kind = type(o)
        h.update(f"{kind.__module__}.{kind.__qualname__}|".encode())
        if kind in _SCALARS:
            h.update(_scalar(o, kind))
            continue
        if id(o) in seen:  # shared or cyclic: where it was met first
            h.update(b"@" + id(o).to_bytes(8, "little"))
            continue
        seen.add(id(o))
        queue.extend(_parts(o, kind, h, home))
    return h.digest()


def _at_home(o, home):
    """Whether class or function `o` is defined in module `home`."""
    return home is not None and getattr(o, "__module__", None) == home


def _globals_read(function):
    """(name, value) of each module global `function`'s code names, nested
    code (comprehensions, lambdas) included, in the order first named."""
    names, codes = [], [function.__code__]
    while codes:
        code = codes.pop()
        names += code.co_names
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    found = function.__globals__
    return [part for name in dict.fromkeys(names) if name in found
            for part in (name, found[name])]


def _parts(o, kind, h, home):
    """What `o` holds, to walk next; what it is by itself goes into `h`.
    Classes and functions of module `home` bring what they read there."""
    if kind in (list, tuple, set, frozenset, dict) or \
            isinstance(o, (list, tuple, dict, collections.deque)):
        items = list(o.items()) if isinstance(o, dict) else o
        if isinstance(o, (set, frozenset)):
            items = sorted(o, key=repr) if len(o) <= _SAMPLE else ()
        h.update(len(o).to_bytes(8, "little"))
        if len(o) > _SAMPLE:  # every element, where all hash (35 ms for 1.28 million pairs)
            try:
                whole = hash(frozenset(o) if isinstance(o, (set, frozenset)) else tuple(items))
                h.update(whole.to_bytes(8, "little", signed=True))
            except TypeError:  # an unhashable element: the spread below alone
                pass
        return [v for item in _sampled(items) for v in (item if isinstance(o, dict) else (item,))]
    memory = _memory(o)
    if memory is not None:
        h.update(repr(memory[0]).encode())
        if memory[1] is not None:
            h.update(memory[1])
        return []
    if isinstance(o, (types.FunctionType, types.MethodType)):
        if isinstance(o, types.MethodType):
            return [o.__func__, o.__self__]
        h.update(id(o.__code__).to_bytes(8, "little"))
        cells = [c.cell_contents for c in (o.__closure__ or ()) if filled(c)]
        read = _globals_read(o) if _at_home(o, home) else []
        return [o.__defaults__, o.__kwdefaults__, *cells, *read]
    if isinstance(o, (type, types.ModuleType, types.BuiltinFunctionType)) or _loader(o):
        h.update(id(o).to_bytes(8, "little"))
        if isinstance(o, type) and _at_home(o, home):  # its attributes, methods included
            return [part for name, value in sorted(vars(o).items())
                    if not (name.startswith("__") and name.endswith("__"))
                    for part in (name, value)] + \
                [v for name in ("__getitem__", "__getitems__", "__iter__")
                 if isinstance(v := vars(o).get(name), types.FunctionType)]
        return []
    if _torch_generator(o):  # its state by value: a reseed in place (manual_seed)
        h.update(o.get_state().numpy().tobytes())
        return []
    fields = getattr(o, "__dict__", None)
    slots = [s for c in kind.__mro__ for s in _slot_names(c) if hasattr(o, s)]
    pickled = _pickled_state(o, kind)
    if fields is None and not slots and pickled is None:
        h.update(id(o).to_bytes(8, "little"))  # opaque: by identity
        return []
    parts = pickled or []
    named = sorted((fields or {}).items(), key=lambda item: repr(item[0]))
    for name, value in named + [(s, getattr(o, s)) for s in slots]:
        parts += [name, value]
    return parts


def _pickled_state(o, kind):
    """What an object whose class says how to pickle it (its own __reduce__
    or __reduce_ex__: random.Random, functools.partial, numpy's generators,
    whose state lives in C where __dict__ does not show it) pickles to, its
    arguments and state, to walk; None for other objects and for those that
    refuse (a lock, a file: then by identity)."""
    if kind.__reduce_ex__ is object.__reduce_ex__ and kind.__reduce__ is object.__reduce__:
        return None
    try:
        reduced = o.__reduce_ex__(4)
    except Exception:  # noqa: BLE001 -- whatever refuses to pickle is opaque
        return None
    if not isinstance(reduced, tuple) or len(reduced) < 2:
        return None
    return list(reduced[1:3])  # its arguments and state (items after, iterators, are not read)


def _torch_generator(o):
    import sys
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(o, torch.Generator)


def _scalar(o, kind):
    """A scalar's bytes for the digest: its length and at most its first
    _SMALL_BYTES (a long string or a huge int costs no more)."""
    if kind in (bytes, bytearray):
        data = bytes(o[:_SMALL_BYTES])
    elif kind is str:
        data = o[:_SMALL_BYTES].encode(errors="surrogatepass")
    elif kind is int and o.bit_length() > 64:  # no repr: Python refuses one past 4300 digits
        data = (o & ((1 << (8 * _SMALL_BYTES)) - 1)).to_bytes(_SMALL_BYTES, "little") + \
            o.bit_length().to_bytes(8, "little") + (b"-" if o < 0 else b"+")
    else:
        data = repr(o).encode()
    size = len(o) if kind in (bytes, bytearray, str) else len(data)
    return size.to_bytes(8, "little") + data


def _slot_names(cls):
    names = getattr(cls, "__slots__", ())
    return (names,) if isinstance(names, str) else tuple(names)


def _sampled(items):
    """All of a small container's items; of a larger one, a fixed spread."""
    n = len(items)
    if n <= _SAMPLE:
        return list(items)
    step = n / _SAMPLE
    return [items[int(i * step)] for i in range(_SAMPLE - 1)] + [items[n - 1]]


def _memory(o):
    """(where it lies, its bytes if small) of a numpy array, a torch tensor
    or an array.array; None for anything else."""
    import sys
    if isinstance(o, array.array):
        nbytes = len(o) * o.itemsize
        where = (o.buffer_info()[0], len(o), o.typecode)
        return where, o.tobytes() if nbytes <= _SMALL_BYTES else None
    np = sys.modules.get("numpy")
    if np is not None and isinstance(o, np.ndarray):
        where = (o.__array_interface__["data"][0], o.shape, o.dtype.str, o.strides)
        return where, o.tobytes() if o.nbytes <= _SMALL_BYTES else None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(o, torch.Tensor):
        where = (o.data_ptr(), tuple(o.shape), str(o.dtype), o.stride(), str(o.device))
        data = None
        if o.device.type == "cpu" and o.numel() * o.element_size() <= _SMALL_BYTES:
            try:
                data = o.detach().contiguous().view(torch.uint8).numpy().tobytes()
            except (RuntimeError, TypeError):  # a layout without plain bytes: by its memory
                data = None
        return where, data
    return None


def _loader(o):
    """A loader or its iterator (a dataset may hold one): what it is made of
    changes as it runs, and is not the dataset's."""
    return isinstance(o, _loader_kinds())


@functools.cache
def _loader_kinds():
    import torch.utils.data
    from . import _dataloader, _loader as loader
    return (_dataloader.DataLoader, _dataloader._Iterator, loader.Loader,
            torch.utils.data.DataLoader, torch.utils.data.dataloader._BaseDataLoaderIter)


def filled(cell):
    """Whether closure cell `cell` holds a value."""
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True
