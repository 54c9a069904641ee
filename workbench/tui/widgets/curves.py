"""Loss curves pane: train/val loss of one or several runs, step or tokens, log, smoothing; or, one key
away, each task's score (``train.eval_tasks``, ``workbench eval``) on the same axes; or, for a GRPO run, each
measure of its reward records (mean reward, train and held-out; its spread; the share of groups without signal;
KL to the reference; completion length), ``r`` stepping through them. A sweep's best trials
(the Queue pane's ``c``) are drawn together, each labelled with its trial and settings, by what the sweep
ranks them by."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.segment import Segment
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.reactive import reactive
from textual.strip import Strip
from textual.widgets import Label, SelectionList, Static

try:  # the box's glyph (Textual draws it for ticked and unticked alike)
    from textual.widgets._toggle_button import ToggleButton
    _BOX: str | None = ToggleButton.BUTTON_INNER
except ImportError:  # pragma: no cover - a Textual without it: leave the rows as drawn
    _BOX = None
from textual.widgets.option_list import OptionDoesNotExist

from workbench.analysis.lineage import lineage
from workbench.tui.plot import (
    REWARD_MEASURES,
    SMOOTHING,
    Series,
    loss_series,
    render_loss_plot,
    render_task_plot,
    reward_series,
    task_series,
    task_title,
)
from workbench.tui.rundata import RunData, joined, task_names
from workbench.tui.widgets.pane import Pane


class RunChecklist(SelectionList[str]):
    """A SelectionList whose box shows the state in the glyph itself (✓ or blank), not only in its
    colour, so it reads right in any terminal theme and in ``tmux capture-pane``."""

    def render_line(self, y: int) -> Strip:
        strip = super().render_line(y)
        segments = list(strip)
        if len(segments) < 2 or segments[1].text != _BOX:
            return strip
        try:
            option = self.get_option_at_index(self.scroll_offset.y + y)
        except OptionDoesNotExist:
            return strip
        ticked = option.value in self._selected
        segments[1] = Segment("✓" if ticked else " ", segments[1].style)
        return Strip(segments, strip.cell_length)


class LossPlot(Static):
    """Redraws on resize; the pane calls ``draw`` when data or settings change."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.series: list[Series] = []   # the lines drawn last (label, xs, ys, colour, marker)

    def on_resize(self) -> None:
        self.draw()

    def draw(self) -> None:
        pane = self.query_ancestor(CurvesPane)
        runs = pane.selected_data()
        w, h = self.content_size.width, self.content_size.height
        if w < 10 or h < 4:
            return
        if not runs:
            pane_runs = pane.query_one("#curves-runs", SelectionList).option_count
            self.update(Text("No runs yet: start one with n." if not pane_runs else
                             "No run ticked: choose one on the left with ↑/↓ and press space "
                             "(or click it) to plot its loss.", style="dim"))
            return
        if pane.plot_task is not None:
            self.draw_task(pane.plot_task, runs, w, h)
            return
        if pane.reward_measure is not None:
            self.draw_reward(pane.reward_measure, runs, w, h)
            return
        self.series = loss_series(runs, w, x_axis=pane.x_axis, smoothing=pane.smoothing, show=pane.show,
                                  metric=pane.metric, labels=pane.labels)
        text = render_loss_plot(self.series, w, h, x_axis=pane.x_axis, log_y=pane.log_y, metric=pane.metric,
                                title=pane.overlay_title())
        self.update(Text.from_ansi(text, no_wrap=True) if text else
                    Text("No loss recorded yet for the selected runs.", style="dim"))

    def draw_reward(self, measure: str, runs: list[RunData], w: int, h: int) -> None:
        pane = self.query_ancestor(CurvesPane)
        self.series = reward_series(runs, measure, w, x_axis=pane.x_axis, smoothing=pane.smoothing, show=pane.show,
                                    labels=pane.labels)
        text = render_loss_plot(self.series, w, h, x_axis=pane.x_axis, log_y=pane.log_y, metric=measure,
                                title=f"GRPO: {REWARD_MEASURES[measure]} (r: the next measure)")
        self.update(Text.from_ansi(text, no_wrap=True) if text else
                    Text(f"No {REWARD_MEASURES[measure]} in the selected runs (r: the next measure, or the loss).",
                         style="dim"))

    def draw_task(self, task: str, runs: list[RunData], w: int, h: int) -> None:
        pane = self.query_ancestor(CurvesPane)
        metric, self.series = task_series(runs, task, pane.x_axis)
        text = render_task_plot(self.series, task_title(task, metric, w), metric or "", w, h,
                                x_axis=pane.x_axis, log_y=pane.log_y)
        self.update(Text.from_ansi(text, no_wrap=True) if text else
                    Text(f"No scores of task {task} in the selected runs (k: the next task, or loss).",
                         style="dim"))


