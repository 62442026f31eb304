"""Numbers that come from outside — a request's field or header, a command
line's flag — parsed strictly, in one place for every app.

Python's own parsers are generous: `int()` takes "١٢" (another script's
digits), "1_000" and " 7 ", and refuses a 5,000-digit string only with its
digit-limit error; `str.isdigit()` accepts "²", which `int()` then refuses;
`float()` takes "inf" and "nan". A number a person or
a client sends is therefore read here: ASCII digits only, a bounded length,
a finite value in a stated range — or `NumberRefused` saying what is
expected. A view turns that into a clear refusal or a 400, a command into
its usage error; nothing answers 500 or runs with a value it cannot use.

Dependency-free (no Django), so the provider simulator's command line can
use it as well as every app's commands and views.
"""

import argparse
import math
import re
from collections.abc import Callable

__all__ = ["NumberRefused", "BIGINT_MAX", "whole_number", "finite_number", "whole_flag", "number_flag"]

# The largest id a database's bigint column holds.
BIGINT_MAX = 2**63 - 1

_WHOLE = re.compile(r"-?[0-9]{1,19}", re.ASCII)
_DECIMAL = re.compile(r"[+-]?(?:[0-9]{1,30}(?:\.[0-9]{0,30})?|\.[0-9]{1,30})(?:[eE][+-]?[0-9]{1,3})?", re.ASCII)


class NumberRefused(ValueError):
    """The text is not a number the caller accepts; the message says what is."""


def _shown(text) -> str:
    shown = str(text)
    return repr(shown if len(shown) <= 40 else shown[:40] + "…")


def _range(minimum, maximum, *, above=None) -> str:
    low = f"above {above:g}" if above is not None else (f"at least {minimum:g}" if minimum is not None else "")
    high = f"at most {maximum:g}" if maximum is not None else ""
    return " and ".join(part for part in (low, high) if part)


def whole_number(text, *, minimum: int | None = 0, maximum: int | None = BIGINT_MAX) -> int:
    """`text` (a str, or an int passed through) as a whole number in
    [minimum, maximum]: ASCII digits, a leading "-" only, at most 19 digits.
    Raises `NumberRefused`."""
    if isinstance(text, bool) or not isinstance(text, int | str):
        raise NumberRefused(f"must be a whole number, not {_shown(text)}")
    if isinstance(text, str):
        if not _WHOLE.fullmatch(text):
            raise NumberRefused(f"must be a whole number written in digits 0-9, not {_shown(text)}")
        value = int(text)
    else:
        value = text
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise NumberRefused(f"must be a whole number {_range(minimum, maximum)}, not {_shown(text)}")
    return value


def finite_number(text, *, minimum: float | None = None, maximum: float | None = None,
                  above: float | None = None) -> float:
    """`text` (a str, or a number passed through) as a finite float in the
    range (`above` excludes its bound: "above 0" for a duration that must be
    positive). Decimal notation in ASCII only — no "inf", "nan", "1_0".
    Raises `NumberRefused`."""
    if isinstance(text, bool) or not isinstance(text, int | float | str):
        raise NumberRefused(f"must be a number, not {_shown(text)}")
    if isinstance(text, str):
        if not _DECIMAL.fullmatch(text):
            raise NumberRefused(f"must be a finite number written in digits 0-9, not {_shown(text)}")
    value = float(text)
    if not math.isfinite(value):
        raise NumberRefused(f"must be a finite number, not {_shown(text)}")
    if ((minimum is not None and value < minimum) or (maximum is not None and value > maximum)
            or (above is not None and value <= above)):
        raise NumberRefused(f"must be a number {_range(minimum, maximum, above=above)}, not {_shown(text)}")
    return value


def _flag(parse, **bounds) -> Callable[[str], float | int]:
    def parse_flag(text: str):
        try:
            return parse(text, **bounds)
        except NumberRefused as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    # argparse names the type in some messages ("invalid parse_flag value").
    parse_flag.__name__ = "number"
    return parse_flag


def whole_flag(minimum: int | None = 0, maximum: int | None = BIGINT_MAX) -> Callable[[str], int]:
    """An argparse `type=` for a whole-number flag in [minimum, maximum]:
    anything else is the command's usage error, naming the flag."""
    return _flag(whole_number, minimum=minimum, maximum=maximum)


def number_flag(*, minimum: float | None = None, maximum: float | None = None,
                above: float | None = None) -> Callable[[str], float]:
    """An argparse `type=` for a finite number flag in the range (see
    `finite_number`): "inf", "nan" or an out-of-range value is the
    command's usage error, naming the flag."""
    return _flag(finite_number, minimum=minimum, maximum=maximum, above=above)
