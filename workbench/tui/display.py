"""How numbers and run states read on screen (plain Python). Bytes and durations use the
package's one formatter of each (``workbench.fmt``)."""

from __future__ import annotations

from typing import Any

from workbench.fmt import MiB, duration, human_bytes

__all__ = ["duration", "human_bytes", "loss", "mb", "num", "si", "state_markup"]


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


def num(v: Any, spec: str = ".3g") -> str:
    if v is None or isinstance(v, bool):
        return "—"
    try:
        return format(float(v), spec)
    except (TypeError, ValueError):
        return str(v)


def mb(v: float | None) -> str:
    """A figure in MiB (as metrics.jsonl records memory)."""
    return human_bytes(None if v is None else v * MiB)


STATE_STYLE = {
    "starting": "bold cyan", "running": "bold green", "finished": "green",
    "stopped": "yellow", "early_stopped": "yellow", "failed": "bold red",
    "crashed": "bold red", "imported": "cyan",
}


def state_markup(state: str) -> str:
    style = STATE_STYLE.get(state, "dim")
    return f"[{style}]{state.replace('_', '-')}[/]"
