"""Training options: defaults < config file (TOML) < command line.

Keys in the file mirror the command-line options (`batch-size` or `batch_size`).
Problems raise ConfigError, a ValueError whose message is one line naming the key.
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys
from dataclasses import dataclass

from ..precision import PRECISIONS  # fp32, fp32-strict, bf16, fp16: their meaning is there

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class ConfigError(ValueError):
    """A bad option value or config file."""


@dataclass
class Config:
    dataset: str = "digits"
    model: str = "mlp"
    epochs: int = 20
    batch_size: int = 64
    lr: float = 2e-3
    time_steps: int | None = None  # None: the data set's own default
    device: str = "auto"  # cuda when present, else cpu
    precision: str = "fp32"
    compile: bool = False
    capture: bool = True  # CUDA-graph training steps on CUDA (--no-capture turns it off)
    background_compile: bool = False  # layers run quick kernels or torch twins while theirs compile (Trainer)
    clip_grad: float | None = None  # max total gradient norm; None: no clipping
    sparse: bool = False  # sparse training (the ipu-* models: spikefuse.models.trains_sparse)
    max_rate: float | None = None  # bound on each hidden neuron's firing rate (RateRegularizer); None: off
    rate_weight: float = 100.0  # the rate penalty's weight
    rate_l1: float = 0.0  # weight of the L1 term on spikes (RateRegularizer); 0: off
    rate_log: float = 0.0  # weight of the log term on rates (RateRegularizer); 0: off
    seed: int = 0
    stop_on_nan: bool = True  # stop when an epoch's training loss is NaN or inf
    threads: int = 1  # CPU threads for PyTorch ops (why 1: see command.py)
    out: str | None = None  # None: runs/<dataset>-<model>-<timestamp>

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


FIELDS = {f.name: f for f in dataclasses.fields(Config)}
TYPES = {"dataset": str, "model": str, "epochs": int, "batch_size": int, "lr": float,
         "time_steps": int, "device": str, "precision": str, "compile": bool, "capture": bool,
         "background_compile": bool,
         "clip_grad": float, "sparse": bool, "max_rate": float, "rate_weight": float, "rate_l1": float,
         "rate_log": float, "seed": int, "stop_on_nan": bool, "threads": int,
         "out": str}
# --sparse's regulariser when none of --max-rate, --rate-l1, --rate-log is given: the per-neuron
# bound and the log term. Over 20 epochs at width 4, batch 8 (docs/sparse.md) the bound alone
# ended the hard shd-synthetic set 2.6-3.0 points under unregularised dense training, the
# bound with the log term 1.6-1.8 (randman: 0.3-1.0); the L1 term (--rate-l1 10) drove the
# rates to 0.1-0.3% and accuracy 5-10 points down, and silenced width 1. `--rate-l1 0` (or
# --rate-log 0) alone trains without a regulariser.
SPARSE_REGULARISER = {"max_rate": 0.05, "rate_log": 0.05}
RATE_OPTIONS = ("max_rate", "rate_l1", "rate_log")
MAX_COUNT = 2**31 - 1  # epochs, batch size, time steps: far beyond use, still an int32
# Not the machine's core count: a run's saved options must resume on another machine. 1024 is
# far past any useful count; libgomp fails to start ~10^4 threads and the process then dies of
# SIGSEGV (and --threads 100000 did, leaving the run directory behind).
MAX_THREADS = 1024
# lr and clip-grad act on float32 values: outside float32's normal range they overflow (the
# optimizer's RuntimeError: --lr 1e300) or round to zero or a subnormal (nothing trains)
FLOAT32_RANGE = (1.1754943508222875e-38, 3.4028234663852886e+38)
# Adam's first step is lr / (1 - beta1) (its bias correction), 10 lr at the betas `spikefuse
# train` uses: an lr in float32's range above a tenth of its top overflowed there (--lr 1e38:
# Adam's RuntimeError, exit 1)
ADAM_BETA1 = 0.9
SEED_RANGE = (-(2**63), 2**63 - 1)  # what torch.manual_seed takes (an int64)


def read_toml(path: str) -> dict:
    """Option values from a TOML file, keys normalised to field names."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    except UnicodeDecodeError as e:  # a binary file: TOML is UTF-8 text
        raise ConfigError(f"config file {path} is not a TOML text file: byte {e.object[e.start]:#04x} "
                          f"at offset {e.start} is not UTF-8") from None
    values = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if name not in FIELDS:
            valid = ", ".join(k.replace("_", "-") for k in FIELDS)
            raise ConfigError(f"config file {path}: unknown key {key!r}; valid keys: {valid}")
        if name in values:  # batch_size and batch-size: which one was meant?
            raise ConfigError(f"config file {path}: {key!r} sets {name.replace('_', '-')!r} a second time; keep one")
        values[name] = value
    return values


