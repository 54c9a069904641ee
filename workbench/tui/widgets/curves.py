"""Loss curves pane: train/val loss of one or several runs, step or tokens, log, smoothing."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.widgets import Label, SelectionList, Static

from workbench.tui.plot import SMOOTHING, render_loss_plot
from workbench.tui.rundata import RunData


class LossPlot(Static):
    """Redraws on resize; the pane calls ``draw`` when data or settings change."""

    def on_resize(self) -> None:
        self.draw()

    def draw(self) -> None:
        pane = self.query_ancestor(CurvesPane)
        runs = pane.selected_data()
        w, h = self.content_size.width, self.content_size.height
        if w < 10 or h < 4:
            return
        if not runs:
            self.update(Text("Select runs on the left (space) to plot their loss.", style="dim"))
            return
        text = render_loss_plot(runs, w, h, x_axis=pane.x_axis, log_y=pane.log_y,
                                smoothing=pane.smoothing, show=pane.show)
        self.update(Text.from_ansi(text, no_wrap=True) if text else
                    Text("No loss recorded yet for the selected runs.", style="dim"))


class CurvesPane(Horizontal):
    BINDINGS = [
        Binding("l", "toggle_log", "Log scale"),
        Binding("x", "toggle_x", "Step/tokens"),
        Binding("s", "cycle_smoothing", "Smoothing"),
        Binding("v", "cycle_show", "Train/val"),
    ]

    log_y: reactive[bool] = reactive(False, init=False)
    x_axis: reactive[str] = reactive("step", init=False)
    smoothing: reactive[float] = reactive(0.0, init=False)
    show: reactive[str] = reactive("both", init=False)

    def __init__(self, data: dict[str, RunData], **kw):
        super().__init__(**kw)
        self.data = data  # the app's run data, shared

    def compose(self) -> ComposeResult:
        with Vertical(id="curves-side"):
            yield SelectionList[str](id="curves-runs")
            yield Label("", id="curves-settings")
        yield LossPlot("", id="curves-plot")

    def on_mount(self) -> None:
        self.query_one("#curves-runs", SelectionList).border_title = "runs (space)"
        self._show_settings()

    def set_runs(self, run_ids: list[str]) -> None:
        sl = self.query_one("#curves-runs", SelectionList)
        selected = set(sl.selected)
        with self.prevent(SelectionList.SelectedChanged):
            sl.clear_options()
            sl.add_options([(rid, rid, rid in selected) for rid in run_ids])

    def select_run(self, run_id: str, only: bool = False) -> None:
        sl = self.query_one("#curves-runs", SelectionList)
        if only:
            sl.deselect_all()
        try:
            sl.select(run_id)
        except Exception:
            pass

    def selected_ids(self) -> list[str]:
        return list(self.query_one("#curves-runs", SelectionList).selected)

    def selected_data(self) -> list[RunData]:
        return [self.data[r] for r in self.selected_ids() if r in self.data]

    def on_selection_list_selected_changed(self) -> None:
        self.app.watch_runs_for_curves(self.selected_ids())
        self.redraw()

    def redraw(self) -> None:
        if self.is_mounted:
            self.query_one(LossPlot).draw()

    def _show_settings(self) -> None:
        self.query_one("#curves-settings", Label).update(
            f"x: {self.x_axis}   y: {'log' if self.log_y else 'linear'}\n"
            f"smoothing: {self.smoothing:g}\nshow: {self.show}")

    def _changed(self) -> None:
        self._show_settings()
        self.redraw()

    watch_log_y = watch_x_axis = watch_smoothing = watch_show = lambda self, _v: self._changed()

    def action_toggle_log(self) -> None:
        self.log_y = not self.log_y

    def action_toggle_x(self) -> None:
        self.x_axis = "tokens" if self.x_axis == "step" else "step"

    def action_cycle_smoothing(self) -> None:
        i = SMOOTHING.index(self.smoothing) if self.smoothing in SMOOTHING else 0
        self.smoothing = SMOOTHING[(i + 1) % len(SMOOTHING)]

    def action_cycle_show(self) -> None:
        order = ["both", "train", "val"]
        self.show = order[(order.index(self.show) + 1) % 3]
