"""Continue a finished run for N more steps: how many, and what that does to the learning rate."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from workbench.config import Preset
from workbench.plan.schedule import extension_note


class MoreStepsScreen(ModalScreen["int | None"]):
    """Dismisses with the number of steps to add, or None."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, run_id: str, preset: Preset, from_step: int):
        super().__init__()
        self.run_id, self.preset, self.from_step = run_id, preset, from_step

    def compose(self) -> ComposeResult:
        default = max(1, self.preset.train.max_iters // 2)
        with Vertical(classes="dialog wide", id="more-steps"):
            yield Label(f"Continue [b]{self.run_id}[/b] from step {self.from_step:,} for how many more steps?")
            yield Input(str(default), id="more-n", type="integer")
            yield Static("", id="more-note")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Continue", id="ok", variant="success")
                yield Button("Cancel (esc)", id="cancel")

    def on_mount(self) -> None:
        self._explain()
        self.query_one("#more-n", Input).focus()

    def steps(self) -> int | None:
        try:
            n = int(self.query_one("#more-n", Input).value.strip())
        except ValueError:
            return None
        return n if n >= 1 else None

    def _explain(self) -> None:
        n = self.steps()
        note = self.query_one("#more-note", Static)
        if n is None:
            note.update("[red]give a whole number of steps, at least 1[/]")
            return
        note.update(f"to step {self.from_step + n:,}; {extension_note(self.preset, self.from_step, n)}. "
                    "Recorded in the run's events as a change of train.max_iters.")

    def on_input_changed(self) -> None:
        self._explain()

    def on_input_submitted(self) -> None:
        self._submit()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "ok":
            self._submit()
        else:
            self.dismiss(None)

    def _submit(self) -> None:
        if (n := self.steps()) is not None:
            self.dismiss(n)

    def action_cancel(self) -> None:
        self.dismiss(None)
