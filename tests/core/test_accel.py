"""Precision and kernels (``scarcelab.accel``, issue 40 item 2): how ``auto`` resolves per
device, that every training loop applies every setting it is given (seen from inside the
network: a spy on the convolutions records whether autocast was on and which layout the
input and weights had, a spy on the optimisers whether their kernel is fused), that each
method trains under bf16 autocast on CPU, the options and params, and that the CPU default
is the former path (the guards check it bit for bit)."""

from __future__ import annotations

import ast
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch import nn

from scarcelab.accel import NAMES, Accel, resolve
from scarcelab.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
FAST = Accel(precision="bf16", channels_last="on", fused_optimizer="on")
FORMER_STUDY = {"precision": "fp32", "channels_last": "weights", "cudnn_benchmark": "off",
                "fused_optimizer": "off", "tf32": "off", "compile": "off"}
CUDA = {"precision": "bf16", "channels_last": "on", "cudnn_benchmark": "on",
        "fused_optimizer": "on", "tf32": "on", "compile": "off"}


# -- resolution ----------------------------------------------------------------------------

def test_auto_is_the_former_path_on_cpu_and_the_fast_path_on_cuda() -> None:
    assert resolve(Accel(), "cpu", cpu_channels_last="weights").params() == FORMER_STUDY
    assert resolve(Accel(), "cpu").params() == {**FORMER_STUDY, "channels_last": "off"}
    assert resolve(None, "mps").params()["precision"] == "fp32"  # only CUDA is fast
    # a device named, none present: the CUDA defaults (no GPU needed to resolve)
    assert resolve(Accel(), "cuda").params() == CUDA
    assert resolve(Accel(), "cuda:1", cpu_channels_last="weights").params() == CUDA
    # a loop the fast path does not help (the AL's MLPs): auto is the former path anywhere
    assert resolve(Accel(), "cuda", fast_auto=False).params() == {**FORMER_STUDY,
                                                                  "channels_last": "off"}


def test_given_settings_are_kept_checked_and_resolve_once() -> None:
    given = Accel(precision="fp32", channels_last="weights", compile="reduce-overhead")
    r = resolve(given, "cuda")
    assert r.params() == {**CUDA, "precision": "fp32", "channels_last": "weights",
                          "compile": "reduce-overhead"}
    assert resolve(r, "cpu") == r and r.is_resolved and not given.is_resolved
    assert Accel().is_auto and not given.is_auto
    assert resolve(Accel(precision="bf16"), "cpu").bf16  # CPU autocast has bf16
    with pytest.raises(ConfigError, match="fused_optimizer=on: torch has no fused"):
        resolve(Accel(fused_optimizer="on"), "meta")
    with pytest.raises(ConfigError, match="precision=bf16: torch has no autocast for meta"):
        resolve(Accel(precision="bf16"), "meta")


