"""Task scores in the TUI (issue 29): the Loss curves pane plots a task's score in place of the loss
(`k`), several runs overlaid; the Runs pane shows the report card of the checkpoint under the cursor.

Two canned runs: ``base`` (scored by the trainer at 100, 200, 300, and by ``workbench eval`` at 300) and
``base-from-200``, a branch of it at step 200 (scored at 250 and 300)."""

from __future__ import annotations

from textual.widgets import DataTable, SelectionList

from tests.support.canned_runs import PRESET
from tests.support.rundirs import RunDir
from tests.support.tui import make_app, run, text_of, wait_for

TOKENS_PER_STEP = 4 * 64
NL, CLOZE, TEXT, QA = "stdlib-next-line", "docs-cloze", "held-out", "qa"

# step -> [(task, metric, value)], as the trainer writes them into metrics.jsonl
BASE = {
    100: [(NL, "centered", 0.10), (NL, "acc", 0.325), (CLOZE, "centered", 0.05), (CLOZE, "acc", 0.2875),
          (TEXT, "bpb", 3.1), (TEXT, "loss", 4.0)],
    200: [(NL, "centered", 0.20), (NL, "acc", 0.40), (CLOZE, "centered", 0.10), (CLOZE, "acc", 0.325),
          (TEXT, "bpb", 2.8), (TEXT, "loss", 3.6)],
    300: [(NL, "centered", 0.25), (NL, "acc", 0.4375), (CLOZE, "centered", 0.12), (CLOZE, "acc", 0.34),
          (TEXT, "bpb", 2.7), (TEXT, "loss", 3.5)],
}
BRANCH = {
    250: [(NL, "centered", 0.30), (NL, "acc", 0.475), (CLOZE, "centered", 0.08), (CLOZE, "acc", 0.31),
          (TEXT, "bpb", 2.5), (TEXT, "loss", 3.3)],
    300: [(NL, "centered", 0.35), (NL, "acc", 0.5125), (CLOZE, "centered", 0.15), (CLOZE, "acc", 0.3625),
          (TEXT, "bpb", 2.4), (TEXT, "loss", 3.1)],
}


def _run(root, rid: str, steps: range, scores: dict, ckpts: list[int], parent: tuple[str, int] | None = None):
    preset = PRESET.format(preset="cpu-small", max_iters=300)
    if parent:
        preset += f'\n[parent]\nrun = "{parent[0]}"\nstep = {parent[1]}\n'
    r = RunDir(root, rid, preset)
    with r:
        r.event("resume" if parent else "start", steps[0] - 10, device="cpu", precision="fp32")
        for step in steps:
            r.train(step, 5.0 - step / 100, tokens_seen=step * TOKENS_PER_STEP, elapsed_s=step * 0.1)
            for task, metric, value in scores.get(step, []):
                r.task(step, task, metric, value, n=80)
        r.event("finish", steps[-1])
        r.status(state="finished", pid=999999, step=steps[-1], max_iters=300, started=1.7e9 + len(rid))
        for s in ckpts:
            r.checkpoint(s, train_loss=5.0 - s / 100, val_loss=5.1 - s / 100, tokens_seen=s * TOKENS_PER_STEP)
    return r


def _runs(root):
    base = _run(root, "base", range(10, 301, 10), BASE, [100, 200, 300])
    base.scored(300, QA, "exact", 0.30, n=50)      # `workbench eval base --checkpoint 300 --task qa.jsonl`
    base.scored(300, QA, "contains", 0.45, n=50)
    _run(root, "base-from-200", range(210, 301, 10), BRANCH, [200, 250, 300], parent=("base", 200))
    return root


def lines(plot) -> list[tuple[str, list[float], list[float]]]:
    """What the plot drew: (legend label, xs, ys) of each line."""
    return [(s.label, s.xs, s.ys) for s in plot.series]


def _rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()]


