"""README claims about the terminal UI that no other test held it to: the Loss curves pane's `a` (a branch
drawn with its ancestors as one line) and `b` (loss or bits per byte), the Runs pane's `enter`/`m` (follow
the run in the Train pane), the Train pane's `r` (resume the run shown, for real), the colour of the Train
tab's health marker (red / yellow / cyan by the worst finding), and what the `+` dialog says the cosine
schedule will do to the learning rate. `enter` in the Runs pane does not do what the README says (the runs table
takes the key itself): its test is an expected failure, strict, so it turns red once that is fixed."""

from __future__ import annotations

import json
import re

from textual.widgets import DataTable, SelectionList

from tests.support.canned_runs import HARDWARE, PRESET
from tests.support.cli import tiny, wb
from tests.support.rundirs import RunDir
from tests.support.runs import read_jsonl
from tests.support.tui import make_app, run, text_of, wait_for
from workbench import rundir
from workbench.machine.activity import HardwareSnapshot

# ----------------------------------------------------------------------------- Loss curves: a and b

TOKENS_PER_STEP = 4 * 64


def _loss(step: int) -> float:
    return round(8.0 - step / 100, 4)


def _bpb(step: int, which: str) -> float:
    return round((1.5 if which == "train" else 1.6) - step / 1000, 4)


def _curve_run(root, rid: str, steps: range, parent: tuple[str, int] | None = None, offset: float = 0.0) -> None:
    """A finished run as the trainer writes it: a train record every 10 steps, an eval (loss and bits per byte)
    every 100; ``parent``: a branch of that run at that step."""
    preset = PRESET.format(preset="cpu-small", max_iters=300)
    if parent:
        preset += f'\n[parent]\nrun = "{parent[0]}"\nstep = {parent[1]}\n'
    with RunDir(root, rid, preset) as r:
        r.event("resume" if parent else "start", steps[0] - 10, device="cpu", precision="fp32")
        for s in steps:
            r.train(s, _loss(s) + offset, tokens_seen=s * TOKENS_PER_STEP, elapsed_s=s * 0.1)
            if s % 100 == 0:
                r.eval(s, _loss(s) - 0.5 + offset, _loss(s) - 0.4 + offset, train_bpb=_bpb(s, "train"),
                       val_bpb=_bpb(s, "val"))
        r.event("finish", steps[-1])
        r.status(state="finished", pid=999999, step=steps[-1], max_iters=300, started=1.7e9 + len(rid))
        for s in (100, 200, 300):
            r.checkpoint(s, train_loss=_loss(s), val_loss=_loss(s) - 0.4)


def _curve_runs(root):
    _curve_run(root, "base", range(10, 301, 10))
    _curve_run(root, "base-from-200", range(210, 301, 10), parent=("base", 200), offset=-1.0)
    return root


def y_ticks(plot_text: str) -> list[float]:
    """The y axis's labels, top to bottom (plotext puts the data's maximum at the top, its minimum at the bottom)."""
    return [float(m.group(1)) for line in plot_text.splitlines() if (m := re.match(r"^\s*(-?[\d.]+)┤", line))]


def x_ticks(plot_text: str) -> list[float]:
    """The x axis's labels, left to right (the first is the data's smallest x, the last its largest)."""
    lines = plot_text.splitlines()
    axis = next(i for i, line in enumerate(lines) if "└" in line)
    return [float(v) for v in lines[axis + 1].split()]


async def _plot_only(pilot, app, rid: str, n_steps: int):
    """The Loss curves pane with only ``rid`` ticked, its metrics read and drawn: (pane, plot widget)."""
    await wait_for(pilot, lambda: len(app.summaries) == 2, what="the run list")
    pane, plot = app.query_one("#curves-pane"), app.query_one("#curves-plot")
    sl = app.query_one("#curves-runs", SelectionList)
    sl.deselect_all()
    sl.select(rid)
    pane.focus_main()
    await wait_for(pilot, lambda: len(app.run_data[rid].steps) == n_steps, what=f"{rid}'s metrics")
    pane.redraw()
    await pilot.pause()
    return pane, plot


def _settings(app) -> str:
    return text_of(app.query_one("#curves-settings"))


