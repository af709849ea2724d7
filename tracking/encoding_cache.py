"""Encodings (``encoded_*`` AL sets) cached as MLflow artifacts, and encoders loaded from
scarcelab ``self`` runs.

An encoding is an expensive, deterministic function of its key (images + encoder
settings, see ``scarcelab.active.encoded``). :class:`MlflowEncodingCache` keeps it twice:
on local disk (first look, no network) and as the artifacts of one MLflow run with role
``encoding`` and tag ``scarcelab.encoding_key`` — so a second machine pointed at the same
tracking server downloads the embeddings instead of retraining the encoder, and every AL
sweep can name the run its features came from.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param

from scarcelab.active.encoded import DiskEncodingCache, Encoded
from tracking.mlflow_tracker import current_experiment_id
from tracking.safe_io import UnsafeArtifact, load_exported, trust_pickled_models

log = logging.getLogger(__name__)
ROLE = "encoding"


class MlflowEncodingCache:
    def __init__(self, disk: DiskEncodingCache, experiment: str | None = None) -> None:
        from mlflow.tracking import MlflowClient

        self.disk = disk
        self.client = MlflowClient()
        self.experiment_id = current_experiment_id(self.client, experiment)

    def _find(self, key: str) -> Any | None:
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=(f"tags.`scarcelab.role` = '{ROLE}' and "
                           f"tags.`scarcelab.encoding_key` = '{key}' and "
                           "attributes.status = 'FINISHED'"),
            max_results=1, order_by=["attributes.start_time DESC"])
        return runs[0] if runs else None

    def get(self, key: str) -> tuple[Encoded, str] | None:
        hit = self.disk.get(key)
        if hit is not None:
            run = self._find(key)
            return hit[0], (f"mlflow-run:{run.info.run_id}" if run else hit[1])
        run = self._find(key)
        if run is None:
            return None
        dst = self.disk.root
        dst.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=dst) as tmp:
            got = Path(self.client.download_artifacts(run.info.run_id, "encoding", tmp))
            for f in got.iterdir():
                f.replace(dst / f.name)
        hit = self.disk.get(key)
        if hit is None:
            log.warning("encoding run %s has no usable artifacts; recomputing",
                        run.info.run_id)
            return None
        return hit[0], f"mlflow-run:{run.info.run_id}"

    def put(self, key: str, enc: Encoded) -> str:
        self.disk.put(key, enc)
        m = enc.meta
        run = self.client.create_run(
            self.experiment_id, run_name=f"encoding-{m.get('dataset')}-{key[:8]}",
            tags={"scarcelab.role": ROLE, "scarcelab.family": "active",
                  "scarcelab.encoding_key": key, "scarcelab.dataset": str(m.get("dataset")),
                  "scarcelab.method": str(m.get("encoder"))})
        rid = run.info.run_id
        try:
            now = int(time.time() * 1000)
            numeric = {k: v for k, v in m.items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool)}
            self.client.log_batch(  # one request for the whole description
                rid, metrics=[Metric(f"encoding/{k}", float(v), now, 0)
                              for k, v in numeric.items()],
                params=[Param(k, str(v)[:500]) for k, v in m.items() if k not in numeric])
            for p in self.disk.paths(key):
                if p.is_file():
                    self.client.log_artifact(rid, str(p), "encoding")
        except Exception:
            self.client.set_terminated(rid, "FAILED")
            raise
        self.client.set_terminated(rid, "FINISHED")
        return f"mlflow-run:{rid}"


def load_pretrained_backbone(uri: str) -> Any:
    """The backbone of a scarcelab model logged by a study (``runs:/<id>/model``,
    ``models:/<name>/<version>``): the exported classifier's ``backbone``, which expects
    normalised images exactly as ``scarcelab.active.encoded.embed_images`` feeds them.

    Studies log their model in MLflow's ``pt2`` format; it is read only after checking that
    the archive holds no pickle payload, so loading it runs no code from the artifact store.
    A pickle-format model (older scarcelab, or logged by hand) would run whatever its pickle
    says: it is refused unless ``SCARCELAB_TRUST_PICKLED_MODELS=1`` says you trust everyone
    who can write that artifact store."""
    import mlflow.pytorch
    import torch
    from mlflow.tracking.artifact_utils import _download_artifact_from_uri

    local = Path(_download_artifact_from_uri(artifact_uri=uri))
    pt2 = local / "data" / "model.pt2"
    if pt2.is_file():
        try:
            model = torch.export.unflatten(load_exported(pt2))
        except UnsafeArtifact as e:
            raise ValueError(f"{uri}: {e}") from e
    elif trust_pickled_models():
        model = mlflow.pytorch.load_model(uri, map_location="cpu")
    else:
        raise ValueError(f"{uri} is a pickle-format model: loading it executes code stored in the "
                         "artifact store. Log it with serialization_format='pt2' (as scarcelab "
                         "studies do), or set SCARCELAB_TRUST_PICKLED_MODELS=1 if you trust "
                         "everyone who can write that store")
    backbone = getattr(model, "backbone", None)
    if backbone is None:
        raise ValueError(f"{uri} is not a scarcelab exported classifier (no .backbone); pass "
                         "the `model` of a scarcelab study run, e.g. runs:/<run id>/model")
    return backbone.eval()
