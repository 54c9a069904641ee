"""The one byte formatter, the one parameter-count formatter and the one duration formatter (CLI and TUI
alike). Plain Python."""

from __future__ import annotations

KiB, MiB, GiB = 1024, 1024 ** 2, 1024 ** 3


def human_bytes(n: float | None) -> str:
    """Three significant figures at most, in binary units: 1536 -> '1.50 KiB', 310.5 * 2**20 ->
    '310 MiB', 23.07 * 2**30 -> '23.1 GiB'; None -> '—'."""
    if n is None:
        return "—"
    for unit, size in (("TiB", 1024 * GiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            v = n / size
            return f"{v:.0f} {unit}" if abs(v) >= 100 else f"{v:.1f} {unit}" if abs(v) >= 10 else f"{v:.2f} {unit}"
    return f"{int(n)} B"


def millions(n: float, spec: str = ".2f") -> str:
    """A parameter (or token) count in millions, ``spec`` its number format: 5048832 -> '5.05 M'."""
    return f"{n / 1e6:{spec}} M"


def duration(seconds: float | None) -> str:
    """59 -> '59s', 65 -> '1m 05s', 3700 -> '1h 01m', 200000 -> '2d 7h'; None -> '—'."""
    if seconds is None:
        return "—"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m {s:02d}s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h {m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d {h}h"
