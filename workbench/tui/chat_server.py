"""The Sample pane's chat models, kept loaded between turns: each is a ``workbench chat RUN --checkpoint STEP
--serve`` process (torch lives there, never here) that loads the checkpoint once and then answers one JSON request
a line on its stdin with JSON lines on its stdout (``workbench.commands.chat``: the reply's pieces as they come,
then the reply). A turn costs the reply, not a reload (~13 s a turn on a slow CPU before).

How memory is bounded, and when it is released (:class:`ChatServers`, one per pane):
- at most one server per column of the pane (A and B: two models at most), each holding one checkpoint;
- a column's server is replaced when its run or checkpoint changes (the old one is ended first), and ended when
  the pane leaves chat mode, when a reply is stopped (ctrl+k: the next turn loads again), and when the pane or
  the app closes;
- a server left idle for :data:`IDLE_EXIT_S` seconds exits by itself (``--idle-exit``), and one whose stdin closes
  (the UI gone, even killed) exits at once: nothing outlives the UI for long. The next turn starts a new one.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path

from workbench.cli_client import cli_argv, popen

IDLE_EXIT_S = 600  # a server with no request for this long exits (its model's memory goes back)


class ServerGone(Exception):
    """The server ended before it answered: its exit status and last stderr line."""

    def __init__(self, rc: int, err: str):
        super().__init__(err or f"exit status {rc}")
        self.rc, self.err = rc, err


class ChatServer:
    """One ``workbench chat --serve`` process: the model of ``run`` at checkpoint ``step``."""

    def __init__(self, runs_dir: Path, run: str, step: str, idle_exit: float = IDLE_EXIT_S):
        self.key = (run, step)
        argv = cli_argv(runs_dir, "chat", run, "--checkpoint", step, "--serve",
                                 "--idle-exit", f"{idle_exit:g}")
        self.proc = popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True)
        self.ready: dict | None = None     # the server's first line, once the model is loaded (its load time)
        self.busy = False                  # a request is being answered
        self.asked = 0                     # requests sent
        self._err: deque[str] = deque(maxlen=20)  # its stderr's last lines (read as they come: the pipe never fills)
        threading.Thread(target=self._read_err, daemon=True, name=f"chat-server-{self.proc.pid}-stderr").start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _read_err(self) -> None:
        assert self.proc.stderr is not None  # (the pipes: Popen'd with PIPE, all three)
        for raw in self.proc.stderr:
            if line := raw.decode("utf-8", "replace").strip():
                self._err.append(line)

    def _gone(self) -> ServerGone:
        rc = self.proc.wait()
        time.sleep(0.05)  # (its last stderr line is read by the other thread)
        return ServerGone(rc, self._err[-1] if self._err else "")

    def ask(self, request: dict) -> Iterator[dict]:
        """Send ``request`` (see ``workbench chat --serve``) and yield the lines that answer it: the ready line
        first when the model loads for this request, the reply's pieces (``text``) when it streams, and last the
        reply (or ``error``). :class:`ServerGone` when the process ends first (killed, stopped, failed to load)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None  # (the pipes)
        self.busy = True
        self.asked += 1
        rid = self.asked  # the lines of a request given up on (its reader stopped) are not this one's
        try:
            try:
                self.proc.stdin.write((json.dumps({**request, "id": rid}) + "\n").encode("utf-8"))
                self.proc.stdin.flush()
            except (OSError, ValueError):  # (it has exited: why is on its stderr)
                raise self._gone() from None
            while True:
                line = self.proc.stdout.readline()
                if not line:
                    raise self._gone()
                obj = json.loads(line)
                if obj.get("ready"):
                    self.ready = obj
                elif obj.get("id") != rid:
                    continue
                yield obj
                if "reply" in obj or "error" in obj:
                    return
        finally:
            self.busy = False

    def close(self) -> None:
        """End it now (its model's memory goes back); a reply being written is dropped."""
        if self.alive():
            try:
                self.proc.terminate()
            except OSError:
                pass
        threading.Thread(target=self._reap, daemon=True).start()

    def _reap(self) -> None:
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            assert pipe is not None  # (the pipes)
            try:
                pipe.close()
            except OSError:
                pass


class ChatServers:
    """A pane's servers, one per column at most (see the module's note on memory)."""

    def __init__(self, idle_exit: float = IDLE_EXIT_S):
        self.idle_exit = idle_exit
        self.by_column: dict[str, ChatServer] = {}

    def get(self, column: str, runs_dir: Path, run: str, step: str) -> ChatServer:
        """The server of ``column`` for ``run`` at ``step``: the one it has when that is still alive and for the
        same checkpoint, else a new one (the old one ended; the model loads for the request that follows).
        OSError: it could not be started."""
        old = self.by_column.get(column)
        if old is not None and old.key == (run, step) and old.alive():
            return old
        self.end(column)
        server = self.by_column[column] = ChatServer(runs_dir, run, step, self.idle_exit)
        return server

    def end(self, column: str) -> None:
        if (server := self.by_column.pop(column, None)) is not None:
            server.close()

    def keep_only(self, wanted: dict[str, tuple[str, str] | None]) -> None:
        """End every server whose column now wants another checkpoint (None: no model at all)."""
        for column in list(self.by_column):
            if self.by_column[column].key != wanted.get(column):
                self.end(column)

    def stop_busy(self) -> None:
        """End the servers writing a reply (stopped by the user: the next turn loads the model again)."""
        for column in [c for c, s in self.by_column.items() if s.busy]:
            self.end(column)

    def end_all(self) -> None:
        for column in list(self.by_column):
            self.end(column)
