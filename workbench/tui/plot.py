"""Loss curves drawn with plotext into a string of ANSI text (no textual, no torch).

plotext keeps one global figure, so this is called from the UI thread only.
"""

from __future__ import annotations

from workbench.tui.rundata import RunData, downsample, ema

COLORS = ["cyan", "orange", "green", "magenta", "blue", "red", "yellow", "white"]
SMOOTHING = [0.0, 0.6, 0.9, 0.97]


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


def render_loss_plot(runs: list[RunData], width: int, height: int, x_axis: str = "step",
                     log_y: bool = False, smoothing: float = 0.0, show: str = "both") -> str:
    import plotext as plt

    plt.clf()
    plt.plotsize(max(20, width), max(6, height))
    plt.theme("clear")
    any_data = False
    for i, d in enumerate(runs):
        color = COLORS[i % len(COLORS)]
        label = d.run_id if len(runs) > 1 else "train"
        if show in ("both", "train") and d.steps:
            xs = d.tokens if x_axis == "tokens" else d.steps
            ys = ema(d.losses, smoothing)
            xs, ys = downsample(xs, ys, max(50, width * 2))
            if log_y:
                ys = [max(y, 1e-6) for y in ys]
            plt.plot(xs, ys, label=label, color=color, marker="braille")
            any_data = True
        if show in ("both", "val") and d.eval_steps:
            xs = _tokens_at(d, d.eval_steps) if x_axis == "tokens" else d.eval_steps
            vlabel = f"{d.run_id} val" if len(runs) > 1 else "val"
            plt.plot(xs, d.eval_val, label=vlabel, color=color if len(runs) > 1 else "orange",
                     marker="dot" if len(runs) > 1 else "hd")
            any_data = True
    if not any_data:
        return ""
    if log_y:
        plt.yscale("log")
    plt.xlabel("tokens seen" if x_axis == "tokens" else "step")
    return plt.build()
