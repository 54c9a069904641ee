"""Sweeps that say when they are noise (issue 53): `sweep` plans every trial's budget as `train` does
(plan.schedule.budget_plan.plan_budget) and refuses trials that cannot buy a complete run unless --force; `sweep show`
marks the trials that trained too little to compare and does not name a best among them without saying so."""

from __future__ import annotations

import json
import tomllib

import pytest
from textual.widgets import DataTable

from tests.support.cli import wb
from tests.support.tui import make_app, run, wait_for
from workbench import rundir
from workbench.plan.schedule.budget_plan import MIN_BUDGET_STEPS

# cpu-small's model on a small corpus, 32 sequences a step: a 1 s budget buys a step or two on any CPU
SHORT = ["data.builtin_mb=0.3", "data.tokenizer_sample_mb=0.3", "model.vocab_size=512", "hardware.nproc=1",
         "hardware.compile=false", "train.batch_size=32", "train.log_interval=1"]


@pytest.mark.slow
def test_trials_too_short_to_compare_are_refused_unless_forced_then_marked_and_no_best_named_without_saying(tmp_path):
    root = tmp_path / "runs"
    args = ["sweep", "cpu-small", "--set-grid", "train.lr=1e-3,3e-3", "--time-budget", "1s", "--name", "short",
            "--runs-dir", str(root), "--set", *SHORT]
    cp = wb(*args)
    assert cp.returncode == 2, cp.stdout + cp.stderr
    err = cp.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("workbench: error: no trial of sweep short can be queued (first: a 1s "
                                               "budget ") and "(`sweep --force` queues it anyway)" in err[0], err
    assert json.loads(wb("queue", "ls", "--json", "--runs-dir", str(root), check=True).stdout)["runs"] == []
    cp = wb(*args, "--force", check=True)
    lines = [ln for ln in cp.stdout.splitlines() if ln.strip().startswith("short-t")]
    assert len(lines) == 2 and all("queued (warning: a 1s budget" in ln for ln in lines), cp.stdout
    wb("queue", "run", "--runs-dir", str(root), timeout=300, check=True)
    res = json.loads(wb("sweep", "show", "short", "--json", "--runs-dir", str(root), check=True).stdout)
    for t in res["trials"]:
        st = rundir.read_status(root / t["run"])
        assert t["state"] == "finished" and st.budget_s == 1.0
        # marked from what the run recorded: its steps against its warmup and the floor
        assert st.step < MIN_BUDGET_STEPS or (st.warmup and st.step <= st.warmup), st
        assert t["short"].startswith(("never left its warmup (", f"trained {st.step:,} steps, fewer than the 10")), t
    assert res["caveats"][0].startswith("all 2 finished trials trained too little to compare")
    assert res["caveats"][-1].startswith(f"the best, {res['best']['run']}, is one of them: train it again with more "
                                         "time")
    text = wb("sweep", "show", "short", "--runs-dir", str(root), check=True).stdout
    assert "the ranking may be noise" in text and f"    {res['trials'][0]['short']}" in text
    # the best is named after the caveat that it is one of them
    assert text.index("is one of them") < text.index("best: short-t")

    # the Queue tab marks them too: the note column, and the best named with its flag

    async def go():
        app = make_app(root, initial_tab="queue")
        async with app.run_test(size=(160, 48)) as pilot:
            table = app.query_one("#sweep-results", DataTable)
            await wait_for(pilot, lambda: table.row_count == 2, what="the sweep's results")
            notes = [str(table.get_row_at(i)[-1]) for i in range(2)]
            assert all(n.startswith(("never left its warmup", "trained ")) for n in notes), notes
            sweeps = app.query_one("#sweeps-table", DataTable)
            assert str(sweeps.get_row_at(0)[3]) == f"{res['best']['run']} (too short)"
    run(go())


