"""Issue 39 item 7: the logged model takes raw images — files or arrays of any size — and
gives the class the run's own test metrics counted. Real MLflow store (sqlite, the
``store`` fixture), never a mock; real BreastMNIST from ../shared/data."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from scarcelab.errors import DataError
from scarcelab.models.image_input import InputSpec, prepare, training_transform, transform_of

# ---------------------------------------------------------------- the preprocessing alone


def _spec(c: int = 1, size: int = 28, **transform: str) -> InputSpec:
    t = {**training_transform(None, c), **transform}
    return InputSpec(transform=t, channels=c, size=(size, size), class_names=["a", "b"])


def test_arrays_in_every_layout_reach_the_network_as_the_training_images_were():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (4, 1, 28, 28), dtype=np.uint8)
    spec = _spec()
    want = x
    assert np.array_equal(prepare(x, spec), want)  # (N, C, H, W): untouched
    assert np.array_equal(prepare(x.transpose(0, 2, 3, 1), spec), want)  # (N, H, W, C)
    assert np.array_equal(prepare([a[0] for a in x], spec), want)  # list of (H, W)
    assert np.array_equal(prepare(x[0], spec), want[:1])  # one (C, H, W)
    assert np.array_equal(prepare(x[0, 0], spec), want[:1])  # one (H, W)
    # float in [0, 1] and int64 (what JSON and lists give) are the same pixels
    assert np.array_equal(prepare(x.astype(np.float32) / 255, spec), want)
    assert np.array_equal(prepare(x.astype(np.int64).tolist(), spec), want)
    # gray given as RGB (R = G = B): Pillow's integer luma gives the value back exactly
    assert np.array_equal(prepare(np.repeat(x, 3, 1), spec), want)
    # an RGB model takes a gray image with the gray repeated
    assert np.array_equal(prepare(x, _spec(c=3)), np.repeat(x, 3, 1))


def test_other_sizes_are_resized_as_the_recorded_fit_says():
    """Hand-computable: constant images stay constant through any resize; ``pad`` leaves
    the recorded fill (0) beside a non-square image (longer side 56 -> 28, so 28 x 14,
    centred: columns 7..20)."""
    tall = np.full((56, 28), 200, np.uint8)
    out = prepare(tall, _spec(fit="pad"))
    assert out.shape == (1, 1, 28, 28)
    assert (out[0, 0, :, 7:21] == 200).all() and (out[0, 0, :, :7] == 0).all()
    assert (out[0, 0, :, 21:] == 0).all()
    crop = prepare(np.full((64, 48), 100, np.uint8), _spec())  # shorter side 48 -> 28, crop
    assert crop.shape == (1, 1, 28, 28) and (crop == 100).all()
    big = prepare(np.full((224, 224, 3), 7, np.uint8), _spec())
    assert big.shape == (1, 1, 28, 28) and (big == 7).all()
    # a model trained at image_size 64 resizes a 28-px image up to it
    up = prepare(np.full((28, 28), 9, np.uint8), _spec(size=64, image_size="64"))
    assert up.shape == (1, 1, 64, 64) and (up == 9).all()


def test_bad_inputs_are_one_line_naming_the_input():
    spec = _spec()
    with pytest.raises(DataError, match=r"input\[1\]: float image arrays are read as "
                                        r"intensities in \[0, 1\], got values in \[255, 255\]"):
        prepare([np.zeros((28, 28), np.float32), np.full((28, 28), 255.0)], spec)
    with pytest.raises(DataError, match="one image, not a batch"):
        prepare(np.zeros((5, 28, 28), np.uint8), spec)  # gray batch must be (N, 1, H, W)
    with pytest.raises(DataError, match="ambiguous"):
        prepare(np.zeros((2, 28, 28), np.uint8), spec)  # not gray + alpha, silently
    import pandas as pd

    with pytest.raises(DataError, match="one column of images"):
        prepare(pd.DataFrame({"a": ["x.png"], "b": ["y.png"]}), spec)
    with pytest.raises(DataError, match=r"input\[0\]: a bytes is neither"):
        prepare([b"\x89PNG"], spec)
    with pytest.raises(DataError, match="missing.png"):
        prepare(["/nonexistent/missing.png"], spec)


def test_the_transform_a_dataset_carries_is_the_one_recorded():
    t = {"image_size": "64", "channels": "gray", "fit": "pad"}
    assert transform_of({"transform": t}) == t  # a bundle's meta
    assert transform_of(type("B", (), {"meta": {"transform": t}})()) == t  # a bundle
    assert transform_of(type("R", (), {"transform": t})()) == t  # a raw dataset
    assert transform_of({"resolution": [28, 28]}) is None
    native = training_transform(None, 3)
    assert native["image_size"] == "native" and native["channels"] == "rgb"
    spec = _spec(image_size="28")
    assert InputSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec


# ---------------------------------------------------------------- the logged model


def _png(path: Path, chw: np.ndarray, rgb: bool = False) -> str:
    a = chw[0] if chw.shape[0] == 1 else chw.transpose(1, 2, 0)
    im = Image.fromarray(a)
    (im.convert("RGB") if rgb else im).save(path)
    return str(path)


def _dicom(path: Path, hw: np.ndarray) -> str:
    """A minimal uncompressed MONOCHROME2 DICOM file holding ``hw`` (uint8), with the VOI
    window that maps 0..255 onto itself (LINEAR_EXACT, centre 127.5, width 255: PS3.3
    C.11.2.1.3.2), so that it decodes to the PNG's pixels (without a window the decoder
    stretches each image over its own min..max)."""
    from pydicom.dataset import FileDataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, SecondaryCaptureImageStorage, generate_uid

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = FileDataset(str(path), {}, file_meta=meta, preamble=b"\0" * 128)
    ds.SOPClassUID, ds.SOPInstanceUID = meta.MediaStorageSOPClassUID, generate_uid()
    ds.Modality, ds.PatientID = "US", "test"
    ds.Rows, ds.Columns = hw.shape
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
    ds.WindowCenter, ds.WindowWidth, ds.VOILUTFunction = "127.5", "255", "LINEAR_EXACT"
    ds.PixelData = np.ascontiguousarray(hw).tobytes()
    ds.save_as(str(path), enforce_file_format=True)
    return str(path)


class _NoUnpickling:
    """Every way into pickle/cloudpickle raises while the model is loaded and used."""

    def __enter__(self) -> _NoUnpickling:
        import cloudpickle

        self.saved = [(m, n, getattr(m, n)) for m in (pickle, cloudpickle)
                      for n in ("load", "loads", "Unpickler") if hasattr(m, n)]

        def refuse(*a: Any, **k: Any) -> Any:
            raise AssertionError("something was unpickled")

        for m, n, _ in self.saved:
            setattr(m, n, refuse)
        self.env = os.environ.get("MLFLOW_ALLOW_PICKLE_DESERIALIZATION")
        os.environ["MLFLOW_ALLOW_PICKLE_DESERIALIZATION"] = "false"
        return self

    def __exit__(self, *exc: Any) -> None:
        for m, n, f in self.saved:
            setattr(m, n, f)
        if self.env is None:
            del os.environ["MLFLOW_ALLOW_PICKLE_DESERIALIZATION"]
        else:
            os.environ["MLFLOW_ALLOW_PICKLE_DESERIALIZATION"] = self.env


def _assert_no_pickle_no_code(model_dir: Path) -> None:
    """The folder holds text (MLmodel, JSON, YAML, README) and one pt2 archive free of
    pickle payloads; its pyfunc flavor names an installed loader module, not a pickled
    ``PythonModel`` nor a code file MLflow would execute."""
    import yaml

    from scarcelab.tracking.safe_io import check_exported

    files = {p.relative_to(model_dir).as_posix() for p in model_dir.rglob("*") if p.is_file()}
    assert {"MLmodel", "data/model.pt2", "data/preprocess.json", "README.md"} <= files
    assert not [f for f in files if f.endswith((".pkl", ".pickle", ".pth", ".pt", ".py"))]
    check_exported(model_dir / "data/model.pt2")
    for f in files - {"data/model.pt2"}:
        (model_dir / f).read_text()  # text, not a binary payload
    conf = yaml.safe_load((model_dir / "MLmodel").read_text())["flavors"]
    assert conf["python_function"]["loader_module"] == "scarcelab.tracking.pyfunc_model"
    assert not {"python_model", "model_code_path", "cloudpickle_version",
                "code"} & set(conf["python_function"])
    assert conf["pytorch"]["model_data"] == "data"


def test_breastmnist_study_model_predicts_the_runs_test_classes_from_files_and_any_size(
        store, medmnist_dir, tmp_path):
    """A real study on BreastMNIST logs its model; loaded with ``mlflow.pyfunc`` (pickle
    refused) it predicts on (a) the test images as 28-px PNG and DICOM files, (b) the
    same images upscaled to 64 and 224 px arrays, (c) as RGB files for the gray model.
    From the files, the test balanced accuracy is the run's logged one (the same
    predictions), and the probabilities are the bare network's on the stored test set."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from scarcelab.data import load_raw
    from scarcelab.metrics import classification_metrics
    from scarcelab.protocols.search import StudyConfig, run_study
    from scarcelab.tracking.mlflow_tracker import MlflowTracker

    t = MlflowTracker(experiment="raw-images")
    res = run_study(StudyConfig(method="sup", dataset="breastmnist", data_dir=str(medmnist_dir),
                                arch="small_cnn", device="cpu", budget_minutes=1.0,
                                max_epochs=8, patience=8, batch_size=32,
                                max_steps_per_epoch=8, max_trials=1, seed=0), t)
    rid = t.study_run_id
    logged = MlflowClient().get_run(rid).data.metrics
    raw = load_raw("breastmnist", medmnist_dir)
    x, y = raw.test_x, raw.test_y
    (tmp_path / "png").mkdir()
    (tmp_path / "rgb").mkdir()
    (tmp_path / "dcm").mkdir()
    pngs = [_png(tmp_path / "png" / f"{i}.png", im) for i, im in enumerate(x)]
    uri = f"runs:/{rid}/model"
    model_dir = Path(mlflow.artifacts.download_artifacts(uri, dst_path=str(tmp_path / "dl")))
    _assert_no_pickle_no_code(model_dir)
    with _NoUnpickling():
        model = mlflow.pyfunc.load_model(uri)
        out = model.predict(pngs)
        network = mlflow.pytorch.load_model(uri)  # the bare network, as documented before
    names = raw.class_names
    assert list(out.columns) == ["class", *[f"p_{n}" for n in names]]
    proba = out[[f"p_{n}" for n in names]].to_numpy()
    pred = np.array([names.index(c) for c in out["class"]])
    assert np.array_equal(pred, proba.argmax(1))
    got = classification_metrics(y, proba, raw.positive_class)
    assert got["balanced_accuracy"] == pytest.approx(logged["best/test_balanced_accuracy"],
                                                     abs=1e-12)
    assert got["balanced_accuracy"] == pytest.approx(res.best_test["balanced_accuracy"],
                                                     abs=1e-12)
    assert got["auroc"] == pytest.approx(res.best_test["auroc"], abs=1e-6)
    with torch.no_grad():
        ref = torch.softmax(network(torch.as_tensor(x).float() / 255), 1).numpy()
    np.testing.assert_allclose(proba, ref, atol=1e-6)
    # the same images in other forms: DICOM files, RGB PNG files, float arrays, a DataFrame
    k = 24
    dcms = [_dicom(tmp_path / "dcm" / f"{i}.dcm", x[i, 0]) for i in range(k)]
    rgbs = [_png(tmp_path / "rgb" / f"{i}.png", x[i], rgb=True) for i in range(k)]
    import pandas as pd

    for form in (dcms, rgbs, x[:k].astype(np.float32) / 255, pd.DataFrame({"image": pngs[:k]}),
                 np.repeat(x[:k], 3, 1).transpose(0, 2, 3, 1)):
        np.testing.assert_allclose(model.predict(form).iloc[:, 1:].to_numpy(), proba[:k],
                                   atol=1e-6)
    # other sizes: the bare network's export guard refuses 64 px; the model resizes
    up64 = np.stack([np.asarray(Image.fromarray(im[0]).resize((64, 64), Image.BICUBIC))
                     for im in x])[:, None]
    with pytest.raises(Exception, match="28"):
        network(torch.as_tensor(up64[:2]).float() / 255)
    up224 = [np.asarray(Image.fromarray(im[0]).resize((224, 224), Image.BICUBIC))
             for im in x[:k]]
    p64, p224 = model.predict(up64), model.predict(up224)
    assert len(p64) == len(x) and len(p224) == k
    # square in, square out: the recorded transform is Pillow's bilinear resize straight to
    # 28 px (crop removes nothing), computed here on its own, then the bare network
    for big, got in ((list(up64[:, 0]), p64), (up224, p224)):
        small = np.stack([np.asarray(Image.fromarray(a).resize((28, 28), Image.BILINEAR))
                          for a in big])[:, None]
        with torch.no_grad():
            want = torch.softmax(network(torch.as_tensor(small).float() / 255), 1).numpy()
        np.testing.assert_allclose(got.iloc[:, 1:].to_numpy(), want, atol=1e-6)
        assert list(got["class"]) == [names[i] for i in want.argmax(1)]