def test_curves_b_plots_bits_per_byte_at_the_evals_then_the_loss_again(tmp_path):
    root = _curve_runs(tmp_path / "runs")

    async def go():
        app = make_app(root, initial_tab="curves")
        async with app.run_test(size=(120, 36)) as pilot:
            pane, plot = await _plot_only(pilot, app, "base", 30)
            loss_text = text_of(plot)
            # the loss: train records 7.9 (step 10) .. 5.0 (step 300), val loss down to 4.6 (at step 300)
            assert (y_ticks(loss_text)[0], y_ticks(loss_text)[-1]) == (7.9, 4.6), loss_text
            assert "bits per byte" not in loss_text and "bpb" not in loss_text
            assert _settings(app).splitlines()[:2] == ["x: step", "y: linear, loss"]

            await pilot.press("b")
            await pilot.pause()
            bpb_text = text_of(plot)
            assert pane.metric == "bpb"
            assert _settings(app).splitlines()[:2] == ["x: step", "y: linear, bits/byte"]
            assert "train bpb" in bpb_text and "val bpb" in bpb_text, bpb_text
            assert "bits per byte" in bpb_text  # the y label
            # only the evals' bits per byte are drawn: train 1.4 .. 1.2, val 1.5 .. 1.3, at steps 100 .. 300
            ys = y_ticks(bpb_text)
            assert (ys[0], ys[-1]) == (1.5, 1.2), (ys, bpb_text)
            xs = x_ticks(bpb_text)
            assert (xs[0], xs[-1]) == (100, 300), (xs, bpb_text)

            await pilot.press("b")  # back to the loss
            await pilot.pause()
            assert pane.metric == "loss" and text_of(plot) == loss_text
            assert _settings(app).splitlines()[:2] == ["x: step", "y: linear, loss"]
    run(go())


def test_curves_a_draws_a_branch_with_its_ancestors_as_one_line(tmp_path):
    root = _curve_runs(tmp_path / "runs")

    async def go():
        app = make_app(root, initial_tab="curves")
        async with app.run_test(size=(120, 36)) as pilot:
            pane, plot = await _plot_only(pilot, app, "base-from-200", 10)
            assert "base" not in app.run_data or not app.run_data["base"].steps  # the parent is not ticked
            alone = text_of(plot)
            assert (x_ticks(alone)[0], x_ticks(alone)[-1]) == (210, 300), alone
            assert _settings(app).splitlines()[-1] == "ancestors: not drawn"

            await pilot.press("a")  # the parent's steps up to the branch point, then the branch's own: one line
            await wait_for(pilot, lambda: len(app.run_data["base"].steps) == 30, what="the parent's metrics read")
            pane.redraw()
            await pilot.pause()
            [line] = pane.selected_data()
            assert line.run_id == "base-from-200"
            assert line.steps == list(range(10, 301, 10))
            assert line.losses == [_loss(s) for s in range(10, 201, 10)] + [_loss(s) - 1.0 for s in range(210, 301, 10)]
            assert line.eval_steps == [100, 200, 300]
            drawn = text_of(plot)
            xs, ys = x_ticks(drawn), y_ticks(drawn)
            assert (xs[0], xs[-1]) == (10, 300), drawn          # from the parent's first step
            assert ys[0] == _loss(10), drawn                     # the parent's loss at its start is on the line
            assert _settings(app).splitlines()[-1] == "ancestors: drawn"

            await pilot.press("a")
            await pilot.pause()
            assert [d.steps for d in pane.selected_data()] == [list(range(210, 301, 10))]
            assert text_of(plot) == alone
            assert _settings(app).splitlines()[-1] == "ancestors: not drawn"
    run(go())


# ----------------------------------------------------------------------------- Runs pane: enter / m

async def _follow_from_runs_pane(pilot, app, rid: str, key: str) -> None:
    await pilot.press("6")
    table = app.query_one("#runs-table", DataTable)
    await wait_for(pilot, lambda: table.row_count == 3, what="the runs table")
    table.focus()
    table.move_cursor(row=table.get_row_index(rid))
    await pilot.pause()
    await pilot.press(key)


def _shown(app) -> str:
    return text_of(app.query_one("#mon-progress-text"))


def test_runs_pane_m_follows_the_run_in_the_train_pane(runs_dir):
    async def go():
        app = make_app(runs_dir, initial_tab="runs")
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_for(pilot, lambda: app.monitored == "gamma", what="the newest run followed")
            for rid, shown in (("beta", "step 150 / 400"), ("alpha", "step 400 / 400")):
                await _follow_from_runs_pane(pilot, app, rid, "m")
                await wait_for(pilot, lambda: app.query_one("#tabs").active == "train" and app.monitored == rid,
                               what=lambda: f"{rid} followed (tab {app.query_one('#tabs').active}, {app.monitored})")
                await wait_for(pilot, lambda: _shown(app).startswith(shown), what=lambda: f"{shown!r}: {_shown(app)!r}")
    run(go())


def test_runs_pane_enter_follows_the_run_in_the_train_pane(runs_dir):
    async def go():
        app = make_app(runs_dir, initial_tab="runs")
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_for(pilot, lambda: app.monitored == "gamma", what="the newest run followed")
            await _follow_from_runs_pane(pilot, app, "beta", "enter")
            await wait_for(pilot, lambda: app.query_one("#tabs").active == "train" and app.monitored == "beta",
                           timeout=3,
                           what=lambda: f"beta followed (tab {app.query_one('#tabs').active}, {app.monitored})")
            await wait_for(pilot, lambda: _shown(app).startswith("step 150 / 400"), what=lambda: _shown(app))
    run(go())


# ----------------------------------------------------------------------------- Train pane: r

