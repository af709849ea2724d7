"""Each hyperparameter changes what it names, by a hand-checkable amount (issue 26 item 4).

``test_hparams_exercised`` only sees that a test *names* a method's hyperparameter; the
tests here set it to two or more values and check that the loss, the pseudo-label mask,
the EMA update, the queue or the layer width moves exactly as the method's formula says,
so a method that ignored the value would fail. Semi-supervised steps reuse the ``MeanPixel``
set-up of ``test_semi_steps`` (an image of constant value ``m`` has logits
``(10m, 0, −10m)``), whose expected numbers are worked out in plain Python; the others use
a flattening backbone with no parameters, so the method's own modules are the only ones
in play, and recompute the expected value from those modules' outputs by the paper's
formula written out here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from scarcelab.active.loop import make_strategy
from scarcelab.methods import Batch, DataInfo, Progress, get_method
from tests.core.methods.test_semi_steps import (
    LOSS_L,
    STRONG,
    WEAK,
    C,
    _batch,
    _images,
    _method,
    argmax,
    ce,
    logits,
    softmax,
)
from tests.core.methods.test_tune_methods import _Feat

DONE = Progress(10, 10, 0)  # past every warm-up: the ramps are 1


def _tempered(v: float, temperature: float) -> list[float]:
    return softmax([z / temperature for z in logits(v)])


# ---------------------------------------------------------------------------------------
# lambda_u / lambda_c scale their term exactly


@pytest.mark.parametrize(("name", "views", "term", "key"), [
    ("flexmatch", 2, "loss_unlabeled", "lambda_u"),
    ("mixmatch", 2, "loss_unlabeled", "lambda_u"),
    ("softmatch", 2, "loss_unlabeled", "lambda_u"),
    ("comatch", 3, "loss_unlabeled", "lambda_u"),
    ("comatch", 3, "loss_contrastive", "lambda_c"),
])
def test_loss_weight_scales_its_term_exactly(name: str, views: int, term: str,
                                             key: str) -> None:
    """Same seed, same batch, weight 0.5 vs 3: the term itself is unchanged and the total
    moves by exactly (3 − 0.5) times it (a method reading a fixed weight would not move)."""
    outs = []
    for weight in (0.5, 3.0):
        m = _method(name, n_unlabeled=8, **{key: weight})
        torch.manual_seed(1)  # mixmatch's mixup draws from the global generator
        outs.append(m.step(_batch(m, [WEAK] + [STRONG] * (views - 1)), DONE))
    a, b = outs
    assert a[term].item() > 1e-3  # the test can see the weight
    assert b[term].item() == pytest.approx(a[term].item(), rel=1e-6)
    assert b["loss"].item() - a["loss"].item() == pytest.approx(2.5 * a[term].item(),
                                                                rel=1e-5)


# ---------------------------------------------------------------------------------------
# confidence thresholds and temperatures decide which pseudo-labels pass


@pytest.mark.parametrize(("temperature", "mask"), [
    (1.0, [1.0, 0.0, 1.0, 0.0]),  # confidences 0.99995, 0.867, 0.99995, 0.51
    (0.5, [1.0, 1.0, 1.0, 0.0]),  # 0.2 -> logits (4, 0, -4): 0.982; 0.05 -> 0.665
    (2.0, [1.0, 0.0, 1.0, 0.0]),  # 1.0 -> logits (5, 0, -5): 0.9933
])
def test_fixmatch_temperature_sharpens_the_weak_prediction(temperature: float,
                                                           mask: list[float]) -> None:
    m = _method("fixmatch", temperature=temperature)
    out = m.step(_batch(m, [WEAK, STRONG]), Progress(0, 10, 0))
    probs = [_tempered(v, temperature) for v in WEAK]
    assert [1.0 if max(p) >= 0.95 else 0.0 for p in probs] == mask  # the comment's numbers
    pseudo = [argmax(p) for p in probs]
    loss_u = sum(k * ce(logits(s), y) for k, s, y in zip(mask, STRONG, pseudo, strict=True)) / 4
    assert out["mask_rate"].item() == pytest.approx(sum(mask) / 4)
    assert out["loss_unlabeled"].item() == pytest.approx(loss_u, rel=1e-5)


@pytest.mark.parametrize(("temperature", "mask"), [
    (1.0, [1.0, 0.0, 1.0, 0.0]),
    (0.5, [1.0, 1.0, 1.0, 0.0]),  # sample 1 (class 0, threshold 0.95) now reaches 0.982
])
def test_flexmatch_temperature_sharpens_before_the_class_thresholds(
        temperature: float, mask: list[float]) -> None:
    """Class thresholds (0.95, 0.3167, 0) from pool counts (2, 1, 0), no warm-up."""
    m = _method("flexmatch", n_unlabeled=8, temperature=temperature, threshold_warmup=False)
    m.status.selected.copy_(torch.tensor([0, 0, 1, -1, -1, -1, -1, -1]))
    out = m.step(_batch(m, [WEAK, STRONG]), Progress(0, 10, 0))
    probs = [_tempered(v, temperature) for v in WEAK]
    pseudo = [argmax(p) for p in probs]
    thr = [0.95 * s / (2 - s) for s in (1.0, 0.5, 0.0)]
    assert [1.0 if max(p) >= thr[c] else 0.0 for p, c in zip(probs, pseudo, strict=True)] == mask
    loss_u = sum(k * ce(logits(s), y) for k, s, y in zip(mask, STRONG, pseudo, strict=True)) / 4
    assert out["mask_rate"].item() == pytest.approx(sum(mask) / 4)
    assert out["loss_unlabeled"].item() == pytest.approx(loss_u, rel=1e-5)


@pytest.mark.parametrize(("threshold", "mask"), [
    (0.5, [1.0, 1.0, 1.0, 1.0]),
    (0.9, [1.0, 0.0, 1.0, 0.0]),
    (0.99999, [0.0, 0.0, 0.0, 0.0]),
])
def test_pseudolabel_threshold_masks_the_unconfident(threshold: float,
                                                     mask: list[float]) -> None:
    """Prediction and target share the one weak view: confidences 0.99995, 0.867, 0.99995,
    0.51."""
    m = _method("pseudolabel", threshold=threshold)
    out = m.step(_batch(m, [WEAK]), DONE)
    probs = [softmax(logits(v)) for v in WEAK]
    assert [1.0 if max(p) >= threshold else 0.0 for p in probs] == mask
    loss_u = sum(k * ce(logits(v), argmax(p)) for k, v, p in zip(mask, WEAK, probs,
                                                                   strict=True)) / 4
    assert out["mask_rate"].item() == pytest.approx(sum(mask) / 4)
    assert out["loss_unlabeled"].item() == pytest.approx(loss_u, rel=1e-5, abs=1e-8)
    assert out["loss"].item() == pytest.approx(LOSS_L + loss_u, rel=1e-5)


def _aligned_first_batch(values: list[float]) -> list[list[float]]:
    """Distribution alignment on a first batch: p · (1/C) / mean p, renormalised."""
    probs = [softmax(logits(v)) for v in values]
    p_model = [sum(p[c] for p in probs) / len(probs) for c in range(C)]
    out = []
    for p in probs:
        a = [p[c] * (1 / C + 1e-6) / (p_model[c] + 1e-6) for c in range(C)]
        out.append([x / sum(a) for x in a])
    return out


@pytest.mark.parametrize("threshold", [0.5, 0.9, 0.99999])
def test_comatch_threshold_masks_the_smoothed_pseudo_labels(threshold: float) -> None:
    """Memory not yet full: q is the aligned weak prediction; the mask is max q ≥ τ."""
    m = _method("comatch", threshold=threshold)
    out = m.step(_batch(m, [WEAK, STRONG, STRONG]), Progress(0, 10, 0))
    conf = [max(a) for a in _aligned_first_batch(WEAK)]
    mask = [1.0 if c >= threshold else 0.0 for c in conf]
    assert out["mask_rate"].item() == pytest.approx(sum(mask) / 4)
    rates = {0.5: 1.0, 0.9: 0.5, 0.99999: 0.0}  # aligned: 0.99975, 0.558, 0.99987, 0.663
    assert sum(mask) / 4 == rates[threshold]


@pytest.mark.parametrize("window", [1, 2, 32])
def test_comatch_da_window_averages_that_many_batch_means(window: int) -> None:
    m = _method("comatch", da_window=window)
    batches = [WEAK, STRONG, [0.3, 0.3, -0.2, 0.1]]
    z = F.normalize(torch.ones(4, int(m.hp["proj_dim"])), dim=1)
    for b in batches:
        m._targets(torch.tensor([logits(v) for v in b]), z, update=True)
    means = [[sum(softmax(logits(v))[c] for v in b) / 4 for c in range(C)] for b in batches]
    kept = means[-window:]
    expected = [sum(mu[c] for mu in kept) / len(kept) for c in range(C)]
    torch.testing.assert_close(m.align.p_model, torch.tensor(expected), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("cutoff", [0.0, 1.0])
def test_comatch_contrast_threshold_cuts_the_pseudo_label_graph(cutoff: float) -> None:
    """At 1 only the self-loops survive (q_i·q_j < 1 between different soft labels): the
    graph is the identity and the loss is instance-contrastive, −mean_i log softmax(z_s0
    z_s1ᵀ / T)_ii; at 0 every edge stays and the loss differs from that."""
    m = _method("comatch", contrast_threshold=cutoff)
    b = _batch(m, [WEAK, STRONG, [0.5, -0.5, 0.2, 0.0]])
    with torch.no_grad():  # BatchNorm in training mode: same outputs as inside step
        z = F.normalize(m.projector(m.backbone(torch.cat([b.x[0], *b.u]))), dim=1)
    z_s0, z_s1 = z[7:11], z[11:15]
    log_sim = F.log_softmax(z_s0 @ z_s1.t() / float(m.hp["temperature"]), dim=1)
    instance = -log_sim.diagonal().mean().item()
    out = m.step(b, Progress(0, 10, 0))
    if cutoff == 1.0:
        assert out["loss_contrastive"].item() == pytest.approx(instance, rel=1e-5)
    else:
        assert abs(out["loss_contrastive"].item() - instance) > 1e-4


@pytest.mark.parametrize("cutoff", [1.5, -0.1])
def test_comatch_refuses_a_contrast_threshold_that_cuts_every_edge(cutoff: float) -> None:
    """Above 1 even the self-loops go and the row normalisation divides by zero (the loss
    was NaN); refused when the method is built and, for a user's override, before any
    data is loaded, naming the key and the valid range."""
    from scarcelab.errors import ConfigError
    from scarcelab.protocols.search import StudyConfig, _validate

    with pytest.raises(ConfigError, match=r"comatch: contrast_threshold=.* outside \[0, 1\]"):
        _method("comatch", contrast_threshold=cutoff)
    cfg = StudyConfig(method="comatch", dataset="synthetic_tiny",
                      overrides={"contrast_threshold": cutoff})
    with pytest.raises(ConfigError, match="contrast_threshold"):
        _validate(cfg, get_method("comatch"))
    _validate(StudyConfig(method="comatch", dataset="synthetic_tiny",
                          overrides={"contrast_threshold": 1.0}), get_method("comatch"))


# ---------------------------------------------------------------------------------------
# SoftMatch's weighting


def _var(xs: list[float]) -> float:
    mu = sum(xs) / len(xs)
    return sum((x - mu) ** 2 for x in xs) / (len(xs) - 1)


#: running confidence statistics set before the step: from the initial μ = 1/C every
#: confidence is above the mean and gets weight 1 whatever n is
MU0, VAR0 = 0.9, 0.25


def _softmatch_weights(conf: list[float], n_sigma: float) -> list[float]:
    mu = 0.999 * MU0 + 0.001 * sum(conf) / 4  # the EMA takes this batch in first
    var = 0.999 * VAR0 + 0.001 * _var(conf)
    return [math.exp(-(min(c - mu, 0.0) ** 2) / (2 * var / n_sigma**2)) for c in conf]


@pytest.mark.parametrize("n_sigma", [0.5, 2.0, 8.0])
def test_softmatch_n_sigma_narrows_the_truncated_gaussian(n_sigma: float) -> None:
    m = _method("softmatch", n_sigma=n_sigma)
    m.weighting.mu.fill_(MU0)
    m.weighting.var.fill_(VAR0)
    out = m.step(_batch(m, [WEAK, STRONG]), Progress(0, 10, 0))
    weight = _softmatch_weights([max(a) for a in _aligned_first_batch(WEAK)], n_sigma)
    assert out["weight_mean"].item() == pytest.approx(sum(weight) / 4, rel=1e-5)
    pseudo = [argmax(softmax(logits(v))) for v in WEAK]
    loss_u = sum(w * ce(logits(s), y) for w, s, y in zip(weight, STRONG, pseudo, strict=True)) / 4
    assert out["loss_unlabeled"].item() == pytest.approx(loss_u, rel=1e-5)


def test_softmatch_n_sigma_cases_differ() -> None:
    """The three cases above are distinguishable: the weight falls as n grows."""
    conf = [max(a) for a in _aligned_first_batch(WEAK)]
    means = [sum(_softmatch_weights(conf, n)) / 4 for n in (0.5, 2.0, 8.0)]
    assert means[0] > means[1] + 1e-4 and means[1] > means[2] + 1e-4
    assert get_method("softmatch").defaults["n_sigma"] == 2.0


@pytest.mark.parametrize("uniform_alignment", [True, False])
def test_softmatch_uniform_alignment_sets_the_weights_confidence(
        uniform_alignment: bool) -> None:
    m = _method("softmatch", uniform_alignment=uniform_alignment)
    m.weighting.mu.fill_(MU0)
    m.weighting.var.fill_(VAR0)
    out = m.step(_batch(m, [WEAK, STRONG]), Progress(0, 10, 0))
    probs = _aligned_first_batch(WEAK) if uniform_alignment else [softmax(logits(v))
                                                                  for v in WEAK]
    weight = _softmatch_weights([max(p) for p in probs], 2.0)
    assert out["weight_mean"].item() == pytest.approx(sum(weight) / 4, rel=1e-5)
    assert int(m.align.n_seen) == (1 if uniform_alignment else 0)
    other = _aligned_first_batch(WEAK) if not uniform_alignment else [
        softmax(logits(v)) for v in WEAK]
    assert abs(sum(_softmatch_weights([max(p) for p in other], 2.0)) - sum(weight)) > 1e-3


# ---------------------------------------------------------------------------------------
# MixMatch


@pytest.mark.parametrize("temperature", [0.25, 0.5, 1.0])
def test_mixmatch_temperature_sharpens_the_guessed_label(temperature: float) -> None:
    """Guess = mean of the two views' predictions, raised to 1/T and renormalised."""
    m = _method("mixmatch", temperature=temperature)
    q = m.guess_labels([_images(WEAK), _images(STRONG)])
    for row, a, b in zip(q.tolist(), WEAK, STRONG, strict=True):
        mean = [(x + y) / 2 for x, y in zip(softmax(logits(a)), softmax(logits(b)),
                                            strict=True)]
        p = [x ** (1 / temperature) for x in mean]
        assert row == pytest.approx([x / sum(p) for x in p], rel=1e-4, abs=1e-7)


