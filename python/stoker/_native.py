"""stoker.DataLoader's native path: a torchvision ImageFolder (or DatasetFolder
with torchvision's image loader) whose transform is a Compose of steps stoker
knows runs as stoker's own source and transform on the engine's C++ threads,
with no Python per sample. ``recognise`` returns the plan, or the reason the
Python path runs instead; ``read_batch`` turns a native batch into what
torch's ``default_collate`` gives: ``[images, labels]``.

Matching is by exact class (``type(x) is ...``: a subclass may change what a
step does) and by every attribute that changes the output; anything not
known here keeps the Python path, with the reason in
``stats()["pipeline_reason"]``. docs/dataloader.md lists the steps.
"""

import collections.abc
import dataclasses
import numbers
import os
import sys

from . import _args, _errors, _stoker, _workers, transforms
from ._workers import NO_SAMPLE

_HEADER = _stoker.protocol.NATIVE_BATCH
# What stoker's decoder reads (by content; the name must say so, since
# torchvision's loader also reads .bmp, .tif, .webp ... through PIL). A
# file so named holding another format goes through PIL (_pil_rgb).
_NATIVE_EXTENSIONS = (b".jpg", b".jpeg", b".png")


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the native path runs: the dataset's samples as a source, the
    steps as one stoker transform, batches of at most ``max_batch``."""

    source: object      # _stoker.Source over dataset.samples
    transform: object   # stoker.transforms.Image
    max_batch: int
    steps: str          # what was recognised, for people


class _Off(Exception):
    """Raised inside recognition with the reason the native path is off."""


def recognise(dataset, options, native):
    """(Plan, "") when the DataLoader over `dataset` with `options` (its
    resolved _DataLoaderOptions) can run natively, else (None, reason)."""
    if not native:
        return None, "native=False"
    try:
        return _recognise(dataset, options), ""
    except _Off as off:
        return None, str(off)


def _recognise(dataset, options):
    dataset, indices = _through_subsets(dataset)
    folder = sys.modules.get("torchvision.datasets.folder")
    if folder is None:  # an ImageFolder cannot exist before its module: no import for every loader
        raise _Off(f"dataset {type(dataset).__qualname__} is not torchvision's ImageFolder or "
                   "DatasetFolder (torchvision.datasets is not imported)")
    kind = type(dataset)
    if kind not in (folder.ImageFolder, folder.DatasetFolder):
        if isinstance(dataset, folder.DatasetFolder):
            raise _Off(f"dataset {kind.__qualname__} is a subclass of torchvision's "
                       f"{folder.DatasetFolder.__name__} (it may change __getitem__)")
        raise _Off(f"dataset {kind.__qualname__} is not torchvision's ImageFolder or "
                   "DatasetFolder")
    for attr in ("__getitem__", "__len__"):
        _check_library_code(getattr(kind, attr, None), f"{kind.__qualname__}.{attr}")
    import torchvision
    from PIL import Image, ImageFile
    loader = getattr(dataset, "loader", None)
    if _own(loader, folder, "default_loader"):
        if torchvision.get_image_backend() != "PIL":
            raise _Off(f"torchvision's image backend is {torchvision.get_image_backend()!r}, "
                       "not 'PIL'")
    elif not _own(loader, folder, "pil_loader"):
        raise _Off(f"the dataset's loader {_name(loader)} is not torchvision's default_loader")
    # What those loaders look up at each call, where a script may patch them.
    for where, function, module, name, whose in (
            ("torchvision.datasets.folder.pil_loader", folder.pil_loader, folder, "pil_loader",
             "torchvision's"),
            ("PIL.Image.open", getattr(getattr(folder, "Image", None), "open", None), Image,
             "open", "PIL's")):
        if not _own(function, module, name):
            raise _Off(f"{where} is {_name(function)}, not {whose} own (a patch: the images are "
                       "what it makes)")
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        raise _Off("PIL.ImageFile.LOAD_TRUNCATED_IMAGES is set: PIL decodes a file cut short "
                   "(what it lacks left black), stoker's decoder refuses it")
    if getattr(dataset, "target_transform", None) is not None:
        raise _Off(f"target_transform {_name(dataset.target_transform)} runs Python")
    if options.unbatched:
        raise _Off("batch_size=None (no batching) is not native")
    if options.collate_fn is not options.default_collate:
        raise _Off(f"collate_fn {_name(options.collate_fn)} is not torch's default_collate")
    if options.worker_init_fn is not None:
        raise _Off("worker_init_fn runs in worker processes")
    if options.cluster is not None:
        raise _Off("cluster= runs the Python path on remote slots")
    max_batch = _max_batch(options)
    transform, steps = _transform(dataset.transform)
    return Plan(source=_source(dataset, indices), transform=transform, max_batch=max_batch,
                steps=steps)


def _through_subsets(dataset):
    """(the dataset under torch's Subsets, e.g. random_split's, and which of
    its samples they keep, in their order; None: all)."""
    import torch.utils.data
    indices = None
    while type(dataset) is torch.utils.data.Subset:
        level = list(dataset.indices)
        indices = level if indices is None else [level[i] for i in indices]
        dataset = dataset.dataset
    return dataset, indices


def _own(function, module, name):
    """Whether `function` is `name` as `module`'s source defines it, not a
    replacement patched in."""
    code = getattr(function, "__code__", None)
    return (code is not None and getattr(function, "__qualname__", None) == name and
            code.co_filename == getattr(module, "__file__", None))


def _name(thing):
    kind = thing if isinstance(thing, type) else type(thing)
    name = getattr(thing, "__qualname__", None) or kind.__qualname__
    return name


def _max_batch(options):
    """The most samples a batch holds: the batch size, or a batch sampler's,
    and no more than the sampler yields in an epoch (a batch_size past a small
    data set's end). A later epoch's larger batch makes the run anew with room
    for it (DataLoader._fit_batches)."""
    size = options.batch_size
    if size is None:
        size = getattr(options.batch_sampler, "batch_size", None)
        if not isinstance(size, numbers.Integral) or isinstance(size, bool) or size < 1:
            raise _Off(f"batch_sampler {_name(options.batch_sampler)} has no batch_size (the "
                       "most samples a batch holds)")
    try:
        yields = len(getattr(options.batch_sampler, "sampler", None))
    except Exception:  # no len(), or one that fails: batch_size is the bound
        return int(size)
    return int(min(size, yields)) if isinstance(yields, int) and yields >= 1 else int(size)


def _source(dataset, indices=None):
    """dataset.samples (those at `indices`, a Subset's) as stoker's source:
    the same files, labels and order."""
    samples = dataset.samples
    if indices is not None:
        try:
            samples = [samples[i] for i in indices]
        except (IndexError, TypeError) as e:  # as the Subset itself would fail
            raise _Off(f"the Subset's indices do not index the dataset's samples: {e}") from None
    if len(samples) == 0:
        raise _Off("the dataset has no samples")
    paths, labels = [], []
    for path, label in samples:
        name = os.fsencode(path)
        if not name.lower().endswith(_NATIVE_EXTENSIONS):
            raise _Off(f"file {os.fsdecode(name)!r} is not .jpg, .jpeg or .png (stoker decodes "
                       "JPEG and PNG; PIL reads the rest)")
        # default_collate keeps a numpy scalar's dtype; stoker's labels are int64.
        if isinstance(label, bool) or not (isinstance(label, int) or
                                           str(getattr(label, "dtype", "")) == "int64"):
            raise _Off(f"label {label!r} of {os.fsdecode(name)!r} is not an int or int64 "
                       f"(a {type(label).__name__}: torch's default_collate keeps its type)")
        label = int(label)
        if not _args.INT64[0] <= label <= _args.INT64[1]:  # the Python path raises as torch does
            raise _Off(f"label {label} of {os.fsdecode(name)!r} does not fit in int64")
        paths.append(name)
        labels.append(label)
    classes = [os.fsencode(c) for c in getattr(dataset, "classes", [])]
    return _stoker.open_path_source(paths, labels, classes)


# -- the transform ----------------------------------------------------------

def _step_kinds():
    """Each known step class (torchvision.transforms and, where installed,
    transforms.v2) -> the name of its handler."""
    kinds = {}
    import torchvision.transforms as t
    for name in ("RandomResizedCrop", "RandomHorizontalFlip", "Resize", "CenterCrop",
                 "ToTensor", "PILToTensor", "ConvertImageDtype", "Normalize"):
        kinds[getattr(t, name)] = name
    try:
        import torchvision.transforms.v2 as v2
    except ImportError:
        return kinds, {t.Compose}
    for name in ("RandomResizedCrop", "RandomHorizontalFlip", "Resize", "CenterCrop",
                 "ToTensor", "PILToTensor", "ConvertImageDtype", "Normalize"):
        if hasattr(v2, name):
            kinds[getattr(v2, name)] = name
    if hasattr(v2, "ToImage"):
        kinds[v2.ToImage] = "PILToTensor"  # a uint8 image tensor, as PILToTensor
    if hasattr(v2, "ToDtype"):
        kinds[v2.ToDtype] = "ToDtype"
    return kinds, {t.Compose, v2.Compose}


@dataclasses.dataclass
class _Pipeline:
    """The steps read so far."""

    crop: object = None      # RandomResizedCrop's (size, scale, ratio)
    interpolation: str = "bilinear"  # the resize's filter (RandomResizedCrop's or Resize's)
    flip: float = 0.0
    flip_first: bool = False  # the flip comes before RandomResizedCrop
    resize: object = None    # an int (shorter side) or (h, w)
    center: object = None    # CenterCrop's (h, w)
    tensor: str = ""         # "" (a PIL image), "uint8" or "float"
    normalize: object = None  # (mean, std)
    seen: list = dataclasses.field(default_factory=list)


def _transform(transform):
    """The stoker transform doing what `transform` does, and its description."""
    if transform is None:
        raise _Off("the dataset has no transform: its samples are PIL images")
    kinds, composes = _step_kinds()
    steps = transform.transforms if type(transform) in composes else [transform]
    if type(transform) not in composes and type(transform) not in kinds:
        if _is_compose(transform, composes):
            raise _Off(f"transform {_name(transform)} is a subclass of Compose")
        raise _Off(f"transform step {_name(transform)} is not native")
    if type(transform) in composes:
        _check_plain(transform)
    p = _Pipeline()
    for step in steps:
        kind = kinds.get(type(step))
        if kind is None:
            raise _Off(f"transform step {_name(step)} is not native")
        _check_plain(step)
        _STEPS[kind](p, step)
        p.seen.append(type(step).__name__)
    return _make(p), " + ".join(p.seen)


def _is_compose(transform, composes):
    return any(isinstance(transform, c) for c in composes)


def _check_plain(step):
    """A step used as its class defines it: no hooks, no forward of its own."""
    for attr in ("_forward_hooks", "_forward_pre_hooks"):
        if getattr(step, attr, None):
            raise _Off(f"transform step {type(step).__name__} has a forward hook")
    own = vars(step) if hasattr(step, "__dict__") else {}
    if "forward" in own or "__call__" in own:
        raise _Off(f"transform step {type(step).__name__} has a forward of its own")
    for attr in ("forward", "__call__"):
        _check_library_code(getattr(type(step), attr, None),
                            f"transform step {type(step).__name__}'s {attr}")


def _check_library_code(function, what):
    """`function` (a class's method, as looked up now) is torchvision's or
    torch's own code, not a replacement patched into the class."""
    if function is None:
        return
    module = sys.modules.get(getattr(function, "__module__", None) or "")
    code = getattr(function, "__code__", None)
    if (module is None or code is None or
            not module.__name__.startswith(("torchvision.", "torch.")) or
            code.co_filename != getattr(module, "__file__", None)):
        raise _Off(f"{what} is {_name(function)}, not torchvision's own (a patch: the "
                   "samples are what it makes)")


def _pil_step(p, name):
    if p.tensor:
        raise _Off(f"{name} after the image became a tensor (tensor resizing differs from "
                   "PIL's) is not native")


def _interpolation(p, step, name):
    """Records the step's filter: Pillow's BILINEAR or BICUBIC, which stoker
    resamples as Pillow does."""
    from torchvision.transforms import InterpolationMode
    mode = getattr(step, "interpolation", None)
    # transforms.v2 steps hold the same InterpolationMode.
    native = {InterpolationMode.BILINEAR: "bilinear", InterpolationMode.BICUBIC: "bicubic"}
    if mode not in native:
        raise _Off(f"{name} interpolation {getattr(mode, 'value', mode)} is not native "
                   "(bilinear and bicubic are)")
    p.interpolation = native[mode]
    # antialias: PIL images are always resized with antialiasing, whatever it says.


def _whole(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _pair(size, name):
    if _whole(size):
        return int(size), int(size)
    try:
        values = list(size)
    except TypeError:
        raise _Off(f"{name} size {size!r} is not an int or (h, w)") from None
    # A float is PIL's to refuse or round (torchvision passes it on): not native.
    if not all(_whole(v) for v in values):
        raise _Off(f"{name} size {size!r} is not of ints")
    values = [int(v) for v in values]
    if len(values) == 1:
        return values[0], values[0]
    if len(values) != 2:
        raise _Off(f"{name} size {size!r} is not an int or (h, w)")
    return values[0], values[1]


def _step_RandomResizedCrop(p, step):
    _pil_step(p, "RandomResizedCrop")
    if p.crop is not None or p.resize is not None or p.center is not None:
        raise _Off(f"RandomResizedCrop after {p.seen[-1]} is not native")
    _interpolation(p, step, "RandomResizedCrop")
    scale, ratio = tuple(float(v) for v in step.scale), tuple(float(v) for v in step.ratio)
    if len(scale) != 2 or len(ratio) != 2:
        raise _Off("RandomResizedCrop scale and ratio must be pairs")
    p.crop = (_pair(step.size, "RandomResizedCrop"), scale, ratio)


def _step_RandomHorizontalFlip(p, step):
    _pil_step(p, "RandomHorizontalFlip")
    if p.flip:
        raise _Off("a second RandomHorizontalFlip is not native")
    if p.resize is not None or p.center is not None:
        raise _Off("RandomHorizontalFlip with Resize or CenterCrop is not native (with "
                   "RandomResizedCrop it is)")
    value = float(step.p)
    if not 0.0 <= value <= 1.0:
        raise _Off(f"RandomHorizontalFlip p={step.p!r} is not a probability")
    p.flip = value
    p.flip_first = p.crop is None


def _step_Resize(p, step):
    _pil_step(p, "Resize")
    if p.crop is not None or p.resize is not None or p.center is not None or p.flip:
        raise _Off(f"Resize after {p.seen[-1]} is not native")
    _interpolation(p, step, "Resize")
    if getattr(step, "max_size", None) is not None:
        raise _Off(f"Resize max_size={step.max_size!r} is not native")
    size = step.size
    # An int, or a sequence of one, resizes the shorter side; two, to (h, w).
    one = _whole(size) or (isinstance(size, collections.abc.Sized) and len(size) == 1)
    pair = _pair(size, "Resize")
    p.resize = pair[0] if one else pair


def _step_CenterCrop(p, step):
    _pil_step(p, "CenterCrop")
    if p.crop is not None or p.center is not None or p.flip:
        raise _Off(f"CenterCrop after {p.seen[-1]} is not native")
    # A crop larger than the image pads it with zeros, as torchvision does.
    p.center = _pair(step.size, "CenterCrop")


def _step_ToTensor(p, step):
    if p.tensor:
        raise _Off("ToTensor of a tensor is not native")
    p.tensor = "float"


def _step_PILToTensor(p, step):
    if p.tensor:
        raise _Off(f"{type(step).__name__} of a tensor is not native")
    p.tensor = "uint8"


def _to_dtype(p, dtype, scale, name):
    import torch
    if p.tensor != "uint8" or p.normalize is not None:
        raise _Off(f"{name} other than after PILToTensor is not native")
    if dtype == torch.float32 and scale:
        p.tensor = "float"
    elif dtype != torch.uint8:
        raise _Off(f"{name} to {dtype} is not native (float32 and uint8 are)")


def _step_ConvertImageDtype(p, step):
    _to_dtype(p, step.dtype, True, "ConvertImageDtype")


def _step_ToDtype(p, step):
    dtype = step.dtype
    if isinstance(dtype, dict):
        raise _Off("ToDtype with a dict of dtypes is not native")
    _to_dtype(p, dtype, bool(getattr(step, "scale", False)), "ToDtype")


def _step_Normalize(p, step):
    if p.tensor != "float":
        raise _Off("Normalize of a tensor that is not float is not native")
    if p.normalize is not None:
        raise _Off("a second Normalize is not native")
    mean, std = _three(step.mean, "mean"), _three(step.std, "std")
    if any(s == 0 for s in std):
        raise _Off(f"Normalize std {tuple(step.std)!r} has a zero")
    p.normalize = (mean, std)


_STEPS = {
    "RandomResizedCrop": _step_RandomResizedCrop, "RandomHorizontalFlip": _step_RandomHorizontalFlip,
    "Resize": _step_Resize, "CenterCrop": _step_CenterCrop, "ToTensor": _step_ToTensor,
    "PILToTensor": _step_PILToTensor, "ConvertImageDtype": _step_ConvertImageDtype,
    "ToDtype": _step_ToDtype, "Normalize": _step_Normalize,
}


def _three(values, name):
    try:
        values = [float(v) for v in values]
    except TypeError:
        values = [float(values)]
    if len(values) == 1:
        values *= 3
    if len(values) != 3:
        raise _Off(f"Normalize {name} has {len(values)} values, not 1 or 3 (RGB)")
    return tuple(values)


def _pil_pixel_limit():
    """The most pixels PIL opens (past twice Image.MAX_IMAGE_PIXELS it raises
    DecompressionBombError; None: no limit), as the native path's max_pixels."""
    from PIL import Image
    limit = Image.MAX_IMAGE_PIXELS
    return _args.INT64[1] if limit is None else 2 * int(limit)


def _pil_rgb(record):
    """torchvision's pil_loader for a file whose name says JPEG or PNG and
    whose bytes are another format PIL reads (a GIF or WebP named .jpg, as
    scraped data sets hold): its RGB pixels, as an (H, W, 3) array."""
    import io

    import numpy
    from PIL import Image
    try:
        image = Image.open(io.BytesIO(record))
    except Image.UnidentifiedImageError:  # its text names the BytesIO: said plainly
        raise Image.UnidentifiedImageError("PIL cannot identify it either") from None
    with image:
        return numpy.asarray(image.convert("RGB"))


def _make(p):
    """The stoker transform for the steps read."""
    if not p.tensor:
        raise _Off("no ToTensor or PILToTensor: the samples stay PIL images")
    layout = "float32" if p.tensor == "float" else "uint8_chw"
    mean, std = p.normalize if p.normalize is not None else ((0.0,) * 3, (1.0,) * 3)
    common = {"layout": layout, "mean": mean, "std": std, "interpolation": p.interpolation,
              "max_pixels": _pil_pixel_limit(), "decode_other": _pil_rgb}
    try:
        if p.crop is not None:
            size, scale, ratio = p.crop
            return transforms.Image("train", size, scale=scale, ratio=ratio, flip=p.flip,
                                    flip_before_crop=p.flip_first, **common)
        if p.flip:
            raise _Off("RandomHorizontalFlip without RandomResizedCrop is not native")
        if p.center is None:
            if p.resize is None:
                raise _Off("no RandomResizedCrop, Resize or CenterCrop: images keep their own "
                           "sizes")
            if isinstance(p.resize, int):
                raise _Off(f"Resize({p.resize}) without CenterCrop keeps each image's aspect "
                           "(sizes differ)")
            return transforms.Image("eval", p.resize, resize=p.resize, **common)
        resize = 0 if p.resize is None else p.resize  # 0: CenterCrop alone
        return transforms.Image("eval", p.center, resize=resize, **common)
    except ValueError as e:  # options stoker's transform refuses (a scale past 1, ...)
        raise _Off(f"{' + '.join(p.seen)}: {e}") from None


# -- batches ----------------------------------------------------------------

def read_batch(buffer, plan):
    """[images, labels] as torch tensors over `buffer` (the engine's item, a
    numpy uint8 array; no copy), as default_collate gives them; NO_SAMPLE
    when every sample of the batch failed. An empty batch (the batch
    sampler gave []) is default_collate([]), as the Python path calls it:
    torch's IndexError, raised as a DataError naming the batch."""
    import numpy as np
    import torch
    header = buffer[:_HEADER.words * 8].view(np.int64)
    if int(header[_HEADER.magic]) != _stoker.protocol.NATIVE_MAGIC:
        raise RuntimeError("a native batch without its header: stoker's bug")
    n = int(header[_HEADER.samples])
    if n == 0 and int(header[_HEADER.asked]) == 0:
        try:
            return torch.utils.data.default_collate([])
        except Exception as e:  # noqa: BLE001 -- the batch's error, as the Python path's
            reason, _, e = _workers._collate_failure(e)
            raise _errors.batch_error(
                f"batch {int(header[_HEADER.batch])} of epoch {int(header[_HEADER.epoch])}: "
                f"{reason}", type(e), e, "")
    if n == 0:
        return NO_SAMPLE
    labels_at, images_at = int(header[_HEADER.labels_offset]), int(header[_HEADER.images_offset])
    shape, dtype = plan.transform.shape, np.dtype(plan.transform.dtype)
    count = n * int(np.prod(shape))
    images = buffer[images_at:images_at + count * dtype.itemsize].view(dtype)
    labels = buffer[labels_at:labels_at + n * 8].view(np.int64)
    return [torch.from_numpy(images.reshape((n,) + tuple(shape))), torch.from_numpy(labels)]
