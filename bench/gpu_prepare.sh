#!/usr/bin/env bash
# Prepare what bench/gpu.py needs on a bare GPU machine that reaches no package index
# (issue 40 item 6): wheels for Python 3.12 / x86-64 of the packages such a machine's image
# lacks (the peers USB and lightly and their few imports; optuna and MLflow for real
# studies), into .whl/, and the two MedMNIST files into .gpudata/. Both folders are
# ignored by git and travel with the run (carry .whl .gpudata); together ~45 MB.
#
#     bash bench/gpu_prepare.sh [PYTHON_VERSION]     # default 3.12
#     then, on the GPU machine: bash bench/gpu_device.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYV="${1:-3.12}"
mkdir -p .whl .gpudata
PIP="python3 -m pip download -q --no-deps --only-binary=:all: --python-version $PYV \
  --implementation cp --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl"
# the peers (bench/install_peers.sh's set, minus what a CUDA image ships: timm, lightning,
# torchmetrics, tensorboard, absl)
$PIP semilearn==0.3.2 ruamel.yaml==0.18.6 ruamel.yaml.clib==0.2.12 lightly==1.6.0 \
  lightly-utils==0.0.2 aenum==3.1.15 hydra-core==1.3.2 omegaconf==2.3.0
# two of them publish only source archives: build their pure-Python wheels here
python3 -m pip wheel -q --no-deps -w .whl progressbar==2.5 antlr4-python3-runtime==4.9.3
# real studies: optuna (the search) and MLflow (the tracker), at the lock's versions, and
# what their import path needs beyond a CUDA image (found with bench/gpu.py --dry-run and
# a dump of sys.modules)
$PIP optuna==5.0.0 alembic==1.20.1 colorlog==6.12.0 sqlalchemy==2.1.9 Mako==1.4.3 \
  mlflow==3.17.2 mlflow-skinny==3.17.2 mlflow-tracing==3.17.2 annotated-types==0.8.0 \
  cachetools==7.3.3 cffi==2.1.1 cryptography==50.0.2 databricks-sdk==0.167.0 \
  fastapi==0.165.0 gitdb==4.0.12 GitPython==3.2.1 google-auth==2.63.0 \
  importlib_metadata==9.1.0 pyasn1==0.6.5 pycparser==3.12 pydantic==2.14.4 \
  pydantic_core==2.50.5 smmap==5.0.3 sqlparse==0.6.1 starlette==1.10.0 \
  typing-inspection==0.4.5 wcwidth==0.9.4 opentelemetry-api==1.45.2 \
  opentelemetry-proto==1.45.2 opentelemetry-sdk==1.45.2 \
  opentelemetry-semantic-conventions==0.66b2
SHARED="${SCARCELAB_SHARED_DATA:-../shared/data}"
cp "$SHARED/medmnist/pneumoniamnist.npz" "$SHARED/medmnist/breastmnist.npz" .gpudata/
du -sh .whl .gpudata
