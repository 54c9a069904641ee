"""What a user types into a preset: TOML text, and ``--set section.key=value`` items checked against
the sections' keys (with a did-you-mean) before they are applied to parsed preset data."""

from __future__ import annotations

import tomllib
from dataclasses import fields
from typing import Any

from workbench.config.schema import SECTIONS, PresetError
from workbench.config.validate import did_you_mean


def parse_toml(text: str, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PresetError(f"{where}: not valid TOML: {e}") from None


def parse_override(item: str) -> tuple[str, str, Any]:
    """``section.key=value`` -> (section, key, value parsed as TOML; a bare word is a string)."""
    if "=" not in item:
        raise PresetError(f"--set {item!r}: expected section.key=value, e.g. --set train.max_iters=200")
    lhs, rhs = item.split("=", 1)
    lhs = lhs.strip()
    if lhs.count(".") != 1:
        raise PresetError(f"--set {item!r}: the key must be section.key, e.g. train.lr")
    sec, key = lhs.split(".")
    if sec not in SECTIONS:
        raise PresetError(f"--set {item!r}: unknown section {sec!r}{did_you_mean(sec, SECTIONS)}; "
                          f"sections are {', '.join(SECTIONS)}")
    known = {f.name for f in fields(SECTIONS[sec])}
    if key not in known:
        raise PresetError(f"--set {item!r}: unknown key {sec}.{key}{did_you_mean(key, known)}")
    return sec, key, parse_value(rhs)


def parse_value(rhs: str) -> Any:
    """A ``--set`` value parsed as TOML; a bare word (cpu, builtin) is taken as a string."""
    rhs = rhs.strip()
    try:
        return tomllib.loads(f"v = {rhs}")["v"]
    except tomllib.TOMLDecodeError:
        return rhs


def overridden_keys(overrides: list[str] | None) -> frozenset[str]:
    """``section.key`` of each --set."""
    return frozenset(item.split("=", 1)[0].strip() for item in overrides or [])


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `section.key=value` strings (value parsed as TOML) to parsed preset data in place."""
    for item in overrides:
        sec, key, value = parse_override(item)
        data.setdefault(sec, {})[key] = value
    return data
