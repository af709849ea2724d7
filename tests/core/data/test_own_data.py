"""A user's own images (issue 39 items 1, 4, 5, 6): a folder or a CSV of real PNGs written
here from PneumoniaMNIST (../shared/data), the real unlabeled pool, the refusals before any
run, and dataset plugins found through entry-point metadata."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from scarcelab.data import load_raw
from scarcelab.data.own import DataOptions, parse_ref
from scarcelab.data.splits import apply_split, make_split
from scarcelab.errors import ConfigError, DataError

REPO = Path(__file__).resolve().parents[3]
CLASSES = ("normal", "pneumonia")


def _pneumonia(medmnist_dir: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Real 28-px chest X-rays in a seeded order (the file is sorted by class)."""
    d = np.load(medmnist_dir / "pneumoniamnist.npz")
    p = np.random.default_rng(0).permutation(len(d["train_labels"]))
    return (d["train_images"][p], d["train_labels"].reshape(-1)[p], d["test_images"],
            d["test_labels"].reshape(-1))


def make_folder(root: Path, medmnist_dir: Path, n_lab: int = 60, n_unl: int = 90,
                n_test: int = 20, unlabeled: bool = True) -> dict[str, list[Path]]:
    """labeled/<class>/, unlabeled/batch<k>/ (nested), test/<class>/, plus a hidden file and
    a README (ignored). The unlabeled images are train images after the labeled ones."""
    x, y, tx, ty = _pneumonia(medmnist_dir)
    out: dict[str, list[Path]] = {"labeled": [], "unlabeled": [], "test": []}
    for i in range(n_lab):
        p = root / "labeled" / CLASSES[y[i]] / f"img{i:04d}.png"
        p.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(x[i]).save(p)
        out["labeled"].append(p)
    for j in range(n_unl if unlabeled else 0):
        i = n_lab + j
        p = root / "unlabeled" / f"batch{j % 3}" / f"u{i:04d}.png"
        p.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(x[i]).save(p)
        out["unlabeled"].append(p)
    for k in range(n_test):
        p = root / "test" / CLASSES[ty[k]] / f"t{k:04d}.png"
        p.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(tx[k]).save(p)
        out["test"].append(p)
    (root / "README.txt").write_text("not an image")
    (root / "labeled" / CLASSES[0] / ".DS_Store").write_bytes(b"\0")
    return out


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _rows(x: np.ndarray) -> set[bytes]:
    return {np.ascontiguousarray(r).tobytes() for r in x}


def _pixels(paths: list[Path]) -> set[bytes]:
    return {np.asarray(Image.open(p))[None].tobytes() for p in paths}


