"""stoker.TarStream: stoker's tar shards read shard by shard, each opened by
itself, with TarShards' samples, keys and labels; under stoker's DataLoader
and torch's, every sample once."""

import hashlib
import io
import os
import pickle
import shutil

import pytest

torch = pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")
import stoker  # noqa: E402
from draining import drain  # noqa: E402


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """The built-in data set's 300 images as 4 tar shards: their brace pattern."""
    out = str(tmp_path_factory.mktemp("data") / "data")
    report = stoker.make_dataset(out, images=300, classes=10, seed=3, shards=4)
    paths = report["shards"]
    folder = os.path.dirname(paths[0])
    assert paths == [os.path.join(folder, f"shard-{i:03d}.tar") for i in range(4)]
    return paths


def digest(image):
    """A sample's identity: its bytes' hash as an int64."""
    return int.from_bytes(hashlib.sha1(image).digest()[:7], "little")


def decode(image, label):
    """What a training transform does (decode, resize to a common shape),
    plus the bytes' identity to check each sample arrives once."""
    pixels = Image.open(io.BytesIO(image)).convert("RGB").resize((16, 16))
    return (torch.frombuffer(bytearray(pixels.tobytes()), dtype=torch.uint8).view(16, 16, 3),
            label, digest(image))


def expected(paths):
    """TarShards' samples: (key, bytes, label) in order, per shard."""
    source = stoker.TarShards(paths)
    per_shard = {p: [] for p in paths}
    for i in range(len(source)):
        key = source.key(i)
        image, label = source.read(i)
        per_shard[key.rsplit(":", 1)[0]].append((key, image, label))
    return per_shard


def test_each_shard_streams_tarshards_samples_in_order(shards):
    want = expected(shards)
    stream = stoker.TarStream(shards)
    assert stream.shards() == shards
    for path in shards:
        got = list(stream.records(path))
        assert got == want[path]
        assert list(stream.iter_shard(path)) == [(image, label) for _, image, label in got]
    assert sum(len(v) for v in want.values()) == 300


def test_a_shard_opened_at_an_offset_transforms_only_from_there(shards):
    seen = []
    stream = stoker.TarStream(shards, transform=lambda image, label: seen.append(label) or label)
    whole = list(stream.iter_shard(shards[0]))
    seen.clear()
    assert list(stream.iter_shard(shards[0], start=37)) == whole[37:]
    assert seen == whole[37:]  # the first 37 were read, not transformed
    assert list(stream.iter_shard(shards[0], start=len(whole) + 5)) == []


def test_pattern_and_tarshards_stream_agree(shards):
    pattern = os.path.join(os.path.dirname(shards[0]), "shard-{000..003}.tar")
    stream = stoker.TarStream(pattern)
    assert stream.shards() == shards
    from_source = stoker.TarShards(pattern).stream(decode)
    assert isinstance(from_source, stoker.TarStream)
    assert from_source.patterns == [pattern] and from_source.transform is decode
    assert isinstance(stream, torch.utils.data.IterableDataset)
    assert isinstance(stream, stoker.ShardedIterable)


def test_construction_opens_nothing_and_pickles_as_its_patterns(tmp_path, shards):
    later = str(tmp_path / "later-{0..1}.tar")
    stream = stoker.TarStream(later, transform=decode)  # neither shard exists
    assert stream.shards() == [str(tmp_path / "later-0.tar"), str(tmp_path / "later-1.tar")]
    it = stream.iter_shard(stream.shards()[1])
    with pytest.raises(FileNotFoundError, match="later-1.tar"):
        next(it)
    many = stoker.TarStream(str(tmp_path / "s-{000000..099999}.tar"))
    assert len(many.shards()) == 100000
    blob = pickle.dumps(many)
    assert len(blob) < 1000, "the pattern travels, not its 100000 names"
    again = pickle.loads(blob)
    assert again.shards() == many.shards()
    again = pickle.loads(pickle.dumps(stoker.TarStream(shards, transform=decode)))
    assert again.transform is decode and again.shards() == shards
    with pytest.raises(ValueError, match="no tar shards"):
        stoker.TarStream([])
    # A shard named twice would be read twice: refused, as TarShards refuses it.
    for named in ([shards[1], shards[0], shards[1]],
                  os.path.join(os.path.dirname(shards[0]), "shard-{000,001,000}.tar")):
        for make in (stoker.TarStream, stoker.TarShards):
            with pytest.raises(ValueError, match="shard-00[01].tar is named twice"):
                make(named)


