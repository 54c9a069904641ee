"""Sample pane: prompt and sampling settings, two checkpoints side by side, streamed output,
and the samples the trainer wrote at eval time.

The pane runs the samplers itself: one ``workbench sample`` subprocess per column, each read by a
thread worker that streams its text into the column as it comes."""

from __future__ import annotations

import time
from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Button, Collapsible, Input, Label, Select, Static
from textual.worker import get_current_worker

from workbench.rundir import list_checkpoints, read_jsonl_tail, select_checkpoint
from workbench.tui import launcher
from workbench.tui.widgets.pane import Pane

NONE = "none"


def checkpoint_options(run_dir: Path) -> list[tuple[str, str]]:
    opts = [("latest", "latest"), ("best", "best")]
    for c in reversed(list_checkpoints(run_dir)):
        val = c.get("val_loss")
        label = f"step {c['step']}" + (f" (val {val:.3f})" if isinstance(val, (int, float)) else "")
        opts.append((label, str(c["step"])))
    return opts


def resolve_checkpoint(run_dir: Path, choice: str) -> str:
    """``latest`` / ``best`` as the step they mean now (a step stays as it is); the choice
    itself when it cannot be resolved, so that the sampler reports why."""
    if choice not in ("latest", "best"):
        return choice
    try:
        return str(select_checkpoint(run_dir, choice)["step"])
    except Exception:
        return choice


def trainer_samples(run_dir: Path, limit: int = 20) -> list[dict]:
    """The last ``limit`` entries of samples.jsonl (reads only the file's tail)."""
    recs = read_jsonl_tail(run_dir / "samples.jsonl", tail_bytes=32768)
    return recs[-limit:]


