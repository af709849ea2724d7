"""A stand-in for a study cell, for tests/tracking/compare/test_compare_store.py.

The sweep driver runs ``<python> -m scarcelab.entrypoints.cli <entry> --method … --seed …``
with ``MLFLOW_RUN_ID`` set; the test's ``python`` runs this file instead, so a cell costs
an MLflow client import, not a study. It records on its run what a study records and the
compare report reads: the study tags (role, family, method, dataset, seed, split hash: one
per seed, as ``make_split`` draws it) and the validation-selected scores
(``best/val_balanced_accuracy``, ``best/test_balanced_accuracy``), taken from
``$FAKE_COMPARE_SCORES`` (JSON ``{method: [test score of seed 0, seed 1, …]}``; validation
is the test score minus 0.02, plus ``$FAKE_COMPARE_VAL_BONUS`` for ``method:seed``). A
``method:seed`` listed in the file ``$FAKE_COMPARE_FAIL`` (while it exists) fails with an
``Error:`` line, as a study command does.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    argv = sys.argv[sys.argv.index("-m") + 2:]  # after "-m scarcelab.entrypoints.cli"
    entry, opts = argv[0], dict(zip(argv[1::2], argv[2::2], strict=True))
    method, seed = opts["--method"], int(opts["--seed"])
    key = f"{method}:{seed}"
    fail = os.environ.get("FAKE_COMPARE_FAIL", "")
    if fail and os.path.exists(fail) and key in open(fail).read().split(","):
        print(f"Error: {key} fails on purpose", flush=True)
        return 1
    test = json.loads(os.environ["FAKE_COMPARE_SCORES"])[method][seed]
    bonus = dict(kv.split("=") for kv in os.environ.get("FAKE_COMPARE_VAL_BONUS", "").split(",")
                 if kv).get(key, "0")
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    run_id = os.environ["MLFLOW_RUN_ID"]
    for k, v in {"role": "study", "family": entry, "method": method,
                 "dataset": opts["--dataset"], "seed": str(seed),
                 "split_hash": f"split{seed}"}.items():
        client.set_tag(run_id, f"scarcelab.{k}", v)
    client.log_param(run_id, "budget_minutes", opts["--budget-minutes"])
    client.log_metric(run_id, "best/val_balanced_accuracy", test - 0.02 + float(bonus), step=0)
    client.log_metric(run_id, "best/test_balanced_accuracy", test, step=0)
    client.log_metric(run_id, "time/elapsed_s", 1.0, step=0)
    client.set_terminated(run_id, "FINISHED")
    print(f"fake study {method} seed {seed}: {test}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
