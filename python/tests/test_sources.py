"""File lists and tar shards, configured from Python."""

import io
import os
import shutil
import tarfile

import torch
import torchvision

import stoker


def _write_shards(tree, folder, shards):
    reference = torchvision.datasets.ImageFolder(tree)
    os.makedirs(folder)
    per_shard = -(-len(reference.samples) // shards)
    for s in range(shards):
        with tarfile.open(os.path.join(folder, f"shard-{s:03d}.tar"), "w") as tar:
            for i, (path, label) in enumerate(reference.samples[s * per_shard:(s + 1) * per_shard]):
                key = f"sample{s:03d}_{i:04d}"
                ext = os.path.splitext(path)[1]
                tar.add(path, arcname=key + ext)
                data = str(label).encode()
                info = tarfile.TarInfo(key + ".cls")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return reference


def test_tar_shards_with_brace_pattern(image_tree, tmp_path):
    folder = str(tmp_path / "shards")
    reference = _write_shards(image_tree, folder, 3)
    pattern = os.path.join(folder, "shard-{000..002}.tar")
    assert len(stoker.expand_braces(pattern)) == 3
    source = stoker.TarShards(pattern)
    assert len(source) == len(reference.samples)
    assert source.key(0).startswith(os.path.join(folder, "shard-000.tar:"))
    loader = stoker.Loader(source, batch_size=6, shuffle=False, transforms=stoker.transforms.eval(16))
    labels = torch.cat([y for _, y in loader])
    assert labels.tolist() == reference.targets
    # The same pixels as from the image folder.
    folder_images = torch.cat([x for x, _ in stoker.Loader(
        image_tree, batch_size=6, shuffle=False, transforms=stoker.transforms.eval(16))])
    by_path = stoker.Loader(pattern, batch_size=6, shuffle=False,
                            transforms=stoker.transforms.eval(16))
    assert isinstance(by_path.source, stoker.TarShards) and by_path.source.shards == [pattern]
    tar_images = torch.cat([x for x, _ in by_path])
    assert torch.equal(folder_images, tar_images)


def test_file_list(image_tree, tmp_path):
    reference = torchvision.datasets.ImageFolder(image_tree)
    list_path = tmp_path / "train.txt"
    lines = [f"{os.path.relpath(p, tmp_path)}\t{label}" for p, label in reference.samples[::2]]
    list_path.write_text("\n".join(lines) + "\n")
    source = stoker.FileList(str(list_path))
    assert len(source) == len(lines)
    loader = stoker.Loader(str(list_path), batch_size=4, shuffle=False,
                           transforms=stoker.transforms.eval(16))
    assert isinstance(loader.source, stoker.FileList)
    assert torch.cat([y for _, y in loader]).tolist() == reference.targets[::2]


def test_make_dataset_folder_and_shards_agree(tmp_path):
    out = str(tmp_path / "data")
    report = stoker.make_dataset(out, images=6, classes=2, seed=1, shards=2)
    assert report["images"] == 6 and report["classes"] == ["n000", "n001"]
    assert len(report["shards"]) == 2
    reference = torchvision.datasets.ImageFolder(out)
    eval16 = stoker.transforms.eval(16)
    folder = list(stoker.Loader(out, batch_size=6, shuffle=False, transforms=eval16))
    shards = list(stoker.Loader(stoker.TarShards(report["shards"]), batch_size=6, shuffle=False,
                                transforms=eval16))
    assert folder[0][1].tolist() == reference.targets
    assert sorted(shards[0][1].tolist()) == sorted(reference.targets)


def test_a_source_opened_by_a_relative_path_pickles_as_the_same_files(image_tree, tmp_path,
                                                                     monkeypatch):
    # A cluster's worker opened the path as typed, in its own working folder:
    # another tree there, with the same names, gave other pixels, no error.
    import pickle
    here, there = tmp_path / "here", tmp_path / "there"
    shutil.copytree(image_tree, here / "data")
    shutil.copytree(image_tree, there / "data")
    for path in (there / "data").rglob("*.*"):
        path.write_bytes(b"other bytes")
    (here / "all.txt").write_text("data/" + os.path.relpath(stoker.ImageFolder(image_tree).key(0),
                                                            image_tree) + "\t0\n")
    _write_shards(str(here / "data"), str(here / "shards"), 1)
    monkeypatch.chdir(here)
    sources = [stoker.ImageFolder("data"), stoker.FileList("all.txt"),
               stoker.TarShards("shards/shard-{000..000}.tar"), stoker.Loader("data").source]
    pickled = [pickle.dumps(source) for source in sources]
    monkeypatch.chdir(there)
    for source, data in zip(sources, pickled):
        again = pickle.loads(data)
        assert [again.read(i) for i in range(len(again))] == \
            [source.read(i) for i in range(len(source))], source


def test_sources_and_transforms_pickle_as_what_made_them(image_tree, tmp_path):
    # A cluster's worker (stoker.Loader(cluster=...)) gets them pickled: it
    # opens the same samples and builds the same transform.
    import pickle
    shards = str(tmp_path / "shards")
    _write_shards(image_tree, shards, 2)
    list_path = tmp_path / "all.txt"
    list_path.write_text("".join(f"{p}\t{y}\n" for p, y in
                                 torchvision.datasets.ImageFolder(image_tree).samples))
    sources = [stoker.ImageFolder(image_tree), stoker.FileList(str(list_path)),
               stoker.TarShards(os.path.join(shards, "shard-{000..001}.tar")),
               stoker.Synthetic(12, shape=(3, 4, 4), seed=9, num_classes=3),
               stoker.Loader(image_tree).source]  # opened by its path
    for source in sources:
        again = pickle.loads(pickle.dumps(source))
        assert type(again) is type(source) and len(again) == len(source)
        assert [again.key(i) for i in range(len(again))] == \
            [source.key(i) for i in range(len(source))]
        assert again.read(len(source) - 1) == source.read(len(source) - 1)
    for transform in (stoker.transforms.train(32, layout="uint8_hwc", flip=0.0),
                      stoker.transforms.eval(24), stoker.transforms.Raw((3, 4, 4), mix_rng=True)):
        again = pickle.loads(pickle.dumps(transform))
        assert repr(again) == repr(transform) and again.shape == transform.shape
