"""Preset files: the shipped ones and the user's, found by name, loaded (with --set overrides) and
saved atomically. A user preset of the same name overrides a shipped one."""

from __future__ import annotations

import os
import re
from importlib import resources
from pathlib import Path
from typing import Any

import tomli_w

from workbench.config.overrides import (
    apply_overrides,
    apply_source_overrides,
    overridden_keys,
    parse_source_override,
    parse_toml,
)
from workbench.config.schema import Preset, PresetError
from workbench.config.validate import did_you_mean, preset_from_dict
from workbench.fs import write_atomic


def load_preset_file(path: str | Path, overrides: list[str] | None = None,
                     values: dict[str, dict[str, Any]] | None = None) -> Preset:
    """A preset file with ``--set`` ``overrides`` (text) and then ``values`` ({section: {key: value}}, set as
    they are: e.g. a corpus list, which never travels through a TOML string) applied, validated."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PresetError(f"preset file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise PresetError(f"cannot read preset file {path}: {e}") from None
    data = parse_toml(text, str(path))
    plain = [o for o in overrides or [] if parse_source_override(o) is None]
    if plain:
        apply_overrides(data, plain)
    for sec, kv in (values or {}).items():
        data.setdefault(sec, {}).update(kv)
    # a mixture's source set by name, once the mixture is known (the preset's, or --corpus NAME=PATH:WEIGHT's)
    apply_source_overrides(data, overrides or [])
    user_set = overridden_keys(overrides) | {f"{sec}.{key}" for sec, kv in (values or {}).items() for key in kv}
    return preset_from_dict(data, str(path), name=data.get("name") or path.stem, user_set=user_set)


_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def shipped_presets_dir() -> Path:
    """The presets that ship with workbench: the checkout's presets/ or the installed copy."""
    checkout = Path(__file__).resolve().parents[2] / "presets"
    if checkout.is_dir() and (checkout / "cpu-small.toml").exists():
        return checkout
    return Path(str(resources.files("workbench._presets")))


def user_presets_dir() -> Path:
    """``$WORKBENCH_PRESETS_DIR``, else ``./presets``; in a checkout's root, where ``./presets`` is the shipped folder,
    its ``user/`` folder (git ignores it): a preset the user saves is never listed as shipped nor left in git's
    working tree."""
    if env := os.environ.get("WORKBENCH_PRESETS_DIR"):
        return Path(env).resolve()
    here = Path("presets").resolve()
    return here / "user" if here == shipped_presets_dir().resolve() else here


def preset_paths() -> dict[str, tuple[Path, str]]:
    """name -> (path, 'shipped'|'user'); user presets override shipped ones by name."""
    out: dict[str, tuple[Path, str]] = {}
    shipped = shipped_presets_dir()
    for p in sorted(shipped.glob("*.toml")):
        out[p.stem] = (p, "shipped")
    user = user_presets_dir()
    if user.is_dir() and user.resolve() != shipped.resolve():
        for p in sorted(user.glob("*.toml")):
            out[p.stem] = (p, "user")
    return out


def check_preset_name(name: str) -> str:
    if not _NAME_RE.match(name):
        raise PresetError(f"preset name {name!r} is not allowed: use letters, digits, '.', '_' and '-' "
                          "(no slashes), up to 64 characters")
    return name


def resolve_preset(name_or_path: str, overrides: list[str] | None = None,
                   values: dict[str, dict[str, Any]] | None = None) -> Preset:
    """A preset by name (user presets first) or by path to a .toml file (``overrides``, ``values``: as
    :func:`load_preset_file` applies them)."""
    if name_or_path.endswith(".toml") or os.sep in name_or_path:
        return load_preset_file(name_or_path, overrides, values)
    paths = preset_paths()
    if name_or_path not in paths:
        check_preset_name(name_or_path)
        hint = did_you_mean(name_or_path, paths)
        raise PresetError(f"unknown preset {name_or_path!r}{hint}; available: {', '.join(sorted(paths))} "
                          "(`workbench presets list`)")
    return load_preset_file(paths[name_or_path][0], overrides, values)


def preset_to_toml(p: Preset) -> str:
    return tomli_w.dumps(p.to_dict())


def toml_string(s: str) -> str:
    """``s`` as a TOML basic string (a Windows path's backslashes escaped), e.g. for ``--set``."""
    return tomli_w.dumps({"v": s})[4:].strip()


def preset_source_path(name_or_path: str) -> Path | None:
    """The file a preset argument names (a path, or the user/shipped file of that name)."""
    if name_or_path.endswith(".toml") or os.sep in name_or_path:
        return Path(name_or_path)
    found = preset_paths().get(name_or_path)
    return found[0] if found else None


def user_preset_path(name: str) -> Path:
    """Where the user preset ``name`` lives (the name checked: it cannot leave the directory)."""
    return user_presets_dir() / f"{check_preset_name(name)}.toml"


def write_user_preset(name: str, text: str, *, overwrite: bool = False, keep: Path | None = None,
                      exists_hint: str = "choose another name") -> Path:
    """The one writer of user presets (``fit``, ``presets copy``, the Presets pane's editor): ``text`` to
    ``<user presets>/<name>.toml`` atomically; never over ``keep`` (the preset it was made from), over an
    existing file only with ``overwrite`` (else a PresetError ending with ``exists_hint``)."""
    path = user_preset_path(name)
    if keep is not None and path.resolve() == Path(keep).resolve():
        raise PresetError(f"{path} is the preset it was made from (never overwritten); choose another name")
    if path.exists() and not overwrite:
        raise PresetError(f"{path} already exists; {exists_hint}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
    except OSError as e:
        raise PresetError(f"cannot write {path}: {e.strerror or e}") from None
    return path


def save_user_preset(p: Preset, header: str = "", force: bool = False, source_path: Path | None = None) -> Path:
    """``p`` as a user preset of its name (``header`` lines as comments at the top), as ``workbench fit``
    writes it: never over the preset being fitted, over another file only with ``force``."""
    return write_user_preset(p.name, "".join(f"# {line}\n" for line in header.splitlines()) + preset_to_toml(p),
                             overwrite=force, keep=source_path,
                             exists_hint="choose another name with --out NAME or overwrite it with --force")
