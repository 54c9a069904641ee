"""The Sample pane's chat half, for a run with a chat template (``chat_template.jinja``: chat-tuned, or an
imported model's own): a system prompt, a message, and each column a transcript of its own conversation with
its checkpoint. Every message goes to both columns; each reply is one request to that column's ``workbench chat
--serve`` (the model kept loaded between turns: ``workbench.tui.chat_server``) given the column's conversation so
far. The settings' defaults are the one definition's (``plan.sampling.CHAT``, as ``workbench chat`` has them:
greedy)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Input, Label

from workbench.plan.sampling import CHAT, Sampling
from workbench.rundir import PREFERENCES_FILE, RATINGS_FILE, append_feedback
from workbench.tui.widgets.sample_output import Column, SampleOutput, setting_name

CHAT_HINT = ("Type a message below (enter sends; ctrl+r starts over, ctrl+t samples text instead). With two "
             "checkpoints, F5 / F6 save A's / B's reply as the better one (RUN/preferences.jsonl); F7 / F8 rate A's "
             "good / bad (RUN/ratings.jsonl); F9 trains a DPO run on the pairs.")


class ChatControls(Vertical):
    """The system prompt, the settings and the message (rows shown in chat mode), and each column's
    conversation."""

    DEFAULT_CSS = "ChatControls { height: auto; }"

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.conversations: dict[str, list[dict]] = {}  # each column's (by its output's id): user and assistant
        self.systems: dict[str, str] = {}       # the system prompt each column's transcript shows now
        self.replying: set[str] = set()         # the columns whose reply is being generated
        self.generation = 0                     # a new conversation drops what the replies of the old one send
        self.checkpoints: dict[str, str] = {}   # the checkpoint (step) each column's last reply came from

    def compose(self) -> ComposeResult:
        with Horizontal(classes="sample-row smp-chat"):
            yield Input(placeholder="system prompt (optional)", id="smp-system")
            yield Label("temp", classes="param-label")
            yield Input(f"{CHAT.temperature:g}", id="smp-chat-temperature", classes="param", type="number")
            yield Label("tokens", classes="param-label")
            yield Input(f"{CHAT.max_new_tokens:g}", id="smp-chat-max_new_tokens", classes="param", type="number")
        with Horizontal(classes="sample-row smp-chat"):
            yield Input(placeholder="message", id="smp-message")
            yield Button("Send", id="smp-send", variant="primary")

    def settings(self) -> Sampling:
        """Chat's settings with the temperature and tokens in the boxes: ValueError with a clear message for a bad
        value."""
        temp, tokens = (self.query_one(f"#smp-chat-{key}", Input).value.strip()
                        for key in ("temperature", "max_new_tokens"))
        try:
            chosen = CHAT.replace(temperature=float(temp), max_new_tokens=int(tokens))
        except ValueError:
            raise ValueError(f"temperature must be a number and tokens an integer, not {temp!r} and {tokens!r}") \
                from None
        return chosen.check(setting_name)

    def reset(self, run: str | None, a: str, b: str, out_a: SampleOutput, out_b: SampleOutput,
              no_b: str) -> None:
        """A new conversation with ``run``'s checkpoints ``a`` and ``b`` (``no_b``: the value for none): nothing
        remembered, the transcripts cleared."""
        self.generation += 1
        self.conversations, self.systems, self.replying, self.checkpoints = {}, {}, set(), {}
        out_a.reset(f"{run} @ {a}  chat" if run else "checkpoint A", "")
        out_a.append(CHAT_HINT, "dim")
        out_b.reset(f"{run} @ {b}  chat" if run and b != no_b else "checkpoint B (choose one to compare)", "")

    def send(self, run: str, columns: list[Column], sampling: Sampling,
             ask: "Callable[[Column, dict, Reply], None]") -> None:
        """The message to each column's checkpoint, with that column's conversation so far: ``ask`` hands the
        request (``workbench chat --serve``'s) to the column's server and its answer to the :class:`Reply`."""
        message = self.query_one("#smp-message", Input)
        text, system = message.value, self.query_one("#smp-system", Input).value.strip()
        message.value = ""
        for col in columns:
            out, out_id = col.out, col.out_id
            history = self.conversations.setdefault(out_id, [])
            if not history:
                out.reset("", "")  # the hint goes
            out.border_title = f"{run} @ {col.shown}  chat T={sampling.temperature}"
            if system != self.systems.get(out_id, ""):
                out.append(f"system: {system or '(none)'}\n", "italic")
                self.systems[out_id] = system
            history.append({"role": "user", "content": text})
            out.append(f"you> {text}\n", "bold")
            out.append("model> ", "bold cyan")
            self.replying.add(out_id)
            self.checkpoints[out_id] = col.checkpoint
            request = {"messages": list(history), "system": system, "stream": True, **dataclasses.asdict(sampling)}
            ask(col, request, Reply(self, out, out_id, self.generation))

    def last_reply(self, out_id: str) -> tuple[list[dict], str, str] | None:
        """A column's last exchange: the conversation it answered (its system prompt first), its reply and the
        checkpoint that gave it; None while it has no finished reply."""
        history = self.conversations.get(out_id, [])
        if out_id in self.replying or not history or history[-1]["role"] != "assistant":
            return None
        system = self.systems.get(out_id, "")
        prompt = ([{"role": "system", "content": system}] if system else []) + [dict(m) for m in history[:-1]]
        return prompt, history[-1]["content"], self.checkpoints.get(out_id, "")

    def pick(self, runs_dir: Path, run: str, better: str, worse: str | None, good: bool = True) -> str:
        """The user's judgement of the last replies, saved in the run's directory: ``better``'s reply preferred to
        ``worse``'s (a pair in preferences.jsonl), or with ``worse`` None, ``better``'s reply rated good or bad
        (``good``: a KTO row in ratings.jsonl). The line to show; ValueError when there is nothing to judge."""
        mine = self.last_reply(better)
        if mine is None:
            raise ValueError("Wait for a reply to judge (send a message first).")
        prompt, reply, ckpt = mine
        if not reply.strip():
            raise ValueError("That reply is empty: there is nothing to train on.")
        if worse is None:
            path = Path(runs_dir) / run / RATINGS_FILE
            n = append_feedback(path, {"prompt": prompt, "completion": [{"role": "assistant", "content": reply}],
                                       "label": good, "run": run, "checkpoint": ckpt, "time": round(time.time(), 3)})
            return f"rated {'good' if good else 'bad'}: {path} ({n} rating{'s' if n != 1 else ''})"
        theirs = self.last_reply(worse)
        if theirs is None:
            raise ValueError("Both columns need a reply to compare (choose checkpoint B, then send a message).")
        _, other, other_ckpt = theirs
        if other == reply:
            raise ValueError("The two replies are the same: there is nothing to prefer.")
        if not other.strip():
            raise ValueError("The other reply is empty: a pair needs two answers.")
        path = Path(runs_dir) / run / PREFERENCES_FILE
        # the prompt is the conversation the chosen reply answered (the columns' histories may differ after the
        # first turn; a pair needs one prompt)
        n = append_feedback(path, {"prompt": prompt, "chosen": [{"role": "assistant", "content": reply}],
                                   "rejected": [{"role": "assistant", "content": other}], "run": run,
                                   "chosen_checkpoint": ckpt, "rejected_checkpoint": other_ckpt,
                                   "time": round(time.time(), 3)})
        return f"preferred (step {ckpt} over step {other_ckpt}): {path} ({n} pair{'s' if n != 1 else ''})"

    def replied(self, gen: int, out: SampleOutput, out_id: str, reply: str | None, note: str) -> None:
        """A reply is done: it joins the column's conversation, or (stopped, failed) the message it answered
        leaves it."""
        if gen != self.generation:
            return
        self.replying.discard(out_id)
        history = self.conversations.get(out_id, [])
        if reply is None:
            if history and history[-1]["role"] == "user":
                history.pop()
            out.append(f"  [{note}; not kept in the conversation]\n\n", "bold red")
        else:
            history.append({"role": "assistant", "content": reply})
            out.append(f"  [{note}]\n\n", "dim")


class Reply:
    """A column's reply as its chat server streams it (a :class:`Reader`): shown as it comes (less a newline that
    ends it), then kept in the column's conversation."""

    def __init__(self, chat: ChatControls, out: SampleOutput, out_id: str, gen: int):
        self.chat, self.out, self.out_id, self.gen = chat, out, out_id, gen
        self.got: list[str] = []
        self.held = ""  # a newline that may be the one the reply ends with
        self.load_seconds: float | None = None  # the model was loaded for this reply, in this long

    def loaded(self, seconds: float) -> None:
        """The column's server loaded its model for this reply (the turns after it reuse the model)."""
        self.load_seconds = seconds

    def unstarted(self, error: OSError) -> None:
        self.chat.replied(self.gen, self.out, self.out_id, None, f"could not start the chat: {error}")

    def text(self, chunk: str) -> None:
        self.got.append(chunk)
        shown, self.held = self.held + chunk, ""
        if shown.endswith("\n"):
            shown, self.held = shown[:-1], "\n"
        if shown and self.gen == self.chat.generation:  # (a reply of a conversation already reset says nothing)
            self.out.append(shown)

    def ended(self, rc: int, err: str, cancelled: bool, seconds: float) -> None:
        if cancelled:
            self.chat.replied(self.gen, self.out, self.out_id, None, "stopped")
        elif rc != 0:
            self.chat.replied(self.gen, self.out, self.out_id, None, f"chat failed: {err or f'exit status {rc}'}")
        else:
            loaded = ("; model loaded" + (f" in {self.load_seconds:.1f}s" if self.load_seconds else "")
                      if self.load_seconds is not None else "; model kept loaded")
            self.chat.replied(self.gen, self.out, self.out_id, "".join(self.got).removesuffix("\n"),
                              f"{seconds:.1f}s{loaded}")