@pytest.mark.parametrize("alpha", [0.0, 1000.0])
def test_mixmatch_alpha_sets_how_far_mixup_mixes(alpha: float) -> None:
    """α = 0: no mixing (λ = 1 exactly, the labeled loss is plain CE on the labeled
    images); α = 1000: Beta(α, α) has sd ≈ 0.011, so λ' = max(λ, 1 − λ) lies within a few
    hundredths of ½ for every seed."""
    for seed in range(4):
        m = _method("mixmatch", alpha=alpha)
        torch.manual_seed(seed)
        out = m.step(_batch(m, [WEAK, STRONG]), DONE)
        lam = out["mixup_lambda"].item()
        if alpha == 0.0:
            assert lam == 1.0
            assert out["loss_labeled"].item() == pytest.approx(LOSS_L, rel=1e-5)
        else:
            assert 0.5 <= lam < 0.56


# ---------------------------------------------------------------------------------------
# Mean Teacher's EMA


@pytest.mark.parametrize("ema_decay", [0.0, 0.5, 0.9])
def test_meanteacher_ema_decay_moves_the_teacher(ema_decay: float) -> None:
    """Late in training (step 1000, so the 1 − 1/(step+1) cap is above the decay), the
    teacher's head becomes d·old + (1 − d)·student."""
    m = _method("meanteacher", ema_decay=ema_decay)
    old = m.teacher.model[1].weight.detach().clone()
    with torch.no_grad():
        m.head.weight.add_(1.0)
    student = m.head.weight.detach().clone()
    assert (student - old).abs().min() > 0.1  # teacher and student differ everywhere
    m.after_optimizer_step(Progress(1000, 2000, 0))
    torch.testing.assert_close(m.teacher.model[1].weight,
                               ema_decay * old + (1 - ema_decay) * student)