@pytest.mark.parametrize("remote", [False, True])
def test_the_spooled_and_the_direct_path_log_the_same_model(tmp_path, monkeypatch, remote):
    """With a tracking server the model travels through the spool (the exported archive
    and the spec as JSON); against a local store it is logged at once. Both give the
    raw-image model, and its test balanced accuracy is the run's."""
    import mlflow
    from mlflow.tracking import MlflowClient

    import scarcelab.tracking.spool as spool_mod
    from scarcelab.data import load_raw
    from scarcelab.metrics import classification_metrics
    from scarcelab.protocols.search import StudyConfig, run_study
    from scarcelab.tracking.mlflow_tracker import MlflowTracker

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    mlflow.set_tracking_uri(uri)
    if remote:  # the spool's path (a tracking server) against the same local store
        monkeypatch.setattr(spool_mod, "is_remote", lambda uri: True)
    t = MlflowTracker(experiment="unit")
    run_study(StudyConfig(method="sup", dataset="synthetic_tiny", arch="small_cnn",
                          device="cpu", budget_minutes=0.5, max_epochs=2, patience=2,
                          batch_size=16, max_steps_per_epoch=3, max_trials=1, seed=0), t)
    assert t.spool is not None and t.spool.remote is remote
    raw = load_raw("synthetic_tiny")
    model_dir = Path(mlflow.artifacts.download_artifacts(f"runs:/{t.study_run_id}/model",
                                                         dst_path=str(tmp_path / "dl")))
    _assert_no_pickle_no_code(model_dir)
    with _NoUnpickling():
        out = mlflow.pyfunc.load_model(f"runs:/{t.study_run_id}/model").predict(
            list(raw.test_x))
    proba = out.iloc[:, 1:].to_numpy()
    logged = MlflowClient().get_run(t.study_run_id).data.metrics
    assert classification_metrics(raw.test_y, proba)["balanced_accuracy"] == pytest.approx(
        logged["best/test_balanced_accuracy"], abs=1e-12)
    # registered (what --register-model does), the version is the same raw-image model
    mlflow.register_model(f"runs:/{t.study_run_id}/model", "raw-images")
    again = mlflow.pyfunc.load_model("models:/raw-images/1").predict(list(raw.test_x))
    np.testing.assert_array_equal(again.iloc[:, 1:].to_numpy(), proba)
    spec = json.loads((model_dir / "data/preprocess.json").read_text())
    assert spec["size"] == [16, 16] and spec["channels"] == 1
    assert spec["class_names"] == raw.class_names
    assert spec["transform"]["image_size"] == "native"