def test_train_pane_r_resumes_the_run_shown(tmp_path):
    """A real run, stopped (SIGTERM) at step 3 of 6; the Train pane shows it; `r` resumes it through the real
    `workbench resume --detach`: it goes on from its step-3 checkpoint and finishes at step 6."""
    root = tmp_path / "runs"
    wb("train", "cpu-small", "--name", "s", "--runs-dir", str(root),
       *tiny("train.max_iters=6", "train.eval_interval=6", "train.ckpt_interval=100", "train.sample_prompt=''"),
       env={"WORKBENCH_TEST_SIGTERM_AT_STEP": "3"}, check=True)
    d = root / "s"
    st = rundir.read_status(d)
    assert (st.state, st.step) == ("stopped", 3) and [c["step"] for c in rundir.list_checkpoints(d)] == [3]
    n_before = len(read_jsonl(d / "metrics.jsonl"))

    async def go():
        app = make_app(root, initial_tab="train")
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: app.monitored == "s", what="the run shown")
            await wait_for(pilot, lambda: _shown(app).startswith("step 3 / 6"), what=lambda: _shown(app))
            await pilot.press("r")
            await wait_for(pilot, lambda: rundir.read_status(d).state == "finished", timeout=120,
                           what=lambda: f"the resumed run to finish ({rundir.read_status(d)})")
            await wait_for(pilot, lambda: _shown(app).startswith("step 6 / 6"), what=lambda: _shown(app))
    run(go())
    after = read_jsonl(d / "metrics.jsonl")[n_before:]
    resume = next(r for r in after if r["kind"] == "event")
    assert (resume["event"], resume["step"], resume["checkpoint"]) == ("resume", 3, "step_0000003")
    assert [r["step"] for r in after if r["kind"] == "train"] == [4, 5, 6]
    assert rundir.read_status(d).step == 6


# ----------------------------------------------------------------------------- the health marker's colour

def _tab(app):
    return app.query_one("#tabs").get_tab("train").label


def _marker(app) -> tuple[str, int | None, bool]:
    """The Train tab's marker: its text, and the ANSI colour number and boldness of the style it is drawn in."""
    label = _tab(app)
    spans = [s for s in label.spans if label.plain[s.start:s.end].strip()]
    if not spans:
        return label.plain[len("3 Train"):].strip(), None, False
    [span] = spans
    style = span.style
    assert label.plain[span.start:span.end] == label.plain[len("3 Train"):], label  # the marker alone is coloured
    return label.plain[span.start:span.end].strip(), style.foreground.ansi, bool(style.bold)


ANSI_RED, ANSI_YELLOW, ANSI_CYAN = 1, 3, 6


def test_the_train_tab_marker_is_coloured_by_the_worst_finding(live_runs_dir, monkeypatch):
    """A low finding (one loss spike): cyan; with a medium one (a non-finite step skipped): yellow; once that
    step led to a rollback (high): bold red. The count is of all findings."""
    from workbench.tui.widgets import health
    monkeypatch.setattr(health.HealthBox, "INTERVAL", 0.2)
    # the machine as the fixture describes it, without a GPU, nothing else busy: only the run's own records count
    monkeypatch.setattr(health, "take_snapshot",
                        lambda pid=None, interval=1.0: HardwareSnapshot(info={**HARDWARE, "nvidia": []}))
    metrics = live_runs_dir / "delta" / "metrics.jsonl"

    def append(record: dict) -> None:
        with open(metrics, "a") as f:
            f.write(json.dumps(record) + "\n")

    async def go():
        app = make_app(live_runs_dir, initial_tab="hardware")
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_for(pilot, lambda: app.monitored == "delta", what="the live run followed")
            await wait_for(pilot, lambda: "no problems found" in text_of(app.query_one("#mon-health")),
                           what="a healthy start")
            assert _tab(app).plain == "3 Train"
            # a loss far above the median of the records before it (~5.8): unstable.loss_spikes, low
            append({"kind": "train", "step": 130, "loss": 50.0, "lr": 1e-3, "grad_norm": 1.25,
                    "tokens_per_s": 25600.0, "tokens_seen": 130 * 256, "elapsed_s": 13.0, "skipped": 0})
            await wait_for(pilot, lambda: _marker(app)[0] == "●1 finding", what=lambda: repr(_tab(app)))
            assert _marker(app) == ("●1 finding", ANSI_CYAN, False)
            # a non-finite step skipped: unstable.nonfinite, medium
            append({"kind": "event", "event": "nonfinite_skip", "step": 131, "loss": None})
            await wait_for(pilot, lambda: _marker(app)[0] == "●2 findings", what=lambda: repr(_tab(app)))
            assert _marker(app) == ("●2 findings", ANSI_YELLOW, False)
            # ... that ended in a rollback: high
            append({"kind": "event", "event": "rollback", "step": 133, "from_step": 133, "to": 131, "lr_scale": 0.5})
            await wait_for(pilot, lambda: _marker(app)[1] == ANSI_RED, what=lambda: repr(_tab(app)))
            assert _marker(app) == ("●2 findings", ANSI_RED, True)
            assert app.query_one("#tabs").active == "hardware"  # marked while another tab is open
    run(go())


# ----------------------------------------------------------------------------- the + dialog's learning rate
