"""Every parameter that should learn receives a gradient (timm's ``test_model_backward``:
"every parameter has a gradient" over ``list_models()``), for every registered backbone and
every registered method's step.

Why: a head that is built but never reached by the loss (a projector whose output is
dropped, a layer created twice and the wrong copy used, a ``detach`` in the wrong place)
trains nothing and fails nowhere else — the loss still falls through the other parts. The
check is a gradient that is present, finite and nonzero somewhere, per parameter.

Nothing is skipped silently: a parameter that is legitimately idle is named in a table
below with its reason, and every table entry must match a parameter (a stale entry
fails). Frozen copies (EMA teachers, momentum encoders) must be frozen: no
``requires_grad`` and no gradient; buffers (queues, memory banks, running centres) too.
A parameter idle at step 0 only (a random branch not drawn, prototypes frozen for the
first steps, a meta-network with its own optimiser) must still learn within a few steps:
:func:`test_every_method_parameter_learns_within_a_few_steps`.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

from scarcelab.methods import METHODS, Method, Progress, get_method
from scarcelab.models import create_model, list_models
from scarcelab.train import BatchSource, data_info

# -- backbones ---------------------------------------------------------------------------
#: image side per arch: the smallest at which the last feature map before global pooling
#: is still 2x2, so that every BatchNorm (training mode, batch 2) normalises more than 2
#: values per channel. With 2 values BN outputs exactly ±1 whatever its input, and every
#: layer below it gets a gradient of ~0: the check would then measure the input size, not
#: the network. Downsampling: CIFAR-stem ResNets 8, WRNs and small_cnn 4, ImageNet stems 32.
SIDE: dict[str, int] = {"mlp": 4, "small_cnn": 8, "wrn16_2": 8, "wrn16_8": 8, "wrn28_2": 8,
                        "resnet18": 16, "resnet50": 16,
                        "resnet18_imagenet": 64, "resnet50_imagenet": 64}
#: an arch registered later (a plugin, a new file) gets the contract's CIFAR side
DEFAULT_SIDE = 32
#: archs whose ``in_channels`` is the flattened input size (tests/core/models/test_models.py's
#: FLAT_INPUT)
FLAT_INPUT = {"mlp"}
#: arch -> {parameter name: why it gets no gradient}; none today: every backbone
#: parameter is on the path from the image to the features
IDLE_BACKBONE_PARAMETERS: dict[str, dict[str, str]] = {}


def _side(arch: str) -> int:
    return SIDE.get(arch, DEFAULT_SIDE)


def _grad_problem(p: torch.Tensor) -> str | None:
    """Why ``p``'s gradient does not show learning, or None when it does."""
    if p.grad is None:
        return "no gradient (not reached by the loss)"
    if not torch.isfinite(p.grad).all():
        return "non-finite gradient"
    if not bool((p.grad != 0).any()):
        return "gradient zero everywhere"
    return None


@pytest.mark.parametrize("arch", list_models())
def test_every_backbone_parameter_gets_a_finite_nonzero_gradient(arch: str) -> None:
    """Forward a seeded batch of 2 through the backbone in training mode, back-propagate a
    loss that weighs every output feature (a fixed random projection, so no feature's
    gradient cancels by symmetry as a plain sum's could), then check every parameter."""
    side = _side(arch)
    torch.manual_seed(0)
    net = create_model(arch, in_channels=3 * side * side if arch in FLAT_INPUT else 3).train()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, side, side, generator=g)
    out = net(x)
    weights = torch.randn(out.shape, generator=g)
    (out * weights).sum().backward()

    idle = IDLE_BACKBONE_PARAMETERS.get(arch, {})
    names = dict(net.named_parameters())
    assert set(idle) <= set(names), f"stale entries for {arch}: {set(idle) - set(names)}"
    problems = {n: why for n, p in names.items() if p.requires_grad and n not in idle
                and (why := _grad_problem(p)) is not None}
    assert not problems, f"{arch}: parameters that would not learn: {problems}"
    assert all(p.requires_grad for p in names.values()), "a backbone freezes nothing itself"


# -- methods -----------------------------------------------------------------------------
#: method -> name prefixes of its frozen copies, with why; each must match a parameter,
#: and every parameter with ``requires_grad=False`` must match one of them
FROZEN: dict[str, dict[str, str]] = {
    "byol": {"target_backbone.": "momentum (EMA) target network, moved in after_optimizer_step",
             "target_projector.": "momentum (EMA) target projector"},
    "dino": {"teacher_backbone.": "momentum (EMA) teacher",
             "teacher_mlp.": "momentum (EMA) teacher head",
             "teacher_last.": "momentum (EMA) teacher prototypes"},
    "meanteacher": {"teacher.": "EMA teacher (Tarvainen & Valpola), updated after each step"},
    "moco": {"key_backbone.": "momentum key encoder", "key_projector.": "momentum key projector"},
}
#: method -> {regex over parameter names: why those may show no learning at step 0}.
#: Each must match a parameter; each such parameter must still learn within a few steps.
IDLE_AT_STEP_0: dict[str, dict[str, str]] = {
    "dsk": {r"(^|\.)(a|b|branch1|branch2)\.":
            "dual selective kernels: per unit and forward pass one of the two branches is "
            "drawn (w in {0, 1}); the other is computed but weighted 0, so its gradient is 0"},
    "ds3l": {r"^wnet\.": "the weighting meta-network is stepped by its own optimiser inside "
             "step (its gradient is cleared there so the shared optimiser never steps it)"},
    "swav": {r"^prototypes\.": "prototypes frozen (requires_grad False) for the first "
             "freeze_prototypes_frac of training, as the paper's first epoch"},
}
#: methods stepped by their own optimiser inside ``step``: learning shows as a change of
#: value, and the shared optimiser must find no gradient on them
OWN_OPTIMISER: dict[str, str] = {"ds3l": r"^wnet\."}
#: methods that rebuild the backbone (per-layout code paths): run on each layout too
REBUILDS_BACKBONE = ("dsk", "fconv", "harmonic", "scattering")
LAYOUTS = ("wrn16_2", "resnet18", "resnet50")  # WRN, basic and bottleneck blocks
BATCH = {"labeled": 8, "unlabeled": 16}


