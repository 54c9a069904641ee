"""The CLI commands the TUI runs as subprocesses (it never imports torch itself).

Everything goes through ``sys.executable -m workbench ... --runs-dir DIR`` (the one
client, ``workbench.cli_client``, which the queue's runner uses too) so it uses the same
interpreter and venv as the TUI. These functions block: call them from thread workers.
"""

from __future__ import annotations

import codecs
import json
import os
import shlex
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from workbench.cli_client import cli_argv, cli_env, error_line, last_line, popen, run_cli

if TYPE_CHECKING:
    from workbench.plan.run_plan import NewRun
    from workbench.plan.sampling import Sampling


@dataclass
class RunRequest:
    """A new run as the new-run form holds it (its fields' text); :meth:`new_run` is the run request it makes."""
    preset: str
    corpus: str = ""
    name: str = ""
    overrides: list[str] = field(default_factory=list)
    init_from: str = ""     # RUN[:STEP]: start from that checkpoint (--init-from); "" from scratch
    finetune: str = ""      # with init_from: full | lora (train.finetune)
    time_budget: str = ""   # train for this long instead of max_iters (train.time_budget): 45m, 2h

    def new_run(self, force: bool = False) -> NewRun:
        """The run request the form makes: what the run plan takes and `workbench train` or `queue add` is given
        (its time budget parsed here: a bad one is a DurationError, the line the form shows)."""
        from workbench.config.duration import TimeBudget
        from workbench.plan.run_plan import NewRun  # lazily: the planner loads with the new-run form, not at start

        return NewRun(self.preset, tuple(self.overrides), self.corpus_items(),
                      self.init_from or None, self.finetune if self.init_from else "",
                      TimeBudget.parse(self.time_budget), self.name or None, force)

    def corpus_items(self) -> tuple[str, ...]:
        """The corpus field as `--corpus` items: a mixture's sources (``web=web.jsonl:0.7 code=src/:0.3``, split as
        a shell splits them: quote a path with spaces) when it names any, else the field whole (one path, spaces,
        quotes and backslashes kept: a file name is taken as it is typed)."""
        if not self.corpus:
            return ()
        try:
            items = shlex.split(self.corpus)
        except ValueError:  # an unbalanced quote: a path's own character
            return (self.corpus,)
        from workbench.data.mixture.mixture_plan import named_source  # lazily, as the planner is

        return tuple(items) if any(named_source(i) for i in items) else (self.corpus,)


def start_run(runs_dir: Path, req: RunRequest, timeout: float = 120) -> str:
    """``workbench train PRESET ... --detach``; returns the new run id (its last stdout line)."""
    # --yes: the new-run form has shown the estimate and asked already when the run will not fit
    out = run_cli(cli_argv(runs_dir, "train", *req.new_run(force=True).cli_args(), "--detach"), timeout)
    return last_line(out)


def inspect_data(runs_dir: Path, req: RunRequest, documents: int = 2, timeout: float = 600) -> dict:
    """``workbench data inspect CORPUS --preset P --set ... [--init-from RUN] --json``: the first documents
    of the run's corpus as its trainer will see them (conversations with their trained spans; preparing a
    chat corpus trains its tokenizer and encodes it into the cache, which the run then reuses)."""
    args = [*(req.corpus_items() or ("builtin",)), "--preset", req.preset, "--json", "-n", str(documents)]
    if req.init_from:
        args += ["--init-from", req.init_from]
    for item in req.new_run().preset_sets():
        args += ["--set", item]
    return json.loads(run_cli(cli_argv(runs_dir, "data", "inspect", *args), timeout))


def import_model(runs_dir: Path, model_dir: str, name: str = "", timeout: float = 1800) -> str:
    """``workbench import MODEL_DIR [--name NAME]``; returns the new run id (its last stdout line)."""
    extra = ["--name", name] if name else []
    return last_line(run_cli(cli_argv(runs_dir, "import", model_dir, *extra), timeout))


def resume_run(runs_dir: Path, run_id: str, checkpoint: str = "latest", timeout: float = 120,
               more: int | None = None) -> str:
    """``workbench resume RUN --checkpoint C [--more N] --detach``; returns the id of the run that goes on
    (the run itself, or the new branch when C is not its latest checkpoint)."""
    extra = ["--more", str(more)] if more else []
    out = run_cli(cli_argv(runs_dir, "resume", run_id, "--checkpoint", checkpoint, *extra, "--detach"), timeout)
    return last_line(out) or run_id


def stop_run(runs_dir: Path, run_id: str, timeout: float = 30) -> str:
    """Send the stop (SIGTERM) and return at once: the save that follows can take longer than
    any timeout here, and the monitor shows the state change when the trainer writes it."""
    return last_line(run_cli(cli_argv(runs_dir, "stop", run_id, "--no-wait"), timeout))


def queue_command(runs_dir: Path, *args: str, timeout: float = 120) -> str:
    """``workbench queue ARGS...`` (add, pause, resume, rm, move, run --detach); its last line of output."""
    return last_line(run_cli(cli_argv(runs_dir, "queue", *args), timeout))


def queue_run(runs_dir: Path, req: RunRequest, timeout: float = 120) -> str:
    """``workbench queue add PRESET ... --yes`` for the new-run form's request (the form has asked already when
    it will not fit); its last line of output."""
    return last_line(run_cli(cli_argv(runs_dir, "queue", "add", *req.new_run(force=True).cli_args()), timeout))


def sweep_command(runs_dir: Path, *args: str, timeout: float = 120) -> str:
    """``workbench sweep ARGS...`` (save-best NAME); its last line of output."""
    return last_line(run_cli(cli_argv(runs_dir, "sweep", *args), timeout))


