"""The logged classifier as an MLflow model that takes raw images (issue 39, item 7).

One model folder, two flavors over one network:

* ``python_function`` — ``mlflow.pyfunc.load_model(uri).predict(x)`` takes image file
  paths or arrays of any size (:data:`scarcelab.models.image_input.INPUT_DOC`), replays the
  training data's transform (``data/preprocess.json``, through the same
  ``scarcelab.data.imagefiles`` functions the training images went through) and returns a
  frame: ``class`` (the predicted class name) and ``p_<class name>`` per class;
* ``pytorch`` — ``mlflow.pytorch.load_model(uri)`` returns the network as before: float
  images in [0, 1] at the training size (N, C, H, W) -> logits (``data/model.pt2``, the
  file and place ``mlflow.pytorch``'s ``pt2`` format uses, so that reader and scarcelab's
  encoder resolver read it unchanged).

Nothing in the folder is code or a pickle. MLflow's two usual ways to ship a custom pyfunc
both run something from the artifact store on whoever loads the model: a ``PythonModel``
*instance* is cloudpickled (``python_model.pkl``, unpickled at load unless
``MLFLOW_ALLOW_PICKLE_DESERIALIZATION=false``; MLflow 3.17's default is ``true``), and
"models from code" copies a ``.py`` file into the folder and executes it at load
(``mlflow.models.utils._load_model_code_path``: ``spec.loader.exec_module``). Here the
pyfunc flavor names a *loader module* (``loader_module: scarcelab.tracking.pyfunc_model``,
MLflow's custom-flavor mechanism, ``mlflow.pyfunc.add_to_model``): the loading code is the
installed scarcelab; the folder holds only JSON/YAML/text and the pt2 archive, which
:func:`scarcelab.tracking.safe_io.load_exported` checks for pickle payloads before
reading. The price: predicting needs scarcelab installed (it does anyway, to decode files
the way training did); it is the model's requirement.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from scarcelab import tags as T
from scarcelab.models.image_input import INPUT_DOC, InputSpec, batches, output_columns

DATA = "data"
NETWORK = "model.pt2"
SPEC = "preprocess.json"
BATCH = 256


def signature(spec: InputSpec) -> Any:
    """The MLflow signature: outputs only. An input schema would make MLflow coerce every
    input to its form before ``predict`` sees it (a column schema turns arrays into a
    DataFrame, which fails for images; a tensor schema refuses paths and other sizes), so
    what the model takes is said in the MLmodel metadata and README instead."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    return ModelSignature(outputs=Schema(
        [ColSpec("string", "class"),
         *[ColSpec("double", c) for c in output_columns(spec.class_names)[1:]]]))


def requirements(base: list[str]) -> list[str]:
    """``base`` (the network's: torch, numpy, pandas…) plus what the preprocessing
    imports: scarcelab itself, Pillow, and pydicom where it is installed (DICOM files)."""
    from importlib.metadata import PackageNotFoundError, version

    import scarcelab

    out = list(base)
    for dist in ("pillow", "pydicom"):
        try:
            out.append(f"{dist}=={version(dist)}")
        except PackageNotFoundError:
            if dist == "pillow":
                out.append(dist)
    return [*out, f"scarcelab=={scarcelab.__version__}"]


def _readme(spec: InputSpec) -> str:
    cols = ", ".join(f"`{c}`" for c in output_columns(spec.class_names))
    t = spec.transform
    rule = t.get("fit_rule") or ("shorter side to the size, centre crop" if
                                 t.get("fit", "crop") == "crop" else
                                 "longer side to the size, centred pad")
    return f"""# scarcelab classifier

Trained on {spec.channels}-channel images; the network takes {spec.size[0]}x{spec.size[1]}.
Training transform: image_size={t.get('image_size')}, channels={t.get('channels')},
fit={t.get('fit')} ({rule}), resample {t.get('resample')}. An image of the network's size is
used as it is. Classes: {', '.join(spec.class_names)}.

```python
import mlflow
model = mlflow.pyfunc.load_model("<this model's URI>")   # needs scarcelab installed
model.predict(["a.png", "b.dcm"])                        # or arrays of any size
```

Input: {INPUT_DOC}

Output: a pandas DataFrame, one row per image, columns {cols}: the predicted class name and
the softmax probability of each class.

`mlflow.pytorch.load_model` on the same URI returns the bare network: float32 (N, {spec.channels},
{spec.size[0]}, {spec.size[1]}) in [0, 1] -> logits (normalisation inside). Files:
`data/model.pt2` (torch.export archive, no pickle), `data/preprocess.json` (the transform).
"""