def test_curves_plot_a_task_score_for_two_runs_overlaid(tmp_path):
    root = _runs(tmp_path / "runs")

    async def go():
        app = make_app(root, initial_tab="curves")
        async with app.run_test(size=(140, 40)) as pilot:
            await wait_for(pilot, lambda: len(app.summaries) == 2, what="the run list")
            pane = app.query_one("#curves-pane")
            plot = app.query_one("#curves-plot")
            sl = app.query_one("#curves-runs", SelectionList)
            sl.deselect_all()
            sl.select("base")
            sl.select("base-from-200")
            pane.focus_main()
            await wait_for(pilot, lambda: len(app.run_data["base-from-200"].steps) == 10
                           and len(app.run_data["base"].steps) == 30, what="both runs' metrics")
            await wait_for(pilot, lambda: app.run_data["base"].task_file, what="base's tasks.jsonl")

            await pilot.press("k")   # the first task scored
            await wait_for(pilot, lambda: pane.plot_task == NL)
            pane.redraw()
            await pilot.pause()
            assert lines(plot) == [("base", [100.0, 200.0, 300.0], [0.10, 0.20, 0.25]),
                                   ("base-from-200", [250.0, 300.0], [0.30, 0.35])]
            shown = text_of(plot)
            assert f"{NL}: centered accuracy (centered, higher is better)" in shown
            assert "base-from-200" in shown and "base" in shown.replace("base-from-200", "")  # the legend
            assert "y: linear, task" in text_of(app.query_one("#curves-settings"))
            assert f"task: {NL}" in text_of(app.query_one("#curves-settings"))

            await pilot.press("a")   # the branch drawn with its ancestor: base's scores up to step 200 first
            await wait_for(pilot, lambda: len(plot.series) == 2 and len(plot.series[1][1]) == 4,
                           what=lambda: repr(plot.series))
            assert lines(plot)[1] == ("base-from-200", [100.0, 200.0, 250.0, 300.0], [0.10, 0.20, 0.30, 0.35])
            await pilot.press("a")
            await pilot.pause()

            await pilot.press("x")   # the x axis toggle applies: tokens seen at each scored step
            await pilot.pause()
            assert plot.series[0].xs == [100.0 * TOKENS_PER_STEP, 200.0 * TOKENS_PER_STEP, 300.0 * TOKENS_PER_STEP]
            assert plot.series[1].xs == [250.0 * TOKENS_PER_STEP, 300.0 * TOKENS_PER_STEP]
            assert "tokens seen" in text_of(plot)
            await pilot.press("x")

            await pilot.press("k", "k")   # docs-cloze, then bits per byte of the text task
            await pilot.pause()
            assert pane.plot_task == TEXT
            assert lines(plot) == [("base", [100.0, 200.0, 300.0], [3.1, 2.8, 2.7]),
                                   ("base-from-200", [250.0, 300.0], [2.5, 2.4])]
            assert f"{TEXT}: bits per byte (bpb, lower is better)" in text_of(plot)

            await pilot.press("k")   # qa: scored by `workbench eval` on base only: the branch has no line
            await pilot.pause()
            assert pane.plot_task == QA
            assert lines(plot) == [("base", [300.0], [0.30])]
            assert f"{QA}: exact match" in text_of(plot)

            # scores the trainer or `workbench eval` write later are tailed in
            with open(root / "base-from-200" / "metrics.jsonl", "a") as f:
                f.write('{"kind":"task","step":300,"task":"qa","metric":"exact","value":0.5,"n":50}\n')
            await wait_for(pilot, lambda: len(plot.series) == 2, what="the branch's qa score, tailed")
            assert lines(plot)[1] == ("base-from-200", [300.0], [0.5])

            await pilot.press("k")   # back to the loss
            await pilot.pause()
            assert pane.plot_task is None   # the loss lines again (the series drawn: each run's train and val)
            assert {ln.label for ln in plot.series} <= {"base", "base val", "base-from-200", "base-from-200 val"}
            assert "y: linear, loss" in text_of(app.query_one("#curves-settings"))
    run(go())