def make(*layers: dict) -> Config:
    """A validated Config from dicts of option values, later ones winning."""
    values = {}
    for layer in layers:
        values.update(layer)
    for name, value in values.items():
        if name not in FIELDS:  # e.g. options saved by a newer version
            raise ConfigError(f"unknown option {name.replace('_', '-')!r}; valid: "
                              f"{', '.join(k.replace('_', '-') for k in FIELDS)}")
        values[name] = _check_type(name, value)
    if values.get("sparse") and not any(name in values for name in RATE_OPTIONS):
        values.update(SPARSE_REGULARISER)
    cfg = Config(**values)
    for name in ("epochs", "batch_size", "time_steps", "threads"):
        if getattr(cfg, name) is not None:
            check_count(name.replace("_", "-"), getattr(cfg, name), MAX_THREADS if name == "threads" else MAX_COUNT)
    check_seed("seed", cfg.seed)
    for name in ("lr", "clip_grad"):
        if getattr(cfg, name) is not None:
            check_float32(name.replace("_", "-"), getattr(cfg, name))
    if cfg.lr is not None:
        check_first_step("lr", cfg.lr, ADAM_BETA1)
    from .activity import check_rate_options
    try:
        check_rate_options(0.0 if cfg.max_rate is None else cfg.max_rate, cfg.rate_weight, cfg.rate_l1, cfg.rate_log)
    except ValueError as e:
        raise ConfigError(str(e).replace("max_rate: ", "max-rate: ").replace("rate_weight: ", "rate-weight: ")
                          .replace("rate_l1: ", "rate-l1: ").replace("rate_log: ", "rate-log: ")) from None
    check_path_name("out", cfg.out, "leave --out out for the default runs/<dataset>-<model>-<time>")
    if cfg.precision not in PRECISIONS:
        raise ConfigError(f"unknown precision {cfg.precision!r}; expected one of: {', '.join(PRECISIONS)}")
    return cfg


# The checks of the training options, one per kind of value, shared by make (the CLI and
# config files, whose labels are the options' dashed names) and Trainer (its keywords' names):
# the same bounds and words from both. ConfigError is a ValueError.

def check_kind(label: str, kind: type, value):
    """value as `kind` (int, float, bool or str; bools are no numbers, an int is a float)."""
    ok = (isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))) or \
         (kind is float and isinstance(value, int) and not isinstance(value, bool))
    if not ok:
        raise ConfigError(f"{label} must be {kind.__name__}, got {value!r}")
    try:
        return kind(value)
    except OverflowError:  # an int too large for a float
        raise ConfigError(f"{label} must be a finite {kind.__name__}, got {value!r}") from None


def check_count(label: str, value, most: int = MAX_COUNT) -> int:
    """An int from 1 to `most`: epochs, batch size, time steps, threads."""
    value = check_kind(label, int, value)
    if value < 1:
        raise ConfigError(f"{label} must be at least 1, got {value}")
    if value > most:
        raise ConfigError(f"{label} must be at most {most}, got {value}")
    return value


def check_seed(label: str, value) -> int:
    """An int64, as torch.manual_seed takes (NaN or 2**70 failed inside it)."""
    value = check_kind(label, int, value)
    if not SEED_RANGE[0] <= value <= SEED_RANGE[1]:
        raise ConfigError(f"{label} must be an integer from -2**63 to 2**63 - 1 (a 64-bit seed), got {value}")
    return value


def check_float32(label: str, value) -> float:
    """A number > 0 in float32's normal range: a learning rate, a gradient-norm bound."""
    value = check_kind(label, float, value)
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"{label} must be a finite number > 0, got {value}")
    if not FLOAT32_RANGE[0] <= value <= FLOAT32_RANGE[1]:
        raise ConfigError(f"{label} must lie in float32's normal range, {FLOAT32_RANGE[0]:.3g} to "
                          f"{FLOAT32_RANGE[1]:.3g} (training runs in float32), got {value:g}")
    return value


def check_path_name(label: str, value, hint: str, what: str = "a directory"):
    """A path given by name (a run directory, an output file), or None: a str or os.PathLike
    that names something (a blank --out '' became the default name, --resume '' a new run and
    fit's run_dir='' the current directory, without a word) and holds no NUL (os's 'embedded
    null byte', exit 1)."""
    if value is None:
        return None
    text = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
    if not isinstance(text, str):
        raise ConfigError(f"{label} must be a path (str or os.PathLike), got {value!r}")
    if not text.strip():
        raise ConfigError(f"{label} must name {what}, got {text!r}; {hint}")
    if "\0" in text:
        raise ConfigError(f"{label} must name {what}, got {text!r}: a path cannot hold a NUL character")
    return value


def check_first_step(label: str, lr: float, beta1: float) -> None:
    """Adam's first step, lr / (1 - beta1) (its bias correction), must stay in float32's range
    (Adam raised a RuntimeError converting it, and only at the first step)."""
    if lr / (1 - beta1) > FLOAT32_RANGE[1]:
        raise ConfigError(f"{label} must be at most {FLOAT32_RANGE[1] * (1 - beta1):.3g}: Adam's first step "
                          f"divides it by 1 - beta1 = {1 - beta1:.3g}, and {lr:g} / {1 - beta1:.3g} is past "
                          f"float32's {FLOAT32_RANGE[1]:.3g}")


def _check_type(name: str, value):
    if value is None and FIELDS[name].default is None:
        return None
    return check_kind(name.replace("_", "-"), TYPES[name], value)
