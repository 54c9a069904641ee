"""Pictures of the real app for the docs, each reproducible: this trains a real tiny sweep (three runs of a 2-layer
model on the built-in corpus, one learning rate each) through `workbench sweep` and `workbench queue run` in a
scratch directory, opens the terminal UI on it (this machine's own hardware, read live) and saves each of the seven
panes as an SVG (Textual's ``save_screenshot``) into docs/images/.

    python docs/gen/screenshots.py                     # ~2-3 minutes on a 2-core CPU, most of it the three runs
    python docs/gen/screenshots.py --runs-dir DIR      # reuse DIR's sweep if it is there (trained once, then kept)

The pictures show this machine (the Hardware pane) and the scratch directory's runs; nothing else is read.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SIZE = (120, 36)
SWEEP = "demo"
TINY = ["model.dim=64", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2", "model.seq_len=32",
        "model.vocab_size=512", "train.batch_size=4", "train.warmup_iters=5", "train.eval_iters=2",
        "train.log_interval=1", "data.builtin_mb=0.3", "data.tokenizer_sample_mb=0.3", "hardware.nproc=1",
        "hardware.compile=false", "train.max_iters=60", "train.eval_interval=15"]


def workbench(*args: str, runs: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    subprocess.run([sys.executable, "-m", "workbench", *args, "--runs-dir", str(runs)], check=True, env=env)


def train_sweep(runs: Path) -> None:
    """Three finished trials of a tiny sweep over the learning rate, as a user would make them."""
    if (runs / f"{SWEEP}-t0003" / "status.json").exists():
        return
    workbench("sweep", "cpu-small", "--set-grid", "train.lr=1e-3,3e-3,1e-2", "--set", *TINY, "--name", SWEEP,
              runs=runs)
    workbench("queue", "run", runs=runs)


async def wait_for(pilot, cond, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if cond():
                return
        except (LookupError, Exception) as e:  # a widget or a run not there yet
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}: {e!r}") from e
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await pilot.pause(0.1)


async def shoot(runs: Path, out: Path) -> list[Path]:
    from workbench.tui.app import WorkbenchApp
    app = WorkbenchApp(runs, watch_interval=0.2, list_interval=1.0, initial_tab="hardware")
    saved = []
    best = f"{SWEEP}-t0003"

    async def save(tab: str) -> None:
        await pilot.pause(0.5)
        path = out / f"{tab}.svg"
        app.save_screenshot(filename=path.name, path=str(out))
        saved.append(path)

    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.panes_ready and len(app.summaries) == 3, "the panes and the runs")
        await pilot.pause(1.5)  # the hardware pane's live readings
        await save("hardware")

        app.action_show_tab("presets")
        pane = app.query_one("#presets-pane")
        await wait_for(pilot, lambda: pane.current is not None, "a preset shown")
        pane.load("cpu-small")
        await pilot.pause(1.0)
        editor = app.query_one("#preset-editor")  # the editor's title names the file: not where this checkout is
        editor.border_title = str(editor.border_title).replace(str(ROOT), "<repo>")
        await save("presets")

        app.monitor(best, switch=True)
        await wait_for(pilot, lambda: app.run_data[best].state == "finished" and len(app.run_data[best].steps) > 50,
                       f"{best}'s metrics")
        await save("train")

        app.action_show_tab("curves")
        runs_list = app.query_one("#curves-runs")
        runs_list.deselect_all()
        for n in (1, 2, 3):
            runs_list.select(f"{SWEEP}-t000{n}")
        await wait_for(pilot, lambda: all(len(app.run_data[f"{SWEEP}-t000{n}"].eval_steps) >= 4 for n in (1, 2, 3)),
                       "the trials' evals")
        app.query_one("#curves-pane").redraw()
        await save("curves")

        app.open_sample(best)  # two checkpoints side by side, real text from `workbench sample` subprocesses
        from textual.widgets import Input, Select
        a, b = app.query_one("#smp-ckpt-a", Select), app.query_one("#smp-ckpt-b", Select)
        await wait_for(pilot, lambda: any(v == "36" for _p, v in a._options), f"{best}'s checkpoints")
        a.value, b.value = "36", "60"  # the decay-start checkpoint and the last
        app.query_one("#smp-prompt", Input).value = "def "
        app.query_one("#smp-max_new_tokens", Input).value = "120"
        app.query_one("#smp-prompt", Input).focus()
        await pilot.press("enter")
        outs = [app.query_one("#smp-out-a"), app.query_one("#smp-out-b")]
        await wait_for(pilot, lambda: all("s]" in o.text.plain.splitlines()[-1] for o in outs), "both samples",
                       timeout=120)
        app.query_one("#smp-trainer").collapsed = False
        await save("sample")

        app.action_show_tab("runs")
        table = app.query_one("#runs-table")
        await wait_for(pilot, lambda: table.row_count == 3, "the runs table")
        table.move_cursor(row=table.get_row_index(best))
        await pilot.pause(1.0)
        await save("runs")

        app.action_show_tab("queue")
        await pilot.pause(1.5)
        await save("queue")
    return saved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "images", help="where the SVGs go")
    ap.add_argument("--runs-dir", type=Path, help="the scratch runs directory (default: a new temporary one)")
    args = ap.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="wb-shots-"))
    runs = args.runs_dir or scratch / "runs"
    os.environ.setdefault("WORKBENCH_CACHE_DIR", str(scratch / "cache"))  # the tiny tokenizer: not the user's cache
    train_sweep(runs)
    args.out.mkdir(parents=True, exist_ok=True)
    for path in asyncio.run(shoot(runs, args.out)):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