def sample_argv(runs_dir: Path, run_id: str, checkpoint: str, prompt: str, sampling: Sampling) -> list[str]:
    """``workbench sample`` with every setting given (the pane's, which are the CLI's defaults until changed)."""
    # --prompt=TEXT, so that a prompt starting with "-" is not taken for an option
    return cli_argv(runs_dir, "sample", run_id, "--checkpoint", checkpoint, f"--prompt={prompt}",
                    *sampling_args(sampling))


def chat_argv(runs_dir: Path, run_id: str, checkpoint: str, system: str, sampling: Sampling) -> list[str]:
    """``workbench chat`` answering the conversation it reads on stdin (the reply streamed, then a newline)."""
    return cli_argv(runs_dir, "chat", run_id, "--checkpoint", checkpoint, "--conversation", "-",
                    *([f"--system={system}"] if system else []), *sampling_args(sampling))


def sampling_args(s: Sampling) -> list[str]:
    return ["--max-new-tokens", str(s.max_new_tokens), "--temperature", str(s.temperature), "--top-k", str(s.top_k),
            "--top-p", str(s.top_p), "--seed", str(s.seed)]


def eval_argv(runs_dir: Path, run_id: str, checkpoint: str, tasks: list[str], limit: int | None = None) -> list[str]:
    """``workbench eval RUN --checkpoint C --task T... [--limit N] --progress``: the scores go to the run's
    tasks.jsonl (the report card's), progress lines to stderr."""
    return cli_argv(runs_dir, "eval", run_id, "--checkpoint", checkpoint, "--task", *tasks,
                    *(["--limit", str(limit)] if limit else []), "--progress")


def export_argv(runs_dir: Path, run_id: str, checkpoint: str, out_dir: str, fmt: str, gguf_type: str = "f16"
                ) -> list[str]:
    """``workbench export RUN OUT_DIR --checkpoint C --format F [--gguf-type T] --progress``."""
    return cli_argv(runs_dir, "export", run_id, out_dir, "--checkpoint", checkpoint, "--format", fmt,
                    *(["--gguf-type", gguf_type] if fmt == "gguf" else []), "--progress")


class CliJob:
    """A CLI command run to its end (``workbench eval`` / ``export``): its stderr read line by line as it comes
    (its progress), its stdout kept for the end."""

    def __init__(self, argv: list[str]):
        self._out = tempfile.TemporaryFile()  # (a pipe the job fills while stderr is read could block it)
        self.proc = popen(argv, stdout=self._out, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=cli_env(),
                          start_new_session=True)
        self.errors: list[str] = []

    def lines(self) -> Iterator[str]:
        """Its stderr, line by line, until it exits."""
        assert self.proc.stderr is not None  # (a pipe: Popen'd with stderr=PIPE)
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip()
            if line.strip():
                self.errors.append(line)
                yield line

    def finish(self) -> tuple[int, str, str]:
        """Wait for exit: (return code, stdout, its last stderr line without 'workbench: error: ')."""
        rc = self.proc.wait()
        self._out.seek(0)
        out = self._out.read().decode("utf-8", "replace")
        self._out.close()
        last = next((ln for ln in reversed(self.errors) if not ln.startswith("progress: ")), "")
        return rc, out, error_line(last)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()


class PromptEcho:
    """Drops the sampler's echo of the prompt from the start of its stream.

    ``workbench sample`` prints the prompt before the generated text; the pane shows the
    prompt itself (in bold), so without this it would appear twice."""

    def __init__(self, prompt: str):
        self.rest = prompt

    def strip(self, chunk: str) -> str:
        if not self.rest:
            return chunk
        n = 0
        limit = min(len(chunk), len(self.rest))
        while n < limit and chunk[n] == self.rest[n]:
            n += 1
        if n == len(chunk) and n < len(self.rest):
            self.rest = self.rest[n:]  # the echo continues in the next chunk
            return ""
        self.rest = ""  # echo done (or the stream differs: show everything after what matched)
        return chunk[n:]


class SampleProcess:
    """A running ``workbench sample`` (or ``chat``, given ``stdin``): iterate over its stdout as it arrives."""

    def __init__(self, argv: list[str], stdin: str | None = None):
        self.proc = popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE, env=cli_env(),
                          start_new_session=True)
        if stdin is not None:
            assert self.proc.stdin is not None  # (a pipe, given stdin)
            try:
                self.proc.stdin.write(stdin.encode("utf-8"))
                self.proc.stdin.close()
            except OSError:
                pass  # it exited before reading: finish() reports why

    def chunks(self) -> Iterator[str]:
        assert self.proc.stdout is not None  # (a pipe: Popen'd with stdout=PIPE)
        fd = self.proc.stdout.fileno()
        decoder = _utf8_decoder()
        while True:
            data = os.read(fd, 4096)  # returns as soon as the sampler flushes a token
            if not data:
                break
            text = decoder.decode(data)
            if text:
                yield text
        tail = decoder.decode(b"", final=True)
        if tail:
            yield tail

    def finish(self) -> tuple[int, str]:
        """Wait for exit; (return code, last stderr line)."""
        err = self.proc.stderr.read().decode("utf-8", "replace") if self.proc.stderr else ""
        rc = self.proc.wait()
        lines = [ln for ln in err.strip().splitlines() if ln.strip()]
        return rc, (lines[-1] if lines else "")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()


def _utf8_decoder() -> codecs.IncrementalDecoder:
    return codecs.getincrementaldecoder("utf-8")("replace")