# ---------------------------------------------------------------------------------------
# DS3L


@pytest.mark.parametrize("wnet_hidden", [3, 100])
def test_ds3l_wnet_hidden_is_the_meta_network_width(wnet_hidden: int) -> None:
    m = _method("ds3l", wnet_hidden=wnet_hidden)
    assert m.wnet[0].weight.shape == (wnet_hidden, C)
    assert m.wnet[2].weight.shape == (1, wnet_hidden)
    out = m.step(_batch(m, [WEAK, STRONG]), DONE)  # and it trains at that width
    assert math.isfinite(out["loss"].item())


# ---------------------------------------------------------------------------------------
# self-supervised and supervised methods on a flattening backbone: 4 "pixels" -> 4 features

N = 6


def _flat(name: str, **hp: object):
    torch.manual_seed(0)
    cls = get_method(name)
    return cls(_Feat(4), C, {**cls.defaults, **hp})


def _views(n_views: int = 2, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(N, 1, 2, 2, generator=g) for _ in range(n_views)]


def _selfsup_batch(seed: int = 0) -> Batch:
    return Batch(x=[], y=torch.zeros(0, dtype=torch.long), u=_views(seed=seed))


@pytest.mark.parametrize(("name", "key"), [
    ("simclr", "proj_dim"), ("moco", "proj_dim"), ("swav", "proj_dim"),
    ("barlowtwins", "proj_dim"), ("supcon", "proj_dim"),
])
@pytest.mark.parametrize("width", [5, 9])
def test_proj_dim_is_the_projection_width(name: str, key: str, width: int) -> None:
    m = _flat(name, **{key: width})
    z = m.projector(m.backbone(torch.cat(_views())))
    assert z.shape == (2 * N, width)
    if name == "moco":  # the queue holds projections of that width
        assert m.queue.feats.shape[1] == width
        assert m.key_projector(m.backbone(torch.cat(_views()))).shape == (2 * N, width)
    if name == "swav":
        assert m.prototypes.weight.shape[1] == width
    if name == "barlowtwins":  # 3 layers, all of that width
        assert all(lin.out_features == width for lin in m.projector.net
                   if isinstance(lin, torch.nn.Linear))
    if name == "supcon":
        out = m.step(Batch(x=_views(), y=torch.tensor([0, 1, 2, 0, 1, 2]), u=[]), DONE)
    else:
        out = m.step(_selfsup_batch(), DONE)
    assert math.isfinite(out["loss"].item())


