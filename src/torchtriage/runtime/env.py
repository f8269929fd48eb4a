"""Reading and writing environment variables for the runtime helpers: one policy, one place.

Reading: an empty or whitespace-only value counts as unset (docker and compose pass-throughs export
empty strings). A malformed number, or a non-positive one where a positive one is needed, warns and
falls back to the default: a typo must never silently disarm a watchdog.

Writing: `set_env` is the only way the runtime helpers change the environment. It never silently
replaces a value the user chose: a different value already there is kept, with a warning saying what
torchtriage would have set and why, unless the caller passes `override=True` (then it warns that it
overwrites). This module imports nothing heavy.
"""

from __future__ import annotations

import math
import os
import warnings
from datetime import timedelta

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})

NCCL_TIMEOUT_ENV = "DIST_NCCL_TIMEOUT_MINUTES"
NCCL_TIMEOUT_DEFAULT_MINUTES = 30.0
STORE_TIMEOUT_ENV = "DIST_STORE_TIMEOUT_HOURS"
STORE_TIMEOUT_DEFAULT_HOURS = 4.0
STRICT_ENV = "TORCHTRIAGE_STRICT"


class EnvWarning(UserWarning):
    """An environment variable torchtriage reads or sets is malformed or already set differently."""


def _warn(message: str) -> None:
    warnings.warn(message, EnvWarning, stacklevel=3)


def env_str(name: str, default: str | None = None) -> str | None:
    """The value of `name`, stripped; `default` when it is unset, empty or only whitespace."""
    value = os.environ.get(name)
    if value is None or not value.strip():
        return default
    return value.strip()


def env_flag(name: str, default: bool = False) -> bool:
    """A boolean: 1/true/yes/on or 0/false/no/off (any case). Anything else warns and gives `default`."""
    value = env_str(name)
    if value is None:
        return default
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    _warn(f"{name}={value!r} is not a boolean (use 1/0, true/false, yes/no or on/off); using {int(default)}")
    return default


def env_positive_float(name: str, default: float) -> float:
    """A finite number > 0. Malformed, zero, negative, inf or nan values warn and give `default`."""
    value = env_str(name)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        _warn(f"{name}={value!r} is not a number; using the default {default:g}")
        return default
    if not math.isfinite(number) or number <= 0:
        _warn(
            f"{name}={value!r} must be a positive number (zero or negative would disarm the timeout it sets); "
            f"using the default {default:g}"
        )
        return default
    return number


def env_positive_int(name: str, default: int) -> int:
    """An integer > 0. Malformed (including `1.5`), zero or negative values warn and give `default`."""
    value = env_str(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        _warn(f"{name}={value!r} is not an integer; using the default {default}")
        return default
    if number <= 0:
        _warn(f"{name}={value!r} must be a positive integer; using the default {default}")
        return default
    return number


def nccl_timeout() -> timedelta:
    """The collective watchdog window: `DIST_NCCL_TIMEOUT_MINUTES` (default 30 minutes)."""
    return timedelta(minutes=env_positive_float(NCCL_TIMEOUT_ENV, NCCL_TIMEOUT_DEFAULT_MINUTES))


def store_timeout() -> timedelta:
    """The bound on c10d-store waits: `DIST_STORE_TIMEOUT_HOURS` (default 4 hours)."""
    return timedelta(hours=env_positive_float(STORE_TIMEOUT_ENV, STORE_TIMEOUT_DEFAULT_HOURS))


def strict_default() -> bool:
    """Whether consistency checks raise by default: `TORCHTRIAGE_STRICT` (default off: they warn)."""
    return env_flag(STRICT_ENV, False)


def set_env(name: str, value: object, *, reason: str, override: bool = False) -> str:
    """Set `name` to `value` unless the user already chose a different value; returns the value in effect.

    An unset or empty variable is set. The same value is left alone. A different value is kept, with a
    warning naming what torchtriage would set and `reason`; with `override=True` it is replaced, with a
    warning that says so.
    """
    wanted = str(value)
    current = env_str(name)
    if current is None or current == wanted:
        os.environ[name] = wanted
        return wanted
    if override:
        _warn(f"torchtriage overwrites {name}={current!r} with {wanted!r}: {reason}")
        os.environ[name] = wanted
        return wanted
    _warn(
        f"keeping your {name}={current!r}; torchtriage would set {wanted!r} ({reason}). "
        f"Unset {name} to take torchtriage's value."
    )
    return current


def set_env_aliases(names: tuple[str, ...], value: object, *, reason: str) -> str:
    """`set_env` for one setting that torch reads under several spellings (newest first).

    If the user set any spelling, every spelling is left as it is (a warning if their value differs);
    otherwise every spelling is set, so older and newer torch versions both see it.
    """
    for name in names:
        current = env_str(name)
        if current is not None:
            if current != str(value):
                _warn(
                    f"keeping your {name}={current!r}; torchtriage would set {value!r} ({reason}). "
                    f"Unset {name} to take torchtriage's value."
                )
            return current
    for name in names:
        set_env(name, value, reason=reason)
    return str(value)
