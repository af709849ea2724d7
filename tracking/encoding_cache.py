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

from scarcelab import tags as T
from scarcelab.active.encoded import DiskEncodingCache, Encoded
from scarcelab.tracking.mlflow_tracker import current_experiment_id

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
            filter_string=(f"tags.`{T.ROLE}` = '{ROLE}' and "
                           f"tags.`{T.ENCODING_KEY}` = '{key}' and "
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
            tags={T.ROLE: ROLE, T.FAMILY: "active",
                  T.ENCODING_KEY: key, T.DATASET: str(m.get("dataset")),
                  T.METHOD: str(m.get("encoder"))})
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
    """The backbone of a scarcelab study (``runs:/<id>/model``, ``models:/<name>/<version>``),
    which expects normalised images exactly as ``scarcelab.active.encoded.embed_images``
    feeds them. Read through ``tracking.encoders.resolve_encoder``: the study's checkpoint
    tensors, never an unpickled model."""
    from scarcelab.tracking.encoders import resolve_encoder

    backbone, _ = resolve_encoder(uri, None, None)
    return backbone.eval()
