"""The one validation layer for every command's options, CLI and ``mlflow run -P`` alike.

MLflow Projects passes every parameter as a string (an empty default renders as ``''``, a
float one as ``"2.0"``) into the same click command a user types, so typing the click
options once validates both: a bad value is a one-line click error naming the option
(``Invalid value for '--budget-minutes': ...``), raised while click parses — before torch,
MLflow or any data is touched. The literal ``default`` (and the empty string) means "let
scarcelab choose" where an option documents a default.

Checks that need the learning core (a method's hyperparameter types, whether CUDA is
there) live here too (:func:`check_overrides`, :func:`check_fields`, :func:`check_device`);
the commands call them after parsing, still before any data is loaded.

Every type records the raw string it was given in ``ctx.meta[RAW]`` so that the command can
log its parameters exactly as ``mlflow run`` would (:func:`entry_params`): one name and one
value per setting, whichever way a study was started.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click

from scarcelab import tags as T

RAW = "scarcelab.raw_params"
DEFAULT_WORDS = ("", "default")
SEED_MAX = 2**32 - 1


class _Typed(click.ParamType):
    """Base: remembers the raw string, then parses it (``parse`` raises ``ValueError`` with
    a message that becomes the click error)."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        if not isinstance(value, str):  # already converted (a default passed twice)
            return value
        if ctx is not None and param is not None and param.name:
            ctx.meta.setdefault(RAW, {})[param.name] = value
        try:
            return self.parse(value.strip())
        except ValueError as e:
            self.fail(f"{value!r}: {e}", param, ctx)

    def parse(self, value: str) -> Any:
        """The option's value from its stripped text (each option type overrides this);
        raise ``ValueError`` with a message that says what is accepted."""
        raise NotImplementedError(f"{type(self).__name__} must implement parse")


def _range_text(lo: float | None, hi: float | None, lo_open: bool = False) -> str:
    if lo is not None and hi is not None:
        return f"between {lo:g} and {hi:g}" if not lo_open else f"> {lo:g} and <= {hi:g}"
    if lo is not None:
        return f"> {lo:g}" if lo_open else f">= {lo:g}"
    return f"<= {hi:g}"


class Int(_Typed):
    """An integer in ``[lo, hi]``; ``"2.0"`` is 2 (MLflow renders float params so), ``"2.5"``,
    ``inf`` and ``nan`` are errors. With ``default_ok`` the words ``default``/``''`` give
    None (the command's documented default)."""

    name = "integer"

    def __init__(self, lo: int | None = None, hi: int | None = None,
                 default_ok: bool = False) -> None:
        self.lo, self.hi, self.default_ok = lo, hi, default_ok

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "INTEGER|default" if self.default_ok else "INTEGER"

    def parse(self, value: str) -> int | None:
        if self.default_ok and value.lower() in DEFAULT_WORDS:
            return None
        try:
            f = float(value)
        except ValueError:
            raise ValueError("not an integer" + (" or 'default'" if self.default_ok else "")
                             ) from None
        if not math.isfinite(f) or f != int(f):
            raise ValueError("not a finite integer")
        n = int(f)
        if (self.lo is not None and n < self.lo) or (self.hi is not None and n > self.hi):
            raise ValueError(f"must be {_range_text(self.lo, self.hi)}")
        return n


class Float(_Typed):
    """A finite float in the range (``lo_open``: strictly above ``lo``)."""

    name = "number"

    def __init__(self, lo: float | None = None, hi: float | None = None,
                 lo_open: bool = False) -> None:
        self.lo, self.hi, self.lo_open = lo, hi, lo_open

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "FLOAT"

    def parse(self, value: str) -> float:
        try:
            f = float(value)
        except ValueError:
            raise ValueError("not a number") from None
        if not math.isfinite(f):
            raise ValueError("not a finite number")
        below = self.lo is not None and (f <= self.lo if self.lo_open else f < self.lo)
        if below or (self.hi is not None and f > self.hi):
            raise ValueError(f"must be {_range_text(self.lo, self.hi, self.lo_open)}")
        return f


