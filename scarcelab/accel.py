"""Precision and kernels: the one declaration of how every training loop runs its arithmetic.

Six settings, each a parameter of the run because each changes its numbers (a bf16 step is
not an fp32 step; a fused Adam kernel, a channels-last convolution, a cuDNN algorithm
picked by benchmarking or a TF32 matmul rounds differently), so they are logged with the
run and key its leaderboard row (docs/performance.md, "Precision and kernels"):

* ``precision`` — ``fp32`` | ``bf16``: bf16 autocast (``torch.autocast``) around the
  forward passes and losses of every training step and evaluation. Autocast keeps the
  parameters, gradients and optimiser state in fp32 and runs its fp32-listed ops (softmax,
  log-softmax, cross-entropy, log-sum-exp, norms, BatchNorm's statistics on CUDA) in fp32
  — the mixed-precision practice of Micikevicius et al., "Mixed Precision Training" (ICLR
  2018), with bf16's fp32 exponent range so no loss scaling is needed (Kalamkar et al.,
  "A Study of BFLOAT16 for Deep Learning Training", 2019). A method's losses are handed
  to the optimiser in fp32; EMA teachers and queues update outside autocast.
* ``channels_last`` — ``off`` | ``weights`` | ``on``: convolution weights in NHWC
  (``weights``), and with ``on`` also every image batch fed to the network (training
  and evaluation), so that cuDNN / oneDNN run NHWC kernels without a layout conversion
  per convolution.
* ``cudnn_benchmark`` — ``on`` | ``off``: ``torch.backends.cudnn.benchmark``.
* ``fused_optimizer`` — ``on`` | ``off``: ``fused=True`` for an optimiser that has a fused
  kernel on the device (Adam, AdamW, SGD); ``off`` leaves torch's default (foreach).
  NAdam has none and runs its default kernel either way.
* ``tf32`` — ``on`` | ``off``: TF32 in CUDA matmuls and cuDNN convolutions
  (``torch.backends.cuda.matmul.allow_tf32`` / ``torch.backends.cudnn.allow_tf32``);
  ``off`` is strict fp32 (torch's own default lets cuDNN convolutions use TF32).
  ``torch.set_float32_matmul_precision`` is deliberately not used: it also switches
  oneDNN's CPU matmuls, and mixing it with the per-backend flags makes
  ``torch.get_float32_matmul_precision`` raise.
* ``compile`` — ``off`` | ``default`` | ``reduce-overhead`` | ``max-autotune``:
  ``nn.Module.compile`` of the network (in place, so state dicts, checkpoints and exported
  models keep their keys); ``reduce-overhead`` is torch's CUDA-graph mode.

Every setting also takes ``auto``, resolved per device by :func:`resolve` — the one
place where defaults live. On a CPU (and any device but CUDA) ``auto`` is exactly what
scarcelab did before these settings existed, so CPU results stay bit-identical: fp32,
no fused kernel, no TF32, no compile, no cuDNN benchmarking, and the loop's own
channels-last default (``weights`` in the shared epoch loop, where it measured 1.10x per
FixMatch step on CPU; ``off`` in the loops that never converted). On CUDA ``auto`` is the
fast path: bf16, channels-last weights and inputs, cuDNN benchmarking, fused optimiser,
TF32; compile stays ``off`` until a GPU measurement shows it pays.

``cudnn_benchmark`` and ``tf32`` are process-wide torch flags: :meth:`Accel.apply_globals`
sets them when a loop starts on a CUDA device (and only there: a CPU run touches no global
state); the last loop started in a process decides them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scarcelab.errors import ConfigError

if TYPE_CHECKING:  # torch is imported where it is used: the options layer reads CHOICES
    # and check_value before any command imports torch (entrypoints/options.py)
    import torch
    from torch import nn

AUTO = "auto"
#: every setting and the values it accepts besides ``auto`` (the first is the CPU default,
#: except channels_last whose CPU default is the loop's own)
CHOICES: dict[str, tuple[str, ...]] = {
    "precision": ("fp32", "bf16"),
    "channels_last": ("off", "weights", "on"),
    "cudnn_benchmark": ("off", "on"),
    "fused_optimizer": ("off", "on"),
    "tf32": ("off", "on"),
    "compile": ("off", "default", "reduce-overhead", "max-autotune"),
}
#: the settings in their documented order: the run params and the CLI options
NAMES: tuple[str, ...] = tuple(CHOICES)
#: what ``auto`` resolves to on CUDA
CUDA_DEFAULTS = {"precision": "bf16", "channels_last": "on", "cudnn_benchmark": "on",
                 "fused_optimizer": "on", "tf32": "on", "compile": "off"}
#: what ``auto`` resolves to on any other device (channels_last: the loop's own)
CPU_DEFAULTS = {"precision": "fp32", "cudnn_benchmark": "off", "fused_optimizer": "off",
                "tf32": "off", "compile": "off"}
#: the words a switch also takes (the options' Bool spelling), normalised to on / off
_SWITCH_WORDS = {"true": "on", "1": "on", "yes": "on", "false": "off", "0": "off",
                 "no": "off", "none": "off"}


def check_value(name: str, value: str) -> str:
    """``value`` normalised for setting ``name`` (``True``/``1``/``yes`` -> ``on`` for a
    switch), or a one-line :class:`ConfigError` naming the setting and its values."""
    if name not in CHOICES:
        raise ConfigError(f"unknown precision/kernel setting {name!r}; valid: "
                          f"{', '.join(NAMES)}")
    v = str(value).strip().lower()
    if "off" in CHOICES[name] and v in _SWITCH_WORDS:
        v = _SWITCH_WORDS[v]
    if v != AUTO and v not in CHOICES[name]:
        raise ConfigError(f"{name}={value!r}: valid values are "
                          f"{', '.join((AUTO, *CHOICES[name]))}")
    return v


@dataclass(frozen=True)
class Accel:
    """The six settings (module docstring); ``auto`` everywhere by default. Build a
    resolved copy for a device with :func:`resolve` (or :meth:`resolved`) before use:
    the helpers below read the concrete values (``auto`` counts as the CPU default)."""

    precision: str = AUTO
    channels_last: str = AUTO
    cudnn_benchmark: str = AUTO
    fused_optimizer: str = AUTO
    tf32: str = AUTO
    compile: str = AUTO

    def __post_init__(self) -> None:
        for name in NAMES:
            object.__setattr__(self, name, check_value(name, getattr(self, name)))

    @classmethod
    def from_params(cls, values: dict[str, Any]) -> Accel:
        """From run params or CLI values by name (missing ones ``auto``; ``None`` too)."""
        return cls(**{k: v for k, v in values.items() if k in CHOICES and v is not None})

    # -- what it is --------------------------------------------------------------------
    @property
    def is_resolved(self) -> bool:
        return all(getattr(self, n) != AUTO for n in NAMES)

    @property
    def is_auto(self) -> bool:
        """Every setting left to the device (what a study key omits, see search.py)."""
        return all(getattr(self, n) == AUTO for n in NAMES)

    def params(self) -> dict[str, str]:
        """The settings as run params, under their CLI names (``precision``,
        ``channels_last``, ...): the resolved values once :func:`resolve` has run."""
        return {n: getattr(self, n) for n in NAMES}

    def resolved(self, device: str | torch.device, *, cpu_channels_last: str = "off",
                 fast_auto: bool = True) -> Accel:
        """:func:`resolve` of this declaration."""
        return resolve(self, device, cpu_channels_last=cpu_channels_last,
                       fast_auto=fast_auto)

    # -- what it does ------------------------------------------------------------------
    @property
    def bf16(self) -> bool:
        return self.precision == "bf16"

    @property
    def nhwc_weights(self) -> bool:
        return self.channels_last in ("weights", "on")

    @property
    def nhwc_inputs(self) -> bool:
        return self.channels_last == "on"

    def autocast(self, device: str | torch.device) -> AbstractContextManager[Any]:
        """bf16 autocast on ``device``'s type, or a no-op context for fp32."""
        if not self.bf16:
            return nullcontext()
        import torch

        return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)

    def apply_globals(self, device: str | torch.device) -> None:
        """Set the process-wide flags (cuDNN benchmarking, TF32) on a CUDA device; on any
        other device nothing is touched (they are CUDA flags, and a CPU run must leave
        the process as it found it)."""
        import torch

        if torch.device(device).type != "cuda":
            return
        torch.backends.cudnn.benchmark = self.cudnn_benchmark == "on"
        on = self.tf32 == "on"
        torch.backends.cuda.matmul.allow_tf32 = on
        torch.backends.cudnn.allow_tf32 = on

    def prepare(self, module: nn.Module, compiled: nn.Module | None = None) -> nn.Module:
        """``module`` (in place) in the configured weight layout, and ``compiled`` (a part
        of it that its training calls, e.g. a method's backbone; default ``module``
        itself) compiled if asked. Only 4-D tensors change layout, so MLPs are untouched.
        ``nn.Module.compile`` works in place: parameter names, state dicts and deep
        copies stay as they were."""
        import torch

        if self.nhwc_weights:
            module.to(memory_format=torch.channels_last)
        if self.compile not in ("off", AUTO):
            (compiled if compiled is not None else module).compile(mode=self.compile)
        return module

    def images(self, x: torch.Tensor) -> torch.Tensor:
        """An image batch (N, C, H, W) in the configured input layout; other tensors as
        they are."""
        if self.nhwc_inputs and x.ndim == 4:
            import torch

            return x.contiguous(memory_format=torch.channels_last)
        return x

    def batch(self, batch: Any) -> Any:
        """A training :class:`~scarcelab.methods.base.Batch` with its image views in the
        configured input layout (the same object when nothing changes)."""
        if not self.nhwc_inputs:
            return batch
        return dataclasses.replace(batch, x=[self.images(v) for v in batch.x],
                                   u=[self.images(v) for v in batch.u])

    def optimizer_kwargs(self, opt_cls: type[torch.optim.Optimizer],
                         device: str | torch.device) -> dict[str, Any]:
        """``{"fused": True}`` when the fused kernel is on and ``opt_cls`` has one on
        ``device``'s type; else nothing (torch's default kernel)."""
        if self.fused_optimizer != "on" or not has_fused(opt_cls, device):
            return {}
        return {"fused": True}


