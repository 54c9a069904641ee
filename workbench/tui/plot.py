"""Loss curves and task scores drawn with plotext into a string of ANSI text (no textual, no torch).

plotext keeps one global figure, so this is called from the UI thread only.
"""

from __future__ import annotations

from typing import NamedTuple

import plotext as plt

from workbench.analysis.report_card import LOWER_IS_BETTER
from workbench.tui.rundata import RunData, downsample, ema, task_metric

COLORS = ["cyan", "orange", "green", "magenta", "blue", "red", "yellow", "white"]
# several runs' val lines: a marker each as well as a colour, so they are told apart without colour too
# (a monochrome terminal, `tmux capture-pane`); "dot" is plotext's •
VAL_MARKERS = ["dot", "x", "+", "o", "*", "%", "=", "#"]
SMOOTHING = [0.0, 0.6, 0.9, 0.97]
# a mixture's sources' val lines: a colour each (one run; several: the run's colour) and a marker none of the runs'
# val lines uses
SOURCE_COLORS = ["green", "magenta", "blue", "red", "yellow", "white"]
SOURCE_MARKERS = ["^", "~", "@", "&", "$", "'"]
# what a task metric is, in words (the y axis and the pane's title)
METRIC_NAMES = {"centered": "centered accuracy", "acc": "accuracy", "acc_norm": "accuracy (length-normalised)",
                "exact": "exact match", "contains": "answer contained", "bpb": "bits per byte", "loss": "loss"}
# a GRPO run's measures (its reward records' fields), in the order the Loss curves pane's r steps through them,
# with what each is in words (the y axis)
REWARD_MEASURES = {"reward": "mean reward", "reward_std": "reward std (within a step)",
                   "no_signal": "groups without signal (share)", "kl": "KL to the reference (nats a token)",
                   "completion_len": "completion length (tokens)"}



class Series(NamedTuple):
    """One line of a plot: a run's losses (train or val) or its scores over one number of items."""
    label: str
    xs: list[float]
    ys: list[float]
    color: str
    marker: str = "braille"


def _tokens_at(d: RunData, steps: list[int]) -> list[float]:
    """Tokens seen at each step, interpolated from the train records (evals do not log tokens)."""
    if not d.steps:
        return [0.0 for _ in steps]
    out, j = [], 0
    for s in steps:
        while j + 1 < len(d.steps) and d.steps[j + 1] <= s:
            j += 1
        st, tk = d.steps[j], d.tokens[j]
        out.append(tk * s / st if st else float(tk))
    return out


def _bpb_points(d: RunData, which: str) -> tuple[list[int], list[float]]:
    """(eval steps, bits per byte) of the evals that have it (runs before bits per byte have none)."""
    ys = d.eval_train_bpb if which == "train" else d.eval_val_bpb
    pts = [(s, y) for s, y in zip(d.eval_steps, ys) if y is not None]
    return [s for s, _ in pts], [y for _, y in pts]


def loss_series(runs: list[RunData], width: int, x_axis: str = "step", smoothing: float = 0.0, show: str = "both",
                metric: str = "loss", labels: dict[str, str] | None = None) -> list[Series]:
    """The lines of the loss plot: each run's train and val loss (``metric`` "loss": nats per token, the train
    records and the evals; a mixture's val loss of each source too, a marker each) or bits per byte (``metric``
    "bpb", at the evals: it compares runs with different tokenizers). Several runs are told apart by their colour
    and their label: ``labels[run_id]`` (a sweep's trial with its settings) or the run id."""
    out: list[Series] = []
    several = len(runs) > 1
    for i, d in enumerate(runs):
        color = COLORS[i % len(COLORS)]
        name = (labels or {}).get(d.run_id, d.run_id)
        if metric == "bpb":
            for which in ("train", "val"):
                steps, ys = _bpb_points(d, which)
                if show in ("both", which) and steps:
                    xs = _tokens_at(d, steps) if x_axis == "tokens" else [float(s) for s in steps]
                    out.append(Series(f"{name} {which} bpb" if several else f"{which} bpb", xs, ys,
                                      color if several or which == "train" else "orange",
                                      "braille" if which == "train" else "hd"))
            continue
        if show in ("both", "train") and d.steps:
            xs, ys = downsample(d.tokens if x_axis == "tokens" else d.steps, ema(d.losses, smoothing),
                                max(50, width * 2))
            out.append(Series(name if several else "train", [float(x) for x in xs], list(ys), color))
        if show in ("both", "val") and d.eval_steps:
            xs = _tokens_at(d, d.eval_steps) if x_axis == "tokens" else [float(s) for s in d.eval_steps]
            marker = VAL_MARKERS[i % len(VAL_MARKERS)] if several else "hd"
            out.append(Series(f"{name} val" if several else "val", xs, list(d.eval_val),
                              color if several else "orange", marker))
        if show in ("both", "val"):  # a mixture: each source's val loss (its own held-out documents)
            for j, (source, pts) in enumerate(d.eval_sources.items()):
                steps = [s for s, _ in pts]
                xs = _tokens_at(d, steps) if x_axis == "tokens" else [float(s) for s in steps]
                out.append(Series(f"{name} val {source}" if several else f"val {source}", xs, [v for _, v in pts],
                                  color if several else SOURCE_COLORS[j % len(SOURCE_COLORS)],
                                  SOURCE_MARKERS[j % len(SOURCE_MARKERS)]))
    return out


