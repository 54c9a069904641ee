"""Detached trainers forked from a server that has torch imported: the tests' runs started the way a user's are
(the TUI, the queue, `train --detach`, `resume --detach`, each trial of a sweep), without paying torch's import
in each.

A detached trainer is ``python -m workbench.train RUN --detached`` in a new session, its output appended to the
run's train.log (:func:`workbench.commands.launch.start_detached`). A fresh interpreter pays ~2.2 s to import
torch and ~2.3 s more for ``torch._dynamo`` (torch's optimizers import it on first use) before its first step; a
tiny test run trains in under a second, and the suite starts a hundred or more of them.

With ``WORKBENCH_TEST_SPAWN`` naming this server's Unix socket (the test session sets it, so every process the
tests start inherits it), ``start_detached`` sends the command here (:func:`workbench.cli_client.spawn_detached`)
and this server forks a child that becomes what the product would have started: a new session
(``os.setsid``), stdin from /dev/null, stdout and stderr appended to the log, the command's environment and
working directory, ``runpy`` running the module as ``-m`` would (workbench imported afresh in the child, so
what it reads from the environment at import time is the command's), torch's thread count from the command's
``OMP_NUM_THREADS`` as a fresh interpreter would read it. The pid it reports is the trainer's: status files,
``workbench stop``, kill -9 and the queue's adoption see the process they would see. What differs from a fresh
interpreter is only the already-imported third-party modules and the parent pid (this server, not the
command that asked). Where the server cannot be reached the product falls back to its own ``Popen``.

Several processes: torchrun itself (``python -m torch.distributed.run``, detached or not) is forked from here
too, and it starts each rank as ``python -m workbench.train RUN``, a fresh interpreter, which stands in for a
trainer forked from here (:func:`workbench.cli_client.stand_in`: this server's "tied" child, killed if its
stand-in dies). torchrun and the ranks are then this server's children, not the CLI's and torchrun's: a test of
that process tree sets ``WORKBENCH_TEST_SPAWN=`` (the dying rank in tests/train/test_distributed.py, the SIGKILL
of a whole run in tests/train/test_mixture_ddp.py).

Set ``WORKBENCH_TEST_SPAWN=`` (empty) in a test's environment for a trainer that must start in a fresh
interpreter (its imports, its peak memory from its own start).
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile

from tests.support.zygote import RUN_AS_MAIN

_proc: subprocess.Popen | None = None  # this process's server, if it started one

SERVER = r'''
import json, os, signal, socket, sys
import torch, torch._dynamo  # what every trainer would import
''' + RUN_AS_MAIN + r'''
tasks = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
path = sys.argv[1]
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(path)
srv.listen(16)
sys.stdout.write(json.dumps({"ready": True, "threads": tasks}) + "\n"); sys.stdout.flush()
if tasks != 1:
    sys.exit(0)
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the children are detached: no one waits for them here


def become(req, streams):
    """In the forked child: the command's session, directory, environment and standard streams."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    if req.get("session", True):
        os.setsid()
    os.chdir(req["cwd"])
    os.environ.clear(); os.environ.update(req["env"])
    for n, fd in enumerate(streams):
        if fd != n:
            os.dup2(fd, n)
    for fd in set(streams):
        if fd > 2:
            os.close(fd)
    sys.stdin = sys.__stdin__ = open(0, "r", encoding="utf-8", closefd=False)
    sys.stdout = sys.__stdout__ = open(1, "w", encoding="utf-8", closefd=False, buffering=1)
    sys.stderr = sys.__stderr__ = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False,
                                       buffering=1)
    threads = req["env"].get("OMP_NUM_THREADS", "").strip()
    if threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


while True:
    conn, _ = srv.accept()
    # a request: one JSON line; one that waits (workbench.faults.popen) sends its stdin, stdout and stderr with it
    buf, fds, _, _ = socket.recv_fds(conn, 65536, 3)
    while buf and not buf.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        buf += chunk
    if not buf:
        conn.close()
        continue
    req = json.loads(buf)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            srv.close()
            if req.get("wait"):
                # the caller's own streams; it is told the pid, then the exit status (none if killed)
                become(req, fds)
                conn.sendall((json.dumps({"pid": os.getpid()}) + "\n").encode())
                if req.get("tied"):  # the signal it gets when the process that asked dies (PR_SET_PDEATHSIG's
                    import threading  # stand-in here: cli_client.popen's parent_death_signal, stand_in)

                    def watch(sig=int(req["tied"])):
                        try:
                            while conn.recv(4096):
                                pass
                        except OSError:
                            pass
                        os.kill(os.getpid(), sig)
                    threading.Thread(target=watch, daemon=True).start()
            else:
                conn.close()
                fd = os.open(req["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                become(req, [os.open(os.devnull, os.O_RDONLY), fd, fd])
            module, *args = req["argv"]
            code = run_as_main(module, args, req["env"])
        finally:
            for f in (sys.stdout, sys.stderr):
                try:
                    f.flush()
                except Exception:
                    pass
            if req.get("wait"):
                try:
                    conn.sendall((json.dumps({"code": code}) + "\n").encode())
                except OSError:
                    pass
            flush_and_exit(code)
    for fd in fds:
        os.close(fd)
    if not req.get("wait"):
        conn.sendall((json.dumps({"pid": pid}) + "\n").encode())
    conn.close()
'''


def start() -> str | None:
    """Start this test process's spawn server; its socket's path (for ``WORKBENCH_TEST_SPAWN``), or None where it
    cannot serve (torch's import started a thread: a fork copies only the calling thread)."""
    if os.environ.get("WORKBENCH_TEST_FORK", "1") == "0":
        return None
    tmp = tempfile.mkdtemp(prefix="wb-spawn-")
    path = os.path.join(tmp, "sock")
    proc = subprocess.Popen([sys.executable, "-c", SERVER, path], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, text=True, env=dict(os.environ), start_new_session=True)
    hello = json.loads(proc.stdout.readline() or "{}")
    global _proc
    _proc = proc

    def close():
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        try:
            os.unlink(path)
            os.rmdir(tmp)
        except OSError:
            pass
    atexit.register(close)
    if not (hello.get("ready") and hello.get("threads") == 1):
        close()
        return None
    return path
