"""The generated reference pages: the presets' keys from the schema's field docs (workbench/config/schema.py) and the
CLI's options from its argparse parsers (workbench/cli.py, workbench/commands/). Nothing here is written twice: a key
or an option added to the code is on the page the next time the docs are built.

``python docs/gen/reference.py OUT_DIR`` writes the pages as files; ``docs/gen/hooks.py`` adds them to every
``mkdocs build`` without writing into docs/.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PRESET_KEYS = "reference/preset-keys.md"
CLI_OPTIONS = "reference/cli-options.md"


def _cell(text: str) -> str:
    """Text for a Markdown table cell: pipes, angle brackets and stars taken literally, on one line."""
    return (" ".join(str(text).split()).replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;")
            .replace("*", "\\*"))


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return ""
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{value!r}`" if not isinstance(value, (list, tuple)) or value else "`[]`"


def _allowed(f: dataclasses.Field) -> str:
    meta = f.metadata
    parts = []
    if meta.get("choices"):
        parts.append(" \\| ".join(f"`{c}`" for c in meta["choices"]))
    lo, hi = meta.get("min"), meta.get("max")
    if lo is not None:
        parts.append(f"{'>' if meta.get('min_exclusive') else '≥'} {lo:g}")
    if hi is not None:
        parts.append(f"≤ {hi:g}")
    return ", ".join(parts)


def preset_keys_page() -> str:
    from workbench.config.schema import SECTIONS
    out = ["# Preset keys", "",
           "Every key a preset's `[model]`, `[train]`, `[data]` and `[hardware]` sections take, with its default "
           "and limits. This page is generated from the schema's field documentation "
           "(`workbench/config/schema.py`) each time the docs are built, the same text `workbench presets show NAME` "
           "prints beside each key; see [Presets](presets.md) for the shipped presets and how to write your own.", ""]
    for section, cls in SECTIONS.items():
        out += [f"## [{section}]", "", "| key | default | allowed | what it does |", "|---|---|---|---|"]
        for f in dataclasses.fields(cls):
            out.append(f"| `{section}.{f.name}` | {_default(f)} | {_allowed(f)} | {_cell(f.metadata['doc'])} |")
        out.append("")
    return "\n".join(out)


def _parsers(parser: argparse.ArgumentParser, prog: str):
    """(name, parser) for every command and subcommand, depth first, in the order they were registered."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield f"{prog} {name}", sub, helps.get(name)
                yield from _parsers(sub, f"{prog} {name}")


def _options(parser: argparse.ArgumentParser) -> list[str]:
    fmt = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.help == argparse.SUPPRESS:
            continue
        invocation = fmt._format_action_invocation(action)
        rows.append(f"| `{invocation}` | {_cell(fmt._expand_help(action) if action.help else '')} |")
    return ["| argument | what it does |", "|---|---|", *rows] if rows else []


def cli_options_page() -> str:
    import os
    os.environ["COLUMNS"] = "100"  # argparse's usage lines wrap at the terminal's width: the same width every build
    from workbench.cli import build_parser
    root = build_parser()
    out = ["# CLI options", "",
           "Every command's and subcommand's arguments, generated from the argparse parsers (`workbench/cli.py`, "
           "`workbench/commands/`) each time the docs are built: the same text as `workbench COMMAND --help`. "
           "[CLI](cli.md) says what each command is for.", ""]
    for prog, parser, summary in _parsers(root, "workbench"):
        out += [f"## {prog}", ""]
        if summary:
            out += [_cell(summary), ""]
        usage = parser.format_usage().strip()
        out += ["```text", usage.removeprefix("usage: "), "```", ""]
        if parser.description:
            out += [_cell(parser.description), ""]
        out += [*_options(parser), ""]
    return "\n".join(out)


PAGES = {PRESET_KEYS: preset_keys_page, CLI_OPTIONS: cli_options_page}


if __name__ == "__main__":
    dest = Path(sys.argv[1] if len(sys.argv) > 1 else "site-gen")
    for path, render in PAGES.items():
        (dest / path).parent.mkdir(parents=True, exist_ok=True)
        (dest / path).write_text(render(), encoding="utf-8")
        print(dest / path)
