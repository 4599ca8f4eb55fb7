"""The benchmarks' command-line options, checked before anything is built or measured: each
failure a UsageError (exit 2) naming the option. Counts, seeds and learning rates take
`spikefuse train`'s bounds and words (spikefuse.train.config); lists of names are checked as
`bench on` first checked them."""
from __future__ import annotations

from ..errors import UsageError
from ..neuron_options import check_number
from ..nn.layers import scaled
from ..train.config import (ADAM_BETA1, MAX_COUNT, ConfigError, check_count, check_first_step, check_float32,
                            check_seed)


def _usage(check, *args):
    try:
        return check(*args)
    except ConfigError as e:  # a ValueError, exit 1 at the command line: these are usage mistakes
        raise UsageError(str(e)) from None


def count(option: str, value, most: int = MAX_COUNT) -> int:
    """An int from 1 to `most` (2**31 - 1): sizes, batches, time steps, repetitions."""
    return _usage(check_count, option, value, most)


def seed(option: str, value) -> int:
    """A 64-bit seed, as torch.manual_seed takes it."""
    return _usage(check_seed, option, value)


def rate(option: str, value) -> float:
    """A learning rate: finite, > 0, in float32's normal range, Adam's first step too."""
    value = _usage(check_float32, option, value)
    _usage(check_first_step, option, value, ADAM_BETA1)
    return value


def counts(option: str, text: str, *, empty: bool = False) -> list[int]:
    """A comma-separated list of counts ("1,8,48"); `empty`: an empty list is allowed."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    try:
        values = [int(t) for t in items]
    except ValueError:
        raise UsageError(f"{option} {text}: expected comma-separated whole numbers") from None
    if not values and not empty:
        raise UsageError(f"{option} {text!r}: expected comma-separated whole numbers, got none")
    return [count(option, v) for v in values]


def names(option: str, text: str, known) -> list[str]:
    """A comma-separated list of at least one of `known`."""
    picked = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in picked if n not in known]
    if unknown or not picked:
        raise UsageError(f"{option} {text}: pick from {', '.join(known)}")
    return picked


def width(option: str, value, size: int) -> float:
    """A model's width scale: finite, > 0, making a layer of `size` units at most 2**31 - 1 wide
    (spikefuse.nn.layers.scaled's check; inf or 1e300 failed while the model was built)."""
    try:
        scaled(size, value)
    except ValueError as e:
        raise UsageError(f"{option}: {str(e).removeprefix('width: ')}") from None
    return value


def number(option: str, value, **bounds) -> float:
    """A finite number within spikefuse.neuron_options.check_number's bounds."""
    try:
        return check_number(option, value, **bounds)
    except ValueError as e:  # ArgumentError is one too
        raise UsageError(str(e)) from None