def reward_series(runs: list[RunData], measure: str, width: int, x_axis: str = "step", smoothing: float = 0.0,
                  show: str = "both", labels: dict[str, str] | None = None) -> list[Series]:
    """The lines of a GRPO measure (``REWARD_MEASURES``): each run's train records (every logged step, smoothed
    as the loss is) and its held-out ones (split ``val``, at each eval: "held-out", as the trainer's log says);
    runs without reward records draw nothing."""
    out: list[Series] = []
    several = len(runs) > 1
    for i, d in enumerate(runs):
        color = COLORS[i % len(COLORS)]
        name = (labels or {}).get(d.run_id, d.run_id)
        steps, ys = d.reward_points(measure, "train")
        if show in ("both", "train") and steps:
            xs, ys = downsample(_tokens_at(d, steps) if x_axis == "tokens" else steps, ema(ys, smoothing),
                                max(50, width * 2))
            out.append(Series(name if several else "train", [float(x) for x in xs], list(ys), color))
        steps, ys = d.reward_points(measure, "val")
        if show in ("both", "val") and steps:
            xs = _tokens_at(d, steps) if x_axis == "tokens" else [float(s) for s in steps]
            out.append(Series(f"{name} held-out" if several else "held-out", xs, ys,
                              color if several else "orange", VAL_MARKERS[i % len(VAL_MARKERS)] if several else "hd"))
    return out


def render_loss_plot(series: list[Series], width: int, height: int, x_axis: str = "step", log_y: bool = False,
                     metric: str = "loss", title: str = "") -> str:
    """``series`` from ``loss_series`` drawn ("" when there is nothing to draw)."""
    plt.clf()
    plt.plotsize(max(20, width), max(6, height))
    plt.theme("clear")
    if not series:
        return ""
    for line in series:
        ys = [max(y, 1e-6) for y in line.ys] if log_y else line.ys
        plt.plot(line.xs, ys, label=line.label, color=line.color, marker=line.marker)
    if log_y:
        plt.yscale("log")
    if title:
        plt.title(title)
    plt.xlabel("tokens seen" if x_axis == "tokens" else "step")
    if metric == "bpb":
        plt.ylabel("bits per byte")
    elif metric in REWARD_MEASURES:
        plt.ylabel(REWARD_MEASURES[metric])
    return plt.build()


def task_series(runs: list[RunData], task: str, x_axis: str = "step") -> tuple[str | None, list[Series]]:
    """The metric ``task`` is plotted by and one line per run that scored it (runs without it have none),
    labelled by run id (by task and metric when only one run is plotted), in the run's colour. Scores over
    different numbers of items are different lines ("n=40"), as the report card never compares them."""
    metric = task_metric(runs, task)
    out: list[Series] = []
    if metric is None:
        return None, out
    points = [d.task_points(task, metric) for d in runs]
    several_n = len({n for by_n in points for n in by_n}) > 1
    for i, (d, by_n) in enumerate(zip(runs, points)):
        for n, (steps, ys) in sorted(by_n.items()):
            xs = _tokens_at(d, steps) if x_axis == "tokens" else [float(s) for s in steps]
            label = (d.run_id if len(runs) > 1 else f"{task} {metric}") + (f" n={n}" if several_n else "")
            out.append(Series(label, xs, ys, COLORS[i % len(COLORS)]))
    return metric, out


def task_title(task: str, metric: str | None, width: int = 1000) -> str:
    """The plot's title: the task and its metric, as long as ``width`` allows (plotext leaves out a title
    wider than the plot)."""
    if metric is None:
        return task
    better = "lower" if metric in LOWER_IS_BETTER else "higher"
    name = METRIC_NAMES.get(metric, metric)
    titles = [f"{task}: {name} ({metric}, {better} is better)", f"{task}: {name}", f"{task} {metric}"]
    return next((t for t in titles if len(t) <= width - 2), titles[-1])


def render_task_plot(series: list[Series], title: str, metric: str, width: int, height: int,
                     x_axis: str = "step", log_y: bool = False) -> str:
    """``series`` from ``task_series``: one line per run, with a marker at each scored step."""
    plt.clf()
    plt.plotsize(max(20, width), max(6, height))
    plt.theme("clear")
    if not series:
        return ""
    dots: dict[str, int] = {}
    for line in series:
        plt.plot(line.xs, line.ys, label=line.label, color=line.color, marker="braille")
        # a dot at each scored step (a run scored once is one dot); a run's second number of items: another
        k = dots[line.color] = dots.get(line.color, -1) + 1
        plt.scatter(line.xs, line.ys, color=line.color, marker="●◆■▲"[k % 4])
    if log_y and all(y > 0 for line in series for y in line.ys):  # centered accuracy may be negative
        plt.yscale("log")
    plt.title(title)
    plt.xlabel("tokens seen" if x_axis == "tokens" else "step")
    plt.ylabel(METRIC_NAMES.get(metric, metric))
    return plt.build()