class LabelCount(_Typed):
    """A number of samples (>= 1), ``default``, or (``allow_all``) ``all``."""

    name = "count"

    def __init__(self, allow_all: bool) -> None:
        self.allow_all = allow_all
        self._int = Int(1, None, default_ok=True)

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "INTEGER|all|default" if self.allow_all else "INTEGER|default"

    def parse(self, value: str) -> int | str | None:
        if self.allow_all and value.lower() == "all":
            return "all"
        try:
            return self._int.parse(value)
        except ValueError as e:
            if str(e).startswith("must be"):
                raise ValueError(f"{e}; an empty set cannot be trained or validated on"
                                 ) from None
            raise ValueError("expected a positive integer" + (", 'all'" if self.allow_all
                                                              else "") + " or 'default'"
                             ) from None


class Bool(_Typed):
    name = "boolean"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "true|false"

    def parse(self, value: str) -> bool:
        v = value.lower()
        if v in ("1", "true", "yes", "y", "on"):
            return True
        if v in ("0", "false", "no", "n", "off", ""):
            return False
        raise ValueError("expected true or false")


class Word(_Typed):
    """A non-empty name (method, dataset, strategy …; the registry checks it later)."""

    name = "name"

    def __init__(self, choices: tuple[str, ...] | None = None, allow_default: bool = False
                 ) -> None:
        self.choices, self.allow_default = choices, allow_default

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "|".join(self.choices) if self.choices else "NAME"

    @property
    def names_only(self) -> bool:
        """Whether it takes a name from a closed set (its ``choices``): a sweep checks such
        a value when it reads a spec (tracking/commands.py)."""
        return bool(self.choices)

    def parse(self, value: str) -> str:
        if not value:
            raise ValueError("must not be empty")
        if self.choices and value not in self.choices:
            raise ValueError(f"expected one of {', '.join(self.choices)}")
        return value