def _standardise(z: torch.Tensor) -> torch.Tensor:
    return (z - z.mean(0)) / torch.sqrt(z.var(0, unbiased=False) + 1e-5)


@pytest.mark.parametrize("lambd", [0.0, 5e-3, 1.0])
def test_barlowtwins_lambd_weighs_the_off_diagonal(lambd: float) -> None:
    """Loss = Σ_i (1 − C_ii)² + λ Σ_{i≠j} C_ij², C the cross-correlation of the two
    views' standardised projections."""
    m = _flat("barlowtwins", lambd=lambd, proj_dim=8)
    b = _selfsup_batch()
    with torch.no_grad():
        z1, z2 = m.projector(m.backbone(torch.cat(b.u))).split([N, N])
    c = _standardise(z1).t() @ _standardise(z2) / N
    on = ((1 - c.diagonal()) ** 2).sum().item()
    off = (c**2).sum().item() - (c.diagonal() ** 2).sum().item()
    assert off > 0.1  # the weight has something to weigh
    assert m.step(b, DONE)["loss"].item() == pytest.approx(on + lambd * off, rel=1e-4)


def _dino_outputs(m, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(student, teacher) logits as DINO's step computes them (training mode)."""
    with torch.no_grad():
        student = m.head_last(m.head_mlp(m.backbone(x)))
        teacher = m.teacher_last(m.teacher_mlp(m.teacher_backbone(x)))
    return student, teacher


@pytest.mark.parametrize(("out_dim", "bottleneck_dim"), [(16, 3), (40, 7)])
def test_dino_out_dim_and_bottleneck_dim_are_the_head_widths(out_dim: int,
                                                             bottleneck_dim: int) -> None:
    m = _flat("dino", out_dim=out_dim, bottleneck_dim=bottleneck_dim)
    x = torch.cat(_views())
    assert m.head_mlp(m.backbone(x)).shape == (2 * N, bottleneck_dim)
    assert m.head_last.weight.shape == (out_dim, bottleneck_dim)
    student, teacher = _dino_outputs(m, x)
    assert student.shape == teacher.shape == (2 * N, out_dim)
    m.step(_selfsup_batch(), DONE)
    assert m.center.shape == (1, out_dim)


@pytest.mark.parametrize("center_momentum", [0.0, 0.5, 0.9])
def test_dino_center_momentum_mixes_the_batch_means(center_momentum: float) -> None:
    """The centre starts at the first batch's teacher mean; after a second batch it is
    m·mean₁ + (1 − m)·mean₂ (no optimiser step, so the teacher is unchanged)."""
    m = _flat("dino", center_momentum=center_momentum, out_dim=16, bottleneck_dim=4)
    b1, b2 = _selfsup_batch(0), _selfsup_batch(1)
    mean1 = _dino_outputs(m, torch.cat(b1.u))[1].mean(0, keepdim=True)
    mean2 = _dino_outputs(m, torch.cat(b2.u))[1].mean(0, keepdim=True)
    assert (mean1 - mean2).abs().max() > 1e-3
    m.step(b1, DONE)
    torch.testing.assert_close(m.center, mean1)
    m.step(b2, DONE)
    torch.testing.assert_close(m.center, center_momentum * mean1
                               + (1 - center_momentum) * mean2)


def _cross_entropy_pairs(targets: list[torch.Tensor], logps: list[torch.Tensor]) -> float:
    """Mean over ordered view pairs s ≠ t of −Σ_k target_t log p_s, averaged over rows."""
    total, pairs = 0.0, 0
    for t, p in enumerate(targets):
        for s, lq in enumerate(logps):
            if s != t:
                total -= (p * lq).sum(1).mean().item()
                pairs += 1
    return total / pairs


@pytest.mark.parametrize("teacher_temperature", [0.04, 0.2])
def test_dino_teacher_temperature_sharpens_the_target(teacher_temperature: float) -> None:
    """First step: centre = the batch's teacher mean; loss = cross-entropy of the student
    (T = 0.1) to softmax((teacher − centre) / τt), over the two view pairs."""
    m = _flat("dino", teacher_temperature=teacher_temperature, out_dim=16, bottleneck_dim=4)
    b = _selfsup_batch()
    student, teacher = _dino_outputs(m, torch.cat(b.u))
    center = teacher.mean(0, keepdim=True)
    targets = [torch.softmax((t - center) / teacher_temperature, 1) for t in teacher.split(N)]
    logps = [torch.log_softmax(s / 0.1, 1) for s in student.split(N)]
    expected = _cross_entropy_pairs(targets, logps)
    other = [torch.softmax((t - center) / (0.24 - teacher_temperature), 1)
             for t in teacher.split(N)]
    assert abs(_cross_entropy_pairs(other, logps) - expected) > 1e-3  # 0.04 vs 0.2 differ
    assert m.step(b, DONE)["loss"].item() == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize("queue_size", [3, 8, 40, 1000])
def test_moco_queue_size_bounds_the_queue(queue_size: int) -> None:
    """The queue holds min(queue_size, n_unlabeled / 2) keys; one step enqueues 2N = 12."""
    m = _flat("moco", queue_size=queue_size)
    m.on_train_start(DataInfo(n_labeled=0, n_unlabeled=100, num_classes=C,
                              labeled_class_counts=[0] * C))
    assert m.queue.size == min(queue_size, 50)
    m.step(_selfsup_batch(), DONE)
    m.after_optimizer_step(DONE)
    assert m.queue.filled == min(queue_size, 50, 2 * N)
    m.step(_selfsup_batch(1), DONE)
    m.after_optimizer_step(DONE)
    assert m.queue.filled == min(queue_size, 50, 4 * N)


def _sinkhorn(scores: torch.Tensor, epsilon: float, iterations: int) -> torch.Tensor:
    """SwAV's Algorithm (plain, not log-domain): exp(S/ε), then alternately every
    prototype to mass 1/K and every sample to mass 1/N; rows rescaled to sum to 1."""
    q = torch.exp(scores.double() / epsilon).t()
    k, n = q.shape
    for _ in range(iterations):
        q = q / q.sum(1, keepdim=True) / k
        q = q / q.sum(0, keepdim=True) / n
    return (q * n).t()


@pytest.mark.parametrize(("epsilon", "sinkhorn_iterations"), [(0.05, 3), (0.5, 1), (0.05, 12)])
def test_swav_epsilon_and_sinkhorn_iterations_shape_the_codes(
        epsilon: float, sinkhorn_iterations: int) -> None:
    m = _flat("swav", epsilon=epsilon, sinkhorn_iterations=sinkhorn_iterations,
              n_prototypes=5, proj_dim=8)
    b = _selfsup_batch()
    with torch.no_grad():
        scores = m.prototypes(m.projector(m.backbone(torch.cat(b.u)))).split([N, N])
    logps = [torch.log_softmax(s.double() / 0.1, 1) for s in scores]

    def loss(eps: float, iters: int) -> float:  # view t predicts the other view's code
        return _cross_entropy_pairs([_sinkhorn(s, eps, iters) for s in scores], logps)

    expected = loss(epsilon, sinkhorn_iterations)
    others = [loss(e, i) for e, i in [(0.05, 3), (0.5, 1), (0.05, 12)]
              if (e, i) != (epsilon, sinkhorn_iterations)]
    assert all(abs(o - expected) > 1e-4 for o in others)  # the cases differ
    assert m.step(b, DONE)["loss"].item() == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize(("freeze_prototypes_frac", "frozen"), [(0.5, True), (0.1, False)])
def test_swav_freeze_prototypes_frac_freezes_them_early(freeze_prototypes_frac: float,
                                                        frozen: bool) -> None:
    """At 30 % of training the prototypes get a gradient only once that fraction is past."""
    m = _flat("swav", freeze_prototypes_frac=freeze_prototypes_frac, n_prototypes=5)
    m.step(_selfsup_batch(), Progress(3, 10, 0))["loss"].backward()
    grad = m.prototypes.weight.grad
    if frozen:
        assert grad is None
    else:
        assert grad is not None and grad.abs().max() > 0
    assert m.projector.net[0].weight.grad.abs().max() > 0  # the encoder trains either way


def _supcon_by_hand(z: torch.Tensor, labels: list[int], temperature: float) -> float:
    zn = F.normalize(z.double(), dim=1).tolist()
    n, total, anchors = len(zn), 0.0, 0
    for i in range(n):
        sims = [sum(a * b for a, b in zip(zn[i], zn[j], strict=True)) / temperature
                for j in range(n)]
        lse = math.log(sum(math.exp(sims[j]) for j in range(n) if j != i))
        pos = [j for j in range(n) if j != i and labels[j] == labels[i]]
        if pos:
            total += -sum(sims[j] - lse for j in pos) / len(pos)
            anchors += 1
    return total / anchors


@pytest.mark.parametrize("temperature", [0.1, 0.5])
def test_supcon_temperature_scales_the_similarities(temperature: float) -> None:
    m = _flat("supcon", temperature=temperature, proj_dim=8)
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    x = _views()
    with torch.no_grad():
        z = m.projector(m.backbone(torch.cat(x)))
    labels = y.tolist() * 2
    expected = _supcon_by_hand(z, labels, temperature)
    assert abs(_supcon_by_hand(z, labels, 0.6 - temperature) - expected) > 1e-3
    out = m.step(Batch(x=x, y=y, u=[]), DONE)
    assert out["loss"].item() == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize("xent_weight", [0.01, 1.0, 10.0])
def test_cosine_ce_xent_weight_weighs_the_cross_entropy(xent_weight: float) -> None:
    """L = (1 − cos) + λ_xent · CE: the total moves with λ by exactly the CE term."""
    m = _flat("cosine_ce", xent_weight=xent_weight)
    out = m.step(Batch(x=[_views(1)[0]], y=torch.tensor([0, 1, 2, 0, 1, 2]), u=[]), DONE)
    assert out["xent"].item() > 0.1
    assert out["loss"].item() == pytest.approx(
        out["cosine"].item() + xent_weight * out["xent"].item(), rel=1e-5)


@pytest.mark.parametrize("kappa", [0.0, 4.0, 16.0])
def test_tvmf_kappa_sharpens_the_similarity(kappa: float) -> None:
    """Class directions (1, 0), (0, 1), (−1, 0) and the feature (1, 1): cosines
    (0.7071, 0.7071, −0.7071), φ_κ(c) = (1 + c) / (1 + κ(1 − c)) − 1; κ = 0 is the cosine."""
    torch.manual_seed(0)
    m = get_method("tvmf")(_Feat(2), C, {**get_method("tvmf").defaults, "kappa": kappa})
    with torch.no_grad():
        m.head.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]]))
    x = torch.tensor([[[[1.0, 1.0]]]])
    c = [1 / math.sqrt(2), 1 / math.sqrt(2), -1 / math.sqrt(2)]
    phi = [(1 + v) / (1 + kappa * (1 - v)) - 1 for v in c]
    assert m.logits(x)[0].tolist() == pytest.approx(phi, rel=1e-5, abs=1e-6)
    s = 1 + math.log(2)  # the learned scale starts at 1 + softplus(0)
    out = m.step(Batch(x=[x], y=torch.tensor([2]), u=[]), DONE)
    assert out["loss"].item() == pytest.approx(ce([s * v for v in phi], 2), rel=1e-5)


