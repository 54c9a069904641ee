"""A GRPO run in the TUI (issue 56), from reward records hand-written as the trainer writes them: the Loss curves
pane's r steps through its measures (mean reward train and held-out, its spread, groups without signal, KL,
completion length; a measure no record has is skipped), the Train pane shows the latest of them in place of the
val loss a GRPO run does not have, and the Health box says what the doctor found (a reward too easy by now)."""

from __future__ import annotations

import pytest
from textual.widgets import SelectionList

from tests.support.rundirs import RunDir
from tests.support.tui import make_app, run, text_of, wait_for
from workbench.config import preset_to_toml, resolve_preset
from workbench.tui.plot import reward_series
from workbench.tui.rundata import RunData


def _grpo_run(root, rid="grpo", kl=True):
    p = resolve_preset("cpu-small", ["model.dim=64", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2",
                                     "model.vocab_size=512", "model.seq_len=64", "train.max_iters=20",
                                     "train.warmup_iters=2", "train.objective=grpo", "train.reward=exact:answer",
                                     "model.dropout=0", "train.grpo_beta=0.04"])
    p.init = {"run": "sft", "step": 100}
    with RunDir(root, rid, preset_to_toml(p)) as r:
        r.event("start", 0, device="cpu", precision="fp32", params=131_392)
        for s in range(1, 21):
            r.train(s, 0.01, tokens_seen=s * 96, elapsed_s=s * 0.5, tokens_per_s=200.0)
            r.reward(s, reward=min(0.99, 0.3 + 0.05 * s), reward_std=0.2, no_signal=min(0.95, 0.25 + 0.05 * s),
                     kl=0.001 * s if kl else None, completion_len=5.0, clipped=0.0, loss=0.01)
            if s % 10 == 0:
                r.reward(s, "val", reward=0.5 + 0.02 * s, reward_std=0.3, no_signal=0.5, completion_len=5.5)
        r.event("finish", 20)
        r.status(state="finished", pid=999999, step=20, max_iters=20)
    return r


def test_reward_series_and_a_resume_that_rewinds_them(tmp_path):
    d = RunData("g")
    d.feed([{"kind": "reward", "step": s, "split": "train", "reward": 0.1 * s, "kl": None} for s in (1, 2, 3)]
           + [{"kind": "reward", "step": 2, "split": "val", "reward": 0.7}])
    assert [(s.label, s.xs, s.ys) for s in reward_series([d], "reward", 80)] == \
        [("train", [1.0, 2.0, 3.0], [0.1, 0.2, pytest.approx(0.3)]), ("held-out", [2.0], [0.7])]
    assert reward_series([d], "kl", 80) == []            # beta 0: no KL logged, no line
    d.feed([{"kind": "event", "event": "resume", "step": 2}])   # the step-3 record belonged to the timeline left
    assert d.reward_points("reward", "train") == ([1, 2], [0.1, 0.2]) and d.last_reward("val").reward == 0.7


def test_curves_train_pane_and_health_box_show_a_grpo_run(tmp_path):
    root = tmp_path / "runs"
    _grpo_run(root)

    async def go():
        app = make_app(root, initial_tab="curves")
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_for(pilot, lambda: len(app.summaries) == 1, what="the run list")
            pane, plot = app.query_one("#curves-pane"), app.query_one("#curves-plot")
            sl = app.query_one("#curves-runs", SelectionList)
            sl.select("grpo")
            pane.focus_main()
            await wait_for(pilot, lambda: len(app.run_data["grpo"].rewards["train"]) == 20, what="the records")
            await pilot.press("r")
            await wait_for(pilot, lambda: pane.reward_measure == "reward")
            pane.redraw()
            await pilot.pause()
            assert [s.label for s in plot.series] == ["train", "held-out"]
            assert plot.series[1].xs == [10.0, 20.0] and plot.series[1].ys == [0.7, 0.9]
            assert "GRPO: mean reward" in text_of(plot) and "y: linear, mean reward" in \
                text_of(app.query_one("#curves-settings"))
            seen = []
            for _ in range(4):
                await pilot.press("r")
                await pilot.pause()
                seen.append(pane.reward_measure)
            assert seen == ["reward_std", "no_signal", "kl", "completion_len"]
            assert "KL to the reference" not in text_of(plot) and "completion length" in text_of(plot)
            await pilot.press("r")
            await pilot.pause()
            assert pane.reward_measure is None    # back to the loss

            app.monitor("grpo", switch=True)
            await wait_for(pilot, lambda: "held-out reward" in text_of(app.query_one("#mon-stats")),
                           what="the reward numbers")
            stats = text_of(app.query_one("#mon-stats"))
            assert "0.990 ± 0.200" in stats and "0.900" in stats and "95% of groups" in stats
            assert "0.0200" in stats and "val loss" not in stats
            await wait_for(pilot, lambda: "too easy" in text_of(app.query_one("#mon-health")),
                           what=lambda: text_of(app.query_one("#mon-health")))
            assert "reward: 95 % of groups have no signal" in text_of(app.query_one("#mon-health"))
    run(go())