class Registered(Word):
    """A registered name (method, dataset, arch, strategy), checked against the names the
    registry's files declare (:class:`scarcelab.registry.StaticIndex`) without importing
    them: a typo is answered in a fraction of a second, with the near misses (``did you mean
    fixmatch?``) and the names that fit (``family``: only that family's methods). ``extra``
    words (``auto``, ``default``) pass as they are."""

    def __init__(self, kind: str, family: str | None = None,
                 extra: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.kind, self.family, self.extra = kind, family, extra

    @property
    def names_only(self) -> bool:
        """A name from a closed set: a sweep checks it when it reads a spec
        (tracking/commands.py)."""
        return True

    def parse(self, value: str) -> str:
        from scarcelab.registry import check_name

        if value.lower() in self.extra:
            return value
        return check_name(self.kind, super().parse(value), self.family)


class DatasetName(Registered):
    """``--dataset``: a registered name, an installed plugin's (entry-point group
    ``scarcelab.datasets``, read from package metadata: nothing is imported), or a user's
    images, ``folder:PATH`` / ``csv:FILE`` / a bare path (``scarcelab.data.own``), whose
    folder or CSV is read and checked here (layout, header, rows, files present) and
    given on as its canonical ``folder:/absolute/path``. With ``al``: the AL forms, i.e.
    also ``encoded_<any of those>`` and names only the AL registry knows (checked by it)."""

    def __init__(self, al: bool = False) -> None:
        super().__init__("dataset")
        self.al = al

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "NAME|folder:PATH|csv:FILE"

    def may_be_own(self, value: str) -> bool:
        """Whether ``value`` may name a user's files, which the cell's machine reads (a
        sweep leaves those to the cell: tracking/commands.py)."""
        return _maybe_own(value)

    def parse(self, value: str) -> str:
        from scarcelab.errors import ScarcelabError
        from scarcelab.registry import plugin_names

        def check_ref(text: str) -> Any:
            from scarcelab.data.own import check_ref

            return check_ref(text)

        if not value:
            raise ValueError("must not be empty")
        prefix = "encoded_" if self.al and value.lower().startswith("encoded_") else ""
        ref = None
        if _maybe_own(value[len(prefix):]):  # else numpy stays unimported while parsing
            try:
                ref = check_ref(value[len(prefix):])
            except ScarcelabError as e:
                raise ValueError(str(e)) from None
        if ref is not None:
            return prefix + ref.name
        if self.al or value.lower() in plugin_names("dataset"):
            return value
        try:
            return super().parse(value)
        except ValueError as e:
            here = Path(value).expanduser()
            hint = (f"; {value} is a folder here: use folder:{value}" if here.is_dir() else
                    f"; {value} is a file here: use csv:{value}" if here.is_file() else
                    "; your own images: folder:PATH or csv:FILE (docs/own-images.md)")
            raise ValueError(f"{e}{hint}") from None


def _maybe_own(value: str) -> bool:
    """Whether ``value`` may name a user's files (``scarcelab.data.own.parse_ref`` decides):
    a folder:/csv: scheme or a path-like word."""
    import os

    return (value.split(":", 1)[0].lower() in ("folder", "csv") or "/" in value
            or os.sep in value or value.startswith(("~", ".")) or value.lower().endswith(".csv"))


def _static_index(kind: str) -> Any:
    """One :class:`~scarcelab.registry.StaticIndex` per kind and process."""
    from scarcelab.registry import static_index

    return static_index(kind)


class Device(_Typed):
    """``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``; whether it exists is
    :func:`check_device`'s job (it needs torch)."""

    name = "device"
    PATTERN = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "auto|cpu|cuda[:N]|mps"

    def parse(self, value: str) -> str:
        if not self.PATTERN.match(value):
            raise ValueError("expected auto, cpu, cuda, cuda:N or mps")
        return value


class Folder(_Typed):
    """An existing folder, or ``default``/``''`` for None (the documented data root). A
    folder that does not exist is refused: a silent fallback elsewhere would train on data
    the user did not point at."""

    name = "folder"
    #: its value is an absolute folder, passed on as it is (tracking/commands.py)
    gives_path = True

    def __init__(self, data_root: bool = True) -> None:
        # a data root (--data-dir) holds public datasets' files; a folder laid out as a
        # user's own images there is a mistake a new user makes (issue 39): say so
        self.data_root = data_root

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "DIR|default"

    def parse(self, value: str) -> str | None:
        if value.lower() in DEFAULT_WORDS:
            return None
        p = Path(value).expanduser()
        if not p.exists():
            raise ValueError("folder does not exist (omit the option for $SCARCELAB_DATA or "
                             "~/.cache/scarcelab)")
        if not p.is_dir():
            raise ValueError("is not a folder")
        if self.data_root and (p / "labeled").is_dir():
            raise ValueError(f"holds a labeled/ folder: your own images are a dataset, not a "
                             f"data root; use --dataset folder:{p} (docs/own-images.md)")
        return str(p.resolve())


class RunId(_Typed):
    """An MLflow run id (MLflow's own rule: a letter or digit, then up to 255 word
    characters or dashes), or ``''``/``none`` for None. Whether the run exists is checked
    against the store later."""

    name = "run id"
    PATTERN = re.compile(r"^[A-Za-z0-9][\w-]{0,255}$")

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "RUN_ID"

    def parse(self, value: str) -> str | None:
        if value.lower() in ("", "none"):
            return None
        if not self.PATTERN.match(value):
            raise ValueError("not an MLflow run id (e.g. 6d02eb752d0444fc9758ecb59b5a28c3)")
        return value


def parse_set(text: str) -> dict[str, Any]:
    """``"lambda_u=2,threshold=0.9"`` -> ``{"lambda_u": 2, "threshold": 0.9}``: JSON values,
    else the string (the same rule as ``scarcelab.protocols.search.parse_overrides``)."""
    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        k, sep, v = part.partition("=")
        if not sep or not k.strip():
            raise ValueError(f"expected key=value pairs separated by commas, got {part!r}")
        try:
            out[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip()] = v.strip()
    return out


class Overrides(_Typed):
    """``key=value,key=value`` (``none``/``default``/``''``: no overrides)."""

    name = "overrides"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "KEY=VALUE,..."

    def parse(self, value: str) -> dict[str, Any]:
        if value.lower() in ("", "none", "default"):
            return {}
        return parse_set(value)


class Ratios(_Typed):
    """Comma-separated OOD fractions, each in [0, 1)."""

    name = "ratios"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "R,R,..."

    def parse(self, value: str) -> list[float]:
        f = Float(0.0, None)
        out = []
        for part in filter(None, (p.strip() for p in value.split(","))):
            r = f.parse(part)
            if r >= 1.0:
                raise ValueError(f"ratio {part} must be < 1 (r = n_ood / (n_ood + n_id))")
            out.append(r)
        if not out:
            raise ValueError("no ratio given")
        return out


class Names(_Typed):
    """Comma-separated names (at least one, unless ``allow_empty``: then ``''`` / ``none``
    is the empty list); with ``unique`` a name given twice is refused (it would run
    twice)."""

    name = "names"

    def __init__(self, allow_empty: bool = False, unique: bool = False) -> None:
        self.allow_empty, self.unique = allow_empty, unique

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "NAME,..."

    def parse(self, value: str) -> list[str]:
        if self.allow_empty and value.lower() in ("", "none"):
            return []
        out = [s.strip() for s in value.split(",") if s.strip()]
        if not out:
            raise ValueError("no name given")
        twice = sorted({n for n in out if out.count(n) > 1}) if self.unique else []
        if twice:
            raise ValueError(f"{', '.join(twice)} given twice")
        return out


class IntList(_Typed):
    """Comma-separated integers, each at least ``lo`` (e.g. a set of batch sizes);
    ``default``/``''`` give None (the command's documented default)."""

    name = "integers"

    def __init__(self, lo: int = 1) -> None:
        self.lo = lo

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "N,N,...|default"

    def parse(self, value: str) -> tuple[int, ...] | None:
        if value.lower() in DEFAULT_WORDS:
            return None
        item = Int(self.lo, None)
        out = []
        for part in (p.strip() for p in value.split(",")):
            if not part:
                continue
            try:
                out.append(item.parse(part))
            except ValueError as e:
                raise ValueError(f"{part!r} {e}") from None
        if not out:
            raise ValueError("no integer given")
        return tuple(out)


# -- checks that need the core (called by commands after parsing) ----------------------------

def check_device(device: str) -> None:
    """A CUDA device that is not there is a parameter error, not a traceback mid-study."""
    if not device.startswith("cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        raise click.BadParameter(f"{device!r}: CUDA is not available on this machine "
                                 "(use cpu or auto)", param_hint="'--device'")
    idx = int(device.split(":", 1)[1]) if ":" in device else 0
    if idx >= torch.cuda.device_count():
        raise click.BadParameter(f"{device!r}: this machine has {torch.cuda.device_count()} "
                                 "CUDA device(s)", param_hint="'--device'")


def check_registered(registry: Any, name: str, hint: str) -> Any:
    """``registry.get(name)`` as a parameter error naming the option (the registry's message
    lists the valid names), so an unknown dataset or arch stops a command before its data
    is read."""
    from scarcelab.errors import ConfigError

    try:
        return registry.get(name)
    except ConfigError as e:
        raise click.BadParameter(str(e), param_hint=hint) from None


def _coerce(value: Any, like: Any, key: str) -> Any:
    """``value`` as the type of ``like`` (a default), or ``ValueError``."""
    if isinstance(like, bool):
        if isinstance(value, bool):
            return value
        return Bool().parse(str(value))
    if isinstance(like, int):
        return Int().parse(str(value))
    if isinstance(like, float):
        return Float().parse(str(value))
    if isinstance(like, str):
        return str(value)
    return value


def check_overrides(overrides: dict[str, Any], method_cls: Any) -> dict[str, Any]:
    """``--set`` values typed like the method's defaults or its search space: ``lambda_u=abc``
    is refused here instead of failing every trial."""
    from scarcelab.methods.space import Choice, IntLogUniform, LogUniform, Uniform

    space, defaults = method_cls.search_space, method_cls.defaults
    out: dict[str, Any] = {}
    for k, v in overrides.items():
        try:
            if k in space:
                d = space[k]
                if isinstance(d, (Uniform, LogUniform)):
                    out[k] = Float().parse(str(v))
                elif isinstance(d, IntLogUniform):
                    out[k] = Int().parse(str(v))
                elif isinstance(d, Choice):
                    if v not in d.options:
                        raise ValueError(f"expected one of {list(d.options)}")
                    out[k] = v
                else:
                    out[k] = v
            elif k in defaults:
                out[k] = _coerce(v, defaults[k], k)
            else:
                valid = sorted(set(space) | set(defaults))
                raise ValueError(f"unknown hyperparameter of {method_cls.registered_name}; "
                                 f"valid: {', '.join(valid)}")
        except ValueError as e:
            raise click.BadParameter(f"{k}={v!r}: {e}", param_hint="'--set'") from None
    return out


def check_fields(values: dict[str, Any], reference: Any, hint: str,
                 parsers: dict[str, Callable[[Any], Any]] | None = None) -> dict[str, Any]:
    """Values for the fields of a config dataclass, typed like ``reference``'s."""
    import dataclasses

    fields = {f.name for f in dataclasses.fields(reference)}
    out: dict[str, Any] = {}
    for k, v in values.items():
        try:
            if k not in fields:
                raise ValueError(f"unknown setting; valid: {', '.join(sorted(fields))}")
            if parsers and k in parsers:
                out[k] = parsers[k](v)
            else:
                out[k] = _coerce(v, getattr(reference, k), k)
        except ValueError as e:
            raise click.BadParameter(f"{k}={v!r}: {e}", param_hint=hint) from None
    return out


class Text(_Typed):
    """Free text, taken as given (typed only so that its raw value is recorded for
    :func:`entry_params`, like every other option's)."""

    name = "text"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "TEXT"

    def parse(self, value: str) -> str:
        return "" if value.lower() in ("", "none") else value


class Tags(_Typed):
    """``k=v,k=v`` run tags (``none``/``''``: none). ``scarcelab.*`` and ``mlflow.*`` keys
    are refused: the query layer and the UI read those, and a user value would silently
    change what a run counts as."""

    name = "tags"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "KEY=VALUE,..."

    def parse(self, value: str) -> dict[str, str]:
        if value.lower() in ("", "none"):
            return {}
        out: dict[str, str] = {}
        for part in filter(None, (p.strip() for p in value.split(","))):
            k, sep, v = part.partition("=")
            k = k.strip()
            if not sep or not k:
                raise ValueError(f"expected key=value pairs separated by commas, got {part!r}")
            if k.startswith((T.PREFIX, "mlflow.")):
                raise ValueError(f"{k}: scarcelab.* and mlflow.* tags are set by scarcelab; "
                                 "choose another key")
            out[k] = v.strip()
        return out


#: MLproject parameter name -> click parameter name of :func:`identity_options` (the run
#: name is not one: under ``mlflow run`` it is MLflow's own ``--run-name``)
IDENTITY_ENTRY = {"tags": "tags", "description": "description"}


_UNDER_MLFLOW_RUN = "; under mlflow run: its own --run-name"
#: what ``--run-name`` names, per command: the run each one opens is a different thing (a
#: study, an AL sweep, a report, a sweep's parent), and one shared text was wrong for most
RUN_NAME_HELP = {
    **{f: "the study run's name (default e.g. fixmatch-breastmnist-s0; trials are "
          "<name>/t03)" + _UNDER_MLFLOW_RUN for f in ("supervised", "semi", "self")},
    "tune": "the study run's name (default: the method, dataset and seed; ASHA trials are "
            "<name>/t03, the final retrains <name>/r01)" + _UNDER_MLFLOW_RUN,
    "al": "the AL sweep's parent run's name (default e.g. al-breastmnist-margin-q10; each "
          "repetition is a child run)" + _UNDER_MLFLOW_RUN,
    "contamination": "the parent run's name (default e.g. contamination-fixmatch-"
                     "breastmnist); each ratio is a child study" + _UNDER_MLFLOW_RUN,
    "probe": "the probe run's name (default e.g. probe-linear-breastmnist-s0)"
             + _UNDER_MLFLOW_RUN,
    "segment": "the segmentation run's name (default e.g. segment-nuclei-resnet18-s0)"
               + _UNDER_MLFLOW_RUN,
    "leaderboard": "the report run's name, when a report is logged (--output, or under "
                   "mlflow run; default: report)",
    "compare": "the report run's name, when the report is logged (default: "
               "compare-report)",
    "sweep": "the sweep's parent run's name (default: sweep-<spec name>); each cell is a "
             "child run" + _UNDER_MLFLOW_RUN,
}


class _RunNameOption(click.Option):
    """``--run-name``, whose help says what the command's run is (:data:`RUN_NAME_HELP`):
    the same decorator serves every command that opens a run."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        name = ctx.command.name or ""
        saved = self.help
        self.help = RUN_NAME_HELP.get(name, "the name of the run this command opens "
                                      "(default: one scarcelab chooses)" + _UNDER_MLFLOW_RUN)
        try:
            return super().get_help_record(ctx)
        finally:
            self.help = saved


def identity_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--run-name``, ``--tags k=v,...`` and ``--description`` on a command that opens a
    run: what the MLflow UI lists it as, filters it by and says about it."""
    fn = option("--description", group=RUN, row=False,
                default="none", show_default=True, type=Text(),
                      help="text put first in the run's description (the MLflow UI's "
                      "Description), before the one scarcelab writes")(fn)
    fn = option("--tags", "tags", group=RUN, row=False,
                default="none", show_default=True, type=Tags(),
                      help="extra run tags, e.g. 'project=liver,owner=ana'")(fn)
    return option("--run-name", group=RUN, row=False, entry=False, default="", cls=_RunNameOption,
                        help="the name of the run this command opens")(fn)


def apply_identity(tracker: Any, kw: dict[str, Any]) -> None:
    """Hand the identity options (popped from ``kw``) to the MLflow tracker, however deep
    it is wrapped (``ProgressTracker`` -> ``MlflowTracker``)."""
    name = kw.pop("run_name", "") or None
    tags = kw.pop("tags", {}) or {}
    text = kw.pop("description", "") or None
    setter = getattr(tracker, "set_identity", None)  # wrappers pass it on to MlflowTracker
    if callable(setter):
        setter(run_name=name, tags=tags, description=text)


# -- a user's images: the dataset options ----------------------------------------------------

#: MLproject parameter name -> click parameter name of :func:`dataset_options` (``folds``
#: only on the commands that run k studies: supervised, semi, self)
DATASET_ENTRY = {n: n for n in ("image_size", "channels", "fit", "skip_bad_files",
                                "test_fraction")}
FOLDS_ENTRY = {"folds": "folds"}


def dataset_options(fn: Callable[..., Any] | None = None, *, folds: bool = False) -> Any:
    """How a user's files (``--dataset folder:PATH|csv:FILE``) become a dataset, on every
    command that takes a dataset (``scarcelab.data.own.DataOptions``; docs/own-images.md).
    Registered datasets refuse values other than the defaults (:func:`data_options`)."""
    if fn is None:
        return lambda f: dataset_options(f, folds=folds)
    opts = [
        option("--image-size", group=OWN, before="default", default="default", show_default=True,
                     type=Int(1, 4096, default_ok=True),
                     help="own images: resize to this side in pixels (shorter side, then "
                     "--fit); default = the files' own size, which must then agree"),
        option("--channels", group=OWN, before="auto", default="auto", show_default=True,
                     type=Word(("auto", "gray", "rgb")),
                     help="own images: auto keeps the files' own (mixed gray and colour is "
                     "refused), gray or rgb converts every file"),
        option("--fit", group=OWN, before="crop",
               default="crop", show_default=True, type=Word(("crop", "pad")),
                     help="own images: a non-square image becomes square by a centre crop "
                     "or by padding with black"),
        option("--skip-bad-files", group=OWN, before="false",
               default="false", show_default=True, type=Bool(),
                     help="own images: skip unreadable files (counted in the run as "
                     "data.n_bad_files) instead of stopping at the first"),
        option("--test-fraction", group=OWN, before="0.2", default="0.2", show_default=True,
                     type=Float(0.0, 0.9, lo_open=True),
                     help="own images without test/: the share of labeled images held out "
                     "(stratified, fixed seed) as the test set"),
    ]
    if folds:
        opts.append(option(
            "--folds", group=OWN, before="1", default="1", show_default=True, type=Int(1, 100),
            help="own images without test/: k > 1 runs k studies, fold i's labeled images "
            "the test set of study i (tags scarcelab.fold, scarcelab.test_from=fold)"))
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def data_options(kw: dict[str, Any], dataset: str) -> Any:
    """Pop the dataset options from ``kw``: a ``DataOptions`` for a user's images (the
    dataset parsed by :class:`DatasetName`, ``encoded_`` stripped), None for any other
    dataset, which may not set them (one line naming them, before torch)."""
    from scarcelab.data.own import DataOptions, is_own

    vals = {k: kw.pop(k) for k in (*DATASET_ENTRY, *FOLDS_ENTRY) if k in kw}
    opts = DataOptions(**vals)
    if is_own(dataset.removeprefix("encoded_")):
        return opts
    if not opts.is_default():
        given = [f"--{k.replace('_', '-')}" for k, v in vals.items()
                 if getattr(DataOptions(), k) != v]
        raise click.BadParameter(
            f"{', '.join(given)} apply to your own images (folder:PATH or csv:FILE); "
            f"dataset {dataset!r} has its own size, channels and test set: leave "
            f"{'it' if len(given) == 1 else 'them'} at the default", param_hint="'--dataset'")
    return None


def check_dataset(name: str, hint: str = "'--dataset'") -> str:
    """A dataset given as a plain word (``tune``): its canonical name, checked as
    :class:`DatasetName` checks it, as a parameter error of ``hint``."""
    try:
        return DatasetName().parse(name.strip())
    except ValueError as e:
        raise click.BadParameter(f"{name!r}: {e}", param_hint=hint) from None


# -- verbosity ------------------------------------------------------------------------------

def verbosity_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``-q/--quiet`` and ``-v/--verbose`` on a command (also accepted before it, on the
    ``scarcelab`` group); they are not MLproject parameters."""
    fn = option("-v", "--verbose", group=OUTPUT, row=False, entry=False, is_flag=True,
                      help="also print trial lines when not on a terminal, one line per "
                      "epoch, and INFO logs")(fn)
    return option("-q", "--quiet", group=OUTPUT, row=False, entry=False, is_flag=True,
                        help="no progress output, only the final summary")(fn)


def verbosity(ctx: click.Context, quiet: bool, verbose: bool) -> int:
    """0 quiet, 1 normal, 2 verbose (``entrypoints._progress``), from the command's flags
    and the group's."""
    import logging

    root = ctx.find_root().params
    if quiet or root.get("quiet"):
        return 0
    if verbose or root.get("verbose"):
        from scarcelab.entrypoints.cli import mlflow_log_level

        logging.getLogger().setLevel(logging.INFO)
        mlflow_log_level(True)
        return 2
    return 1


# -- parameter parity with mlflow run --------------------------------------------------------

def entry_params(ctx: click.Context, names: dict[str, str]) -> dict[str, str]:
    """The entry point's parameters as ``mlflow run`` logs them: MLproject name -> the raw
    value, shell-quoted as MLflow Projects quotes it. ``names`` maps MLproject names to
    click parameter names."""
    raw = ctx.meta.get(RAW, {})
    # an option outside the typed layer (a click.Choice such as contamination's --tuning)
    # records no raw text: its value is what MLflow Projects would log, the given or
    # default string; the contamination parent once logged tuning='' for the default
    out = {}
    for k, p in names.items():
        v = raw[p] if p in raw else ctx.params.get(p)
        out[k] = shlex.quote("" if v is None else str(v))
    return out


def param_str(v: Any) -> str:
    """How a tracker renders a parameter value (``tracking.mlflow_tracker._param_value``)."""
    return v if isinstance(v, str) else json.dumps(v, default=str)


def merge_params(entry: dict[str, str], resolved: dict[str, Any]) -> dict[str, Any]:
    """What a run started by ``mlflow run`` ends up with: the entry parameters as given, and
    each resolved value that differs as ``resolved.<name>`` (the tracker's rule when params
    already exist). The console script logs the same, so one UI filter finds both."""
    out: dict[str, Any] = dict(entry)
    for k, v in resolved.items():
        if k in entry:
            if v is None or v == "":  # "not set": the entry value says it already
                continue
            if param_str(v) != entry[k]:
                out[f"resolved.{k}"] = v
        else:
            out[k] = v
    return out


# -- kept for callers of the old helpers -----------------------------------------------------

def opt_int(value: str | None, name: str) -> int | None:
    try:
        return Int(default_ok=True).parse(str(value or "").strip())
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint=name) from None


