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


def _bpb_points(d: RunData, which: str) -> tuple[list[int], list[float]]:
    """(eval steps, bits per byte) of the evals that have it (runs before bits per byte have none)."""
    ys = d.eval_train_bpb if which == "train" else d.eval_val_bpb
    pts = [(s, y) for s, y in zip(d.eval_steps, ys) if y is not None]
    return [s for s, _ in pts], [y for _, y in pts]


def render_loss_plot(runs: list[RunData], width: int, height: int, x_axis: str = "step",
                     log_y: bool = False, smoothing: float = 0.0, show: str = "both", metric: str = "loss") -> str:
    """``metric``: "loss" (nats per token: train records and evals) or "bpb" (bits per byte, at the evals;
    it compares runs with different tokenizers)."""
    import plotext as plt

    plt.clf()
    plt.plotsize(max(20, width), max(6, height))
    plt.theme("clear")
    any_data = False
    for i, d in enumerate(runs):
        color = COLORS[i % len(COLORS)]
        label = d.run_id if len(runs) > 1 else "train"
        if metric == "bpb":
            for which in ("train", "val"):
                steps, ys = _bpb_points(d, which)
                if show in ("both", which) and steps:
                    xs = _tokens_at(d, steps) if x_axis == "tokens" else steps
                    name = f"{d.run_id} {which} bpb" if len(runs) > 1 else f"{which} bpb"
                    plt.plot(xs, ys, label=name, color=color if len(runs) > 1 or which == "train" else "orange",
                             marker="braille" if which == "train" else "hd")
                    any_data = True
            continue
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
    if metric == "bpb":
        plt.ylabel("bits per byte")
    return plt.build()