# ---------------------------------------------------------------------------------------
# CoreGCN's graph network (the strategy's parameters)


def _pool_embeddings() -> np.ndarray:
    return np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)


def _gcn_features(name: str, n_labeled: int = 3, **params: object) -> np.ndarray:
    strat = make_strategy(name, params)
    return strat.gcn_features(_pool_embeddings(), n_labeled, torch.Generator().manual_seed(0))


def _untrained_features(hidden: int) -> np.ndarray:
    """relu(Â X W1) with W1 the generator's first draw, U(−1/√d, 1/√d); Â = the cosine
    graph without self-loops, negative edges cut, rows normalised, plus the identity."""
    x = torch.from_numpy(_pool_embeddings())
    e = F.normalize(x, dim=1)
    adj = (e @ e.t()).fill_diagonal_(0.0).clamp_min(0.0)
    adj = adj / adj.sum(1, keepdim=True) + torch.eye(len(x))
    w1 = (torch.rand(4, hidden, generator=torch.Generator().manual_seed(0)) * 2 - 1) / 2.0
    return torch.relu(adj @ x @ w1).numpy()


@pytest.mark.parametrize("hidden", [3, 16])
def test_coregcn_hidden_is_the_feature_width(hidden: int) -> None:
    assert _gcn_features("coregcn", hidden=hidden, epochs=2).shape == (8, hidden)