class SampleOutput(VerticalScroll):
    """Accumulates streamed text; one per checkpoint column."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.text = Text()

    def compose(self) -> ComposeResult:
        yield Static("", classes="sample-text")

    def reset(self, title: str, prompt: str) -> None:
        self.border_title = title
        self.text = Text(prompt, style="bold")
        self.query_one(Static).update(self.text)

    def append(self, chunk: str, style: str = "") -> None:
        self.text.append(chunk, style=style)
        self.query_one(Static).update(self.text)
        self.scroll_end(animate=False)

    def finish(self, note: str) -> None:
        """The sampler is done: ``note`` (e.g. the time taken) on a line of its own."""
        plain = self.text.plain
        self.append(("" if not plain or plain.endswith("\n") else "\n") + note, "dim")


class SamplePane(Vertical, Pane):
    MAIN_WIDGET = "#smp-run"
    BINDINGS = [
        Binding("ctrl+g", "generate", "Generate"),
        Binding("ctrl+k", "cancel", "Stop sampling", show=False),
    ]

    def __init__(self, runs_dir: Path, **kw):
        super().__init__(**kw)
        self.runs_dir = runs_dir
        self._samplers: list[launcher.SampleProcess] = []  # running now, to kill on cancel

    def compose(self) -> ComposeResult:
        with Horizontal(classes="sample-row"):
            yield Select([], prompt="run", id="smp-run", allow_blank=True)
            yield Select([("latest", "latest")], value="latest", allow_blank=False, id="smp-ckpt-a")
            yield Select([("none", NONE)], value=NONE, allow_blank=False, id="smp-ckpt-b")
        with Horizontal(classes="sample-row"):
            yield Input("def ", placeholder="prompt", id="smp-prompt")
            yield Button("Generate", id="smp-go", variant="primary")
        with Horizontal(classes="sample-row", id="smp-params"):
            for key, label, value in (("temperature", "temp", "0.8"), ("top_k", "top-k", "50"),
                                      ("top_p", "top-p", "0.95"), ("max_new_tokens", "tokens", "200"),
                                      ("seed", "seed", "1337")):
                yield Label(label, classes="param-label")
                yield Input(value, id=f"smp-{key}", classes="param", type="number")
        with Horizontal(id="smp-outputs"):
            yield SampleOutput(id="smp-out-a")
            yield SampleOutput(id="smp-out-b")
        with Collapsible(title="samples written by the trainer", id="smp-trainer", collapsed=True):
            yield Static("", id="smp-trainer-text")

    def on_mount(self) -> None:
        self.query_one("#smp-out-a", SampleOutput).border_title = "checkpoint A"
        self.query_one("#smp-out-b", SampleOutput).border_title = "checkpoint B (choose one to compare)"

    def on_unmount(self) -> None:
        self.action_cancel()

    @property
    def run_id(self) -> str | None:
        """The run chosen to sample from."""
        value = self.query_one("#smp-run", Select).value
        return None if value == Select.NULL else str(value)

    def set_runs(self, run_ids: list[str], current: str | None = None) -> None:
        sel = self.query_one("#smp-run", Select)
        keep = current if current is not None else (sel.value if sel.value != Select.NULL else None)
        with self.prevent(Select.Changed):
            sel.set_options([(r, r) for r in run_ids])
            if keep in run_ids:
                sel.value = keep

    def choose(self, run_id: str, checkpoint: str | None = None) -> None:
        """Sample from ``run_id`` (one of the runs set), from ``checkpoint`` in column A if given."""
        with self.prevent(Select.Changed):
            self.query_one("#smp-run", Select).value = run_id
        self.show_run(self.runs_dir / run_id, checkpoint)

    def tab_shown(self) -> None:
        self.refresh_checkpoints()

    def refresh_checkpoints(self) -> None:
        """Read the chosen run's checkpoints again (a live run writes and prunes them), keeping the
        choices that still exist."""
        run = self.run_id
        if run is not None and (self.runs_dir / run).is_dir():
            self.show_run(self.runs_dir / run, keep=True)

    @on(Select.Changed, "#smp-run")
    def _run_chosen(self, event: Select.Changed) -> None:
        event.stop()
        if event.value != Select.NULL:
            self.choose(str(event.value))

    def show_run(self, run_dir: Path | None, checkpoint: str | None = None, keep: bool = False) -> None:
        """Fill the checkpoint choices and the trainer's samples for this run; ``keep`` re-reads
        them for the same run (a live run writes new checkpoints) keeping what was chosen."""
        a = self.query_one("#smp-ckpt-a", Select)
        b = self.query_one("#smp-ckpt-b", Select)
        opts = checkpoint_options(run_dir) if run_dir else [("latest", "latest")]
        values = {v for _, v in opts}
        old_a, old_b = str(a.value), str(b.value)
        with self.prevent(Select.Changed):
            a.set_options(opts)
            if checkpoint and checkpoint in values:
                a.value = checkpoint
            else:
                a.value = old_a if keep and old_a in values else "latest"
            b.set_options([("none", NONE)] + opts)
            b.value = old_b if keep and old_b in values else NONE
        lines = Text()
        for rec in trainer_samples(run_dir) if run_dir else []:
            lines.append(f"step {rec.get('step', '?')}", style="bold cyan")
            if rec.get("checkpoint"):
                lines.append(f" ({rec['checkpoint']})", style="dim")
            lines.append("\n")
            lines.append(str(rec.get("prompt", "")), style="bold")
            lines.append(str(rec.get("text", "")) + "\n\n")
        self.query_one("#smp-trainer-text", Static).update(lines or Text("no samples yet", style="dim"))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "smp-go":
            event.stop()
            self.action_generate()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_generate()

    def params(self) -> dict:
        """The sampling settings, with a clear message for a bad value."""
        out: dict = {}
        casts = {"temperature": float, "top_k": int, "top_p": float, "max_new_tokens": int, "seed": int}
        for key, cast in casts.items():
            raw = self.query_one(f"#smp-{key}", Input).value.strip()
            try:
                out[key] = cast(raw)
            except ValueError:
                raise ValueError(f"{key.replace('_', ' ')} must be {'an integer' if cast is int else 'a number'}, "
                                 f"not {raw!r}") from None
        out["prompt"] = self.query_one("#smp-prompt", Input).value
        return out

    # ------------------------------------------------------------------ the samplers

    def action_generate(self) -> None:
        """Sample from the chosen checkpoint(s) with the settings shown, one sampler per column."""
        run = self.run_id
        if run is None:
            self.notify("Choose a run to sample from.", severity="warning")
            return
        try:
            params = self.params()
        except ValueError as e:
            self.notify(str(e), severity="error")
            return
        self.action_cancel()
        sel_a, sel_b = self.query_one("#smp-ckpt-a", Select), self.query_one("#smp-ckpt-b", Select)
        a, b = str(sel_a.value), str(sel_b.value)
        # a live run writes and prunes checkpoints: re-read them, and refuse a choice that is gone
        run_dir = self.runs_dir / run
        self.show_run(run_dir, keep=True)
        gone = [ck for ck, sel in ((a, sel_a), (b, sel_b)) if str(sel.value) != ck]
        if gone:
            self.notify(f"Checkpoint step {gone[0]} of {run} is gone (the trainer keeps only recent and best "
                        "checkpoints); choose another.", severity="warning", timeout=8)
            return
        columns = [("#smp-out-a", a)] + ([("#smp-out-b", b)] if b != NONE else [])
        if b == NONE:
            self.query_one("#smp-out-b", SampleOutput).reset("checkpoint B (choose one to compare)", "")
        for out_id, choice in columns:
            out = self.query_one(out_id, SampleOutput)
            # latest / best pinned to a step now, so the title names what the sampler loads
            ck = resolve_checkpoint(run_dir, choice)
            shown = choice if ck == choice else f"{choice} (step {ck})"
            out.reset(f"{run} @ {shown}  T={params['temperature']} k={params['top_k']} p={params['top_p']} "
                      f"seed={params['seed']}", params["prompt"])
            argv = launcher.sample_argv(self.runs_dir, run, ck, params["prompt"], params["max_new_tokens"],
                                        params["temperature"], params["top_k"], params["top_p"], params["seed"])
            self._sample(argv, out, params["prompt"])

    @work(thread=True, group="sample", exit_on_error=False)
    def _sample(self, argv: list[str], out: SampleOutput, prompt: str = "") -> None:
        """Run one sampler, streaming its text into ``out`` (its echo of the prompt left out)."""
        worker = get_current_worker()
        call = self.app.call_from_thread
        echo = launcher.PromptEcho(prompt)
        try:
            proc = launcher.SampleProcess(argv)
        except OSError as e:
            call(out.append, f"\n[could not start the sampler: {e}]", "bold red")
            return
        self._samplers.append(proc)
        started = time.monotonic()
        try:
            for chunk in proc.chunks():
                if worker.is_cancelled:
                    proc.kill()
                    break
                if (chunk := echo.strip(chunk)):
                    call(out.append, chunk)
            rc, err = proc.finish()
        finally:
            if proc in self._samplers:
                self._samplers.remove(proc)
        if rc != 0 and not worker.is_cancelled:
            call(out.append, f"\n[sampler failed: {err or f'exit status {rc}'}]", "bold red")
        else:
            call(out.finish, f"[{time.monotonic() - started:.1f}s]")

    def action_cancel(self) -> None:
        """Stop sampling: kill the samplers and cancel their workers."""
        for proc in list(self._samplers):
            proc.kill()
        self.workers.cancel_group(self, "sample")
