"""Checks for the values a user gives (an option, a hostfile's field, an environment variable), made
where the value enters, so a wrong one is named with its range instead of failing later as
something else ("math domain error", a port "in use"). A leaf: imports nothing of the project."""

from __future__ import annotations

import math

PORT_MIN, PORT_MAX = 1, 65535


class InputError(ValueError):
    """A value a user gave is not of its form or out of its range; the message names the value,
    where it came from and the range."""


def checked_int(value: int | str, what: str, minimum: int, maximum: int | None = None) -> int:
    """`value` (an int, or its text) as an int in [minimum, maximum]; InputError naming `what`."""
    try:
        number = int(str(value).strip(), 10) if isinstance(value, str) else int(value)
    except ValueError:
        raise InputError(f"{what} {value!r}: expected a whole number") from None
    if number < minimum or (maximum is not None and number > maximum):
        span = f"{minimum}-{maximum}" if maximum is not None else f"at least {minimum}"
        raise InputError(f"{what} {number}: must be {span}")
    return number


def checked_float(
    value: float | str,
    what: str,
    minimum: float = 0.0,
    maximum: float | None = None,
    *,
    allow_minimum: bool = False,
) -> float:
    """`value` as a finite float above `minimum` (or equal to it with allow_minimum), at most
    `maximum`; InputError naming `what` (NaN and infinities never pass)."""
    try:
        number = float(value)
    except ValueError:
        raise InputError(f"{what} {value!r}: expected a number") from None
    low_ok = number >= minimum if allow_minimum else number > minimum
    if not math.isfinite(number) or not low_ok or (maximum is not None and number > maximum):
        low = f"{'at least' if allow_minimum else 'more than'} {minimum:g}"
        span = low + (f" and at most {maximum:g}" if maximum is not None else "")
        raise InputError(f"{what} {value}: must be a finite number, {span}")
    return number


def checked_port(value: int | str, what: str = "port") -> int:
    """A TCP port, 1-65535 (what a socket can bind: 70000 is a range error, not a port in use)."""
    return checked_int(value, what, PORT_MIN, PORT_MAX)
