"""Small modal dialogs: yes/no confirmation and asking for a name; the labelled field row the forms are made of,
and the keys and buttons of a form that starts a job."""

from __future__ import annotations

from typing import Callable, Literal, TypeVar

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widget import Widget
from textual.widgets import Button, Input, Label, Static


def form_field(label: str, *widgets: Widget) -> Horizontal:
    """A form's row: ``label`` in the label column, then ``widgets`` (the dialogs' CSS lays out ``.field``)."""
    return Horizontal(Label(label, classes="field-label"), *widgets, classes="field")


R = TypeVar("R")


class StartDialog(ModalScreen[R]):
    """A form that starts a job: its ``start`` button and Enter in a field start it (``action_start``), its other
    button closes it (``action_close``); its first field has the focus."""

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "start":
            self.action_start()
        else:
            self.action_close()

    def on_input_submitted(self) -> None:
        self.action_start()

    def action_start(self) -> None:
        raise NotImplementedError

    def action_close(self) -> None:
        raise NotImplementedError


class ConfirmScreen(ModalScreen[bool]):
    """Dismisses with True only on an explicit yes."""

    BINDINGS = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    def __init__(self, question: str, yes_label: str = "Yes", danger: bool = True):
        super().__init__()
        self.question = question
        self.yes_label = yes_label
        self.danger = danger

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(self.question, id="confirm-question")
            with Horizontal(classes="dialog-buttons"):
                yield Button(f"{self.yes_label} (y)", id="yes", variant="error" if self.danger else "primary")
                yield Button("Cancel (n)", id="no")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class InputScreen(ModalScreen):
    """One line of input under a title, a note line, OK and Cancel.

    Subclasses say what the text means in ``parse``: it returns ``(value, note)``; a value of None keeps the
    dialog open with the note shown as the error. The note is refreshed as the user types when ``live``.
    """

    BINDINGS = [Binding("escape", "cancel", "Cancel")]
    input_id = "dialog-input"
    input_type: Literal["integer", "number", "text"] = "text"  # (the types Input takes)
    ok_label = "OK"
    live = False

    def __init__(self, title: str, value: str = "", wide: bool = False):
        super().__init__()
        self.title_text, self.value, self.wide = title, value, wide

    def parse(self, text: str) -> tuple[object | None, str]:
        raise NotImplementedError

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide" if self.wide else "dialog"):
            yield Label(self.title_text)
            yield Input(self.value, id=self.input_id, type=self.input_type)
            yield Static("", id="dialog-note")
            with Horizontal(classes="dialog-buttons"):
                yield Button(self.ok_label, id="ok", variant="primary")
                yield Button("Cancel (esc)", id="cancel")

    def on_mount(self) -> None:
        if self.live:
            self._show(*self.parse(self._text()))
        self.query_one(Input).focus()

    def _text(self) -> str:
        return self.query_one(Input).value.strip()

    def _show(self, value: object | None, note: str) -> None:
        self.query_one("#dialog-note", Static).update(f"[red]{note}[/]" if value is None and note else note)

    def on_input_changed(self) -> None:
        if self.live:
            self._show(*self.parse(self._text()))

    def on_input_submitted(self) -> None:
        self._submit()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "ok":
            self._submit()
        else:
            self.dismiss(None)

    def _submit(self) -> None:
        value, note = self.parse(self._text())
        if value is None:
            self._show(value, note)
            return
        self.dismiss(value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class NameScreen(InputScreen):
    """Ask for a name; ``check`` returns an error message or None."""

    input_id = "name-input"

    def __init__(self, title: str, value: str = "", check: Callable[[str], str | None] | None = None):
        super().__init__(title, value)
        self.check = check

    def parse(self, text: str) -> tuple[str | None, str]:
        err = self.check(text) if self.check else None
        return (None, err) if err else (text, "")
