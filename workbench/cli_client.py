"""The workbench CLI run as a child process: the one client through which the queue's runner and the TUI start,
resume, stop and queue runs (so neither imports torch: the command does, in its own process).

Every command is ``sys.executable -m workbench COMMAND ... --runs-dir DIR``, so it runs with the interpreter and
venv of its caller. :func:`run_cli` blocks until the command exits: the TUI calls it from thread workers. A
command that streams (a sample, a chat server, an eval's progress) is started with :func:`popen`. Under the tests,
both fork the command from the tests' spawn server instead of starting an interpreter (:class:`Forked`), as
:func:`spawn_detached` does a detached trainer. Here,
below every package, because the queue and the TUI (above it) both need it and it needs nothing but the one
exception.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

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
        proc = run(argv, timeout, cli_env() if env is None else env)
    except subprocess.TimeoutExpired:
        raise CliError(f"`workbench {argv[3]}` did not return within {timeout:.0f} s") from None
    except OSError as e:
        raise CliError(f"could not run {argv[0]}: {e.strerror}") from None
    if proc.returncode != 0:
        msg = last_line(proc.stderr or proc.stdout) or f"`workbench {argv[3]}` exited with status {proc.returncode}"
        raise CliError(error_line(msg))
    return proc.stdout


class Forked:
    """A command forked by the tests' spawn server, as :class:`subprocess.Popen` shows one: ``pid``, ``stdin``,
    ``stdout`` and ``stderr`` (binary pipes where PIPE was asked), ``poll``, ``wait``, ``send_signal``,
    ``terminate``, ``kill``, ``returncode``. Its exit status comes over the server's connection: the child sends
    it as it exits; a child killed by a signal sends none, and its status is that signal's (the last one sent
    through this object, else SIGKILL's)."""

    def __init__(self, args: list[str], conn: Any, pid: int, pipes: dict[str, Any], rest: bytes = b""):
        self.args, self.pid, self._conn, self._buf = args, pid, conn, rest
        self.stdin, self.stdout, self.stderr = pipes.get("stdin"), pipes.get("stdout"), pipes.get("stderr")
        self.returncode: int | None = None
        self._signal = int(signal.SIGKILL)
        self._lock = threading.Lock()  # (a chat server's reader thread and the TUI both ask whether it is alive)
        self._read()

    def _read(self) -> None:
        """What the connection has brought, without waiting: the exit status, or its end (killed)."""
        while self.returncode is None and (b"\n" in self._buf or select.select([self._conn], [], [], 0)[0]):
            if b"\n" not in self._buf:
                chunk = self._conn.recv(4096)
                if not chunk:
                    self._done(-self._signal)
                    break
                self._buf += chunk
            line, _, self._buf = self._buf.partition(b"\n")
            if line.strip() and "code" in (msg := json.loads(line)):
                self._done(int(msg["code"]))

    def _done(self, code: int) -> None:
        self.returncode = code
        self._conn.close()

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                self._read()
            if self.returncode is None:
                try:
                    os.kill(self.pid, 0)
                except ProcessLookupError:  # gone (the server's children are reaped as they exit)
                    self._read()            # its status may have come as it exited
                    if self.returncode is None:
                        self._done(-self._signal)
                except PermissionError:
                    pass
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            left = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
            if left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            try:
                select.select([self._conn], [], [], left)  # the exit status, or the end of the connection
            except (ValueError, OSError):  # closed by another thread's poll, which has the status
                pass
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            self.pass_signal(sig)

    def pass_signal(self, sig: int) -> None:
        """``send_signal`` without asking first whether the child is alive: what a signal handler may call, which
        can interrupt :meth:`poll` in its own thread with the lock held."""
        self._signal = int(sig)
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _ask(path: str, req: dict[str, Any], fds: list[int]) -> tuple[Any, int, bytes] | None:
    """Send ``req`` (and ``fds``, the child's stdin, stdout and stderr) to the tests' spawn server at ``path``: (the
    connection, the child's pid, what came after the pid's line), or None where it cannot be asked."""
    import socket

    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        s.connect(path)
        data = (json.dumps(req) + "\n").encode()
        if fds:
            socket.send_fds(s, [data], fds)
        else:
            s.sendall(data)
        reply = b""
        while b"\n" not in reply:
            chunk = s.recv(4096)
            if not chunk:
                raise OSError("the spawn server closed the connection")
            reply += chunk
        line, _, rest = reply.partition(b"\n")
        pid = int(json.loads(line)["pid"])
    except (OSError, ValueError, KeyError):
        s.close()
        return None
    s.settimeout(None)
    return s, pid, rest


def spawn_detached(cmd: list[str], log: Path, env: dict[str, str]) -> int | None:
    """The pid of ``cmd`` (``python -m MODULE ARGS``) started detached by the tests' spawn server named in
    ``WORKBENCH_TEST_SPAWN``, its output appended to ``log``; None when none is named (every real run) or it cannot
    be reached (the caller then starts the command itself)."""
    path = env.get("WORKBENCH_TEST_SPAWN", "")
    if not path or len(cmd) < 3 or cmd[1] != "-m":
        return None
    asked = _ask(path, {"argv": cmd[2:], "cwd": os.getcwd(), "env": dict(env), "log": str(log)}, [])
    if asked is None:
        return None
    asked[0].close()
    return asked[1]