def test_curves_task_key_without_scores_says_how_to_get_them(runs_dir):
    async def go():
        app = make_app(runs_dir, initial_tab="curves")
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: len(app.summaries) == 3, what="the run list")
            pane = app.query_one("#curves-pane")
            pane.select_run("alpha", only=True)
            pane.focus_main()
            await wait_for(pilot, lambda: len(app.run_data["alpha"].steps) == 40, what="alpha's metrics")
            await pilot.press("k")
            await pilot.pause()
            assert pane.plot_task is None
            assert any("No task scores" in str(n.message) for n in app._notifications)
    run(go())


def test_runs_pane_report_card_of_the_checkpoint_under_the_cursor(tmp_path):
    root = _runs(tmp_path / "runs")

    async def go():
        app = make_app(root, initial_tab="runs")
        async with app.run_test(size=(120, 44)) as pilot:
            table = app.query_one("#runs-table", DataTable)
            ckpts = app.query_one("#ckpt-table", DataTable)
            card = app.query_one("#runs-card")
            await wait_for(pilot, lambda: table.row_count == 2, what="the run list")

            # the branch, its latest checkpoint (300): Δ from its step 250 and from its parent's step 200
            table.move_cursor(row=table.get_row_index("base-from-200"))
            await wait_for(pilot, lambda: "Δ step 250" in text_of(card), what=lambda: text_of(card))
            assert str(card.border_title) == "report card: base-from-200 step 300"
            rows = _rows(text_of(card))
            assert rows[0] == ["task", "metric", "score", "n", "Δ", "step", "250", "Δ", "parent", "base@200"]
            assert rows[1:] == [[NL, "centered", "0.350", "80", "+0.050", "+0.150"],
                                [CLOZE, "centered", "0.150", "80", "+0.070", "+0.050"],
                                [TEXT, "bpb", "2.400", "80", "-0.100", "-0.400"],
                                ["mean", "centered", "accuracy:", "0.250"]]

            # the branch's step 250: its previous scored step is the parent's 200, which is also its base
            ckpts.focus()
            ckpts.move_cursor(row=ckpts.get_row_index("step_0000250"))
            await wait_for(pilot, lambda: "Δ step 200" in text_of(card), what=lambda: text_of(card))
            assert _rows(text_of(card))[1:4] == [[NL, "centered", "0.300", "80", "+0.100", "+0.100"],
                                                 [CLOZE, "centered", "0.080", "80", "-0.020", "-0.020"],
                                                 [TEXT, "bpb", "2.500", "80", "-0.300", "-0.300"]]

            # step 200 (the parent's checkpoint, not scored in the branch): the hint
            ckpts.move_cursor(row=ckpts.get_row_index("step_0000200"))
            await wait_for(pilot, lambda: "no task scores" in text_of(card), what=lambda: text_of(card))
            assert text_of(card).startswith("no task scores at step 200; score it with `workbench eval "
                                            "base-from-200 --checkpoint 200 --task builtin`")

            # the cursor stays on the checkpoint when the runs are listed again
            app.action_refresh_runs()
            await pilot.pause(0.3)
            assert str(ckpts.coordinate_to_cell_key(ckpts.cursor_coordinate).row_key.value) == "step_0000200"

            # base at 300: the trainer's scores and `workbench eval`'s (qa) together; no origin
            table.focus()
            table.move_cursor(row=table.get_row_index("base"))
            await wait_for(pilot, lambda: "Δ step 200" in text_of(card) and "qa" in text_of(card),
                           what=lambda: text_of(card))
            rows = _rows(text_of(card))
            assert rows[0] == ["task", "metric", "score", "n", "Δ", "step", "200", "Δ", "base"]
            assert rows[1:] == [[NL, "centered", "0.250", "80", "+0.050", "—"],
                                [CLOZE, "centered", "0.120", "80", "+0.020", "—"],
                                [TEXT, "bpb", "2.700", "80", "-0.100", "—"],
                                [QA, "exact", "0.300", "50", "—", "—"],
                                ["mean", "centered", "accuracy:", "0.185"]]
    run(go())
