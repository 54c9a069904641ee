"""Preset files: the shipped ones and the user's, found by name, loaded (with --set overrides) and
saved atomically. A user preset of the same name overrides a shipped one."""

from __future__ import annotations

import os
import re
from importlib import resources
from pathlib import Path

import tomli_w

from workbench.config.overrides import apply_overrides, overridden_keys, parse_toml
from workbench.config.schema import Preset, PresetError, _did_you_mean, preset_from_dict
from workbench.fs import write_atomic


def load_preset_file(path: str | Path, overrides: list[str] | None = None) -> Preset:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PresetError(f"preset file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise PresetError(f"cannot read preset file {path}: {e}") from None
    data = parse_toml(text, str(path))
    if overrides:
        apply_overrides(data, overrides)
    return preset_from_dict(data, str(path), name=data.get("name") or path.stem, user_set=overridden_keys(overrides))


_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def shipped_presets_dir() -> Path:
    """The presets that ship with workbench: the checkout's presets/ or the installed copy."""
    checkout = Path(__file__).resolve().parents[2] / "presets"
    if checkout.is_dir() and (checkout / "cpu-small.toml").exists():
        return checkout
    return Path(str(resources.files("workbench._presets")))


def user_presets_dir() -> Path:
    return Path(os.environ.get("WORKBENCH_PRESETS_DIR", "presets")).resolve()


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


def resolve_preset(name_or_path: str, overrides: list[str] | None = None) -> Preset:
    """A preset by name (user presets first) or by path to a .toml file."""
    if name_or_path.endswith(".toml") or os.sep in name_or_path:
        return load_preset_file(name_or_path, overrides)
    paths = preset_paths()
    if name_or_path not in paths:
        check_preset_name(name_or_path)
        hint = _did_you_mean(name_or_path, paths)
        raise PresetError(f"unknown preset {name_or_path!r}{hint}; available: {', '.join(sorted(paths))} "
                          "(`workbench presets list`)")
    return load_preset_file(paths[name_or_path][0], overrides)


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


def save_user_preset(p: Preset, header: str = "", force: bool = False, source_path: Path | None = None) -> Path:
    """Write ``<user presets>/<name>.toml`` atomically, never over the preset it came from and over
    another file only with ``force``; ``header`` lines become comments at the top."""
    check_preset_name(p.name)
    out_dir = user_presets_dir()
    path = out_dir / f"{p.name}.toml"
    if source_path is not None and path.resolve() == source_path.resolve():
        raise PresetError(f"{path} is the preset being fitted; choose another name with --out NAME")
    if path.exists() and not force:
        raise PresetError(f"{path} already exists; choose another name with --out NAME or overwrite it with --force")
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(path, "".join(f"# {line}\n" for line in header.splitlines()) + preset_to_toml(p))
    return path
