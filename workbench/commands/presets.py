"""`workbench presets list|show|validate|copy`."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import tomli_w

from workbench.commands.common import add_set_option
from workbench.config import (
    SECTIONS,
    Preset,
    PresetError,
    check_preset_name,
    load_preset_file,
    preset_paths,
    preset_to_toml,
    resolve_preset,
    write_user_preset,
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("presets", help="list, show, validate and copy presets")
    ps = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    ps.add_parser("list", help="shipped and user presets").set_defaults(func=cmd_list)
    s = ps.add_parser("show", help="a preset's resolved values, each key with its documentation")
    s.add_argument("name")
    add_set_option(s)
    s.set_defaults(func=cmd_show)
    v = ps.add_parser("validate", help="check preset files (default: every known preset)")
    v.add_argument("paths", nargs="*")
    v.set_defaults(func=cmd_validate)
    c = ps.add_parser("copy", help="copy a preset to a new user preset (./presets/DST.toml)")
    c.add_argument("src")
    c.add_argument("dst")
    add_set_option(c)
    c.set_defaults(func=cmd_copy)


def cmd_list(args: argparse.Namespace) -> int:
    for name, (path, kind) in sorted(preset_paths().items()):
        try:
            desc = load_preset_file(path).description
        except PresetError as e:
            desc = f"INVALID: {e}"
        print(f"{name:<20} {kind:<8} {desc}")
    return 0


def documented_toml(p: Preset) -> str:
    """The preset as TOML with each key's documentation as a comment."""
    out = [f'name = {tomli_w.dumps({"v": p.name})[4:].strip()}']
    if p.description:
        out.append(f'description = {tomli_w.dumps({"v": p.description})[4:].strip()}')
    for sec, cls in SECTIONS.items():
        out.append(f"\n[{sec}]")
        obj = getattr(p, sec)
        for f in dataclasses.fields(cls):
            val = tomli_w.dumps({"v": getattr(obj, f.name)})[4:].strip()
            out.append(f"{f.name} = {val:<12} # {f.metadata['doc']}")
    return "\n".join(out) + "\n"


def cmd_show(args: argparse.Namespace) -> int:
    sys.stdout.write(documented_toml(resolve_preset(args.name, args.overrides)))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    paths = [Path(x) for x in args.paths] or [path for path, _ in preset_paths().values()]
    bad = 0
    for path in paths:
        try:
            load_preset_file(path)
            print(f"ok: {path}")
        except PresetError as e:
            print(f"invalid: {e}")
            bad += 1
    return 1 if bad else 0


def cmd_copy(args: argparse.Namespace) -> int:
    check_preset_name(args.dst)
    p = resolve_preset(args.src, args.overrides)
    p.name = args.dst
    dst = write_user_preset(args.dst, preset_to_toml(p), exists_hint="choose another name or delete it first")
    print(f"wrote {dst}")
    return 0
