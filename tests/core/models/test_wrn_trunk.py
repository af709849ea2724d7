"""The WideResNet trunk is written once (issue 26 item 5) and both WRN families still build
the same networks: same parameter names and shapes, same seeded initial weights, same
outputs and BatchNorm running statistics after a training-mode pass.

The reference values in ``tests/reference/wrn_trunk.json`` were recorded from the code
before the refactor (two separate trunks in ``wrn.py`` and ``wrn_deic.py``), with
torch.manual_seed(0) for the weights and a seeded N(0, 1) batch of four 16×16 images.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from scarcelab.models import create_model

REF = json.loads((Path(__file__).resolve().parents[2] / "reference" / "wrn_trunk.json").read_text())
CASES = {"wrn28_2": ("wrn28_2", False, 3), "wrn16_2": ("wrn16_2", False, 3),
         "wrn16_2_fconv": ("wrn16_2", True, 3), "wrn28_2_gray": ("wrn28_2", False, 1)}


def _run(name: str, full_conv: bool, in_ch: int) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    net = create_model(name, in_channels=in_ch)
    if full_conv:
        for m in net.modules():
            if getattr(m, "supports_full_conv", False):
                m.set_full_conv()
    x = torch.randn(4, in_ch, 16, 16, generator=torch.Generator().manual_seed(1))
    net.train()
    with torch.no_grad():
        net(x)  # running statistics move by each family's BatchNorm momentum
    net.eval()
    with torch.no_grad():
        return net, net(x)


@pytest.mark.parametrize("case", sorted(CASES))
def test_wrn_matches_the_pre_refactor_networks(case: str) -> None:
    ref = REF[case]
    net, out = _run(*CASES[case])
    sd = net.state_dict()
    assert [[k, list(v.shape)] for k, v in sd.items()] == ref["keys"]
    for k, v in sd.items():
        if v.is_floating_point():
            assert float(v.double().sum()) == pytest.approx(ref["sums"][k], rel=1e-6, abs=1e-6), k
    assert [float(v) for v in out[:2, :8].flatten()] == pytest.approx(ref["out"], abs=1e-5)
    assert float(out.double().sum()) == pytest.approx(ref["out_sum"], rel=1e-5)
    assert net.num_features == ref["num_features"]


def test_the_two_families_differ_where_their_papers_do() -> None:
    """One trunk, two settings: FixMatch's WRN-28-2 (BN momentum 0.001, leaky ReLU 0.1)
    and Tune-It's WRN-16-k (PyTorch's BN momentum 0.1, ReLU); swapping them would change
    the running statistics, which the reference sums above would catch too."""
    from scarcelab.models.wrn import WideResNet
    from scarcelab.models.wrn_deic import WideResNetDEIC

    a, b = create_model("wrn28_2", in_channels=3), create_model("wrn16_2", in_channels=3)
    assert type(a) is WideResNet and type(b) is WideResNetDEIC  # unet's stage split keys
    assert {m.momentum for m in a.modules() if isinstance(m, torch.nn.BatchNorm2d)} == {0.001}
    assert {m.momentum for m in b.modules() if isinstance(m, torch.nn.BatchNorm2d)} == {0.1}
    with pytest.raises(ValueError, match="6n\\+4"):
        create_model("wrn28_2", in_channels=3).__class__(3, depth=27)
