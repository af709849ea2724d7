"""``--precision``, ``--channels-last``, ``--cudnn-benchmark``, ``--fused-optimizer``,
``--tf32`` and ``--compile``: one decorator for every command that trains.

The settings are declared once in :mod:`scarcelab.accel` (which imports torch only where
it is used, so their values are checked here while click parses, before any command
imports torch); each option defaults to ``auto`` (resolved per device when the run
starts) and is an MLproject parameter of the same name on every training entry point.
(The leading underscore keeps ``entrypoints.cli``'s command discovery from importing this
module as a command module.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from scarcelab.accel import AUTO, CHOICES, NAMES, Accel, check_value
from scarcelab.entrypoints.options import DEVICE, _Typed, option
from scarcelab.errors import ConfigError

#: MLproject parameter name -> click parameter name, for the entry maps of the commands
ACCEL_ENTRY = {n: n for n in NAMES}

_HELP = {
    "precision": "bf16 = bf16 autocast of forward passes and losses (weights, gradients "
                 "and optimiser state stay fp32); auto = bf16 on CUDA, fp32 elsewhere",
    "channels_last": "NHWC layout: weights = convolution weights, on = weights and input "
                     "batches; auto = on on CUDA, elsewhere each loop's former layout",
    "cudnn_benchmark": "let cuDNN time its convolution algorithms (process-wide); auto = on "
                       "on CUDA",
    "fused_optimizer": "torch's fused Adam/AdamW/SGD kernel where the device has one; auto = "
                       "on on CUDA",
    "tf32": "TF32 in CUDA matmuls and cuDNN convolutions (process-wide); auto = on on CUDA",
    "compile": "torch.compile the network (reduce-overhead: CUDA graphs); auto = off",
}
#: what every study ran with before these settings were logged: the CPU's fp32
#: path with channels-last convolution weights, no cuDNN benchmark, fused optimiser, TF32
#: or compilation; bf16 and fp32 studies are different leaderboard rows
BEFORE = {"precision": "fp32", "channels_last": "weights", "cudnn_benchmark": "off",
          "fused_optimizer": "off", "tf32": "off", "compile": "off"}


class AccelChoice(_Typed):
    """One precision/kernel setting: ``auto`` or one of its values (a switch also takes
    true/false), checked by :func:`scarcelab.accel.check_value`."""

    name = "setting"

    def __init__(self, setting: str) -> None:
        self.setting = setting

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "|".join((AUTO, *CHOICES[self.setting]))

    def parse(self, value: str) -> str:
        try:
            return check_value(self.setting, value)
        except ConfigError as e:
            raise ValueError(str(e).split(": ", 1)[-1]) from None


def accel_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The six options (each ``auto`` by default) on a command that trains; the command
    builds its :class:`~scarcelab.accel.Accel` with :func:`accel_from`."""
    for name in reversed(NAMES):
        fn = option(f"--{name.replace('_', '-')}", name, group=DEVICE, before=BEFORE[name],
                    default=AUTO, show_default=True, type=AccelChoice(name),
                    help=_HELP[name])(fn)
    return fn


def accel_from(kw: dict[str, Any], pop: bool = False) -> Accel:
    """The :class:`~scarcelab.accel.Accel` of a command's parsed options (``pop``: and
    remove them from ``kw``)."""
    get = kw.pop if pop else kw.get
    return Accel(**{n: get(n, AUTO) for n in NAMES})


__all__ = ["ACCEL_ENTRY", "AccelChoice", "accel_from", "accel_options"]
