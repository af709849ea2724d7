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

import pytest
import torch
import torch.nn.functional as F

from scarcelab.methods import Progress, get_method
from tests.test_semi_steps import (
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