def save_model(path: str | Path, mlflow_model: Any = None, *, network: str | Path,
               spec: InputSpec, pip_requirements: list[str],
               metadata: dict[str, Any] | None = None,
               serialization_format: str = "pt2") -> None:
    """Write the model folder from an exported network (``network``: a ``.pt2`` archive
    from :func:`scarcelab.tracking.safe_io.export_model`). ``serialization_format`` is the
    one ``Model.log`` records on the logged-model entity; it is always pt2 here."""
    from mlflow import pyfunc
    from mlflow.models import Model
    from mlflow.models.model import MLMODEL_FILE_NAME
    from mlflow.utils.environment import _process_pip_requirements, _PythonEnv
    from mlflow.utils.file_utils import get_total_file_size

    del serialization_format
    root = Path(path)
    (root / DATA).mkdir(parents=True)
    shutil.copyfile(network, root / DATA / NETWORK)
    (root / DATA / SPEC).write_text(json.dumps(spec.to_json(), indent=1) + "\n")
    (root / "README.md").write_text(_readme(spec))
    model = mlflow_model if mlflow_model is not None else Model()
    model.signature = signature(spec)
    model.metadata = {**(model.metadata or {}), **(metadata or {}),
                      T.MODEL_INPUT: INPUT_DOC,
                      T.MODEL_OUTPUT: output_columns(spec.class_names),
                      T.MODEL_TRANSFORM: dict(spec.transform),
                      T.MODEL_NETWORK_INPUT: [spec.channels, *spec.size]}
    # the bare network, where and as mlflow.pytorch's pt2 format keeps it
    model.add_flavor("pytorch", model_data=DATA, pytorch_version=str(torch.__version__),
                     code=None)
    pyfunc.add_to_model(model, loader_module=__name__, data=DATA,
                        conda_env="conda.yaml", python_env="python_env.yaml")
    if size := get_total_file_size(root):
        model.model_size_bytes = size
    model.save(str(root / MLMODEL_FILE_NAME))
    conda_env, reqs, constraints = _process_pip_requirements([], pip_requirements)
    import yaml

    (root / "conda.yaml").write_text(yaml.safe_dump(conda_env, default_flow_style=False))
    (root / "requirements.txt").write_text("\n".join(reqs))
    if constraints:
        (root / "constraints.txt").write_text("\n".join(constraints))
    _PythonEnv.current().to_yaml(str(root / "python_env.yaml"))


def log_model(network: str | Path, spec: InputSpec, run_id: str,
              pip_requirements: list[str], metadata: dict[str, Any] | None = None,
              tags: dict[str, str] | None = None, name: str = "model") -> Any:
    """Log the model folder as the run's ``name`` model (``runs:/<run id>/model``); the
    caller has made the run's experiment the current one (MLflow creates the logged-model
    entity there)."""
    from mlflow.models import Model

    return Model.log(artifact_path=None, name=name, flavor=sys.modules[__name__],
                     run_id=run_id, tags=tags, network=network, spec=spec,
                     pip_requirements=pip_requirements, metadata=metadata,
                     serialization_format="pt2")


class RawImageClassifier:
    """What ``mlflow.pyfunc.load_model`` wraps: raw images -> class and probabilities.

    Images go through :func:`scarcelab.models.image_input.batches` (decode, channels,
    resize: the training transform) and ``scarcelab.data.augment.to_float`` (uint8 ->
    [0, 1], as every training and evaluation batch), then the network."""

    def __init__(self, network: torch.nn.Module, spec: InputSpec, batch_size: int = BATCH):
        self.network, self.spec, self.batch_size = network, spec, batch_size

    def predict(self, model_input: Any, params: dict[str, Any] | None = None) -> pd.DataFrame:
        from scarcelab.data.augment import to_float

        del params
        probs = []
        with torch.no_grad():
            for b in batches(model_input, self.spec, self.batch_size):
                logits = self.network(to_float(torch.from_numpy(b)))
                probs.append(torch.softmax(logits.float(), 1).numpy())
        cols = output_columns(self.spec.class_names)
        p = (np.concatenate(probs) if probs
             else np.zeros((0, len(self.spec.class_names)), np.float32)).astype(np.float64)
        out = pd.DataFrame(p, columns=cols[1:])
        out.insert(0, "class", np.asarray(self.spec.class_names, dtype=object)[p.argmax(1)]
                   if len(p) else np.asarray([], dtype=object))
        return out


def _load_pyfunc(path: str, model_config: dict[str, Any] | None = None) -> RawImageClassifier:
    """MLflow's entry (``loader_module``): ``path`` is the model's ``data`` folder. The
    archive is checked for pickle payloads whatever ``MLFLOW_ALLOW_PICKLE_DESERIALIZATION``
    says."""
    from scarcelab.tracking.safe_io import load_exported

    del model_config
    spec = InputSpec.from_json(json.loads((Path(path) / SPEC).read_text()))
    network = load_exported(Path(path) / NETWORK).module()
    return RawImageClassifier(network, spec)