def test_a_gpu_without_native_bf16_resolves_auto_to_fp32(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    assert resolve(Accel(), "cuda").precision == "fp32"
    assert resolve(Accel(precision="bf16"), "cuda").precision == "bf16"  # asked for: kept


def test_bad_values_are_one_line_errors_and_switch_words_normalise() -> None:
    with pytest.raises(ConfigError) as e:
        Accel(precision="fp16")
    assert str(e.value) == "precision='fp16': valid values are auto, fp32, bf16"
    with pytest.raises(ConfigError, match="channels_last='nhwc': valid values are auto, off, "
                                          "weights, on"):
        Accel(channels_last="nhwc")
    assert Accel(channels_last="yes").channels_last == "on"
    assert Accel(tf32="True", cudnn_benchmark="0", compile="none").params() == {
        "precision": "auto", "channels_last": "auto", "cudnn_benchmark": "off",
        "fused_optimizer": "auto", "tf32": "on", "compile": "off"}
    assert Accel.from_params({"precision": "bf16", "seed": 3}).precision == "bf16"


def test_process_wide_flags_are_set_on_cuda_only() -> None:
    flags = (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32,
             torch.backends.cudnn.allow_tf32)
    try:
        resolve(Accel(), "cuda").apply_globals("cpu")  # a CPU run touches nothing
        assert (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32,
                torch.backends.cudnn.allow_tf32) == flags
        resolve(Accel(), "cuda").apply_globals("cuda")
        assert torch.backends.cudnn.benchmark and torch.backends.cuda.matmul.allow_tf32
        assert torch.backends.cudnn.allow_tf32
        resolve(Accel(tf32="off", cudnn_benchmark="off"), "cuda").apply_globals("cuda:0")
        assert not (torch.backends.cudnn.benchmark or torch.backends.cuda.matmul.allow_tf32
                    or torch.backends.cudnn.allow_tf32)
        # only the per-backend flags: torch's global matmul precision still answers
        assert torch.get_float32_matmul_precision() == "highest"
    finally:
        (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32,
         torch.backends.cudnn.allow_tf32) = flags


# -- spies inside the network ----------------------------------------------------------------

@dataclass
class Conv:
    autocast: bool
    grad: bool
    c_in: int
    x_nhwc: bool | None  # None: the layout is ambiguous (one channel or one pixel)
    w_nhwc: bool | None


def _nhwc(t: torch.Tensor) -> bool | None:
    if t.shape[1] == 1 or t.shape[2] * t.shape[3] == 1:
        return None
    return t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


@pytest.fixture
def convs(monkeypatch: pytest.MonkeyPatch) -> list[Conv]:
    """Every 2-D convolution run: autocast, grad mode, input and weight layout."""
    seen: list[Conv] = []
    real = nn.Conv2d._conv_forward

    def spy(self, x, w, b):  # type: ignore[no-untyped-def]
        seen.append(Conv(torch.is_autocast_enabled(x.device.type), torch.is_grad_enabled(),
                         x.shape[1], _nhwc(x), _nhwc(w)))
        return real(self, x, w, b)

    monkeypatch.setattr(nn.Conv2d, "_conv_forward", spy)
    return seen


@pytest.fixture
def opts(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """(optimiser class, its ``fused`` default) at every ``zero_grad``."""
    seen: list[tuple[str, Any]] = []
    real = torch.optim.Optimizer.zero_grad

    def spy(self, set_to_none=True):  # type: ignore[no-untyped-def]
        seen.append((type(self).__name__, self.defaults.get("fused")))
        return real(self, set_to_none)

    monkeypatch.setattr(torch.optim.Optimizer, "zero_grad", spy)
    return seen


@pytest.fixture
def compiled(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """``nn.Module.compile`` calls (class, mode), recorded instead of compiling (a CPU
    inductor compile costs ~30 s here; bench/gpu.py measures the real thing)."""
    seen: list[tuple[str, str]] = []
    monkeypatch.setattr(nn.Module, "compile",
                        lambda self, *a, **k: seen.append((type(self).__name__, k.get("mode"))))
    return seen


def _applied(convs: list[Conv], *, autocast: bool, nhwc_inputs: bool, nhwc_weights: bool,
             training_only_inputs: bool = False, trains: bool = True, rgb: bool = True
             ) -> None:
    """From the first training forward on (a model may probe itself once when it is
    built): autocast and the weights' layout in every convolution; the layout of the
    images (RGB: the convolutions that take 3 channels; ``training_only_inputs``: in the
    training forwards only; ``trains=False``: an evaluation alone, ``rgb=False``:
    one-channel images, whose layout is ambiguous)."""
    first = next((i for i, c in enumerate(convs) if c.grad or not trains), None)
    assert first is not None, "no training forward ran"
    run = convs[first:]
    assert {c.autocast for c in run} == {autocast}
    assert {c.w_nhwc for c in run} - {None} == {nhwc_weights}
    if rgb:
        images = [c for c in run if c.c_in == 3 and (c.grad or not training_only_inputs)]
        assert images and {c.x_nhwc for c in images} == {nhwc_inputs}


def _rgb_bundle() -> Any:
    from scarcelab.data import load_raw
    from scarcelab.data.splits import apply_split, make_split

    raw = load_raw("synthetic_tiny_rgb")
    return apply_split(raw, make_split(raw, 30, 30, seed=0))


def _trial(cfg_kw: dict[str, Any], method: str = "fixmatch") -> Any:
    from scarcelab.methods import get_method
    from scarcelab.models import create_model
    from scarcelab.train import TrainConfig, train_trial

    b = _rgb_bundle()
    torch.manual_seed(0)
    m = get_method(method)(create_model("small_cnn", in_channels=3), b.num_classes, {})
    cfg = TrainConfig(max_epochs=1, patience=1, max_steps_per_epoch=2, batch_labeled=8,
                      batch_unlabeled=8, **cfg_kw)
    res = train_trial(m, b, cfg, deadline=time.time() + 600,
                      generator=torch.Generator().manual_seed(0),
                      probe_rng=np.random.default_rng(0))
    assert res.steps == 2 and 0.0 <= res.best_val <= 1.0
    return m


def test_the_epoch_loop_applies_every_setting(convs, opts, compiled) -> None:  # type: ignore[no-untyped-def]
    """Studies, tune and probe's fine-tuning all train through ``train_trial``: bf16
    autocast in every forward (training and evaluation), NHWC inputs and weights, fused
    Adam, the backbone compiled."""
    m = _trial({"accel": Accel(precision="bf16", channels_last="on", fused_optimizer="on",
                               compile="max-autotune")})
    _applied(convs, autocast=True, nhwc_inputs=True, nhwc_weights=True)
    assert any(not c.grad for c in convs)  # the evaluation ran under it too
    assert set(opts) == {("Adam", True)}
    assert compiled == [(type(m.backbone).__name__, "max-autotune")]


def test_the_epoch_loops_cpu_default_is_the_former_path(convs, opts, compiled) -> None:  # type: ignore[no-untyped-def]
    _trial({})
    _applied(convs, autocast=False, nhwc_inputs=False, nhwc_weights=True)
    assert set(opts) == {("Adam", None)} and compiled == []
    convs.clear()
    _trial({"channels_last": False})  # the former keyword still works
    _applied(convs, autocast=False, nhwc_inputs=False, nhwc_weights=False)


def test_sgd_methods_get_the_fused_kernel_too(opts) -> None:  # type: ignore[no-untyped-def]
    from scarcelab.methods import METHODS

    sgd = next(n for n in METHODS.names() if getattr(METHODS.get(n), "optimizer", "") == "sgd")
    _trial({"accel": Accel(fused_optimizer="on")}, method=sgd)
    assert set(opts) == {("SGD", True)}


def test_the_al_fits_apply_every_setting(convs, opts, compiled, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """An image backbone's fits, its evaluations and the strategy's view of it; the batched
    oracle's and a sequential MLP's fits under an explicit setting."""
    from scarcelab.accel import Accel as A
    from scarcelab.active.loop import ALRunConfig, load_for_sweep, run_one

    images: list[bool] = []
    real_images = A.images
    monkeypatch.setattr(A, "images", lambda self, x: images.append(self.nhwc_inputs)
                        or real_images(self, x))
    img = {"arch": "small_cnn", "budget": 2, "max_epochs": 1, "val_fraction": 0.2,
           "optimizer": "adam"}
    rc = ALRunConfig("margin", "synthetic_tiny", query_size=2, overrides=img,
                     accel=Accel(precision="bf16", channels_last="on", fused_optimizer="on",
                                 compile="default"))
    rep = run_one(rc, 0, load_for_sweep(rc))
    assert all(math.isfinite(a) for a in rep.accuracies)
    _applied(convs, autocast=True, nhwc_inputs=True, nhwc_weights=True, rgb=False)
    assert images and all(images)  # the one-channel inputs went through the layout too
    assert set(opts) == {("Adam", True)}
    assert compiled == [("SmallCNN", "default")]
    # the MLP sets: explicit settings reach the sequential and the batched (oracle) fits
    autocast: list[bool] = []
    real_linear = nn.Linear.forward
    monkeypatch.setattr(nn.Linear, "forward", lambda self, x: autocast.append(
        torch.is_autocast_enabled("cpu")) or real_linear(self, x))
    from scarcelab.active import batched

    stacked: list[bool] = []
    real_fwd = batched._forward
    monkeypatch.setattr(batched, "_forward", lambda ws, bs, x: stacked.append(
        torch.is_autocast_enabled("cpu")) or real_fwd(ws, bs, x))
    opts.clear()
    for strategy in ("margin", "oracle"):
        # the batched oracle needs the default fit (fresh optimiser, best weights kept)
        rc = ALRunConfig(strategy, "honeypot", query_size=2, strategy_params={"tau": 2}
                         if strategy == "oracle" else {},
                         overrides={"budget": 2, "max_epochs": 2, "first_fit_epochs": 0,
                                    "restore_best": True, "drop_last": False,
                                    "keep_optimizer": False},
                         accel=Accel(precision="bf16", fused_optimizer="on"))
        assert math.isfinite(run_one(rc, 0, None).auc)
    assert autocast and all(autocast) and stacked and all(stacked)
    assert {o for o in opts} == {("NAdam", None)}  # NAdam has no fused kernel


def test_the_al_mlp_keeps_the_former_path_under_auto_on_cuda() -> None:
    from scarcelab.active.classifier import al_accel

    assert al_accel(None, "cuda", "mlp").params() == {**FORMER_STUDY, "channels_last": "off"}
    assert al_accel(None, "cuda", "resnet18").params() == CUDA
    assert al_accel(None, "cpu", "resnet18").params() == {**FORMER_STUDY,
                                                          "channels_last": "off"}


def test_the_encoder_of_an_encoded_set_applies_every_setting(convs, opts, compiled) -> None:  # type: ignore[no-untyped-def]
    from scarcelab.active.encoded import EncoderConfig, embed_images, train_encoder

    x = _rgb_bundle().unlabeled_x[:32]
    cfg = EncoderConfig(method="simclr", arch="small_cnn", epochs=1, batch_size=16)
    backbone, stats = train_encoder(x, 3, cfg, torch.device("cpu"), FAST)
    assert math.isfinite(stats["encoder_final_loss"])
    _applied(convs, autocast=True, nhwc_inputs=True, nhwc_weights=True)
    assert set(opts) == {("Adam", True)}
    convs.clear()
    f = embed_images(backbone, x, torch.device("cpu"), accel=FAST)
    assert f.dtype == np.float32 and np.isfinite(f).all()
    _applied(convs, autocast=True, nhwc_inputs=True, nhwc_weights=True, trains=False)


def test_encoding_keys_change_only_off_the_former_path() -> None:
    from scarcelab.active.encoded import EncoderConfig, encoder_accel, encoding_key

    x = _rgb_bundle().unlabeled_x[:8]
    cfg = EncoderConfig(arch="small_cnn")
    old = encoding_key(x, x, cfg, "small_cnn")
    assert encoding_key(x, x, cfg, "small_cnn", accel=encoder_accel(None, "cpu")) == old
    assert encoding_key(x, x, cfg, "small_cnn", accel=encoder_accel(FAST, "cpu")) != old


def test_segment_applies_every_setting(convs, opts, compiled, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Training forwards under autocast with NHWC inputs, validation and test under
    autocast, NHWC weights, fused Adam; the resolved settings logged."""
    from test_segment_guard import Recorder, _cfg, _synthetic_nuclei

    from scarcelab.protocols import segment as seg

    monkeypatch.setattr(seg, "load_nuclei", _synthetic_nuclei)
    monkeypatch.setitem(seg.SEG_DATASETS._entries, "synthetic_nuclei", _synthetic_nuclei)
    tr = Recorder()
    res = seg.run_segment(_cfg(lr=1e-3, steps_per_epoch=2, accel=FAST), tr)
    assert res.epochs == 1
    _applied(convs, autocast=True, nhwc_inputs=True, nhwc_weights=True,
             training_only_inputs=True)
    assert any(not c.grad for c in convs)
    assert set(opts) == {("Adam", True)}
    assert {k: tr.study.params[k] for k in NAMES} == {**FORMER_STUDY, "precision": "bf16",
                                                      "channels_last": "on",
                                                      "fused_optimizer": "on"}


def test_tune_and_probe_hand_their_settings_to_every_loop(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Tune's trials and retrains and probe's fine-tuning search run the epoch loop with
    the settings (seen by ``train_trial``), and log them resolved."""
    import scarcelab.protocols.search as search_mod
    import scarcelab.protocols.tune as tune
    from scarcelab.protocols.transfer import ProbeConfig, _finetune_study_config
    from scarcelab.tracker import InMemoryTracker

    seen: list[Accel] = []
    real = tune.train_trial

    def spy(method, bundle, cfg, **kw):  # type: ignore[no-untyped-def]
        seen.append(cfg.resolved_accel())
        return real(method, bundle, cfg, **kw)

    monkeypatch.setattr(tune, "train_trial", spy)
    t = InMemoryTracker()
    tune.run_tune(tune.TuneConfig(method="ce", dataset="synthetic_tiny_rgb", arch="small_cnn",
                                  epochs=1, grace_period=1, n_trials=1, batch_sizes=(8,),
                                  max_steps_per_epoch=1, n_final=1, accel=FAST), t)
    assert len(seen) == 2 and all(a.params() == resolve(FAST, "cpu").params() for a in seen)
    assert t.study.params["precision"] == "bf16" and t.study.params["channels_last"] == "on"
    assert t.study.params["tf32"] == "off"  # auto on CPU
    scfg = _finetune_study_config(ProbeConfig(protocol="finetune", accel=FAST),
                                  {"n_labeled": 10, "n_val": 5}, "small_cnn")
    assert scfg.accel == FAST
    assert search_mod._train_config(scfg, search_mod.get_method("sup"), "cpu").accel == FAST


def test_a_study_logs_its_resolved_settings_and_keys_only_given_ones() -> None:
    from scarcelab.protocols.search import StudyConfig, _study_key, run_study
    from scarcelab.tracker import InMemoryTracker

    base = dict(method="sup", dataset="synthetic_tiny", budget_minutes=5.0, max_epochs=1,
                patience=1, batch_size=16, max_steps_per_epoch=1, max_trials=1,
                arch="small_cnn", device="cpu", storage=None)
    t = InMemoryTracker()
    run_study(StudyConfig(**base, accel=Accel(precision="bf16")), t)
    assert {k: t.study.params[k] for k in NAMES} == {**FORMER_STUDY, "precision": "bf16"}
    assert t.artifacts["config.json"]["accel"]["precision"] == "bf16"
    assert all(t.trials) and all(math.isfinite(v) for _, v, _ in t.study.metrics
                                 if isinstance(v, float))
    # the key of a study that leaves every setting auto is the one it had before them
    import dataclasses
    import hashlib
    import json

    plain = StudyConfig(**base)
    d = {k: v for k, v in dataclasses.asdict(plain).items()
         if k not in ("storage", "study_name", "fresh_study", "device", "started_at",
                      "final_reserve_s", "label_fraction", "budget_clock", "accel", "data_options",
                      "probe_solver", "eval_every_steps", "schedule_horizon")}
    blob = json.dumps({**d, "split_hash": "h"}, sort_keys=True, default=str)
    assert _study_key(plain, "h") == "study-" + hashlib.sha256(blob.encode()).hexdigest()[:16]
    assert _study_key(plain, "h") != _study_key(StudyConfig(**base, accel=Accel(tf32="on")),
                                                "h")


# -- every method under bf16 -------------------------------------------------------------------

def _methods() -> list[str]:
    from scarcelab.methods import METHODS

    return sorted(METHODS.names())


@pytest.mark.parametrize("name", _methods())
def test_every_method_trains_under_bf16_autocast(name: str, tiny_bundle) -> None:  # type: ignore[no-untyped-def]
    """Four steps through the loop's own ``optimizer_step`` under CPU bf16 autocast:
    finite fp32 losses, the first (same weights, same batch) within bf16 rounding of the
    fp32 one, and fp32 parameters throughout."""
    from method_contract import BATCH, build

    from scarcelab.methods import Progress
    from scarcelab.train import BatchSource, make_optimizer, optimizer_step

    def run(accel: Accel | None) -> list[float]:
        m = build(name, tiny_bundle, seed=0)
        src = BatchSource(tiny_bundle, type(m), BATCH["labeled"], BATCH["unlabeled"],
                          torch.device("cpu"), torch.Generator().manual_seed(0))
        opt, sched = make_optimizer(m, 4)
        m.train()
        out = []
        for s in range(4):
            losses = optimizer_step(m, opt, sched, src.next(), Progress(s, 4, 0), accel)
            assert all(v.dtype == torch.float32 for v in losses.values()), losses
            out.append(float(losses["loss"].detach()))
        assert all(p.dtype == torch.float32 for p in m.parameters())
        return out

    fp32, bf16 = run(None), run(resolve(Accel(precision="bf16"), "cpu"))
    assert all(math.isfinite(v) for v in bf16), bf16
    assert bf16[0] == pytest.approx(fp32[0], rel=0.02, abs=0.01), (fp32, bf16)
    assert bf16 != fp32  # autocast did run in bf16


# -- options and params ------------------------------------------------------------------------

TRAINING_COMMANDS = ("supervised", "semi", "self", "contamination", "tune", "al", "probe",
                     "segment")


@pytest.mark.parametrize("command", TRAINING_COMMANDS)
def test_every_training_command_takes_the_six_options(command: str) -> None:
    from scarcelab.entrypoints.cli import main

    cmd = main.commands[command]
    opts = {o: p for p in cmd.params for o in p.opts}
    for name in NAMES:
        p = opts[f"--{name.replace('_', '-')}"]
        assert p.default == "auto" and p.name == name


def test_options_refuse_bad_values_in_one_line_before_torch() -> None:
    import subprocess
    import sys

    code = ("import sys\nfrom scarcelab.entrypoints.cli import main\n"
            "try:\n    main(['semi', '--method', 'fixmatch', '--precision', 'fp16'])\n"
            "except SystemExit as e:\n"
            "    print('torch' in sys.modules, e.code, file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin"})
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("Error")]
    assert lines == ["Error: Invalid value for '--precision': 'fp16': valid values are "
                     "auto, fp32, bf16"], out.stderr
    assert out.stderr.strip().endswith("False 2")  # refused before torch was imported
    r = CliRunner().invoke(__import__("scarcelab.entrypoints.cli", fromlist=["main"]).main,
                           ["al", "--strategy", "margin", "--compile", "fast"])
    assert r.exit_code == 2 and "'--compile': 'fast': valid values are auto, off, default, " \
        "reduce-overhead, max-autotune" in r.output


def test_the_options_reach_each_commands_config(monkeypatch, store) -> None:  # type: ignore[no-untyped-def]
    """Each command builds its config's ``accel`` from the options (the protocols are
    replaced by a spy that keeps the config)."""
    import scarcelab.active.loop as loop
    import scarcelab.protocols.segment as seg
    import scarcelab.protocols.tune as tune
    from scarcelab.entrypoints.cli import main
    from scarcelab.entrypoints.study import study_config

    got: dict[str, Accel] = {}

    class Stop(Exception):
        pass

    def keep(name: str) -> Any:
        def spy(cfg, *a, **k):  # type: ignore[no-untyped-def]
            got[name] = cfg.accel
            raise Stop

        return spy

    monkeypatch.setattr(tune, "run_tune", keep("tune"))
    monkeypatch.setattr(loop, "run_al", keep("al"))
    monkeypatch.setattr(seg, "run_segment", keep("segment"))
    flags = ["--precision", "bf16", "--channels-last", "weights", "--tf32", "off",
             "--compile", "reduce-overhead"]
    want = Accel(precision="bf16", channels_last="weights", tf32="off",
                 compile="reduce-overhead")
    runner = CliRunner()
    for argv in (["tune", "--method", "ce", "--dataset", "synthetic_tiny_rgb", "--device",
                  "cpu"], ["al", "--strategy", "margin", "--dataset", "honeypot", "--device",
                           "cpu"], ["segment", "--device", "cpu"]):
        r = runner.invoke(main, argv + flags)
        assert isinstance(r.exception, Stop), (argv, r.output, r.exception)
    assert got == {"tune": want, "al": want, "segment": want}
    kw = {"method": "fixmatch", "dataset": "breastmnist", "data_dir": None, "arch": "auto",
          "seed": 0, "budget_minutes": 1.0, "max_epochs": 1, "patience": 1,
          "n_labeled": None, "n_val": None, "allow_large_val": False, "search": "random",
          "batch_size": None, "unlabeled_batch_size": None, "max_steps_per_epoch": None,
          "max_trials": 0, "device": "cpu", "overrides": {}, "diag_samples": 0,
          **want.params()}
    assert study_config("semi", kw).accel == want


def test_leaderboard_rows_split_by_precision_and_old_studies_count_as_fp32() -> None:
    import pandas as pd

    from scarcelab.tracking.query.frame import NOT_SETTINGS, study_settings

    assert not set(NAMES) & NOT_SETTINGS
    runs = pd.DataFrame({"run_id": ["old", "new", "gpu", "mlflow"],
                         "params.budget_minutes": ["3"] * 4,
                         "params.precision": [None, "fp32", "bf16", "auto"],
                         "params.resolved.precision": [None, None, None, "bf16"],
                         "params.channels_last": [None, "weights", "on", "auto"]})
    s = study_settings(runs)
    assert list(s["precision"]) == ["fp32", "fp32", "bf16", "bf16"]
    assert list(s["channels_last"]) == ["weights", "weights", "on", "auto"]


# -- no training loop without the settings -----------------------------------------------------

#: training code that runs without the run's settings, and why
EXEMPT = {
    ("scarcelab/active/strategies/coregcn.py", "gcn_features"):
        "a query strategy's 2-layer GCN on CPU numpy embeddings (a query-time computation of "
        "the strategy, not a training loop of the run's model)",
    ("scarcelab/methods/semi/ds3l.py", "__init__"):
        "DS3L's meta-network optimiser; it steps inside method.step, under the step's "
        "autocast",
}


def _training_sites() -> list[tuple[str, str, int, bool]]:
    """(file, innermost function, line, whether it names ``accel``) of every ``.backward(``
    call and every ``torch.optim.<Optimizer>(`` construction in scarcelab/."""
    out = []
    for path in sorted((REPO / "scarcelab").rglob("*.py")):
        tree = ast.parse(path.read_text())
        rel = str(path.relative_to(REPO))

        def visit(node: ast.AST, fn: ast.AST | None, rel: str = rel) -> None:
            for child in ast.iter_child_nodes(node):
                inner = child if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                    else fn
                if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute):
                    f = child.func
                    optim = (isinstance(f.value, ast.Attribute) and f.value.attr == "optim"
                             and f.attr[:1].isupper() and f.attr not in ("Optimizer",))
                    if f.attr == "backward" or optim:
                        names = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)} | {
                            n.attr for n in ast.walk(fn) if isinstance(n, ast.Attribute)} | {
                            a.arg for n in ast.walk(fn) if isinstance(n, ast.arguments)
                            for a in n.args + n.kwonlyargs} if fn is not None else set()
                        out.append((rel, getattr(fn, "name", "<module>"), child.lineno,
                                    any("accel" in n for n in names)))
                visit(child, inner)

        visit(tree, None)
    return out


def test_every_training_loop_takes_the_settings() -> None:
    """A ``backward()`` or an optimiser built in code that never names ``accel`` is a
    training loop that ignores the run's precision and kernels (issue 40: "every training
    loop uses them"); the exemptions say why each is not one."""
    sites = _training_sites()
    assert len(sites) >= 8  # the scan finds the known loops
    missing = [s for s in sites if not s[3] and (s[0], s[1]) not in EXEMPT]
    assert not missing, f"training code without the accel settings: {missing}"
    stale = set(EXEMPT) - {(s[0], s[1]) for s in sites}
    assert not stale, f"EXEMPT names code that no longer trains: {stale}"