def _cases() -> list[tuple[str, str]]:
    cases = [(m, "small_cnn") for m in METHODS.names()]
    cases += [(m, a) for m in REBUILDS_BACKBONE for a in LAYOUTS]
    return cases


def _build(name: str, arch: str, bundle: Any) -> tuple[Method, BatchSource]:
    torch.manual_seed(0)
    cls = get_method(name)
    m = cls(create_model(arch, in_channels=bundle.channels), bundle.num_classes,
            dict(cls.defaults))
    m.on_train_start(data_info(bundle))
    m.train()
    src = BatchSource(bundle, cls, BATCH["labeled"], BATCH["unlabeled"] if cls.views else 0,
                      torch.device("cpu"), torch.Generator().manual_seed(0))
    return m, src


def _matching(patterns: dict[str, str], names: list[str], regex: bool) -> set[str]:
    hit = set()
    for pat in patterns:
        found = {n for n in names if (re.search(pat, n) if regex else n.startswith(pat))}
        assert found, f"stale entry {pat!r}: no parameter matches it"
        hit |= found
    return hit


def _check_frozen_and_buffers(name: str, m: Method) -> set[str]:
    """Frozen copies frozen, nothing else frozen, no buffer with a gradient; returns the
    frozen names."""
    params = dict(m.named_parameters())
    frozen = _matching(FROZEN.get(name, {}), list(params), regex=False)
    for n in frozen:
        assert not params[n].requires_grad, f"{name}: {n} is a frozen copy but requires grad"
        assert params[n].grad is None, f"{name}: frozen {n} received a gradient"
    for n, b in m.named_buffers():
        assert not b.requires_grad and b.grad is None, f"{name}: buffer {n} tracks a gradient"
    return frozen


@pytest.mark.parametrize(("name", "arch"), _cases())
def test_every_method_parameter_gets_a_gradient_at_step_0(name: str, arch: str,
                                                          tiny_bundle: Any) -> None:
    """One ``step`` at step 0 on a seeded synthetic batch, the total loss back-propagated:
    every trainable parameter (backbone, head, projector, predictor, prototypes) has a
    finite gradient, nonzero somewhere, unless IDLE_AT_STEP_0 names it; frozen copies
    and buffers have none."""
    m, src = _build(name, arch, tiny_bundle)
    out = m.step(src.next(), Progress(step=0, total_steps=10, epoch=0))
    out["loss"].backward()
    params = dict(m.named_parameters())
    frozen = _check_frozen_and_buffers(name, m)
    idle = _matching(IDLE_AT_STEP_0.get(name, {}), list(params), regex=True)
    stray = {n for n, p in params.items() if not p.requires_grad} - frozen - idle
    assert not stray, f"{name}: frozen but not declared in FROZEN: {sorted(stray)}"
    problems = {n: why for n, p in params.items() if n not in frozen | idle
                and (why := _grad_problem(p)) is not None}
    assert not problems, f"{name} on {arch}: parameters that would not learn: {problems}"
    for n in idle:  # idle is allowed, a non-finite gradient never is
        g = params[n].grad
        assert g is None or torch.isfinite(g).all(), f"{name}: {n} non-finite gradient"


@pytest.mark.parametrize(("name", "arch"), _cases())
def test_every_method_parameter_learns_within_a_few_steps(name: str, arch: str,
                                                          tiny_bundle: Any) -> None:
    """Steps across the schedule (progress 0, 0.1, ..., so ramps and freezes lift),
    gradients accumulated (no optimiser: the weights the gradients are taken at stay
    put, except what a method steps itself): every trainable parameter learns — a
    nonzero gradient, or, for a meta-network on its own optimiser, a changed value with
    no gradient left for the shared optimiser. The step-0 exceptions must lift here."""
    m, src = _build(name, arch, tiny_bundle)
    own = OWN_OPTIMISER.get(name)
    params = dict(m.named_parameters())
    frozen = _check_frozen_and_buffers(name, m)
    before = {n: p.detach().clone() for n, p in params.items()}
    learned: set[str] = set()
    wanted = set(params) - frozen
    total = 10
    for s in range(total):
        out = m.step(src.next(), Progress(step=s, total_steps=total, epoch=0))
        out["loss"].backward()
        for n in wanted - learned:
            p = params[n]
            if own and re.search(own, n):
                assert p.grad is None, f"{name}: {n} left a gradient for the shared optimiser"
                if not torch.equal(p.detach(), before[n]):
                    learned.add(n)
            elif _grad_problem(p) is None:
                learned.add(n)
        if learned == wanted:
            break
    assert learned == wanted, (f"{name} on {arch}: never learned in {total} steps: "
                               f"{sorted(wanted - learned)}")
    _check_frozen_and_buffers(name, m)
