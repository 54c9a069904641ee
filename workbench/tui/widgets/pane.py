"""What every pane offers the app (the widget that takes the focus when its tab is shown), and the row key under
a table's cursor for the panes with tables."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from textual import on
from textual.widget import Widget
from textual.widgets import DataTable
from textual.worker import Worker, WorkerState

if TYPE_CHECKING:
    from textual import getters

    from workbench.tui.app import WorkbenchApp


class Pane(Widget):
    """A pane of one tab. It acts on its own keys and tells the app what it wants by messages
    nested in its class; the app calls only its public methods, never its children.

    Mixed in after the container a pane is (``class RunsPane(Vertical, Pane)``): Textual takes a
    widget's default CSS from its first base only, and the container's layout is in it."""

    MAIN_WIDGET: ClassVar[str] = ""  # the selector of the child that takes the focus; "": the pane

    if TYPE_CHECKING:  # a pane lives in the workbench's app: its methods typed (as Textual types its own ``app``)
        app = getters.app(WorkbenchApp)

    def focus_main(self) -> None:
        """Focus the main widget now, so that the pane's keys are live and shown in the footer.

        Synchronous (``Widget.focus()`` waits for the next idle: keys typed right after the tab key
        would miss the pane), and on the pane's own screen, which may be under a dialog or the
        command palette just now."""
        widget = self.query_one(self.MAIN_WIDGET) if self.MAIN_WIDGET else self
        widget.screen.set_focus(widget)

    def cursor_key(self, table: str) -> str | None:
        """The row key under the cursor of the pane's DataTable ``table`` (a selector); None when it is empty."""
        t = self.query_one(table, DataTable)
        if not t.row_count:
            return None
        try:
            return str(t.coordinate_to_cell_key(t.cursor_coordinate).row_key.value)
        except Exception:  # the cursor is past the rows a refresh left
            return None

    def tab_shown(self) -> None:
        """The pane's tab was just shown: bring what it shows up to date (nothing by default)."""

    @on(Worker.StateChanged)
    def _worker_failed(self, event: Worker.StateChanged) -> None:
        # a worker's state changes are told to its own node only: the pane's, here
        if event.state == WorkerState.ERROR:
            self.notify(f"{event.worker.name or event.worker.group} failed: {event.worker.error!r}",
                        severity="error", timeout=10)
