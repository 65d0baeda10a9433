"""How many digits a ``mean ± std`` shows in ``hpcfl report``'s text, markdown and LaTeX tables.

The std is rounded to two significant digits and the mean to the same decimal place, so a
column never claims more precision than its spread carries and every cell of a table follows
one rule::

    0.8123 ± 0.0147  ->  0.812 ± 0.015
    33.0 ± 3.2       ->  33.0 ± 3.2
    19.3 ± 4.041     ->  19.3 ± 4.0
    33.0 ± 12.3      ->  33 ± 12
    333 ± 123        ->  330 ± 120

A mean without a std (one run) keeps the column's own format, which the caller passes in; a
std of 0 (every seed the same, to float rounding) shows the mean that way too, with ``± 0``. CSV and
JSON keep the raw numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable

# a std this small against the mean is float rounding of equal values (0.8 - 0.1 + 0.1 ...), not spread
NEGLIGIBLE = 1e-9


def _undefined(v) -> bool:
    return v is None or not math.isfinite(v)


def decimals(std: float) -> int:
    """The decimal place two significant digits of ``std`` end at (negative: tens, hundreds).

    ``format(std, ".1e")`` rounds to two significant digits first, so 0.0996 (-> 0.10) gives
    2, not 3.
    """
    return 1 - int(format(abs(std), ".1e").split("e")[1])


def fixed(v: float, places: int, sign: bool = False) -> str:
    """``v`` rounded to ``places`` decimals (negative: to tens, hundreds...); '+' first with
    ``sign``; a value that rounds to zero shows no minus sign."""
    if places < 0:
        v, places = round(v, places), 0
    text = f"{v:+.{places}f}" if sign else f"{v:.{places}f}"
    if not any(c in "123456789" for c in text):   # -0.000: the sign means nothing
        text = text.lstrip("+-")
    return text


def pm_text(mean, std, alone: Callable[[float], str], sign: bool = False) -> str:
    """``mean ± std`` with the std to two significant digits and the mean to the same place.

    Parameters
    ----------
    mean, std : float or None
        NaN or None std: the mean alone, as ``alone(mean)`` writes it (one run).
    alone : callable(float) -> str
        The column's own format of a value, used where there is no spread to round to.
    sign : bool
        Write a '+' before a positive mean (a paired difference).
    """
    if _undefined(mean):
        return "-"
    if _undefined(std):
        return _signed(alone(mean), mean, sign)
    if std <= NEGLIGIBLE * max(abs(mean), 1.0):   # equal values but for float rounding (1e-16)
        return _signed(alone(mean), mean, sign) + " ± 0"
    d = decimals(std)
    return f"{fixed(mean, d, sign)} ± {fixed(std, d)}"


def _signed(text: str, v: float, sign: bool) -> str:
    return "+" + text if sign and v > 0 and not text.startswith("+") else text