@pytest.fixture
def folder(tmp_path: Path, medmnist_dir: Path, monkeypatch: pytest.MonkeyPatch
           ) -> tuple[Path, dict[str, list[Path]]]:
    monkeypatch.setenv("SCARCELAB_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "chest"
    return root, make_folder(root, medmnist_dir)


# -- the pool is exactly the given files ----------------------------------------------------


def test_unlabeled_pool_is_exactly_the_given_files(folder) -> None:  # type: ignore[no-untyped-def]
    root, files = folder
    raw = load_raw(f"folder:{root}")
    assert raw.unlabeled_x is not None and len(raw.unlabeled_x) == len(files["unlabeled"])
    # the same images, pixel for pixel, and none of the labeled ones
    assert _rows(raw.unlabeled_x) == _pixels(files["unlabeled"])
    assert not _rows(raw.unlabeled_x) & _pixels(files["labeled"])
    assert len(raw.train_y) == len(files["labeled"]) and raw.test_from == "folder"
    assert _rows(raw.test_x) == _pixels(files["test"])
    assert raw.class_names == list(CLASSES)
    split = make_split(raw, 20, 10, seed=3)  # 30 labeled images left over: unused
    b = apply_split(raw, split)
    assert split["unlabeled"] == "given" and split["n_unlabeled"] == len(files["unlabeled"])
    # the pool digest, computed here from the files: sha256 over their sha256s in pool order
    order = sorted(files["unlabeled"], key=lambda p: p.relative_to(root / "unlabeled").as_posix())
    want = hashlib.sha256("".join(f"{_sha(p)}\n" for p in order).encode()).hexdigest()
    assert split["unlabeled_sha256"] == want
    assert np.array_equal(b.unlabeled_x, raw.unlabeled_x) and b.unlabeled_y is None
    # the transform the logged model replays: channels resolved, size as given
    assert b.meta["transform"]["channels"] == "gray" == raw.transform["channels"]
    assert b.meta["transform"]["image_size"] == "native"
    # labeled and validation come from the labeled images; leftovers stay unused, never pooled
    assert not _rows(b.labeled_x) & _rows(b.unlabeled_x)
    assert not _rows(b.val_x) & _rows(b.unlabeled_x)
    assert len(split["unused"]) == 30 and len(b.unlabeled_x) == len(files["unlabeled"])
    assert len(split["labeled"]) + len(split["val"]) + len(split["unused"]) == len(raw.train_y)
    # default budget: every labeled image, a fifth of them for validation
    default = make_split(raw, seed=3)
    assert (default["n_labeled"], default["n_val"], default["unused"]) == (48, 12, [])


def test_pool_leaves_out_copies_of_labeled_images(folder) -> None:  # type: ignore[no-untyped-def]
    root, files = folder
    dup = root / "unlabeled" / "copy_of_labeled.png"
    dup.write_bytes(files["labeled"][0].read_bytes())
    raw = load_raw(f"folder:{root}")
    assert len(raw.unlabeled_x) == len(files["unlabeled"])  # the copy is not unlabeled
    from scarcelab.data import provenance

    d = provenance.described()
    assert d["params"]["data.n_pool_duplicates"] == 1
    roles = {f["path"]: f["role"] for f in d["manifest"]["files"]}
    assert roles["unlabeled/copy_of_labeled.png"] == "pool-duplicate"


def test_each_file_is_read_once_for_its_digest(folder, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A first load reads every file twice: once to hash it and read its header, once to
    decode it; a later load (stat index and decode cache warm) reads none. own.load used to
    hash every file a second time for the manifest (a third read on a first load, one on
    every later load of a fresh process)."""
    import builtins
    import collections
    import io
    import time

    from scarcelab.data import own, provenance

    root, files = folder
    paths = [p for part in files.values() for p in part]
    t = time.time() - 60  # an old folder: the stat index trusts it (not racily changed)
    for p in paths:
        os.utime(p, (t, t))
    opened: collections.Counter[str] = collections.Counter()
    real_open = builtins.open

    def counting(file, *a, **k):  # type: ignore[no-untyped-def]
        if isinstance(file, str | os.PathLike) and str(file).endswith(".png"):
            opened[os.path.realpath(file)] += 1
        return real_open(file, *a, **k)

    monkeypatch.setattr(builtins, "open", counting)
    monkeypatch.setattr(io, "open", counting)  # Path.open's
    monkeypatch.setattr(provenance, "_HASHES", {})  # a fresh process: no digest in memory
    ref = parse_ref(f"folder:{root}")
    own.load(ref, progress=False)
    assert len(opened) == len(paths)
    assert set(opened.values()) == {2}, collections.Counter(opened.values())
    manifest = provenance.described()["manifest"]
    assert {f["path"]: f["sha256"] for f in manifest["files"]} == {
        p.relative_to(root).as_posix(): _sha(p) for p in paths}
    opened.clear()
    provenance._HASHES.clear()  # another fresh process
    own.load(ref, progress=False)
    assert not opened, f"{sum(opened.values())} reads on a warm load"


def test_split_hash_follows_the_pool_and_the_files(folder) -> None:  # type: ignore[no-untyped-def]
    root, files = folder
    h0 = make_split(load_raw(f"folder:{root}"), seed=0)["hash"]
    assert make_split(load_raw(f"folder:{root}"), seed=0)["hash"] == h0  # deterministic
    files["unlabeled"][0].unlink()  # the pool changes: so does the split's hash
    raw = load_raw(f"folder:{root}")
    s1 = make_split(raw, seed=0)
    assert s1["hash"] != h0 and s1["n_unlabeled"] == len(files["unlabeled"]) - 1
    old = dict(s1, unlabeled_sha256="0" * 64)
    with pytest.raises(DataError, match="unlabeled images .* changed"):
        apply_split(raw, old)
    # a labeled file's content changes (same name, same count): the hash changes too
    Image.fromarray(255 - np.asarray(Image.open(files["labeled"][1]))).save(files["labeled"][1])
    assert make_split(load_raw(f"folder:{root}"), seed=0)["hash"] != s1["hash"]


def test_public_splits_keep_their_json_and_hash(medmnist_dir) -> None:  # type: ignore[no-untyped-def]
    """No given pool: the split has no new key, the pool is train minus labeled minus val."""
    raw = load_raw("breastmnist", medmnist_dir)
    assert raw.unlabeled_x is None and raw.test_from == "official"
    s = make_split(raw, 100, 100, seed=0)
    assert set(s) == {"dataset", "seed", "n_labeled", "n_val", "val_from", "labeled", "val",
                      "unlabeled", "test", "hash"}
    assert "transform" not in apply_split(raw, s).meta and raw.transform is None
    assert len(s["unlabeled"]) == 546 - 200 and s["test"] == "official"


# -- the CSV layout -------------------------------------------------------------------------


def _csv(root: Path, files: dict[str, list[Path]], name: str = "labels.csv",
         extra: str = "") -> Path:
    def rel(p: Path) -> str:
        return p.relative_to(root).as_posix()

    rows = ["path,label,split"]  # in the folder scan's order: by class, then path
    for p in sorted(files["labeled"], key=rel):
        rows.append(f"{rel(p)},{p.parent.name},")
    for p in sorted(files["unlabeled"], key=rel):
        rows.append(f"{rel(p)},,train")
    for p in sorted(files["test"], key=rel):
        rows.append(f"{rel(p)},{p.parent.name},test")
    path = root / name
    path.write_text("\n".join(rows) + "\n" + extra)
    return path


def test_csv_gives_the_folder_s_dataset(folder) -> None:  # type: ignore[no-untyped-def]
    root, files = folder
    a = load_raw(f"folder:{root}")
    b = load_raw(f"csv:{_csv(root, files)}")
    assert a.class_names == b.class_names and b.test_from == "folder"
    for part in ("train_x", "train_y", "test_x", "test_y", "unlabeled_x"):
        assert np.array_equal(getattr(a, part), getattr(b, part)), part
    assert a.digests == b.digests  # the same files in the same order and classes


@pytest.mark.parametrize(("text", "message"), [
    ("path,lable\n{L},x\n", r"lacks column\(s\) label \(did you mean lable -> label\?\)"),
    ("path,label,spilt\n", "column 'spilt' is not 'split'"),
    ("path,label,split\n{L},x,valid\n", "line 2: split 'valid' is not one of train, val, test"),
    ("path,label\n{L},x\nno/such.png,x\n",
     r"line 3: file 'no/such.png' not found \(looked for .*no/such.png\)"),
    ("path,label\n{L},x\n{L},x\n", "line 3: '{L}' is listed twice \\(first on line 2\\)"),
    ("path,label,split\n{L},x,\n{T},,test\n",
     "line 3: an unlabeled row .* cannot be in split 'test'"),
    ("path,label,split\n{L},x,\n{T},covid,test\n",
     "line 3: label 'covid' appears only in test rows"),
    ("", "is empty"),
])
def test_csv_errors_name_the_line_and_the_fix(folder, text, message) -> None:  # type: ignore[no-untyped-def]
    root, files = folder
    names = {"{L}": files["labeled"][0].relative_to(root).as_posix(),
             "{T}": files["test"][0].relative_to(root).as_posix()}
    for k, v in names.items():
        text, message = text.replace(k, v), message.replace(k, v)
    (root / "bad.csv").write_text(text)
    with pytest.raises(DataError, match=message):
        load_raw(f"csv:{root / 'bad.csv'}")


@pytest.mark.parametrize(("change", "message"), [
    (lambda r: (r / "labeled").rename(r / "train"), "has no labeled/ folder .*found train/"),
    (lambda r: (r / "labeled").rename(r / "labelled"),
     "has no labeled/ folder \\(found labelled/: rename it to labeled/\\)"),
    (lambda r: next((r / "labeled" / "normal").glob("*.png")).rename(r / "labeled" / "x.png"),
     r"labeled/ holds images directly \(e.g. x.png\)"),
    (lambda r: (r / "test" / "normal").rename(r / "test" / "covid"),
     "class 'covid' has no labeled images"),
    (lambda r: (r / "extra").mkdir(), "unknown folder extra/"),
])
def test_folder_errors_name_the_folder_and_the_fix(folder, change, message) -> None:  # type: ignore[no-untyped-def]
    root, _ = folder
    change(root)
    with pytest.raises(DataError, match=message):
        load_raw(f"folder:{root}")


def test_hidden_and_non_image_files_are_ignored_and_counted(folder) -> None:  # type: ignore[no-untyped-def]
    root, files = folder
    load_raw(f"folder:{root}")
    from scarcelab.data import provenance

    d = provenance.described()
    assert d["params"]["data.n_ignored_files"] == 2  # README.txt and .DS_Store
    assert d["params"]["data.n_files"] == sum(len(v) for v in files.values())
    rel = {f["path"] for f in d["manifest"]["files"]}
    assert rel == {p.relative_to(root).as_posix() for v in files.values() for p in v}
    sha = {f["path"]: f["sha256"] for f in d["manifest"]["files"]}
    assert all(sha[p.relative_to(root).as_posix()] == _sha(p) for p in files["unlabeled"])


# -- test hold-out and folds ----------------------------------------------------------------


def test_holdout_is_stratified_fixed_and_disjoint(folder) -> None:  # type: ignore[no-untyped-def]
    root, files = folder
    import shutil

    shutil.rmtree(root / "test")
    raw = load_raw(f"folder:{root}", options=DataOptions(test_fraction=0.25))
    assert raw.test_from == "holdout" and len(raw.test_y) == 15 and len(raw.train_y) == 45
    counts = np.bincount(raw.test_y, minlength=2) / 15
    whole = np.bincount(np.concatenate([raw.train_y, raw.test_y])) / 60
    assert np.all(np.abs(counts - whole) <= 1 / 15 + 1e-9)  # class shares kept
    assert not _rows(raw.test_x) & _rows(raw.train_x)
    # the same test images for every study seed: seeds draw labeled/validation only
    s0, s1 = make_split(raw, seed=0), make_split(raw, seed=1)
    assert s0["test_sha256"] == s1["test_sha256"] and s0["labeled"] != s1["labeled"]
    assert s0["test"] == "holdout" and s0["n_test"] == 15


def test_folds_partition_the_labeled_images(folder) -> None:  # type: ignore[no-untyped-def]
    root, _ = folder
    import shutil

    shutil.rmtree(root / "test")
    tests, budgets = [], set()
    for i in range(3):
        raw = load_raw(f"folder:{root}", options=DataOptions(folds=3, fold=i))
        assert raw.test_from == f"fold {i + 1}/3"
        tests.append(_rows(raw.test_x))
        assert len(raw.test_y) == 20 and not tests[-1] & _rows(raw.train_x)
        s = make_split(raw, seed=0)
        budgets.add((s["n_labeled"], s["n_val"]))
    assert not (tests[0] & tests[1] or tests[0] & tests[2] or tests[1] & tests[2])
    assert len(tests[0] | tests[1] | tests[2]) == 60
    assert len(budgets) == 1  # every fold draws the same label budget
    for c in CLASSES:  # a test/ set of its own: folds are not drawn
        (root / "test" / c).mkdir(parents=True)
        (root / "test" / c / "t.png").write_bytes(next(
            p for p in (root / "labeled" / c).iterdir() if p.suffix == ".png").read_bytes())
    with pytest.raises(ConfigError, match="--folds 3: .* has its own test set \\(2 images"):
        load_raw(f"folder:{root}", options=DataOptions(folds=3))


# -- refusals before any work ---------------------------------------------------------------


def test_too_few_images_per_class_is_refused_at_load(folder) -> None:  # type: ignore[no-untyped-def]
    root, files = folder
    for p in files["labeled"]:
        if p.parent.name == "normal":
            p.unlink()
    (root / "labeled" / "normal" / "only.png").write_bytes(files["unlabeled"][0].read_bytes())
    with pytest.raises(DataError, match="class 'normal' of .* has 1 labeled image; a class "
                       "needs at least 2 .*add labeled images of 'normal'"):
        load_raw(f"folder:{root}")


def _no_runs(uri: str) -> int:
    from mlflow.tracking import MlflowClient

    c = MlflowClient(uri)
    return sum(len(c.search_runs([e.experiment_id])) for e in c.search_experiments())


def _invoke(args: list[str]) -> object:
    from scarcelab.entrypoints.cli import main

    return CliRunner().invoke(main, args)


STUDY = ["--max-epochs", "1", "--max-trials", "1", "--max-steps-per-epoch", "2",
         "--device", "cpu", "--budget-minutes", "1"]


def _refused(result: object, message: str) -> None:
    out = result.output  # type: ignore[attr-defined]
    assert result.exit_code == 1, out  # type: ignore[attr-defined]
    last = out.strip().splitlines()[-1]
    assert last.startswith("Error: ") and "Traceback" not in out
    import re

    assert re.search(message, last), last


def test_semi_on_an_empty_pool_is_refused_with_no_run(tmp_path, medmnist_dir, store,  # type: ignore[no-untyped-def]
                                                      monkeypatch) -> None:
    monkeypatch.setenv("SCARCELAB_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "nopool"
    make_folder(root, medmnist_dir, unlabeled=False)
    r = _invoke(["semi", "--method", "fixmatch", "--dataset", f"folder:{root}", *STUDY])
    _refused(r, r"fixmatch \(semi\) learns from unlabeled images, but the unlabeled pool of "
             r"folder:.* is empty; add images to .*nopool/unlabeled/, or run a supervised")
    r = _invoke(["contamination", "--method", "fixmatch", "--dataset", f"folder:{root}",
                 "--ratios", "0,0.3", *STUDY])
    _refused(r, "the unlabeled pool of folder:.* is empty")
    assert _no_runs(store) == 0


def test_own_images_given_as_a_data_root_point_to_the_dataset_syntax(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The issue's new user: ``--data-dir owndata`` (a folder with labeled/) downloaded
    BreastMNIST into it; now it is one line naming ``--dataset folder:...``."""
    (tmp_path / "owndata" / "labeled" / "a").mkdir(parents=True)
    r = _invoke(["semi", "--method", "fixmatch", "--data-dir", str(tmp_path / "owndata"),
                 *STUDY])
    assert r.exit_code == 2, r.output  # type: ignore[attr-defined]
    assert f"use --dataset folder:{tmp_path / 'owndata'}" in r.output  # type: ignore[attr-defined]
    assert "Traceback" not in r.output  # type: ignore[attr-defined]
    (tmp_path / "plain").mkdir()  # a data root without labeled/ is still a data root
    from scarcelab.entrypoints.options import Folder

    assert Folder().parse(str(tmp_path / "plain")) == str((tmp_path / "plain").resolve())


def test_more_labels_than_exist_is_refused_with_no_run(tmp_path, medmnist_dir, store,  # type: ignore[no-untyped-def]
                                                       monkeypatch) -> None:
    """The issue's case: 300 labeled images, --n-labeled 200 --n-val 100, a 20 % hold-out."""
    monkeypatch.setenv("SCARCELAB_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "own"
    make_folder(root, medmnist_dir, n_lab=300, n_unl=30, n_test=0)
    r = _invoke(["semi", "--method", "fixmatch", "--dataset", f"folder:{root}",
                 "--n-labeled", "200", "--n-val", "100", *STUDY])
    _refused(r, r"n_labeled \+ n_val = 300 exceeds the 240 labeled images of folder:.* left "
             r"for training \(60 more are the test hold-out, --test-fraction\); lower "
             r"--n-labeled and --n-val to at most 240 together")
    assert _no_runs(store) == 0


def test_mixed_channels_are_refused_with_no_run(folder, store) -> None:  # type: ignore[no-untyped-def]
    root, files = folder
    rgb = np.stack([np.asarray(Image.open(files["labeled"][0]))] * 3, -1)
    Image.fromarray(rgb).save(files["labeled"][0])
    r = _invoke(["supervised", "--method", "sup", "--dataset", f"folder:{root}", *STUDY])
    _refused(r, r"mix grayscale and colour files: .*\(--channels gray\|rgb\)")
    assert _no_runs(store) == 0
    raw = load_raw(f"folder:{root}", options=DataOptions(channels="gray"))  # forced: fine
    assert raw.channels == 1


def test_one_image_class_is_refused_with_no_run(folder, store) -> None:  # type: ignore[no-untyped-def]
    root, files = folder
    for p in [p for p in files["labeled"] if p.parent.name == "pneumonia"][1:]:
        p.unlink()
    r = _invoke(["supervised", "--method", "sup", "--dataset", f"folder:{root}", *STUDY])
    _refused(r, "class 'pneumonia' of folder:.* has 1 labeled image; a class needs at "
             "least 2 \\(one to train on, one to validate on\\)")
    assert _no_runs(store) == 0


def test_public_semi_with_an_empty_pool_is_refused_with_no_run(medmnist_dir, store) -> None:  # type: ignore[no-untyped-def]
    """BreastMNIST's 546 train images all labeled or validation: refused up front, not 42
    failed trials."""
    r = _invoke(["semi", "--method", "fixmatch", "--dataset", "breastmnist", "--data-dir",
                 str(medmnist_dir), "--n-labeled", "446", "--n-val", "100",
                 "--val-from", "train", *STUDY])
    _refused(r, r"n_labeled=446 \+ n_val=100 take all 546 training images of breastmnist, "
             "leaving the unlabeled pool empty; lower --n-labeled or --n-val")
    assert _no_runs(store) == 0


def test_dataset_options_are_refused_on_public_data_before_torch() -> None:
    code = ("import json, sys\nfrom scarcelab.entrypoints.cli import main\n"
            "try:\n    main(['semi', '--method', 'fixmatch', '--dataset', "
            "'folder:/no/such/folder'])\n"
            "except SystemExit as e:\n"
            "    print(json.dumps({'rc': e.code, 'torch': 'torch' in sys.modules}))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"rc": 2, "torch": False}
    assert "folder:/no/such/folder: no such folder" in out.stderr
    r = _invoke(["semi", "--method", "fixmatch", "--dataset", "breastmnist", "--image-size",
                 "64"])
    assert r.exit_code == 2 and "--image-size apply to your own images" in r.output


def test_dataset_names_of_own_images(tmp_path, folder, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from scarcelab.entrypoints.options import DatasetName

    root, files = folder
    monkeypatch.chdir(root.parent)
    assert DatasetName().parse("folder:chest") == f"folder:{root}"
    assert DatasetName().parse("./chest") == f"folder:{root}"  # a bare path
    csv = _csv(root, files)
    assert DatasetName().parse(str(csv)) == f"csv:{csv}"
    assert DatasetName(al=True).parse("encoded_folder:chest") == f"encoded_folder:{root}"
    with pytest.raises(ValueError, match="chest is a folder here: use folder:chest"):
        DatasetName().parse("chest")
    assert parse_ref("encoded_folder:/x") is None and parse_ref("pathmnist") is None
    assert parse_ref(f"folder:{root}").slug == "folder-chest"


# -- a real study through the CLI -----------------------------------------------------------


def test_study_on_the_folder_logs_the_real_pool(folder, store) -> None:  # type: ignore[no-untyped-def]
    import mlflow

    root, files = folder
    r = _invoke(["semi", "--method", "fixmatch", "--dataset", f"folder:{root}",
                 "--experiment", "own", *STUDY])
    assert r.exit_code == 0, r.output
    runs = mlflow.search_runs(experiment_names=["own"])
    study = runs[runs["tags.scarcelab.role"] == "study"].iloc[0]
    split = mlflow.artifacts.load_dict(f"runs:/{study.run_id}/split.json")
    assert split["unlabeled"] == "given" and split["n_unlabeled"] == len(files["unlabeled"])
    assert split["hash"] == study["tags.scarcelab.split_hash"]
    assert study["tags.scarcelab.test_from"] == "folder"
    assert study["params.n_unlabeled"] == str(len(files["unlabeled"]))
    assert study["params.data.n_bad_files"] == "0" and study["params.transform.fit"] == "crop"
    assert len(study["params.data.cache_key"]) == 64
    manifest = mlflow.artifacts.load_dict(f"runs:/{study.run_id}/data_manifest.json")
    assert len(manifest["files"]) == sum(len(v) for v in files.values())
    assert study["tags.scarcelab.dataset"] == f"folder:{root}"
    assert study["tags.mlflow.runName"] == "fixmatch-folder-chest-s0"


def test_al_says_the_given_pool_is_not_queried_and_why(folder, store) -> None:  # type: ignore[no-untyped-def]
    """AL on a folder with unlabeled/ queries the labeled training images (the simulated
    annotator reveals labels the data has; the given images have none). That is said, not
    done silently: one line on stderr, the sweep's tag scarcelab.unlabeled_pool and its
    description; an encoded_ set says its encoder trains on the pool."""
    import mlflow

    root, files = folder
    n_pool, n_lab = len(files["unlabeled"]), len(files["labeled"])
    r = _invoke(["al", "--strategy", "random", "--dataset", f"folder:{root}", "--budget", "2",
                 "--query-size", "1", "--repetitions", "1", "--set", "arch=small_cnn",
                 "--device", "cpu", "--experiment", "al-own"])
    assert r.exit_code == 0, r.output
    said = [ln for ln in r.output.splitlines() if "given unlabeled images" in ln]
    assert len(said) == 1, r.output
    line = said[0]
    assert line.startswith("[scarcelab] ") and f"the {n_pool} given unlabeled images" in line
    assert "are not used" in line and "simulated" in line and f"{n_lab} labeled" in line
    assert "semi or self" in line and f"encoded_folder:{root}" in line
    runs = mlflow.search_runs(experiment_names=["al-own"])
    sweep = runs[runs["tags.scarcelab.role"] == "al_sweep"].iloc[0]
    assert sweep["tags.scarcelab.unlabeled_pool"] == line.removeprefix("[scarcelab] ")
    assert f"Unlabeled pool: {sweep['tags.scarcelab.unlabeled_pool']}." in \
        sweep["tags.mlflow.note.content"]
    # the encoded form: the encoder learns from the pool, the AL pool is still the labeled
    from scarcelab.active.datasets import given_pool_note

    enc = given_pool_note(f"folder:{root}", n_pool, n_lab, "trained")
    assert "train the encoder" in enc and "not queried" in enc and "not used" not in enc
    assert given_pool_note(f"folder:{root}", 0, n_lab, None) == ""


def test_encoded_al_on_the_folder_says_its_encoder_trains_on_the_pool(folder, tmp_path,
                                                                      capsys) -> None:  # type: ignore[no-untyped-def]
    """encoded_folder: the encoder learns from the labeled and the given unlabeled images;
    the AL pool is still the labeled ones, and the sweep's tags say both."""
    from scarcelab import tags as T
    from scarcelab.active.datasets import LoadContext, _encoded_loader, default_data_dir
    from scarcelab.active.encoded import DiskEncodingCache

    root, files = folder
    ctx = LoadContext("cpu", {"method": "simclr", "arch": "small_cnn", "epochs": 1,
                              "batch_size": 64}, DiskEncodingCache(tmp_path / "enc"),
                      data_options=DataOptions())
    d = _encoded_loader(f"folder:{root}")(default_data_dir(), np.random.default_rng(0), ctx)
    note = d.tags[T.UNLABELED_POOL]
    assert f"the {len(files['unlabeled'])} given unlabeled images" in note
    assert "train the encoder" in note and "not queried" in note
    assert T.ENCODING_KEY in d.tags and len(d.y_train) == len(files["labeled"])
    assert f"[scarcelab] {note}" in capsys.readouterr().err.splitlines()


def test_folds_run_k_studies_under_one_parent(folder, store) -> None:  # type: ignore[no-untyped-def]
    import shutil

    import mlflow

    from scarcelab.tracking.query import frame, views

    root, _ = folder
    shutil.rmtree(root / "test")
    r = _invoke(["supervised", "--method", "sup", "--dataset", f"folder:{root}", "--folds",
                 "2", "--experiment", "folds", *STUDY])
    assert r.exit_code == 0, r.output
    runs = mlflow.search_runs(experiment_names=["folds"])
    parent = runs[runs["tags.scarcelab.role"] == "folds"]
    studies = runs[runs["tags.scarcelab.role"] == "study"]
    assert len(parent) == 1 and len(studies) == 2
    assert set(studies["tags.mlflow.parentRunId"]) == {parent.iloc[0].run_id}
    assert sorted(studies["tags.scarcelab.fold"]) == ["1/2", "2/2"]
    assert set(studies["tags.scarcelab.test_from"]) == {"fold"}
    assert len(set(studies["tags.scarcelab.split_hash"])) == 2
    mean = studies["metrics.best/test_balanced_accuracy"].mean()
    assert parent.iloc[0]["metrics.folds/test_balanced_accuracy_mean"] == pytest.approx(mean)
    lb = views.leaderboard(frame.load("folds", store))
    assert len(lb) == 1 and int(lb.iloc[0]["n"]) == 2  # the folds are two samples of a row
    assert lb.iloc[0]["test_balanced_accuracy_mean"] == pytest.approx(mean)


# -- sweep specs ----------------------------------------------------------------------------


def test_sweep_spec_takes_own_datasets_relative_to_the_spec(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from scarcelab.tracking.sweep.spec import load_spec

    (tmp_path / "specs").mkdir()
    spec = tmp_path / "specs" / "own.yaml"
    spec.write_text("name: own\ngrids:\n  - entry: semi\n    method: fixmatch\n"
                    "    dataset: [folder:../data/chest, csv:labels.csv, encoded_folder:/abs/x,"
                    " breastmnist]\n")
    cells = load_spec(spec).cells
    got = [dict(c.options)["dataset"] for c in cells]
    assert got == [f"folder:{(tmp_path / 'data' / 'chest').resolve()}",
                   f"csv:{(tmp_path / 'specs' / 'labels.csv').resolve()}",
                   "encoded_folder:/abs/x", "breastmnist"]
    assert cells[0].argv()[cells[0].argv().index("--dataset") + 1] == got[0]


# -- formats --------------------------------------------------------------------------------


def test_16bit_tiff_and_dicom_in_a_folder(folder) -> None:  # type: ignore[no-untyped-def]
    """16-bit TIFFs (the pixels times 257: the same image after the min..max rule) and
    DICOM files written with pydicom from the same real pixels decode like the PNGs."""
    root, files = folder
    p = files["labeled"][0]
    a = np.asarray(Image.open(p))
    Image.fromarray(a.astype(np.uint16) * 257).save(p.with_suffix(".tif"))
    p.unlink()
    pydicom = pytest.importorskip("pydicom")
    from pydicom.dataset import FileDataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    u = files["unlabeled"][0]
    ua = np.asarray(Image.open(u))
    meta = FileMetaDataset()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    meta.MediaStorageSOPClassUID = generate_uid()
    meta.MediaStorageSOPInstanceUID = generate_uid()
    ds = FileDataset(str(u.with_suffix(".dcm")), {}, file_meta=meta, preamble=b"\0" * 128)
    ds.Rows, ds.Columns = ua.shape
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
    ds.PixelData = (ua.astype(np.uint16) * 16).tobytes()
    ds.save_as(u.with_suffix(".dcm"), enforce_file_format=True)
    u.unlink()
    assert pydicom.dcmread(u.with_suffix(".dcm")).pixel_array.max() == int(ua.max()) * 16
    raw = load_raw(f"folder:{root}")
    assert len(raw.unlabeled_x) == len(files["unlabeled"])

    def stretched(v: np.ndarray) -> np.ndarray:  # the min..max rule of 16-bit pixels
        lo, hi = float(v.min()), float(v.max())
        return np.rint((v.astype(float) - lo) * 255 / (hi - lo)).astype(np.uint8)

    assert any(np.array_equal(r[0], stretched(a)) for r in raw.train_x)
    assert any(np.array_equal(r[0], stretched(ua)) for r in raw.unlabeled_x)


# -- dataset plugins ------------------------------------------------------------------------

PLUGIN = '''\
"""A user's dataset package: a loader in entry-point group scarcelab.datasets."""
import os
from pathlib import Path

import numpy as np

if os.environ.get("TOY_PLUGIN_MARKER"):  # proves when the package is imported
    Path(os.environ["TOY_PLUGIN_MARKER"]).write_text("imported")


def load(data_dir=None):
    from scarcelab.data.bundle import RawDataset

    rng = np.random.default_rng(0)
    y = np.arange(240) % 2
    x = (rng.integers(0, 60, (240, 1, 12, 12)) + 150 * y[:, None, None, None]).astype(np.uint8)
    return RawDataset(name="toyplug", train_x=x[:180], train_y=y[:180], test_x=x[180:],
                      test_y=y[180:], num_classes=2, class_names=["a", "b"],
                      source="toy_scarce_plugin")
'''


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A real package installed the way pip leaves one: its module and a dist-info folder
    with METADATA and entry_points.txt, on sys.path (no network, no pip)."""
    from scarcelab.registry import refresh_plugins

    site = tmp_path / "site"
    (site / "toy_scarce_plugin").mkdir(parents=True)
    (site / "toy_scarce_plugin" / "__init__.py").write_text(PLUGIN)
    info = site / "toy_scarce_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-scarce-plugin\n"
                                   "Version: 0.1\n")
    (info / "entry_points.txt").write_text("[scarcelab.datasets]\n"
                                           "toyplug = toy_scarce_plugin:load\n")
    marker = tmp_path / "imported.txt"
    monkeypatch.setenv("TOY_PLUGIN_MARKER", str(marker))
    monkeypatch.syspath_prepend(str(site))
    refresh_plugins()
    yield site, marker
    refresh_plugins()
    sys.modules.pop("toy_scarce_plugin", None)


def test_plugin_is_found_by_name_checks_and_listing_without_import(plugin) -> None:  # type: ignore[no-untyped-def]
    from scarcelab.data import DATASETS
    from scarcelab.data.catalog import describe
    from scarcelab.entrypoints.options import DatasetName

    site, marker = plugin
    assert "toyplug" in DATASETS.names() and "toyplug" in DATASETS
    assert DatasetName().parse("toyplug") == "toyplug"
    e = describe("toyplug")
    assert e.on_disk == "plugin" and "toy_scarce_plugin:load" in e.where
    assert "toy-scarce-plugin" in e.where
    assert not marker.exists()  # names, checks and listing read metadata only
    raw = load_raw("toyplug")
    assert marker.exists() and raw.name == "toyplug" and len(raw.train_y) == 180
    out = subprocess.run([sys.executable, "-m", "scarcelab.entrypoints.cli", "list",
                          "datasets"], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO}",
                              "TOY_PLUGIN_MARKER": str(marker) + ".list"})
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("toyplug"))
    assert "plugin" in line and "toy_scarce_plugin:load" in line
    assert "--dataset folder:PATH or --dataset csv:FILE" in out.stdout  # how to name a folder
    assert not Path(str(marker) + ".list").exists()


def test_a_broken_plugin_is_one_line(plugin) -> None:  # type: ignore[no-untyped-def]
    site, _ = plugin
    (site / "toy_scarce_plugin" / "__init__.py").write_text("raise ImportError('no numpy2')\n")
    from scarcelab.data import DATASETS

    with pytest.raises(ConfigError, match="dataset plugin 'toyplug' .*toy_scarce_plugin:load.* "
                       "failed to load: ImportError: no numpy2"):
        DATASETS.get("toyplug")


def test_a_sweep_cell_runs_a_study_on_the_plugin(plugin, store) -> None:  # type: ignore[no-untyped-def]
    """A cell is a fresh ``python -m scarcelab.entrypoints.cli`` process (on a Ray node: that
    node's Python): the plugin is found there from the installed package alone."""
    import mlflow

    from scarcelab.tracking.sweep.driver import run_cell_process

    site, _ = plugin
    res = run_cell_process(["supervised", "--method", "sup", "--dataset", "toyplug",
                            "--experiment", "plug", "--n-labeled", "20", *STUDY],
                           {"PYTHONPATH": f"{site}{os.pathsep}{REPO}"}, str(REPO),
                           sys.executable)
    assert res["rc"] == 0, res["output"][-3000:]
    runs = mlflow.search_runs(experiment_names=["plug"])
    study = runs[runs["tags.scarcelab.role"] == "study"].iloc[0]
    assert study["tags.scarcelab.dataset"] == "toyplug" and study["status"] == "FINISHED"
