"""The `workbench` command: no arguments opens the TUI; subcommands do every action headless.

Each subcommand lives in workbench/commands/<name>.py with ``register(sub)`` and
``run(args) -> int``. A :class:`WorkbenchError` becomes one line on stderr
(``workbench: error: ...``) and a non-zero exit.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import NoReturn

from workbench import __version__
from workbench.commands.tui import run as run_tui
from workbench.errors import WorkbenchError
from workbench.rundir import runs_root

# Module names in workbench/commands (`workbench import` lives in import_model.py: import is a keyword).
COMMANDS = ["train", "resume", "stop", "runs", "doctor", "eval", "pairs", "rounds", "sample", "chat", "data", "presets",
            "hw", "estimate", "fit", "export", "import_model", "metrics", "queue", "sweep", "tui", "serve"]


class OneLineParser(argparse.ArgumentParser):
    """argparse with its errors in one line: what is wrong and where the options are listed, exit 2. argparse's
    own printed the command's whole usage first (eleven lines for `workbench rounds`), the error last."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the options)\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or with ``only`` (a module of COMMANDS) of that one alone: what it parses and
    says is the same, without importing the other commands' modules (``command_module``)."""
    ap = OneLineParser(  # its subcommands' parsers are of its class (argparse makes them with type(parent))
        prog="workbench",
        description="Train small GPT-style language models on your own machine. "
                    "With no command, opens the terminal UI.")
    ap.add_argument("--version", action="version", version=f"workbench {__version__}")
    ap.add_argument("--runs-dir", type=runs_root, default=runs_root(),
                    help="where runs live (default: $WORKBENCH_RUNS_DIR or ./runs)")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS if only is None else [only]:
        importlib.import_module(f"workbench.commands.{name}").register(sub)
    # Accept --runs-dir after the subcommand too, and after a subcommand's action (`data inspect ... --runs-dir`).
    parsers = list(sub.choices.values())
    while parsers:
        p = parsers.pop()
        p.add_argument("--runs-dir", type=runs_root, default=argparse.SUPPRESS,
                       help="where runs live (default: $WORKBENCH_RUNS_DIR or ./runs)")
        parsers += [c for a in p._actions if isinstance(a, argparse._SubParsersAction) for c in a.choices.values()]
    return ap


def bare_tui_args(argv: list[str]) -> argparse.Namespace | None:
    """``argv`` when it only opens the UI (nothing, or ``--runs-dir DIR``), parsed without importing every
    command's module: building the full parser imports them all, about a quarter of a second that a new
    user would wait for the first screen (bench/tui_first_paint.py). None for anything else."""
    ap = argparse.ArgumentParser(prog="workbench", add_help=False, exit_on_error=False)
    ap.add_argument("--runs-dir", type=runs_root, default=runs_root())
    try:
        args, rest = ap.parse_known_args(argv)
    except argparse.ArgumentError:
        return None  # the full parser says what is wrong
    return None if rest else argparse.Namespace(command=None, runs_dir=args.runs_dir)


def command_module(argv: list[str]) -> str | None:
    """The module of the command ``argv`` names (its first word after the top-level ``--runs-dir``), or None: no
    command, a top-level option (``--help``, ``--version``) or a word that is no command, which the full parser
    answers. Building every command's parser imports all their modules, about 0.2 s of CPU at each call."""
    rest = list(argv)
    while rest and (rest[0] == "--runs-dir" or rest[0].startswith("--runs-dir=")):
        rest = rest[2:] if rest[0] == "--runs-dir" else rest[1:]
    if not rest or rest[0].startswith("-"):
        return None
    word = rest[0]
    module = "import_model" if word == "import" else word
    return module if module in COMMANDS and word != "import_model" else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = bare_tui_args(argv)
    if args is None:
        args = build_parser(command_module(argv)).parse_args(argv)
    try:
        if args.command is None:
            return run_tui(args)
        return args.func(args)
    except WorkbenchError as e:
        print(f"workbench: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("workbench: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `workbench ... | head`: the reader has gone; stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
