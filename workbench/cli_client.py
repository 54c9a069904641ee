"""The workbench CLI run as a child process: the one client through which the queue's runner and the TUI start,
resume, stop and queue runs (so neither imports torch: the command does, in its own process).

Every command is ``sys.executable -m workbench COMMAND ... --runs-dir DIR``, so it runs with the interpreter and
venv of its caller. :func:`run_cli` blocks until the command exits: the TUI calls it from thread workers. Here,
below every package, because the queue and the TUI (above it) both need it and it needs nothing but the one
exception.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from workbench.errors import WorkbenchError


class CliError(WorkbenchError):
    """A CLI command that failed (its last line of error output), ran out of time, or could not start."""


def cli_argv(runs_dir: Path, command: str, *args: str) -> list[str]:
    """``python -m workbench COMMAND ARGS... --runs-dir RUNS_DIR`` with this interpreter."""
    return [sys.executable, "-m", "workbench", command, *args, "--runs-dir", str(runs_dir)]


def cli_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a command runs in: ``base`` (this process's by default), output unbuffered, so that its
    lines arrive as it prints them."""
    env = dict(os.environ if base is None else base)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def last_line(text: str) -> str:
    """The last non-blank line of ``text``, stripped ("" if none): a command's answer (a run id), or its error."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def error_line(line: str) -> str:
    """A command's error line without the ``workbench: error:`` the CLI puts before it."""
    return line.removeprefix("workbench: ").removeprefix("error: ")


def run_cli(argv: list[str], timeout: float, env: dict[str, str] | None = None) -> str:
    """Run a CLI command (``argv`` from :func:`cli_argv`) to its end: its stdout, or a CliError with its last line
    of error output (stdout's when stderr is empty)."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              env=cli_env() if env is None else env)
    except subprocess.TimeoutExpired:
        raise CliError(f"`workbench {argv[3]}` did not return within {timeout:.0f} s") from None
    except OSError as e:
        raise CliError(f"could not run {argv[0]}: {e.strerror}") from None
    if proc.returncode != 0:
        msg = last_line(proc.stderr or proc.stdout) or f"`workbench {argv[3]}` exited with status {proc.returncode}"
        raise CliError(error_line(msg))
    return proc.stdout
