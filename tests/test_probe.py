import numpy as np
import torch

from scarcelab.protocols.probe import LinearProbe


def _blobs(n, d, k, seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    centers = rng.normal(0, 3, (k, d))
    return centers[y] + rng.normal(0, 1, (n, d)), y


def test_probe_picks_best_on_val_and_linear_export_matches():
    x, y = _blobs(300, 5, 3, 0)
    p = LinearProbe(3).fit(x[:100], y[:100], x[100:200], y[100:200], np.random.default_rng(0))
    assert p.val_balanced_accuracy > 0.9 and 1e-3 <= p.C <= 1e3
    lin = p.to_linear()
    logits = lin(torch.as_tensor(x[200:], dtype=torch.float32))
    np.testing.assert_allclose(torch.softmax(logits, 1).detach().numpy(),
                               p.predict_proba(x[200:]), atol=1e-4)


def test_probe_binary_and_missing_class_export():
    x, y = _blobs(200, 4, 2, 1)
    p = LinearProbe(3).fit(x[:100], y[:100], x[100:], y[100:], np.random.default_rng(1))
    proba = p.predict_proba(x[100:])
    assert proba.shape == (100, 3) and np.allclose(proba[:, 2], 0)
    lin = p.to_linear()
    sm = torch.softmax(lin(torch.as_tensor(x[100:], dtype=torch.float32)), 1).detach().numpy()
    np.testing.assert_allclose(sm, proba, atol=1e-4)


def test_probe_deterministic_given_rng():
    x, y = _blobs(150, 4, 3, 2)
    a = LinearProbe(3).fit(x[:75], y[:75], x[75:], y[75:], np.random.default_rng(7))
    b = LinearProbe(3).fit(x[:75], y[:75], x[75:], y[75:], np.random.default_rng(7))
    assert a.C == b.C