def has_fused(opt_cls: type[torch.optim.Optimizer], device: str | torch.device) -> bool:
    """Whether torch has a fused kernel of ``opt_cls`` for ``device``'s type."""
    import inspect

    import torch
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    return ("fused" in inspect.signature(opt_cls.__init__).parameters
            and torch.device(device).type in _get_fused_kernels_supported_devices())


def resolve(accel: Accel | None, device: str | torch.device, *,
            cpu_channels_last: str = "off", fast_auto: bool = True) -> Accel:
    """Every ``auto`` of ``accel`` made concrete for ``device`` (module docstring: the CUDA
    defaults, and on other devices what scarcelab did before; ``cpu_channels_last`` is the
    calling loop's own CPU layout). ``fast_auto=False``: ``auto`` is the former behaviour
    on every device (a loop the fast path does not help: the AL's tiny MLPs). Concrete
    values are kept, after a check that the device can run them; resolving twice changes
    nothing."""
    import torch

    accel = accel or Accel()
    dev = torch.device(device)
    cuda = dev.type == "cuda" and fast_auto
    out: dict[str, str] = {}
    for name in NAMES:
        v = getattr(accel, name)
        if v == AUTO:
            if cuda:
                v = CUDA_DEFAULTS[name]
                if name == "precision" and not _bf16_fast(dev):
                    v = "fp32"
            else:
                v = cpu_channels_last if name == "channels_last" else CPU_DEFAULTS[name]
        out[name] = v
    if out["precision"] == "bf16" and not torch.amp.is_autocast_available(dev.type):
        raise ConfigError(f"precision=bf16: torch has no autocast for {dev.type} devices; "
                          "use precision=fp32")
    if out["fused_optimizer"] == "on":
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        if dev.type not in _get_fused_kernels_supported_devices():
            raise ConfigError(f"fused_optimizer=on: torch has no fused optimiser kernels "
                              f"for {dev.type} devices; use fused_optimizer=off")
    return Accel(**out)


def _bf16_fast(dev: torch.device) -> bool:
    """bf16 runs natively on this CUDA device (Ampere or newer); True when no CUDA device
    is present to ask (a resolution for a named device, e.g. in a test or a dry run)."""
    import torch

    if not torch.cuda.is_available():
        return True
    return bool(torch.cuda.is_bf16_supported(including_emulation=False))


@contextmanager
def step_autocast(accel: Accel | None, module: nn.Module) -> Iterator[None]:
    """:meth:`Accel.autocast` on the device of ``module``'s parameters (what a loop that
    does not hold its device at hand wraps a step in); a no-op for fp32 or no ``accel``."""
    if accel is None or not accel.bf16:
        yield
        return
    device = next(module.parameters()).device
    with accel.autocast(device):
        yield


__all__ = ["AUTO", "CHOICES", "CPU_DEFAULTS", "CUDA_DEFAULTS", "NAMES", "Accel", "check_value",
           "has_fused", "resolve", "step_autocast"]