def test_coregcn_epochs_and_lr_train_the_first_layer() -> None:
    """No epoch, or epochs at lr 0, leave W1 at its initial draw (features computed by
    hand); some epochs at lr > 0 move it."""
    untrained = _untrained_features(64)
    np.testing.assert_allclose(_gcn_features("coregcn", epochs=0), untrained, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_gcn_features("coregcn", epochs=5, lr=0.0), untrained,
                               rtol=1e-5, atol=1e-6)
    trained = _gcn_features("coregcn", epochs=5, lr=1e-2)
    assert np.abs(trained - untrained).max() > 1e-3
    assert np.abs(_gcn_features("coregcn", epochs=20, lr=1e-2) - trained).max() > 1e-3


def test_coregcn_weight_decay_shrinks_the_first_layer() -> None:
    """Adam with L2 decay: a decay that dwarfs the loss's gradient pulls W1 to ~0 (Adam
    steps of size ≈ lr against its sign), so the features shrink; without it they do not."""
    plain = np.abs(_gcn_features("coregcn", epochs=30, lr=5e-2, weight_decay=0.0)).sum()
    decayed = np.abs(_gcn_features("coregcn", epochs=30, lr=5e-2, weight_decay=1e3)).sum()
    assert decayed < 0.3 * plain


def test_coregcn_lambda_u_and_dropout_change_the_training() -> None:
    """The unlabeled nodes' weight and the dropout rate both enter each epoch's loss: a
    different value gives different features from the same seed."""
    base = _gcn_features("coregcn", epochs=10, lr=1e-2)
    for params in ({"lambda_u": 0.0}, {"lambda_u": 10.0}, {"dropout": 0.0},
                   {"dropout": 0.8}):
        other = _gcn_features("coregcn", epochs=10, lr=1e-2, **params)
        assert np.abs(other - base).max() > 1e-4, params


