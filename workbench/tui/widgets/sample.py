"""Sample pane: a run, two of its checkpoints side by side, and the samples the trainer wrote at eval time;
in text mode a prompt's continuation (``sample_text``), in chat mode a conversation (``sample_chat``).

The pane runs the samplers itself: in text mode one CLI subprocess per column (``workbench sample``), read by the
one worker loop (:meth:`SamplePane.stream`) that hands its text to the column's reader as it comes; in chat mode
each column's ``workbench chat --serve``, which keeps its checkpoint's model loaded between turns (started on the
first message, replaced when the column's checkpoint changes, ended when chat mode, the pane or the app ends, or
after ``chat_server.IDLE_EXIT_S`` idle: ``workbench.tui.chat_server``), each reply read by
:meth:`SamplePane.converse`. A run with a chat template (``chat_template.jinja``: chat-tuned, or an imported model's
own) opens in chat mode; any other in text mode."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Button, Collapsible, Input, Select, Static
from textual.worker import get_current_worker

from workbench.data.chat.chat_templates import CHAT_TEMPLATE_FILE
from workbench.errors import WorkbenchError
from workbench.plan.sampling import Sampling
from workbench.rundir import PREFERENCES_FILE
from workbench.tui import launcher
from workbench.tui.chat_server import ChatServer, ChatServers, ServerGone
from workbench.tui.widgets.pane import Pane
from workbench.tui.widgets.sample_chat import CHAT_HINT, ChatControls, Reply
from workbench.tui.widgets.sample_output import Column, Reader, SampleOutput
from workbench.tui.widgets.sample_sources import (
    checkpoint_options,
    count_picks,
    resolve_checkpoint,
    trainer_samples,
)
from workbench.tui.widgets.sample_text import TextControls

NONE = "none"
NO_B = "checkpoint B (choose one to compare)"

# "Train on my picks" (F9) needs this many preference pairs: the trainer holds at least one pair out for the val
# loss, so 8 leave 7 to train on; fewer is a run that learns two or three answers by heart, not a preference (the
# trainer itself takes 2).
MIN_PICKS = 8

__all__ = ["CHAT_HINT", "NONE", "SampleOutput", "SamplePane", "checkpoint_options", "resolve_checkpoint",
           "trainer_samples"]


class SamplePane(Vertical, Pane):
    MAIN_WIDGET = "#smp-run"
    BINDINGS = [
        Binding("ctrl+g", "generate", "Generate"),
        Binding("ctrl+k", "cancel", "Stop sampling", show=False),
        Binding("ctrl+r", "reset_chat", "Reset chat"),
        Binding("ctrl+t", "toggle_chat", "Chat / text"),
        # A/B picks (chat mode): function keys, which a text box does not take
        Binding("f5", "prefer('a')", "A better"),
        Binding("f6", "prefer('b')", "B better"),
        Binding("f7", "rate(True)", "A good"),
        Binding("f8", "rate(False)", "A bad"),
        Binding("f9", "train_on_picks", "Train on picks"),  # a DPO run from this run on RUN/preferences.jsonl
        # in a box, digits are text (a message may hold numbers); escape leaves it, and 1-7 switch tabs again
        Binding("escape", "leave_box", "Leave the box"),
    ]

    @dataclass
    class TrainOnPicksRequested(Message):
        """Open the new-run form for a DPO run from ``init_from`` (RUN:STEP) on ``corpus`` (the run's
        preferences.jsonl, ``picks`` pairs)."""
        run_id: str
        init_from: str
        corpus: str
        picks: int

    def __init__(self, runs_dir: Path, **kw: Any) -> None:
        super().__init__(**kw)
        self.runs_dir = runs_dir
        self._samplers: list[launcher.SampleProcess] = []  # running now, to kill on cancel
        self.chat_run = False   # the run shown has a chat template (chat-tuned, or an imported model's)
        self.chat_mode = False  # the pane chats (else samples text)
        self._shown: tuple = ()  # (run, checkpoint A, checkpoint B) the conversation is with
        self.text = TextControls()
        self.chat = ChatControls()
        self.servers = ChatServers()  # chat mode: each column's model, kept loaded between turns

    def compose(self) -> ComposeResult:
        with Horizontal(classes="sample-row"):
            yield Select([], prompt="run", id="smp-run", allow_blank=True)
            yield Select([("latest", "latest")], value="latest", allow_blank=False, id="smp-ckpt-a")
            yield Select([("none", NONE)], value=NONE, allow_blank=False, id="smp-ckpt-b")
        yield self.text
        yield self.chat
        with Horizontal(id="smp-outputs"):
            yield SampleOutput(id="smp-out-a")
            yield SampleOutput(id="smp-out-b")
        with Collapsible(title="samples written by the trainer", id="smp-trainer", collapsed=True):
            yield Static("", id="smp-trainer-text")

    def on_mount(self) -> None:
        self.query_one("#smp-out-a", SampleOutput).border_title = "checkpoint A"
        self.query_one("#smp-out-b", SampleOutput).border_title = NO_B

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Chat keys only where they apply (a text run's footer stays as it was)."""
        if action == "toggle_chat":
            return self.chat_run
        if action in ("reset_chat", "prefer", "rate", "train_on_picks"):
            return self.chat_mode
        if action == "leave_box":
            return isinstance(self.app.focused, Input)
        return True

    def action_prefer(self, side: str) -> None:
        """Save the reply of column ``side`` (a or b) as the better of the two last replies: a preference pair in
        the run's preferences.jsonl (``workbench train --init-from RUN --corpus RUN/preferences.jsonl --set
        train.objective=dpo`` trains on them)."""
        a, b = "#smp-out-a", "#smp-out-b"
        self._judge(lambda run: self.chat.pick(self.runs_dir, run, a if side == "a" else b, b if side == "a" else a),
                    a if side == "a" else b)

    def action_rate(self, good: bool) -> None:
        """Rate column A's last reply good or bad: a KTO row in the run's ratings.jsonl (train.objective = kto)."""
        self._judge(lambda run: self.chat.pick(self.runs_dir, run, "#smp-out-a", None, good), "#smp-out-a")

    def action_train_on_picks(self) -> None:
        """Open the new-run form for a DPO run from this run's checkpoint A on the picks saved with F5 / F6
        (RUN/preferences.jsonl); refused in one line below :data:`MIN_PICKS` pairs."""
        if (run := self._chosen_run("train on its picks")) is None:
            return
        run_dir = self.runs_dir / run
        n = count_picks(run_dir)
        if n < MIN_PICKS:
            self.notify(f"{n} pick{'s' if n != 1 else ''} in {run}/{PREFERENCES_FILE}: a DPO run needs at least "
                        f"{MIN_PICKS} (F5 / F6 on two checkpoints' replies save one each).", severity="warning")
            return
        step = resolve_checkpoint(run_dir, str(self.query_one("#smp-ckpt-a", Select).value))
        self.post_message(self.TrainOnPicksRequested(run, f"{run}:{step}", str(run_dir / PREFERENCES_FILE), n))

    def _judge(self, save: Callable[[str], str], column: str) -> None:
        run = self.run_id
        if run is None:
            self.notify("Choose a run to chat with.", severity="warning")
            return
        try:
            line = save(run)
        except ValueError as e:
            self.notify(str(e), severity="warning")
            return
        except OSError as e:
            self.notify(f"could not save the pick: {e.strerror or e}", severity="error")
            return
        self.query_one(column, SampleOutput).append(f"  [{line}]\n\n", "bold green")
        self.notify(line)

    def action_leave_box(self) -> None:
        """Leave the text box for the run choice, where the app's keys (1-7, q) work again."""
        self.focus_main()

    def on_unmount(self) -> None:
        self.action_cancel()
        self.servers.end_all()

    # ------------------------------------------------------------------ the run and its checkpoints

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

    def _columns(self, run: str) -> list[Column] | None:
        """The columns to fill, each with the checkpoint chosen for it and the step that means now; None once the
        user is told that a chosen checkpoint is gone."""
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
            self.query_one("#smp-out-b", SampleOutput).reset(NO_B, "")
        # latest / best pinned to a step now, so the title names what the sampler loads
        return [Column(self.query_one(out_id, SampleOutput), choice, resolve_checkpoint(self.runs_dir / run, choice))
                for out_id, choice in [("#smp-out-a", a)] + ([("#smp-out-b", b)] if b != NONE else [])]

    # ------------------------------------------------------------------ the samplers

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

    def action_generate(self) -> None:
        """Sample from the chosen checkpoint(s) with the settings shown, one sampler per column (in chat
        mode: send the message)."""
        if self.chat_mode:
            self.action_send()
            return
        run = self._chosen_run("sample from")
        sampling = self._settings(self.text) if run is not None else None
        if run is None or sampling is None:
            return
        self.action_cancel()
        if (columns := self._columns(run)) is not None:
            self.text.start(self.runs_dir, run, columns, sampling, self.stream)

    def action_send(self) -> None:
        """Send the message to the chosen checkpoint(s): each column's reply to its own conversation so far."""
        if (run := self._chosen_run("chat with")) is None:
            return
        if not self.query_one("#smp-message", Input).value.strip():
            self.notify("Type a message to send.", severity="warning")
            return
        if self.chat.replying:
            self.notify("Still answering the last message (ctrl+k stops it).", severity="warning")
            return
        if (sampling := self._settings(self.chat)) is not None and (columns := self._columns(run)) is not None:
            self.chat.send(run, columns, sampling, lambda col, request, reply: self._ask(run, col, request, reply))

    def _ask(self, run: str, col: Column, request: dict, reply: Reply) -> None:
        """``request`` to the server of ``col``'s checkpoint (started now if it has none, or one for another
        checkpoint), its answer to ``reply``."""
        try:
            server = self.servers.get(col.out_id, self.runs_dir, run, col.checkpoint)
        except OSError as e:
            reply.unstarted(e)
            return
        self.converse(server, request, reply)

    def _chosen_run(self, to: str) -> str | None:
        """The run chosen, or None with a warning that asks for one (``to``: what it is for)."""
        run = self.run_id
        if run is None:
            self.notify(f"Choose a run to {to}.", severity="warning")
        return run

    def _settings(self, controls: TextControls | ChatControls) -> Sampling | None:
        """The settings in ``controls``' boxes, or None with what is wrong with them said."""
        try:
            return controls.settings()
        except (ValueError, WorkbenchError) as e:
            self.notify(str(e), severity="error")
            return None

    @work(thread=True, group="sample", exit_on_error=False)
    def stream(self, argv: list[str], reader: Reader, stdin: str | None = None) -> None:
        """Run one sampler (``workbench sample``, or ``workbench chat`` given ``stdin``), handing its text to
        ``reader`` on the app's thread as it comes, then how it ended."""
        worker = get_current_worker()
        call = self.app.call_from_thread
        try:
            proc = launcher.SampleProcess(argv, stdin=stdin)
        except OSError as e:
            call(reader.unstarted, e)
            return
        self._samplers.append(proc)
        started = time.monotonic()
        try:
            for chunk in proc.chunks():
                if worker.is_cancelled:
                    proc.kill()
                    break
                call(reader.text, chunk)
            rc, err = proc.finish()
        finally:
            if proc in self._samplers:
                self._samplers.remove(proc)
        call(reader.ended, rc, err, worker.is_cancelled, time.monotonic() - started)

    @work(thread=True, group="sample", exit_on_error=False)
    def converse(self, server: ChatServer, request: dict, reply: Reply) -> None:
        """One chat turn: ``request`` to ``server`` (a new one loads its model first, and says so), its reply's
        pieces to ``reply`` on the app's thread as they come, then how it ended."""
        worker = get_current_worker()
        call = self.app.call_from_thread
        started = time.monotonic()
        rc, err = 0, ""
        try:
            for line in server.ask(request):
                if worker.is_cancelled:
                    break
                if line.get("ready"):
                    call(reply.loaded, float(line.get("load_seconds", 0.0)))
                elif "text" in line:
                    call(reply.text, line["text"])
                elif "error" in line:
                    rc, err = 1, str(line["error"])
        except ServerGone as e:
            rc, err = e.rc or 1, e.err
        call(reply.ended, rc, err, worker.is_cancelled, time.monotonic() - started)

    def action_cancel(self) -> None:
        """Stop sampling: kill the samplers (and the chat servers writing a reply) and cancel their workers."""
        for proc in list(self._samplers):
            proc.kill()
        self.servers.stop_busy()
        self.workers.cancel_group(self, "sample")

    # ------------------------------------------------------------------ chat mode or text mode

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
        self._keep_servers(shown if chat_run else None)
        if new_run or chat_run != self.chat_run:
            self.chat_run = chat_run
            self._set_mode(chat_run)
        elif self.chat_mode:
            self.action_reset_chat()

    def _keep_servers(self, shown: tuple | None) -> None:
        """End the chat servers that no longer serve a column's checkpoint (``shown``: the run and the columns'
        choices; None: none at all)."""
        if shown is None or shown[0] is None:
            self.servers.end_all()
            return
        run, a, b = shown
        run_dir = self.runs_dir / run
        self.servers.keep_only({"#smp-out-a": (run, resolve_checkpoint(run_dir, a)),
                                "#smp-out-b": None if b == NONE else (run, resolve_checkpoint(run_dir, b))})

    def _set_mode(self, chat: bool) -> None:
        was, self.chat_mode = self.chat_mode, chat
        if not chat:
            self.servers.end_all()  # text mode samples with `workbench sample`: no model kept
        self.query(".smp-text").set(display=not chat)
        self.query(".smp-chat").set(display=chat)
        self.refresh_bindings()
        if chat:
            self.action_reset_chat()
        elif was:
            self.action_reset_chat()  # (the replies still being written say nothing more)
            self.query_one("#smp-out-a", SampleOutput).reset("checkpoint A", "")
            self.query_one("#smp-out-b", SampleOutput).reset(NO_B, "")

    def action_toggle_chat(self) -> None:
        """Chat with a chat-tuned run, or sample raw text from it."""
        if self.chat_run:
            self._set_mode(not self.chat_mode)
            self.query_one("#smp-message" if self.chat_mode else "#smp-prompt", Input).focus()

    def action_reset_chat(self) -> None:
        """Start the conversation over (a reply being written is stopped)."""
        self.action_cancel()
        run, a, b = self._shown or (None, "latest", NONE)
        self.chat.reset(run, a, b, self.query_one("#smp-out-a", SampleOutput),
                        self.query_one("#smp-out-b", SampleOutput), NONE)