def test_queue_add_refuses_a_budget_train_would_refuse_unless_yes(tmp_path):
    """`queue add` says now what `train` would say when the runner starts it hours later: a 1 s budget of cpu-small
    cannot buy a complete run (one line, exit 2, nothing queued); --yes queues it, and its train gets --yes."""
    root = tmp_path / "runs"
    args = ["queue", "add", "cpu-small", "--time-budget", "1s", "--name", "tiny", "--runs-dir", str(root),
            "--set", *SHORT]
    cp = wb(*args)
    err = cp.stderr.strip().splitlines()
    assert cp.returncode == 2 and len(err) == 1 and err[0].startswith("workbench: error: a 1s budget ") \
        and err[0].endswith("(queue it anyway with --yes)"), cp.stdout + cp.stderr
    assert not (root / "queue.db").exists() or json.loads(
        wb("queue", "ls", "--json", "--runs-dir", str(root), check=True).stdout)["runs"] == []
    wb(*args, "--yes", check=True)
    runs = json.loads(wb("queue", "ls", "--json", "--runs-dir", str(root), check=True).stdout)["runs"]
    assert [r["name"] for r in runs] == ["tiny"]


@pytest.mark.slow
def test_every_trial_is_reported_at_each_rung_with_its_eval_at_that_share_of_its_budget(tmp_path):
    """The pruner compares trials at the same share of their budgets: the sweep sets its rungs as every trial's
    train.eval_shares, so each trial has an eval at each rung (the first past it, by the budget's training share its
    record carries), and each rung's value is that eval, whenever the runner happened to look; a trial that ended
    between two looks still has every rung it passed (issue 54's audit: it was the last eval when polled, and a rung
    passed between looks was lost). Before, the rungs took the eval at or before their share from evals at shares
    each trial's plan chose: 13 evals on the way in one trial, 3 in the next beside a loaded machine, and a rung at
    20 % with no eval before it (the halving pruner's test failed in CI)."""
    import optuna

    from tests.support.cli import TINY
    from tests.support.runs import read_jsonl
    root = tmp_path / "runs"
    wb("sweep", "cpu-small", "--set-grid", "train.lr=1e-3,3e-3,1e-2", "--time-budget", "3s", "--pruner", "median",
       "--name", "rungs", "--runs-dir", str(root), "--set", *TINY, "train.min_lr=1e-7", check=True)
    wb("queue", "run", "--runs-dir", str(root), timeout=300, check=True)
    study = optuna.load_study(study_name="rungs", storage=f"sqlite:///{root / 'optuna.db'}")
    res = json.loads(wb("sweep", "show", "rungs", "--json", "--runs-dir", str(root), check=True).stdout)
    for t, row in zip(study.trials, res["trials"]):
        assert tomllib.loads((root / row["run"] / "preset.toml").read_text())["train"]["eval_shares"] == [
            0.25, 0.5, 0.75]
        evs = [r for r in read_jsonl(root / row["run"] / "metrics.jsonl") if r["kind"] == "eval"]
        assert all("budget_share" in e for e in evs) and evs[0]["budget_share"] == 0.0, evs
        shares = [e["budget_share"] for e in evs]
        assert shares == sorted(shares) and shares[-1] <= 1.0
        if row["state"] == "finished":   # an eval of its own at each rung (the last one may be the 75 %'s)
            firsts = [next(i for i, x in enumerate(shares) if x >= s - 1e-6) for s in (0.25, 0.5, 0.75)]
            assert len(set(firsts)) == 3 and len(evs) in (4, 5), shares
        for rung, value in t.intermediate_values.items():
            at = [e for e in evs if e["step"] > 0 and e["budget_share"] >= rung / 100 - 1e-6]
            assert value == pytest.approx(at[0]["val_loss"], abs=1e-6), (row["run"], rung, value, shares)
        if row["state"] == "finished":   # every rung it passed, however the runner's looks fell
            assert set(t.intermediate_values) == {25, 50, 75}, (row["run"], shares)