def label_budget(value: str | None, name: str) -> int | str | None:
    try:
        return LabelCount(True).parse(str(value or "").strip())
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint=name) from None


def bool_option(value: str) -> bool:
    try:
        return Bool().parse(str(value).strip())
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


# -- one declaration per option ---------------------------------------------------------------

# the --help groups of the study commands, in the order --help shows them
WHAT = "What to run"
BUDGET = "Time budget and search"
OWN = "Your own images (--dataset folder:PATH or csv:FILE)"
DEVICE = "Batches and device"
DIAGNOSTICS = "Per-epoch diagnostics"
RUN = "MLflow run"
OUTPUT = "Output"
OTHER = "Other options"
GROUPS: tuple[str, ...] = (WHAT, BUDGET, OWN, DEVICE, DIAGNOSTICS, RUN, OUTPUT)


@dataclass(frozen=True)
class Declaration:
    """What an option is beside its click definition (type, default, help), declared with
    it in one call (:func:`option`), so that nothing else lists options by hand (issue 44
    item 2: a study option was declared in 13 places and they drifted).

    - ``group``: its ``--help`` section (:data:`GROUPS`);
    - ``row``: whether it keys a leaderboard row — a setting that changes what a study
      computes — or not (the seed, names, where things live, how the console talks);
    - ``before``: for a setting added after studies were already recorded, the value
      those studies ran with (so an older study and a newer one of the same
      configuration stay one row); None when it has been logged since the first studies;
    - ``entry``: whether it is a parameter of the command's MLproject entry point (not:
      the console's verbosity, the run name and experiment, which ``mlflow run`` owns).

    From these, :func:`entry_map` gives the MLproject parameter maps, the grouped
    ``--help`` reads ``group``, and ``python -m scarcelab.entrypoints.declared`` writes the
    query layer's table of ``row``/``before`` (tracking/query/declared.py)."""

    group: str
    row: bool = True
    before: str | None = None
    entry: bool = True


