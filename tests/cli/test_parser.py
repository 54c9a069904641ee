"""`workbench COMMAND ...` builds only that command's parser (building them all imports every command's module:
0.2 s of CPU at every call, the TUI's and the queue runner's included), and parses and says exactly what the full
parser does."""

from __future__ import annotations

import subprocess
import sys

import pytest

from workbench.cli import COMMANDS, build_parser, command_module

NAMES = ["import" if m == "import_model" else m for m in COMMANDS]


def _said(parser, argv: list[str], capsys) -> tuple[int | None, str, str]:
    """What parsing ``argv`` prints and its exit status (None: it parsed)."""
    try:
        parser.parse_args(argv)
        code = None
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("name", NAMES)
def test_each_commands_help_is_the_full_parsers(name, capsys):
    argv = [name, "--help"]
    assert command_module(argv) == ("import_model" if name == "import" else name)
    full = _said(build_parser(), argv, capsys)
    assert full[0] == 0 and f"usage: workbench {name}" in full[1]
    assert _said(build_parser(command_module(argv)), argv, capsys) == full


@pytest.mark.parametrize("argv", [
    ["runs"], ["--runs-dir", "elsewhere", "runs", "--json"], ["--runs-dir=elsewhere", "stop", "a-run"],
    ["train", "cpu-small", "--set", "train.lr=1e-3", "--time-budget", "5m", "--detach"],
    ["queue", "add", "cpu-small", "--set", "model.dim=64"], ["data", "inspect", "notes.txt", "--runs-dir", "x"],
    ["train", "--bogus"], ["rounds", "r", "--rounds", "two"], ["queue", "bogus"]])
def test_a_command_line_parses_to_what_the_full_parser_gives(argv, capsys):
    full, only = build_parser(), build_parser(command_module(argv))
    said = _said(full, argv, capsys)
    assert _said(only, argv, capsys) == said
    if said[0] is None:
        assert vars(only.parse_args(argv)) == vars(full.parse_args(argv))


@pytest.mark.parametrize("argv", [[], ["--help"], ["--version"], ["trian"], ["import_model"], ["--runs-dir", "x"]])
def test_no_command_or_a_word_that_is_none_gets_the_full_parser(argv):
    assert command_module(argv) is None


def test_runs_loads_no_other_commands_module(tmp_path):
    code = ("import sys; from workbench.cli import main; rc = main(['runs', '--runs-dir', sys.argv[1]]); "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('workbench.commands.'))), file=sys.stderr); "
            "sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    loaded = set(r.stderr.split())
    others = {f"workbench.commands.{m}" for m in COMMANDS} - {"workbench.commands.runs", "workbench.commands.tui"}
    assert "workbench.commands.runs" in loaded and not loaded & others, r.stderr  # (tui: cli.py's own import)