class CurvesPane(Horizontal, Pane):
    MAIN_WIDGET = "#curves-runs"
    BINDINGS = [
        Binding("l", "toggle_log", "Log y"),
        Binding("x", "toggle_x", "Step/tokens"),
        Binding("s", "cycle_smoothing", "Smooth"),
        Binding("v", "cycle_show", "Train/val"),
        # what is plotted together (and before "Ancestors": the footer of an 80-column terminal shows them)
        Binding("b", "toggle_metric", "Loss/bpb"),
        Binding("k", "cycle_task", "Task"),
        Binding("a", "toggle_lineage", "Ancestors"),
        Binding("r", "cycle_reward", "Reward"),   # a GRPO run's measures, then the loss again
    ]

    log_y: reactive[bool] = reactive(False, init=False)
    x_axis: reactive[str] = reactive("step", init=False)
    smoothing: reactive[float] = reactive(0.0, init=False)
    show: reactive[str] = reactive("both", init=False)
    metric: reactive[str] = reactive("loss", init=False)   # loss (nats/token) or bpb (bits/byte, at evals)
    lineage: reactive[bool] = reactive(False, init=False)  # a branched run drawn with its ancestors, as one line
    plot_task: reactive[str | None] = reactive(None, init=False)  # a task's score is drawn in place of the loss
    reward_measure: reactive[str | None] = reactive(None, init=False)  # a GRPO measure (REWARD_MEASURES) in its place

    @dataclass
    class RunsTicked(Message):
        """The runs ticked for plotting changed: their metrics must be read."""
        run_ids: list[str]

    def __init__(self, data: dict[str, RunData], redraw_interval: float = 0.5, runs_dir: Path | None = None,
                 **kw: Any) -> None:
        """``data``: the app's run data, shared; new records are drawn at most every ``redraw_interval`` s;
        ``runs_dir``: where to find a branched run's ancestors."""
        super().__init__(**kw)
        self.data = data
        self.runs_dir = runs_dir
        self.redraw_interval = redraw_interval
        self._stale = False  # a ticked run has records the plot does not show yet
        self.labels: dict[str, str] = {}   # run id -> its label in the legend (a sweep's trial: with its settings)
        self.overlay: tuple[str, list[str]] | None = None  # (title, runs) of the sweep drawn last

    def compose(self) -> ComposeResult:
        with Vertical(id="curves-side"):
            yield RunChecklist(id="curves-runs")
            yield Label("", id="curves-settings")
        yield LossPlot("", id="curves-plot")

    def on_mount(self) -> None:
        sl = self.query_one("#curves-runs", SelectionList)
        sl.border_title = "runs"
        sl.border_subtitle = "↑↓ space"
        self._show_settings()
        self.set_interval(self.redraw_interval, self._redraw_if_stale)

    def set_runs(self, run_ids: list[str]) -> None:
        """Called on every listing (every few seconds): a no-op unless the runs changed, and the
        highlighted run stays highlighted, so a keypress after a refresh still lands on it."""
        sl = self.query_one("#curves-runs", RunChecklist)
        # (the ignores: options are typed as Options; a SelectionList's are Selections, which have a value)
        if [str(o.value) for o in sl.options] == run_ids:  # type: ignore[attr-defined]
            return
        selected = set(sl.selected)
        current = self.highlighted_id()
        with self.prevent(SelectionList.SelectedChanged, SelectionList.SelectionHighlighted):
            sl.clear_options()
            sl.add_options([(rid, rid, rid in selected) for rid in run_ids])
            if current in run_ids:
                sl.highlighted = run_ids.index(current)
            elif run_ids:
                sl.highlighted = 0

    def highlighted_id(self) -> str | None:
        sl = self.query_one("#curves-runs", RunChecklist)
        if sl.highlighted is None:
            return None
        try:
            return str(sl.get_option_at_index(sl.highlighted).value)
        except Exception:
            return None

    def focus_main(self) -> None:
        super().focus_main()
        self.ensure_highlight()

    def ensure_highlight(self) -> None:
        """Something is always highlighted (the first run when the pane opens), so space toggles it."""
        sl = self.query_one("#curves-runs", RunChecklist)
        if sl.highlighted is None and sl.option_count:
            sl.highlighted = 0

    def select_run(self, run_id: str, only: bool = False) -> None:
        sl = self.query_one("#curves-runs", SelectionList)
        if only:
            sl.deselect_all()
        try:
            sl.select(run_id)
        except Exception:
            pass

    def show_sweep(self, title: str, runs: list[tuple[str, str]], metric: str) -> None:
        """Draw ``runs`` (run id, label: a sweep's best trials, best first) together and nothing else, by the
        sweep's ``metric``: its val loss, bits per byte, or task score (``task:NAME[:METRIC]``)."""
        sl = self.query_one("#curves-runs", RunChecklist)
        have = {str(o.value) for o in sl.options}  # type: ignore[attr-defined]  # (Selections: see set_runs)
        missing = [rid for rid, _ in runs if rid not in have]  # trials not listed yet (the runs list is slower)
        if missing:
            sl.add_options([(rid, rid) for rid in missing])
        self.labels.update(dict(runs))
        self.overlay = (title, [rid for rid, _ in runs])
        with self.prevent(SelectionList.SelectedChanged):
            sl.deselect_all()
            for rid, _ in runs:
                sl.select(rid)
        self.reward_measure = None
        if metric.startswith("task:"):
            self.plot_task = metric.split(":")[1]
        else:
            self.metric = "bpb" if metric == "val_bpb" else "loss"
            self.plot_task = None
            self.show = "val"   # what the trials were ranked by (v: train and val)
        self._watch_ticked()
        self.redraw()

    def overlay_title(self) -> str:
        """The sweep's title while exactly its trials are ticked."""
        if self.overlay and sorted(self.overlay[1]) == sorted(self.selected_ids()):
            return self.overlay[0]
        return ""

    def selected_ids(self) -> list[str]:
        return list(self.query_one("#curves-runs", SelectionList).selected)

    def chains(self) -> dict[str, list[tuple[str, int | None]]]:
        """Each ticked run with its ancestors, oldest first (just itself unless ancestors are drawn)."""
        if not (self.lineage and self.runs_dir):
            return {r: [(r, None)] for r in self.selected_ids()}
        return {r: lineage(self.runs_dir, r) for r in self.selected_ids()}

    def selected_data(self) -> list[RunData]:
        out = []
        for rid, chain in self.chains().items():
            parts = [(self.data[r], upto) for r, upto in chain if r in self.data]
            if parts and parts[-1][0].run_id == rid:
                out.append(joined(parts) if len(parts) > 1 else parts[0][0])
        return out

    def _watch_ticked(self) -> None:
        """Ask for the metrics of every run drawn: the ticked ones and, with ancestors, theirs."""
        self.post_message(self.RunsTicked([r for chain in self.chains().values() for r, _ in chain]))

    def on_selection_list_selected_changed(self, event: SelectionList.SelectedChanged) -> None:
        event.stop()
        self._watch_ticked()
        self.redraw()

    def tab_shown(self) -> None:
        self.redraw()

    def records_added(self, run_id: str) -> None:
        """New records of ``run_id`` were read: redraw soon if it is plotted (not for every record of
        a fast run: plotting the whole series is the costly part)."""
        if any(run_id == r for chain in self.chains().values() for r, _ in chain):
            self._stale = True

    def _redraw_if_stale(self) -> None:
        if self._stale and self.is_on_screen:
            self.redraw()

    def redraw(self) -> None:
        if self.is_mounted:
            self._stale = False
            self.query_one(LossPlot).draw()

    def _show_settings(self) -> None:
        y = ("task" if self.plot_task is not None else REWARD_MEASURES[self.reward_measure] if self.reward_measure
             else "bits/byte" if self.metric == "bpb" else "loss")
        task = f"task: {self.plot_task}\n" if self.plot_task is not None else ""
        self.query_one("#curves-settings", Label).update(
            # one setting a line: "x: tokens   y: log, bits/byte" on one was wider than the panel (bug 8)
            f"x: {self.x_axis}\ny: {'log' if self.log_y else 'linear'}, {y}\n{task}"
            f"smoothing: {self.smoothing:g}\nshow: {self.show}\nancestors: {'drawn' if self.lineage else 'not drawn'}")

    def _changed(self) -> None:
        self._show_settings()
        self.redraw()

    watch_log_y = watch_x_axis = watch_smoothing = watch_show = watch_metric = watch_plot_task = \
        watch_reward_measure = lambda self, _v: self._changed()

    def action_toggle_metric(self) -> None:
        """Loss or bits per byte (from a task's score: back to the loss, toggled)."""
        self.metric = "bpb" if self.metric == "loss" else "loss"
        self.plot_task = self.reward_measure = None

    def action_cycle_task(self) -> None:
        """Loss, then each task scored in the runs plotted (its headline metric), then the loss again."""
        names = task_names(self.selected_data())
        if not names:
            self.plot_task = None
            self.notify("No task scores in the runs plotted: train with train.eval_tasks set, or score "
                        "checkpoints with `workbench eval RUN --task builtin`.", severity="warning")
            return
        order: list[str | None] = [None, *names]
        i = order.index(self.plot_task) if self.plot_task in order else 0
        self.reward_measure = None
        self.plot_task = order[(i + 1) % len(order)]

    def action_cycle_reward(self) -> None:
        """The loss, then each GRPO measure the runs plotted have (a run with beta 0 logs no KL), then the loss."""
        runs = self.selected_data()
        have = [m for m in REWARD_MEASURES if any(d.reward_points(m, split)[0] for d in runs
                                                  for split in ("train", "val"))]
        if not have:
            self.reward_measure = None
            self.notify("No reward records in the runs plotted: a GRPO run logs them (train.objective=grpo).",
                        severity="warning")
            return
        order: list[str | None] = [None, *have]
        i = order.index(self.reward_measure) if self.reward_measure in order else 0
        self.plot_task = None
        self.reward_measure = order[(i + 1) % len(order)]

    def watch_lineage(self, _v: bool) -> None:
        self._watch_ticked()
        self._changed()

    def action_toggle_lineage(self) -> None:
        self.lineage = not self.lineage

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