def test_coregcn_lambda_u_weighs_the_unlabeled_nodes() -> None:
    """With no labeled node the loss is λU times the unlabeled BCE: λU = 0 leaves nothing
    to learn (features stay at the initial draw, no weight decay), and λU = 1 vs 5 only
    rescale the loss, which Adam's normalised step ignores (the same features)."""
    untrained = _untrained_features(64)
    kw = {"n_labeled": 0, "epochs": 10, "lr": 1e-2, "weight_decay": 0.0}
    np.testing.assert_allclose(_gcn_features("coregcn", lambda_u=0.0, **kw), untrained,
                               rtol=1e-5, atol=1e-6)
    one = _gcn_features("coregcn", lambda_u=1.0, **kw)
    assert np.abs(one - untrained).max() > 1e-3
    np.testing.assert_allclose(_gcn_features("coregcn", lambda_u=5.0, **kw), one, rtol=1e-3,
                               atol=1e-5)
    # with labeled nodes λU = 0 still trains (the labeled term), unlike above
    assert np.abs(_gcn_features("coregcn", lambda_u=0.0, **{**kw, "n_labeled": 3})
                  - untrained).max() > 1e-3


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_coregcn_dropout_is_inverted_dropout_at_that_rate(dropout: float) -> None:
    """Against the paper's two-layer GCN written out here (3 epochs, Adam, BCE with
    labeled nodes 1 and weight 1, unlabeled 0 and weight λU): each epoch drops hidden
    units with probability p and scales the kept ones by 1/(1 − p), drawing the mask from
    the same generator after the two weight draws."""
    emb = torch.from_numpy(_pool_embeddings())
    e = F.normalize(emb, dim=1)
    adj = (e @ e.t()).fill_diagonal_(0.0).clamp_min(0.0)
    adj = adj / adj.sum(1, keepdim=True) + torch.eye(8)
    gen = torch.Generator().manual_seed(0)
    w1 = ((torch.rand(4, 5, generator=gen) * 2 - 1) / 2.0).requires_grad_()
    w2 = ((torch.rand(5, 1, generator=gen) * 2 - 1) / math.sqrt(5)).requires_grad_()
    opt = torch.optim.Adam([w1, w2], lr=1e-2, weight_decay=0.0)
    target = torch.tensor([[1.0]] * 3 + [[0.0]] * 5)
    weight = torch.tensor([[1.0]] * 3 + [[1.2]] * 5)
    for _ in range(3):
        h = torch.relu(adj @ emb @ w1)
        keep = (torch.rand(h.shape, generator=gen) >= dropout).float()
        out = adj @ ((h * keep / (1 - dropout)) @ w2)
        opt.zero_grad()
        F.binary_cross_entropy_with_logits(out, target, weight=weight).backward()
        opt.step()
    expected = torch.relu(adj @ emb @ w1).detach().numpy()
    got = _gcn_features("coregcn", hidden=5, epochs=3, lr=1e-2, weight_decay=0.0,
                        lambda_u=1.2, dropout=dropout)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