_F = TypeVar("_F", bound=Callable[..., Any])


def option(*flags: str, group: str, row: bool = True, before: str | None = None,
           entry: bool = True, **kw: Any) -> Callable[[_F], _F]:
    """``click.option(*flags, **kw)`` with its :class:`Declaration`."""
    if group not in GROUPS:
        raise ValueError(f"option {flags}: group {group!r} is not one of {GROUPS}")
    decl = Declaration(group, row, before, entry)
    make = click.option(*flags, **kw)

    def apply(fn: _F) -> _F:
        fn = make(fn)
        # click keeps a decorated function's options in this attribute until the command
        # is built; the one just added is last
        getattr(fn, "__click_params__")[-1].declaration = decl  # noqa: B009
        return fn
    return apply


def declaration(p: click.Parameter) -> Declaration | None:
    """The declaration of a parameter made by :func:`option`; None for any other."""
    return getattr(p, "declaration", None)


def param_key(p: click.Parameter) -> str:
    """The name an option has as an MLproject parameter and a logged param: its long flag
    (``--set`` -> ``set``; click's own name for it is ``overrides``)."""
    longs = [o for o in getattr(p, "opts", ()) if o.startswith("--")]
    return longs[0][2:].replace("-", "_") if longs else str(p.name)


def declared_params(*decorators: Callable[[Callable[..., Any]], Any]
                    ) -> list[click.Parameter]:
    """The parameters the option decorators put on a command, in --help order."""
    def fn(**kw: Any) -> None: ...
    for d in reversed(decorators):
        fn = d(fn)
    return list(reversed(getattr(fn, "__click_params__", [])))


