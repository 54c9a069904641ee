"""Sample pane: prompt and sampling settings, two checkpoints side by side, streamed output,
and the samples the trainer wrote at eval time.

The pane runs the samplers itself: one ``workbench sample`` subprocess per column, each read by a
thread worker that streams its text into the column as it comes.

A run with a chat template (``chat_template.jinja``: chat-tuned, or an imported model's own) opens in chat
mode: a system prompt, a message, and each column a transcript of its own conversation with its checkpoint;
every message goes to both, and each reply is one ``workbench chat --conversation -`` given that column's
conversation so far."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Button, Collapsible, Input, Label, Select, Static
from textual.worker import get_current_worker

from workbench.data.chat_templates import CHAT_TEMPLATE_FILE
from workbench.rundir import SAMPLES_FILE, list_checkpoints, read_jsonl_tail, select_checkpoint
from workbench.tui import launcher
from workbench.tui.widgets.pane import Pane

NONE = "none"
CHAT_HINT = "Type a message below (enter sends; ctrl+r starts over, ctrl+t samples text instead)."


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
    recs = read_jsonl_tail(run_dir / SAMPLES_FILE, tail_bytes=32768)
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
        Binding("ctrl+r", "reset_chat", "Reset chat"),
        Binding("ctrl+t", "toggle_chat", "Chat / text"),
        # in a box, digits are text (a message may hold numbers); escape leaves it, and 1-6 switch tabs again
        Binding("escape", "leave_box", "Leave the box"),
    ]

    def __init__(self, runs_dir: Path, **kw):
        super().__init__(**kw)
        self.runs_dir = runs_dir
        self._samplers: list[launcher.SampleProcess] = []  # running now, to kill on cancel
        self.chat_run = False   # the run shown has a chat template (chat-tuned, or an imported model's)
        self.chat_mode = False  # the pane chats (else samples text)
        self._shown: tuple = ()  # (run, checkpoint A, checkpoint B) the conversation is with
        self._chat: dict[str, list[dict]] = {}  # each column's conversation: user and assistant messages
        self._chat_gen = 0  # a new conversation drops what the replies of the old one still send
        self._replying: set[str] = set()  # the columns whose reply is being generated
        self._system: dict[str, str] = {}  # the system prompt each column's transcript shows now

    def compose(self) -> ComposeResult:
        with Horizontal(classes="sample-row"):
            yield Select([], prompt="run", id="smp-run", allow_blank=True)
            yield Select([("latest", "latest")], value="latest", allow_blank=False, id="smp-ckpt-a")
            yield Select([("none", NONE)], value=NONE, allow_blank=False, id="smp-ckpt-b")
        with Horizontal(classes="sample-row smp-text"):
            yield Input("def ", placeholder="prompt", id="smp-prompt")
            yield Button("Generate", id="smp-go", variant="primary")
        with Horizontal(classes="sample-row smp-text", id="smp-params"):
            for key, label, value in (("temperature", "temp", "0.8"), ("top_k", "top-k", "50"),
                                      ("top_p", "top-p", "0.95"), ("max_new_tokens", "tokens", "200"),
                                      ("seed", "seed", "1337")):
                yield Label(label, classes="param-label")
                yield Input(value, id=f"smp-{key}", classes="param", type="number")
        with Horizontal(classes="sample-row smp-chat"):
            yield Input(placeholder="system prompt (optional)", id="smp-system")
            yield Label("temp", classes="param-label")
            yield Input("0", id="smp-chat-temperature", classes="param", type="number")
            yield Label("tokens", classes="param-label")
            yield Input("256", id="smp-chat-max_new_tokens", classes="param", type="number")
        with Horizontal(classes="sample-row smp-chat"):
            yield Input(placeholder="message", id="smp-message")
            yield Button("Send", id="smp-send", variant="primary")
        with Horizontal(id="smp-outputs"):
            yield SampleOutput(id="smp-out-a")
            yield SampleOutput(id="smp-out-b")
        with Collapsible(title="samples written by the trainer", id="smp-trainer", collapsed=True):
            yield Static("", id="smp-trainer-text")

    def on_mount(self) -> None:
        self.query_one("#smp-out-a", SampleOutput).border_title = "checkpoint A"
        self.query_one("#smp-out-b", SampleOutput).border_title = "checkpoint B (choose one to compare)"

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Chat keys only where they apply (a text run's footer stays as it was)."""
        if action == "toggle_chat":
            return self.chat_run
        if action == "reset_chat":
            return self.chat_mode
        if action == "leave_box":
            return isinstance(self.app.focused, Input)
        return True

    def action_leave_box(self) -> None:
        """Leave the text box for the run choice, where the app's keys (1-6, q) work again."""
        self.focus_main()

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
        if self.run_id is not None and not self.chat_run:  # its template may have been written since
            self._conversation_with(self.run_id)

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

    @on(Select.Changed, "#smp-ckpt-a, #smp-ckpt-b")
    def _checkpoint_chosen(self, event: Select.Changed) -> None:
        event.stop()
        self._conversation_with(self.run_id)

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
        self._conversation_with(run_dir.name if run_dir else None)
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
        if event.button.id in ("smp-go", "smp-send"):
            event.stop()
            self.action_generate()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if event.input.id == "smp-system":
            self.query_one("#smp-message", Input).focus()  # the system prompt is sent with the next message
        else:
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

    def chat_params(self) -> tuple[float, int]:
        """Chat mode's temperature and tokens, with a clear message for a bad value."""
        temp, tokens = (self.query_one(f"#smp-chat-{key}", Input).value.strip()
                        for key in ("temperature", "max_new_tokens"))
        try:
            return float(temp), int(tokens)
        except ValueError:
            raise ValueError(f"temperature must be a number and tokens an integer, not {temp!r} and {tokens!r}") \
                from None

    # ------------------------------------------------------------------ the samplers

    def _columns(self, run: str) -> list[tuple[str, str]] | None:
        """The columns to fill, each (its id, the checkpoint chosen for it); None once the user is told
        that a chosen checkpoint is gone."""
        sel_a, sel_b = self.query_one("#smp-ckpt-a", Select), self.query_one("#smp-ckpt-b", Select)
        a, b = str(sel_a.value), str(sel_b.value)
        # a live run writes and prunes checkpoints: re-read them, and refuse a choice that is gone
        self.show_run(self.runs_dir / run, keep=True)
        gone = [ck for ck, sel in ((a, sel_a), (b, sel_b)) if str(sel.value) != ck]
        if gone:
            self.notify(f"Checkpoint step {gone[0]} of {run} is gone (the trainer keeps only recent and best "
                        "checkpoints); choose another.", severity="warning", timeout=8)
            return None
        if b == NONE:
            self.query_one("#smp-out-b", SampleOutput).reset("checkpoint B (choose one to compare)", "")
        return [("#smp-out-a", a)] + ([("#smp-out-b", b)] if b != NONE else [])

    def action_generate(self) -> None:
        """Sample from the chosen checkpoint(s) with the settings shown, one sampler per column (in chat
        mode: send the message)."""
        if self.chat_mode:
            self.action_send()
            return
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
        run_dir = self.runs_dir / run
        if (columns := self._columns(run)) is None:
            return
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

    # ------------------------------------------------------------------ chat mode

    def _conversation_with(self, run: str | None) -> None:
        """A conversation is with a run's checkpoints: choosing another run or checkpoint starts a new one, and a
        run with a chat template opens in chat mode (any other in text mode). Whether it has one is read each time
        the run is shown: a run chosen as it started has none until its trainer's start writes it."""
        shown = (run, str(self.query_one("#smp-ckpt-a", Select).value),
                 str(self.query_one("#smp-ckpt-b", Select).value))
        chat_run = run is not None and (self.runs_dir / run / CHAT_TEMPLATE_FILE).is_file()
        if shown == self._shown and chat_run == self.chat_run:
            return
        new_run = not self._shown or shown[0] != self._shown[0]
        self._shown = shown
        if new_run or chat_run != self.chat_run:
            self.chat_run = chat_run
            self._set_mode(chat_run)
        elif self.chat_mode:
            self.action_reset_chat()

    def _set_mode(self, chat: bool) -> None:
        was, self.chat_mode = self.chat_mode, chat
        self.query(".smp-text").set(display=not chat)
        self.query(".smp-chat").set(display=chat)
        self.refresh_bindings()
        if chat:
            self.action_reset_chat()
        elif was:
            self.action_reset_chat()  # (the replies still being written say nothing more)
            self.query_one("#smp-out-a", SampleOutput).reset("checkpoint A", "")
            self.query_one("#smp-out-b", SampleOutput).reset("checkpoint B (choose one to compare)", "")

    def action_toggle_chat(self) -> None:
        """Chat with a chat-tuned run, or sample raw text from it."""
        if self.chat_run:
            self._set_mode(not self.chat_mode)
            self.query_one("#smp-message" if self.chat_mode else "#smp-prompt", Input).focus()

    def action_reset_chat(self) -> None:
        """Start the conversation over (a reply being written is stopped)."""
        self.action_cancel()
        self._chat_gen += 1
        self._chat, self._system, self._replying = {}, {}, set()
        run, a, b = self._shown or (None, "latest", NONE)
        out_a = self.query_one("#smp-out-a", SampleOutput)
        out_a.reset(f"{run} @ {a}  chat" if run else "checkpoint A", "")
        out_a.append(CHAT_HINT, "dim")
        self.query_one("#smp-out-b", SampleOutput).reset(
            f"{run} @ {b}  chat" if run and b != NONE else "checkpoint B (choose one to compare)", "")

    def action_send(self) -> None:
        """Send the message to the chosen checkpoint(s): each column's reply to its own conversation so far."""
        run = self.run_id
        message = self.query_one("#smp-message", Input)
        if run is None:
            self.notify("Choose a run to chat with.", severity="warning")
            return
        if not message.value.strip():
            self.notify("Type a message to send.", severity="warning")
            return
        if self._replying:
            self.notify("Still answering the last message (ctrl+k stops it).", severity="warning")
            return
        try:
            temperature, max_new_tokens = self.chat_params()
        except ValueError as e:
            self.notify(str(e), severity="error")
            return
        if (columns := self._columns(run)) is None:
            return
        text, system = message.value, self.query_one("#smp-system", Input).value.strip()
        message.value = ""
        for out_id, choice in columns:
            out = self.query_one(out_id, SampleOutput)
            ck = resolve_checkpoint(self.runs_dir / run, choice)
            history = self._chat.setdefault(out_id, [])
            if not history:
                out.reset("", "")  # the hint goes
            out.border_title = f"{run} @ {choice if ck == choice else f'{choice} (step {ck})'}  chat T={temperature}"
            if system != self._system.get(out_id, ""):
                out.append(f"system: {system or '(none)'}\n", "italic")
                self._system[out_id] = system
            history.append({"role": "user", "content": text})
            out.append(f"you> {text}\n", "bold")
            out.append("model> ", "bold cyan")
            self._replying.add(out_id)
            argv = launcher.chat_argv(self.runs_dir, run, ck, system, max_new_tokens, temperature)
            self._reply(argv, out_id, json.dumps({"messages": history}), self._chat_gen)

    @work(thread=True, group="sample", exit_on_error=False)
    def _reply(self, argv: list[str], out_id: str, conversation: str, gen: int) -> None:
        """Run one ``workbench chat`` on ``conversation``, streaming the reply into the column."""
        worker = get_current_worker()
        call = self.app.call_from_thread
        try:
            proc = launcher.SampleProcess(argv, stdin=conversation)
        except OSError as e:
            call(self._replied, gen, out_id, None, f"could not start the chat: {e}")
            return
        self._samplers.append(proc)
        started = time.monotonic()
        got, held = [], ""  # held: a newline that may be the one the CLI ends the reply with
        try:
            for chunk in proc.chunks():
                if worker.is_cancelled:
                    proc.kill()
                    break
                got.append(chunk)
                shown, held = held + chunk, ""
                if shown.endswith("\n"):
                    shown, held = shown[:-1], "\n"
                if shown:
                    call(self._chat_text, gen, out_id, shown)
            rc, err = proc.finish()
        finally:
            if proc in self._samplers:
                self._samplers.remove(proc)
        if worker.is_cancelled:
            call(self._replied, gen, out_id, None, "stopped")
        elif rc != 0:
            call(self._replied, gen, out_id, None, f"chat failed: {err or f'exit status {rc}'}")
        else:
            call(self._replied, gen, out_id, "".join(got).removesuffix("\n"), f"{time.monotonic() - started:.1f}s")

    def _chat_text(self, gen: int, out_id: str, text: str) -> None:
        if gen == self._chat_gen:  # (a reply of a conversation already reset says nothing)
            self.query_one(out_id, SampleOutput).append(text)

    def _replied(self, gen: int, out_id: str, reply: str | None, note: str) -> None:
        """A reply is done: it joins the column's conversation, or (stopped, failed) the message it answered
        leaves it."""
        if gen != self._chat_gen:
            return
        self._replying.discard(out_id)
        out, history = self.query_one(out_id, SampleOutput), self._chat.get(out_id, [])
        if reply is None:
            if history and history[-1]["role"] == "user":
                history.pop()
            out.append(f"  [{note}; not kept in the conversation]\n\n", "bold red")
        else:
            history.append({"role": "assistant", "content": reply})
            out.append(f"  [{note}]\n\n", "dim")