def _forked(argv: list[str], streams: tuple[Any, Any, Any], env: dict[str, str], session: bool,
            cwd: str | None, tied: int | None = None) -> Forked | None:
    """:func:`popen`'s child from the spawn server, or None where there is none to ask."""
    path = env.get("WORKBENCH_TEST_SPAWN", "")
    if not path or len(argv) < 3 or argv[1] != "-m":
        return None
    fds: list[int] = []     # what the child gets as its stdin, stdout and stderr
    opened: list[int] = []  # of those, the ones made here (closed here once the child has them)
    ends: dict[str, Any] = {}
    for n, (name, spec) in enumerate(zip(("stdin", "stdout", "stderr"), streams)):
        if spec is None:
            fds.append(n)
        elif spec == subprocess.STDOUT:
            fds.append(fds[1])
        elif spec == subprocess.DEVNULL:
            fds.append(os.open(os.devnull, os.O_RDWR))
            opened.append(fds[-1])
        elif spec == subprocess.PIPE:
            r, w = os.pipe()
            fds.append(r if n == 0 else w)
            opened.append(fds[-1])
            ends[name] = os.fdopen(w, "wb") if n == 0 else os.fdopen(r, "rb")
        else:
            fds.append(spec if isinstance(spec, int) else spec.fileno())
    req = {"argv": argv[2:], "cwd": os.path.abspath(cwd or os.getcwd()), "env": env, "wait": True, "session": session,
           "tied": tied}
    try:
        asked = _ask(path, req, fds)
    finally:
        for fd in opened:
            os.close(fd)
    if asked is None:
        for end in ends.values():
            end.close()
        return None
    return Forked(argv, *asked[:2], ends, asked[2])


def stand_in(module: str, argv: list[str]) -> int | None:
    """In a fresh interpreter under the tests (``WORKBENCH_TEST_SPAWN`` names their spawn server; torch not imported
    yet): ``python -m MODULE ARGV`` forked from the spawn server with this process's streams, directory and
    environment, this process standing in for it until it exits: the signals it is sent are passed on, and the
    child's exit status is returned (its signal is ours). The tests' torchrun ranks start so: torchrun starts each
    rank as a new interpreter, which would import torch and ``torch._dynamo`` afresh (~2.4 CPU-s a rank). The
    child is tied to this process: killed if this one dies. None where there is no server to ask (every
    real run): the caller runs the module itself."""
    if "torch" in sys.modules:  # already a child of the server
        return None
    child = _forked([sys.executable, "-m", module, *argv], (None, None, None), dict(os.environ), True, None,
                    int(signal.SIGKILL))
    if child is None:  # a real run
        return None
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda signum, _frame: child.pass_signal(signum))
    code = child.wait()
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def die_with_parent(sig: int) -> None:
    """This process gets ``sig`` when its parent dies (``PR_SET_PDEATHSIG``; Linux only, elsewhere nothing): in a
    child before it execs (:func:`popen`), or in a forked worker (data.text.encode's encoding processes)."""
    if sys.platform != "linux":
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def popen(argv: list[str], *, stdin: Any = None, stdout: Any = None, stderr: Any = None,
          env: dict[str, str] | None = None, start_new_session: bool = False, cwd: str | Path | None = None,
          parent_death_signal: int | None = None) -> Any:
    """``subprocess.Popen(argv, ...)`` for a ``python -m MODULE ...`` command (binary pipes). Where the tests'
    spawn server is named (``WORKBENCH_TEST_SPAWN``, tests/support/spawner.py), the command
    is a child forked from it, torch already imported, with these same streams, directory and environment: a
    :class:`Forked`. Every real run gets the Popen. ``parent_death_signal``: the signal the command gets when this
    process dies, however it dies (Linux: ``PR_SET_PDEATHSIG``; forked, when its connection to this process
    ends)."""
    env = dict(os.environ if env is None else env)
    where = None if cwd is None else str(cwd)
    dies = parent_death_signal if sys.platform == "linux" else None
    return (_forked(argv, (stdin, stdout, stderr), env, start_new_session, where, dies)
            or subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=stderr, env=env,
                                start_new_session=start_new_session, cwd=where,
                                preexec_fn=None if dies is None else functools.partial(die_with_parent, dies)))


def run(argv: list[str], timeout: float | None = None, env: dict[str, str] | None = None,
        input: str | None = None, cwd: str | Path | None = None) -> Any:
    """``subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input)`` (stdin /dev/null
    without ``input``) through :func:`popen`: a ``CompletedProcess``, or ``TimeoutExpired`` once the command has
    been killed."""
    import tempfile
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as given:
        if input is not None:
            given.write(input.encode("utf-8"))
            given.seek(0)
        proc = popen(argv, stdin=subprocess.DEVNULL if input is None else given, stdout=out, stderr=err, env=env,
                     cwd=cwd)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        texts = []
        for f in (out, err):
            f.seek(0)
            texts.append(f.read().decode("utf-8", "replace"))
    return subprocess.CompletedProcess(argv, code, texts[0], texts[1])
