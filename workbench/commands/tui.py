"""`workbench tui` (also bare `workbench`): the terminal UI."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("tui", help="open the terminal UI (the default with no command)")
    p.set_defaults(func=run)


def run(args) -> int:
    from workbench.tui.app import run_tui  # lazily: Textual loads only for the UI, not with every command
    return run_tui(args.runs_dir)