def test_truncated_shard_is_an_error_naming_it(tmp_path, shards):
    cut = str(tmp_path / "cut.tar")
    shutil.copy(shards[0], cut)
    size = os.path.getsize(cut)
    with open(cut, "r+b") as f:
        f.truncate(size // 2 + 100)
    stream = stoker.TarStream(cut)
    got = []
    with pytest.raises(stoker.DataError, match="cut.tar.*truncated") as e:
        for sample in stream.iter_shard(cut):
            got.append(sample)
    assert "cut.tar" in str(e.value)
    assert 0 < len(got) < len(expected(shards[:1])[shards[0]]), "the samples before the cut came"


def every(shards):
    return sorted((digest(image), label)
                  for samples in expected(shards).values() for _, image, label in samples)


def delivered(loader):
    got = []
    for pixels, labels, digests in loader:
        assert pixels.dtype == torch.uint8 and pixels.shape[1:] == (16, 16, 3)
        got += zip(digests.tolist(), labels.tolist())
    return sorted(got)


def test_stoker_dataloader_delivers_every_sample_once(shards):
    stream = stoker.TarStream(shards, transform=decode)
    loader = stoker.DataLoader(stream, batch_size=16, num_workers=2)
    assert delivered(loader) == every(shards)


def test_torch_dataloader_delivers_every_sample_once(shards):
    stream = stoker.TarStream(shards, transform=decode)
    loader = torch.utils.data.DataLoader(stream, batch_size=16, num_workers=2)
    assert delivered(loader) == every(shards)


def _shard_with_bad_samples(path, n=12, bad=(2, 7)):
    """A shard of `n` samples whose label is their number; those in `bad`
    have a .cls and no image stoker decodes (a .webp)."""
    import tarfile
    with tarfile.open(path, "w") as t:
        for i in range(n):
            for name, data in ((f"s{i:02d}." + ("webp" if i in bad else "jpg"), b"pixels"),
                               (f"s{i:02d}.cls", str(i).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return [i for i in range(n) if i not in bad]


@pytest.mark.parametrize("workers,kind", [(0, "processes"), (2, "processes"), (2, "threads")])
def test_a_bad_sample_fails_alone_and_the_shard_goes_on(tmp_path, workers, kind):
    # As TarShards fails that one sample: before, the shard ended at it, and
    # the samples after it were lost (one shard failure under "skip").
    paths = [tmp_path / "a.tar", tmp_path / "b.tar"]
    good = sorted(_shard_with_bad_samples(paths[0]) + _shard_with_bad_samples(paths[1]))
    stream = stoker.TarStream([str(p) for p in paths], transform=lambda image, label: label)
    with stoker.DataLoader(stream, batch_size=4, num_workers=workers, worker_kind=kind,
                           on_error="skip") as dl:
        assert sorted(v for b in dl for v in b.tolist()) == good
        skipped = dl.skipped()
    assert sorted((r["key"], r["reason"].split("DataError: ")[1].split(":")[1]) for r in skipped) \
        == [(str(p), f"s{i:02d}.webp") for p in paths for i in (2, 7)]
    with stoker.DataLoader(stream, batch_size=4, num_workers=workers, worker_kind=kind) as dl:
        got, errors = drain(dl)
    assert sorted(got) == good
    assert sum(e.count(": a sample after ") for e in errors) == 4, errors
    # Under torch's DataLoader, iter_shard raises at the bad sample, as a stream does there.
    with pytest.raises(stoker.DataError, match="s02.webp"):
        list(stream.iter_shard(str(paths[0])))


def _refusing(image, label):
    """A transform that raises on some samples, as PIL does on a corrupt JPEG."""
    if label % 5 == 3:
        raise OSError(f"image file is truncated (label {label})")
    return label


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sample_its_transform_refuses_fails_alone_and_the_shard_goes_on(tmp_path, workers):
    # Before, the transform's error ended the shard: 8 of 38 good samples came.
    paths = [tmp_path / "a.tar", tmp_path / "b.tar"]
    for p in paths:
        _shard_with_bad_samples(p, bad=())
    stream = stoker.TarStream([str(p) for p in paths], transform=_refusing)
    good = sorted(i for _ in paths for i in range(12) if i % 5 != 3)
    with stoker.DataLoader(stream, batch_size=4, num_workers=workers, on_error="skip") as dl:
        assert sorted(v for b in dl for v in b.tolist()) == good
        assert len(dl.skipped()) == 4


class _EvenLabels(stoker.TarStream):
    """A subclass that filters and decodes in its own iter_shard."""

    def iter_shard(self, shard, start=0):
        for _, label in super().iter_shard(shard, start):
            if label % 2 == 0:
                yield label


@pytest.mark.parametrize("workers", [0, 2])
def test_a_subclass_is_read_through_its_own_iter_shard_as_torch_reads_it(shards, workers):
    stream = _EvenLabels(shards)
    want = sorted(v for b in torch.utils.data.DataLoader(stream, batch_size=4) for v in b.tolist())
    assert want and all(v % 2 == 0 for v in want)
    with stoker.DataLoader(stream, batch_size=4, num_workers=workers) as dl:
        assert sorted(v for b in dl for v in b.tolist()) == want


@pytest.mark.parametrize("form", ["gnu", "posix"])
def test_a_link_or_a_sparse_member_is_named_not_read_as_a_missing_image(tmp_path, form):
    # GNU tar writes a file's second hard link as a link member (no option
    # needed) and, with -S, a file with holes as a sparse one; stoker reads
    # regular members only. Each such sample fails naming its member (it
    # said "a label but no image", or read the pax stand-in's sparse map).
    tar = shutil.which("tar")
    if tar is None:
        pytest.skip("no tar program")
    import subprocess
    src = tmp_path / "src"
    src.mkdir()
    Image.new("RGB", (4, 4)).save(src / "a.jpg")
    with open(src / "s.jpg", "wb") as f:  # a hole of a MiB
        f.write((src / "a.jpg").read_bytes())
        f.seek(1 << 20)
        f.write(b"x" * 4096)
    os.link(src / "a.jpg", src / "h.jpg")
    for key, label in (("a", 1), ("s", 2), ("h", 3)):
        (src / f"{key}.cls").write_text(str(label))
    shard = str(tmp_path / "links.tar")
    subprocess.run([tar, f"--format={form}", "-S", "-cf", shard, "-C", str(src), "a.jpg", "a.cls",
                    "s.jpg", "s.cls", "h.jpg", "h.cls"], check=True)
    source = stoker.TarShards(shard)
    assert len(source) == 3
    assert source.read(0)[1] == 1
    for i, name in ((1, "s.jpg"), (2, "h.jpg")):
        with pytest.raises(stoker.DataError) as e:
            source.read(i)
        assert f"links.tar:{name}: the member is a link or a GNU sparse file" in str(e.value)


def test_a_shard_named_by_two_paths_is_refused(tmp_path, shards):
    # A relative and an absolute path, or a symlinked folder: one file, whose
    # samples came twice.
    link = tmp_path / "link"
    link.symlink_to(os.path.dirname(shards[0]))
    relative = os.path.relpath(shards[0])
    for other in (relative, str(link / os.path.basename(shards[0]))):
        with pytest.raises(ValueError, match="is named twice"):
            stoker.TarShards([shards[0], other])
        with pytest.raises(ValueError, match="is named twice"):
            stoker.TarStream([shards[0], other]).shards()