def test_a_model_folder_with_a_pickle_in_its_archive_is_refused(tmp_path):
    """The loader checks the archive itself, whatever MLFLOW_ALLOW_PICKLE_DESERIALIZATION
    says (MLflow's default lets ``torch.export.load`` unpickle)."""
    import mlflow

    from scarcelab.models import create_model
    from scarcelab.models.classifier import ExportedClassifier, for_export
    from scarcelab.tracking import pyfunc_model
    from scarcelab.tracking.safe_io import UnsafeArtifact, export_model

    bb = create_model("small_cnn", in_channels=1)
    m = for_export(ExportedClassifier(bb, torch.nn.Linear(bb.num_features, 2), ["a", "b"]))
    ex = torch.rand(2, 1, 16, 16)
    export_model(m, ex, tmp_path / "net.pt2")
    spec = InputSpec.of(m, ex)
    pyfunc_model.save_model(tmp_path / "good", network=tmp_path / "net.pt2", spec=spec,
                            pip_requirements=["torch"])
    out = mlflow.pyfunc.load_model(str(tmp_path / "good")).predict(np.zeros((3, 40, 30)))
    assert out.shape == (1, 3)  # one RGB (C, H, W) image, of another size
    torch.save({"w": torch.zeros(2)}, tmp_path / "pickled.pt")  # a zip with data.pkl
    pyfunc_model.save_model(tmp_path / "bad", network=tmp_path / "pickled.pt", spec=spec,
                            pip_requirements=["torch"])
    with pytest.raises(UnsafeArtifact, match="refused"):
        mlflow.pyfunc.load_model(str(tmp_path / "bad"))
