"""Small formatting helpers for numbers on screen (plain Python)."""

from __future__ import annotations


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def si(n: float | None, unit: str = "") -> str:
    """1234567 -> '1.23M'."""
    if n is None:
        return "—"
    n = float(n)
    for suffix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{suffix}{unit}"
    return f"{n:.3g}{unit}" if n != int(n) else f"{int(n)}{unit}"


def loss(v: float | None) -> str:
    return "—" if v is None else f"{v:.4f}"


def num(v, spec: str = ".3g") -> str:
    if v is None or isinstance(v, bool):
        return "—"
    try:
        return format(float(v), spec)
    except (TypeError, ValueError):
        return str(v)


def mb(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v / 1024:.2f} GB" if v >= 1024 else f"{v:.0f} MB"


STATE_STYLE = {
    "starting": "bold cyan", "running": "bold green", "finished": "green",
    "stopped": "yellow", "early_stopped": "yellow", "failed": "bold red",
    "crashed": "bold red",
}


def state_markup(state: str) -> str:
    style = STATE_STYLE.get(state, "dim")
    return f"[{style}]{state.replace('_', '-')}[/]"
