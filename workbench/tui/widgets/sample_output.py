"""What the Sample pane's two halves share: a column (:class:`SampleOutput`, and the checkpoint it shows:
:class:`Column`), what a sampler's text is handed to as it streams (:class:`Reader`), and how a setting is
named in a message."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static


def setting_name(key: str) -> str:
    """A sampling setting as the pane's messages name it (``max_new_tokens`` -> ``max new tokens``)."""
    return key.replace("_", " ")


class SampleOutput(VerticalScroll):
    """Accumulates streamed text; one per checkpoint column."""

    def __init__(self, **kw: Any) -> None:
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


@dataclass(frozen=True)
class Column:
    """A column to fill: its output, the checkpoint chosen for it (``latest``, ``best`` or a step) and the step
    that choice means now (what its sampler loads)."""
    out: SampleOutput
    choice: str
    checkpoint: str

    @property
    def out_id(self) -> str:
        return f"#{self.out.id}"

    @property
    def shown(self) -> str:
        """The checkpoint as its title names it: the choice, pinned to its step when it was latest or best."""
        return self.choice if self.checkpoint == self.choice else f"{self.choice} (step {self.checkpoint})"


class Reader(Protocol):
    """What one sampler's output goes to, on the app's thread (the pane's one worker loop calls it)."""

    def unstarted(self, error: OSError) -> None:
        """The sampler could not be started."""

    def text(self, chunk: str) -> None:
        """The next piece of its stdout, as it came."""

    def ended(self, rc: int, err: str, cancelled: bool, seconds: float) -> None:
        """It exited (``err``: its last stderr line; ``cancelled``: the user stopped it)."""
