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


# One source of a mixture: ``data.mixture.NAME.FIELD=value`` (its weight a sweep can search, its max_repeat or
# corpus), applied to the source of that name once the preset's mixture (or --corpus NAME=PATH:WEIGHT's) is known.
SOURCE_FIELDS = ("weight", "max_repeat", "corpus")
_SOURCE_PREFIX = "data.mixture."


def parse_source_override(item: str) -> tuple[str, str, Any] | None:
    """``data.mixture.NAME.FIELD=value`` -> (NAME, FIELD, value); None for any other item."""
    lhs, _, rhs = item.partition("=")
    lhs = lhs.strip()
    if not lhs.startswith(_SOURCE_PREFIX) or "=" not in item:
        return None
    name, _, fld = lhs[len(_SOURCE_PREFIX):].rpartition(".")
    if not name or fld not in SOURCE_FIELDS:
        raise PresetError(f"--set {item!r}: a mixture's source is set as data.mixture.NAME.FIELD=value, FIELD one "
                          f"of {', '.join(SOURCE_FIELDS)}, e.g. --set data.mixture.code.weight=0.3")
    return name, fld, parse_value(rhs)


def apply_source_overrides(data: dict[str, Any], overrides: list[str]) -> None:
    """Each ``data.mixture.NAME.FIELD=value`` of ``overrides`` applied to the source named NAME (in place)."""
    for item in overrides:
        if (parsed := parse_source_override(item)) is None:
            continue
        name, fld, value = parsed
        sources = data.get("data", {}).get("mixture") or []
        match = [s for s in sources if isinstance(s, dict) and s.get("name") == name]
        if not match:
            names = ", ".join(repr(s.get("name")) for s in sources if isinstance(s, dict)) or "none"
            raise PresetError(f"--set {item!r}: the mixture has no source named {name!r} (its sources: {names}); "
                              "name one of them, or add it with --corpus NAME=PATH:WEIGHT or [[data.mixture]]")
        match[0][fld] = value


def parse_override(item: str) -> tuple[str, str, Any]:
    """``section.key=value`` -> (section, key, value parsed as TOML; a bare word is a string). A mixture's source
    (``data.mixture.NAME.FIELD``) -> ("data", "mixture.NAME.FIELD", value)."""
    if "=" not in item:
        raise PresetError(f"--set {item!r}: expected section.key=value, e.g. --set train.max_iters=200")
    if (source := parse_source_override(item)) is not None:
        return "data", f"mixture.{source[0]}.{source[1]}", source[2]
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
        if parse_source_override(item) is None:
            data.setdefault(sec, {})[key] = value
    apply_source_overrides(data, overrides)
    return data
