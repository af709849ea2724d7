#!/usr/bin/env bash
# Optional peer libraries for bench/peers.py (USB's `semilearn` and `lightly`), kept OUT of
# the project venv: semilearn 0.3.2 pins old torch/numpy/scikit-learn, so it is installed
# with --no-deps into .peers-venv/ (which sees the project venv's torch through a .pth
# file), plus only the extra modules its FixMatch import path needs.
#
#     bash bench/install_peers.sh            # creates .peers-venv/ next to .venv/
#     .peers-venv/bin/python bench/peers.py  # or: bench/peers.py --peers-python ...
set -euo pipefail
cd "$(dirname "$0")/.."
BASE_PY="$(readlink -f .venv/bin/python)"
if [ ! -x .peers-venv/bin/python ]; then
  "$BASE_PY" -m venv .peers-venv
fi
# see the project venv's packages (torch 2.14.1, torchvision, numpy, ...) after our own:
# the project venv is itself a venv, so --system-site-packages would reach the base
# interpreter instead
PROJECT_SITE="$(.venv/bin/python -c 'import site; print(site.getsitepackages()[0])')"
PEERS_SITE="$(.peers-venv/bin/python -c 'import site; print(site.getsitepackages()[0])')"
echo "$PROJECT_SITE" > "$PEERS_SITE/scarcelab-project-venv.pth"
PIP=".peers-venv/bin/python -m pip install --disable-pip-version-check -q"
# the peers themselves, without their (old, pinned) dependency trees
$PIP --no-deps semilearn==0.3.2 lightly==1.6.0
# what `import semilearn` (FixMatch path) and `import lightly` actually import beyond the
# project venv (torch, torchvision, numpy, scikit-learn, pyyaml come from there)
$PIP --no-deps ruamel.yaml==0.18.6 ruamel.yaml.clib==0.2.12 progressbar==2.5 \
  lightly-utils==0.0.2 aenum==3.1.15 pytorch-lightning==2.5.0.post0 \
  lightning-utilities==0.11.9 torchmetrics==1.6.1 hydra-core==1.3.2 omegaconf==2.3.0 \
  antlr4-python3-runtime==4.9.3 timm==1.0.12 tensorboard==2.18.0 absl-py==2.1.0 2>&1 | tail -3 || true
# Check the imports the way bench/peers.py makes them: modules that `import semilearn`
# pulls in only for audio/NLP datasets and loggers (USB_OPTIONAL: torchaudio, which has no
# wheel for this torch here, transformers, wandb, ...) get the bench's inert stand-ins when
# absent, so "ok" means the bench's FixMatch worker can import USB.
.peers-venv/bin/python - <<'PY'
import importlib
import importlib.metadata
import sys

sys.path.insert(0, "bench")
from peers import USB_OPTIONAL, _stub_missing  # noqa: E402  (the bench's own run-time shim)

for m in ("semilearn", "lightly"):
    stubbed = _stub_missing(USB_OPTIONAL) if m == "semilearn" else []
    try:
        mod = importlib.import_module(m)
    except Exception as e:  # report, do not hide, what is still missing
        print(f"{m}: import fails: {type(e).__name__}: {e}")
        continue
    note = ""
    if stubbed:
        note = (f" (not installed, stood in for by bench/peers.py at run time, as here: "
                f"{', '.join(stubbed)}; none is on the FixMatch path)")
    print(f"{m} {getattr(mod, '__version__', None) or importlib.metadata.version(m)}: ok{note}")
PY
