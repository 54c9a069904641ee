"""The CLI in a forked process: a real, separate process per command, without paying torch's import each time.

Every ``workbench`` command the tests run through :func:`tests.support.cli.wb` used to start a fresh
interpreter: ~2.2 s to import torch, and ~2.3 s more for ``torch._dynamo``, which torch's own optimizers import
on first use (their methods are wrapped in ``torch._disable_dynamo``). A tiny 4-step run took 5 s, 0.4 s of
it the run itself; the suite starts several hundred.

Here one server process per test worker imports torch and ``torch._dynamo`` once, then for each command forks a
child that runs ``python -m workbench ARGS`` as the interpreter would (``runpy``, ``sys.argv``, the command's
environment, working directory, stdin from /dev/null or from a file of the input given, stdout and stderr to
files), and reports its pid and exit status. The child is a process of its own: it imports workbench afresh (so
settings read from the environment at import time see the command's environment), its crashes, signals and exit
codes are its own, and what it starts (a detached trainer, torchrun) is started as the product starts it. What
it shares with a fresh interpreter's run is everything but the already-imported third-party modules.

``WORKBENCH_TEST_CPU_LOG=FILE`` in the suite's environment: each forked command (this server's and the detached
trainers', tests/support/spawner.py) appends its module, first arguments, CPU seconds and the test that ran it to FILE.

Not for what depends on the interpreter's own start: which modules a command imports (the import-hygiene
tests start their own interpreters), getrusage of children (``wb(..., fresh=True)``). Set
``WORKBENCH_TEST_FORK=0`` to run every command in a fresh interpreter instead.

The server refuses to fork if importing torch started a thread (a fork copies only the calling thread);
the client then falls back to a fresh interpreter for the rest of the session.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import tempfile
import threading

# What a forked child of either fork server does last (this one, and tests/support/spawner.py's): run a module as
# `python -m MODULE ARGS` would (runpy, sys.argv, sys.path with the command's PYTHONPATH), its exit status as the
# interpreter would give it, atexit's functions run, the streams flushed, then exit without the server's cleanup.
RUN_AS_MAIN = r'''
def run_as_main(module, argv, env):
    import atexit, runpy, traceback
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.getcwd(), *extra, *[p for p in sys.path[1:] if p not in extra]]
    sys.argv = ["-m", *argv]
    code = 1
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr); code = 1
    except BaseException:
        traceback.print_exc(); code = 1
    atexit._run_exitfuncs()
    if env.get("WORKBENCH_TEST_CPU_LOG"):  # where the suite's CPU goes: each forked command's, since its fork
        import resource
        use = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
        with open(env["WORKBENCH_TEST_CPU_LOG"], "a") as log:
            log.write(f"{module}\t{' '.join(argv[:2])}\t{sum(u.ru_utime + u.ru_stime for u in use):.3f}"
                      f"\t{env.get('PYTEST_CURRENT_TEST', '').split(' ')[0]}\n")
    return code


def flush_and_exit(code):
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except Exception:
            pass
    os._exit(code)
'''

SERVER = r'''
import json, os, sys
import torch, torch._dynamo  # the imports every command would pay for
''' + RUN_AS_MAIN + r'''
tasks = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
control_in, control_out = sys.stdin, sys.stdout
control_out.write(json.dumps({"ready": True, "threads": tasks}) + "\n"); control_out.flush()
if tasks != 1:
    sys.exit(0)
for line in control_in:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        import io
        code = 1
        try:
            os.chdir(req["cwd"])
            os.environ.clear(); os.environ.update(req["env"])
            fd = os.open(req.get("stdin") or os.devnull, os.O_RDONLY); os.dup2(fd, 0); os.close(fd)
            for n, path in ((1, req["out"]), (2, req["err"])):
                fd = os.open(path, os.O_WRONLY | os.O_TRUNC); os.dup2(fd, n); os.close(fd)
            unbuffered = bool(req["env"].get("PYTHONUNBUFFERED"))
            def stream(n):
                return io.TextIOWrapper(io.FileIO(n, "w", closefd=False), encoding="utf-8",
                                        errors="backslashreplace" if n == 2 else "strict",
                                        line_buffering=False, write_through=unbuffered)
            sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
            sys.stdout = sys.__stdout__ = stream(1)
            sys.stderr = sys.__stderr__ = stream(2)
            code = run_as_main("workbench", req["argv"], req["env"])
        finally:
            flush_and_exit(code)
    control_out.write(json.dumps({"pid": pid}) + "\n"); control_out.flush()
    _, status = os.waitpid(pid, 0)
    rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    control_out.write(json.dumps({"rc": rc}) + "\n"); control_out.flush()
'''


class _Server:
    def __init__(self):
        env = dict(os.environ)
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1, env=env)
        hello = json.loads(self.proc.stdout.readline() or "{}")
        self.ok = bool(hello.get("ready")) and hello.get("threads") == 1
        self.lock = threading.Lock()
        atexit.register(self.close)

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def _reply(self, deadline: float | None) -> dict | None:
        import time
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([self.proc.stdout], [], [], wait)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the fork server died")
        return json.loads(line)

    def run(self, argv: list[str], cwd: str, env: dict, timeout: float | None,
            input: str | None = None) -> subprocess.CompletedProcess | None:
        """The command's result; None if the server is busy with another thread's command (the caller then
        starts a fresh interpreter rather than wait: that command may be waiting on this one)."""
        if not self.lock.acquire(blocking=False):
            return None
        try:
            return self._run(argv, cwd, env, timeout, input)
        finally:
            self.lock.release()

    def _run(self, argv: list[str], cwd: str, env: dict, timeout: float | None,
             input: str | None) -> subprocess.CompletedProcess:
        import time
        with tempfile.TemporaryDirectory(prefix="wb-fork-") as tmp:
            out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
            for p in (out, err):
                open(p, "w").close()
            stdin = None
            if input is not None:
                stdin = os.path.join(tmp, "in")
                with open(stdin, "w", encoding="utf-8") as f:
                    f.write(input)
            self.proc.stdin.write(json.dumps({"argv": argv, "cwd": cwd, "env": env, "out": out, "err": err,
                                              "stdin": stdin}) + "\n")
            self.proc.stdin.flush()
            pid = self._reply(None)["pid"]
            deadline = None if timeout is None else time.monotonic() + timeout
            reply = self._reply(deadline)
            timed_out = reply is None
            if timed_out:
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
                reply = self._reply(None)
            stdout, stderr = (open(p, encoding="utf-8", errors="replace").read() for p in (out, err))
        cmd = [sys.executable, "-m", "workbench", *argv]
        if timed_out:
            raise subprocess.TimeoutExpired(cmd, timeout, output=stdout, stderr=stderr)
        return subprocess.CompletedProcess(cmd, reply["rc"], stdout, stderr)


_server: _Server | None = None
_failed = False


def run(argv: list[str], cwd: str | None, env: dict, timeout: float | None,
        input: str | None = None) -> subprocess.CompletedProcess | None:
    """``python -m workbench ARGV`` in a forked child (``input``: its standard input); None where the fork server
    cannot be used (the caller then starts a fresh interpreter)."""
    global _server, _failed
    if _failed or os.environ.get("WORKBENCH_TEST_FORK", "1") == "0":
        return None
    try:
        if _server is None or _server.proc.poll() is not None:
            _server = _Server()
    except (OSError, ValueError):
        _failed = True
    if _failed or not _server.ok:
        _failed = True
        return None
    # once a command is sent, a failure is the test's to see (running the command again could repeat its effects)
    return _server.run(list(argv), str(cwd or os.getcwd()), dict(env), timeout, input)