def entry_map(*decorators: Callable[[Callable[..., Any]], Any]) -> dict[str, str]:
    """MLproject parameter name -> click parameter name, for the options the decorators
    declare as entry-point parameters (tests/entrypoints/test_cli.py checks MLproject
    against it)."""
    return command_entry_map(declared_params(*decorators))


def command_entry_map(params: list[click.Parameter]) -> dict[str, str]:
    """:func:`entry_map` of a command's parameters (``command.params``)."""
    out = {}
    for p in params:
        d = declaration(p)
        if d is not None and d.entry:
            out[param_key(p)] = str(p.name)
    return out


class GroupedCommand(click.Command):
    """A command whose ``--help`` lists its options in titled groups (each option's
    :class:`Declaration`, in the order of :data:`GROUPS`)
    instead of one flat list: a study command has ~40 options, and the one a newcomer
    looks for (the budget, their own images, the device) was lost among them. Written
    here rather than taken from cloup or rich-click: ~20 lines against a new dependency."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        groups: dict[str, list[tuple[str, str]]] = {g: [] for g in (*GROUPS, OTHER)}
        for p in self.get_params(ctx):
            rec = p.get_help_record(ctx)
            if rec is None:
                continue
            # click names its help option as it likes: known by its flags
            is_help = bool(set(getattr(p, "opts", ())) & set(ctx.help_option_names))
            d = declaration(p)
            groups[OUTPUT if is_help else d.group if d is not None else OTHER].append(rec)
        for title, recs in groups.items():
            if recs:
                with formatter.section(title):
                    formatter.write_dl(recs)
