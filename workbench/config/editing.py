"""A preset as the editor holds it: TOML text a person wrote, kept as written (comments and layout)
where a change can be made in place, and checked with the line a problem is on."""

from __future__ import annotations

import re
import tomllib

import tomli_w

from workbench.config.overrides import parse_toml
from workbench.config.preset_files import toml_string
from workbench.config.schema import Preset, PresetError
from workbench.config.validate import preset_from_dict


def locate_error(text: str, message: str) -> int | None:
    """1-based line of the problem a validation message names, when it can be found."""
    m = re.search(r"at line (\d+)", message)
    if m:
        return int(m.group(1))
    m = re.search(r"(?:unknown key |\b)(model|train|data|hardware)\.([A-Za-z_][A-Za-z0-9_]*)", message)
    if not m:
        return None
    section, key = m.groups()
    current = None
    for i, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if s.startswith("[") and s.endswith("]"):
            current = s.strip("[]").strip()
        elif current == section and re.match(rf"{re.escape(key)}\s*=", s):
            return i
    return None


def validate_preset_text(text: str, name: str) -> tuple[Preset | None, str]:
    """(preset, '') when valid, else (None, 'line N: message')."""
    try:
        p = preset_from_dict(parse_toml(text, name), name, name=name)
    except PresetError as e:
        msg = str(e).removeprefix(f"{name}: ")
        line = locate_error(text, msg)
        return None, (f"line {line}: {msg}" if line and "at line" not in msg else msg)
    return p, ""


def with_name(text: str, name: str) -> str:
    """The preset ``text`` (valid TOML) with its top-level ``name`` set to ``name``.

    Only that line is rewritten (or one is added at the top), so the user's layout and comments
    stay; the result is checked by parsing it. Where no such edit gives the right document (say, a
    name written over several lines) the document is written anew from its data, without comments."""
    want = dict(tomllib.loads(text), name=name)
    lines = text.splitlines(keepends=True)
    candidates: list[list[str]] = []
    for i, line in enumerate(lines):
        try:
            is_name = tomllib.loads(line).keys() == {"name"}
        except tomllib.TOMLDecodeError:
            continue
        if is_name:
            ending = line[len(line.rstrip("\r\n")):] or "\n"
            candidates.append(lines[:i] + [f"name = {toml_string(name)}{ending}"] + lines[i + 1:])
    candidates.append([f"name = {toml_string(name)}\n"] + lines)  # no name yet: before any table
    for candidate in candidates:
        new = "".join(candidate)
        try:
            if tomllib.loads(new) == want:
                return new
        except tomllib.TOMLDecodeError:
            continue
    return tomli_w.dumps(want)
