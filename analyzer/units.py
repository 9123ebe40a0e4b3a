"""Human units for the report: GiB, %, hours, money, kWh and dates, never scientific notation."""

from __future__ import annotations

import math
from datetime import UTC, datetime

GIB = 1024**3


def _missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def gib(value: object) -> str:
    """Bytes as GiB with one decimal ("33.3 GiB"); small values in MiB."""
    if _missing(value):
        return ""
    number = float(value)  # type: ignore[arg-type]
    if abs(number) < GIB:
        return f"{number / 1024**2:,.0f} MiB"
    return f"{number / GIB:,.1f} GiB"


def gib_fixed(value: float, digits: int) -> str:
    """Bytes as GiB with exactly `digits` decimals and no MiB below 1 GiB ("0.50 GiB"): for a
    reason or an error that sets a figure beside a limit, which must read in the same unit."""
    return f"{value / GIB:.{digits}f} GiB"


def pct(value: object, digits: int = 0) -> str:
    """A fraction as a percentage ("42 %"); below 1 % with one decimal so 0.2 % is not "0 %"."""
    if _missing(value):
        return ""
    number = 100 * float(value)  # type: ignore[arg-type]
    if 0 < abs(number) < 1 and digits == 0:
        return f"{number:.1f} %"
    return f"{number:.{digits}f} %"


def hours(value: object) -> str:
    """GPU-hours with thousands separators and one decimal under 100 ("12.5 h", "1,204 h")."""
    if _missing(value):
        return ""
    number = float(value)  # type: ignore[arg-type]
    return f"{number:,.0f} h" if abs(number) >= 100 else f"{number:,.1f} h"


def money(value: float, currency: str = "USD") -> str:
    return f"{value:,.0f} {currency}" if abs(value) >= 100 else f"{value:,.2f} {currency}"


def kwh(value: float) -> str:
    return f"{value:,.0f} kWh" if abs(value) >= 100 else f"{value:,.1f} kWh"


def number(value: object) -> str:
    """Any other number: integers as integers, others with up to three significant digits."""
    if _missing(value):
        return ""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def when(epoch: float) -> str:
    """A timestamp as "2026-11-24 00:00 UTC"."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M UTC")
