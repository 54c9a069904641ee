"""Sweeps (`workbench sweep`): every trial estimated before it is queued (one that will not fit is auto-fitted or
refused with the reason); a grid of real tiny budgeted trials runs to its end and is ranked by the val loss each
run reached; a TPE sweep (Optuna, its SQLite storage) goes on after its runner's kill -9; the median and
successive-halving pruners stop a hopeless trial through the normal stop path, and the compute they saved is
reported; a trial a described 8 GB GPU cannot hold is auto-fitted (same tokens per step) or dropped before
anything starts; every bad input is one line, exit 2, and nothing written."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.cli import TINY, wb
from tests.support.runs import evals, wait_until
from workbench import rundir
from workbench.config import resolve_preset
from workbench.fmt import GiB
from workbench.machine.detect import Gpu, Machine
from workbench.queue.store import QueueStore
from workbench.queue.sweep import create_sweep
from workbench.queue.sweep_spec import build_spec, parse_set_grid


def tiny_without(*keys: str) -> list[str]:
    """The tiny overrides less the searched keys (a searched key may not also be --set)."""
    return [s for s in TINY if s.split("=")[0] not in keys]


def show(root: Path, name: str) -> dict:
    return json.loads(wb("sweep", "show", name, "--json", "--runs-dir", str(root), check=True).stdout)


def toml_list(items) -> str:
    return "[" + ", ".join(json.dumps(s) for s in items) + "]"


def tables(root: Path) -> dict[str, int]:
    """Rows in the queue's tables (nothing half-written: these do not change on a refusal)."""
    if not (root / "queue.db").exists():
        return {}
    conn = sqlite3.connect(root / "queue.db")
    try:
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("items", "sweeps", "trials")}
    finally:
        conn.close()


def test_trials_that_cannot_fit_are_refused_before_queueing_and_bad_input_is_one_line(tmp_path):
    root = tmp_path / "runs"
    sets = tiny_without("model.dim")
    cp = wb("sweep", "cpu-small", "--set-grid", "model.dim=64,16384", "--time-budget", "2s", "--name", "dims",
            "--runs-dir", str(root), "--set", *sets, check=True)
    assert "dims-t0001  model.dim=64  queued" in cp.stdout
    refused = next(ln for ln in cp.stdout.splitlines() if "dims-t0002" in ln)
    assert "refused: does not fit this machine's memory by the estimate" in refused
    rows = show(root, "dims")["trials"]
    assert [(r["run"], r["state"]) for r in rows] == [("dims-t0001", "queued"), ("dims-t0002", "refused")]
    assert "does not fit" in rows[1]["note"]
    store = QueueStore(root)
    assert [i.name for i in store.items()] == ["dims-t0001"]          # the refused one was never queued
    assert store.find("dims-t0001").sets[0] == "model.dim=64" and store.find("dims-t0001").time_budget == "2s"
    store.close()

    spec = tmp_path / "s.toml"
    before = tables(root)
    bad = [
        (["cpu-small", "--set-grid", "train.lrr=1e-3,1e-2"], "unknown key train.lrr (did you mean 'lr'?)"),
        (["cpu-small", "--set-grid", "train.lr=1e-3,fast"], "train.lr = 'fast' must be a number"),
        (["cpu-small", "--set-grid", "train.lr=,"], "an empty value"),
        (["cpu-small", "--set-grid", "train.lr=1e-3", "--metric", "accuracy"], "metric 'accuracy' is not one"),
        (["cpu-small", "--set-grid", "train.lr=1e-3", "--name", "dims"], "sweep name 'dims' is taken"),
        (["cpu-small", "--set-grid", "model.dim=16384", "--name", "big", "--set", *sets],
         "no trial of sweep big fits this machine"),
        (["cpu-small"], "name what to search: --set-grid"),
        ([str(spec)], "unknown key 'paramters' (did you mean 'parameters'?)"),
    ]
    spec.write_text('preset = "cpu-small"\n[paramters]\n"train.lr" = [1e-3]\n')
    for args, words in bad:
        cp = wb("sweep", *args, "--runs-dir", str(root))
        err = cp.stderr.strip().splitlines()
        assert cp.returncode == 2 and len(err) == 1 and words in err[0], (args, cp.stdout, cp.stderr)
    for text, words in [('preset = "cpu-small"\n[parameters]\n', "nothing to search"),
                        ('preset = "cpu-small"\n[parameters]\n"train.lr" = []\n', "no values to try"),
                        ('preset = "cpu-small"\n[parameters]\n"train.lr" = { min = 1e-3, max = 1e-2 }\n',
                         "a grid takes values"),
                        ('preset = "cpu-small"\nmethod = "tpe"\n[parameters]\n"train.lr" = [1e-3]\n',
                         "needs the number of trials"),
                        ('preset = "cpu-small"\n[parameters]\ntrain.lr = [1e-3]\n', "quote the dotted key")]:
        spec.write_text(text)
        cp = wb("sweep", str(spec), "--runs-dir", str(root))
        assert cp.returncode == 2 and words in cp.stderr and len(cp.stderr.strip().splitlines()) == 1, cp.stderr
    assert tables(root) == before                                     # nothing half-written
    cp = wb("sweep", "show", "dimz", "--runs-dir", str(root))
    assert cp.returncode == 2 and "no sweep 'dimz'" in cp.stderr and "did you mean 'dims'" in cp.stderr


# An 8 GB card described by hand (the estimate's machine override, as tests/plan/test_settings.py describes its
# machines): gpu-8gb at batch 32 fits it at dim 768, needs a smaller micro-batch at 1344, and nothing fits at 3072.
CARD_8GB = Machine(gpus=(Gpu(0, "NVIDIA GPU", 8 * GiB, 8 * GiB, (8, 9)),), physical_cores=8, ram_total=64 * GiB,
                   ram_available=48 * GiB)
DIMS = ["model.dim=768,1344,3072"]


def test_trials_a_described_8gb_gpu_cannot_hold_are_auto_fitted_or_dropped_before_anything_starts(tmp_path):
    root = tmp_path / "runs"
    spec = build_spec(name="dims", preset="gpu-8gb", params=parse_set_grid(DIMS), time_budget="60s",
                      sets=("train.batch_size=32",))
    create_sweep(root, spec, CARD_8GB, {})
    store = QueueStore(root)
    items = {i.name: i for i in store.items()}
    store.close()
    assert sorted(items) == ["dims-t0001", "dims-t0002"] and {i.state for i in items.values()} == {"queued"}
    assert items["dims-t0001"].sets == ("model.dim=768", "train.batch_size=32")  # fits; searched key first
    fitted = resolve_preset("gpu-8gb", list(items["dims-t0002"].sets)).train
    assert (fitted.batch_size, fitted.grad_accum) == (8, 4)                          # same 32 sequences a step
    rows = show(root, "dims")["trials"]
    assert [(r["run"], r["state"]) for r in rows] == [("dims-t0001", "queued"), ("dims-t0002", "queued"),
                                                      ("dims-t0003", "refused")]
    assert rows[0]["fit"] == "" and rows[1]["fit"] == "auto-fitted: batch 32 -> 8, accum 1 -> 4"
    assert "does not fit" in rows[2]["note"] and "no smaller micro-batch fits" in rows[2]["note"]
    text = wb("sweep", "show", "dims", "--runs-dir", str(root), check=True).stdout
    assert "    auto-fitted: batch 32 -> 8, accum 1 -> 4" in text and "2 queued, 1 refused" in text
    assert "no smaller micro-batch fits with the same tokens per step" in text
    # the same plan for machines that have such a card, through the CLI: one line a trial
    cp = wb("sweep", "gpu-8gb", "--set-grid", *DIMS, "--set", "train.batch_size=32", "--gpu", "RTX 4060",
            "--name", "dims", "--print-commands", "--runs-dir", str(root), check=True)
    lines = cp.stdout.strip().splitlines()
    assert lines[0].endswith("model.dim=768 train.batch_size=32 --runs-dir " + str(root))
    assert "model.dim=1344 train.batch_size=32 train.batch_size=8 train.grad_accum=4 " in lines[1]
    assert lines[1].endswith("# auto-fitted: batch 32 -> 8, accum 1 -> 4")
    assert lines[2].startswith("# dims-t0003 refused: ") and "no smaller micro-batch fits" in lines[2]
    cp = wb("sweep", "gpu-8gb", "--set-grid", *DIMS, "--gpu", "RTX 4060", "--name", "x", "--runs-dir", str(root))
    assert cp.returncode == 2 and "--gpu plans the trials for machines with that GPU" in cp.stderr


def test_print_commands_writes_one_train_line_per_trial(tmp_path):
    # a budget long enough for cpu-small's evals at any speed: under CI's load 60 s was refused (a batch of
    # train and val measured 6.6 s), and the budget's check is another test's subject
    root = tmp_path / "runs"
    cp = wb("sweep", "cpu-small", "--set-grid", "train.lr=1e-3,1e-2", "train.warmup_iters=5,10", "--name", "pc",
            "--time-budget", "30m", "--print-commands", "--runs-dir", str(root), check=True)
    lines = cp.stdout.strip().splitlines()
    assert len(lines) == 4 and all(ln.startswith("workbench train cpu-small --name pc-t000") for ln in lines)
    assert "--time-budget 30m --set train.lr=0.001 train.warmup_iters=5" in lines[0]
    assert not (root / "queue.db").exists()                           # nothing queued


@pytest.mark.slow
def test_a_grid_of_budgeted_trials_runs_unattended_and_is_ranked_by_what_each_run_reached(tmp_path):
    root = tmp_path / "runs"
    cp = wb("sweep", "cpu-small", "--set-grid", "train.lr=1e-3,1e-2", "train.warmup_iters=2,10",
            "--time-budget", "2s", "--name", "grid", "--runs-dir", str(root),
            "--set", *tiny_without("train.warmup_iters"), check=True)
    assert "4 trial(s) queued" in cp.stdout
    cp = wb("queue", "run", "--runs-dir", str(root), timeout=300, check=True)
    assert "sweep grid done: best grid-t" in cp.stdout
    res = show(root, "grid")
    rows = res["trials"]
    assert [r["run"] for r in rows] == [f"grid-t000{k}" for k in range(1, 5)]
    assert [r["params"] for r in rows] == [{"train.lr": lr, "train.warmup_iters": w}
                                           for lr in (1e-3, 1e-2) for w in (2, 10)]
    assert all(r["state"] == "finished" for r in rows)
    # each trial's metric is its run's last val loss; ranks order them, 1 the lowest
    for r in rows:
        final = evals(root / r["run"])
        assert r["metric"] == pytest.approx(final[max(final)])
        st = rundir.read_status(root / r["run"])
        assert st.state == "finished" and st.budget_s == 2.0
    by_rank = sorted(rows, key=lambda r: r["rank"])
    assert [r["metric"] for r in by_rank] == sorted(r["metric"] for r in rows)
    assert res["best"]["run"] == by_rank[0]["run"]
    text = wb("sweep", "grid", "--status", "--runs-dir", str(root), check=True).stdout
    assert f"best: {by_rank[0]['run']}" in text and "4 finished" in text
    tsv = wb("sweep", "show", "grid", "--tsv", "--runs-dir", str(root), check=True).stdout.strip().splitlines()
    assert tsv[0].split("\t")[:4] == ["run", "train.lr", "train.warmup_iters", "val_loss"] and len(tsv) == 5


TPE_SPEC = """
preset = "cpu-small"
method = "tpe"
trials = 3
time_budget = "2s"
seed = 7
set = {sets}
[parameters]
"train.lr" = {{ min = 1e-4, max = 1e-2, log = true }}
"train.warmup_iters" = {{ min = 1, max = 20 }}
"""


@pytest.mark.slow
def test_a_tpe_sweep_goes_on_after_its_runner_is_killed(tmp_path):
    import optuna
    root = tmp_path / "runs"
    spec = tmp_path / "tpe.toml"
    spec.write_text(TPE_SPEC.format(sets=toml_list(tiny_without("train.warmup_iters"))))
    cp = wb("sweep", str(spec), "--runs-dir", str(root), check=True)
    assert "tpe-t0001" in cp.stdout and "1 trial(s) queued (tpe: each next trial is drawn when one ends)" in cp.stdout
    runner = subprocess.Popen([sys.executable, "-m", "workbench", "queue", "run", "--runs-dir", str(root)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    try:  # killed once the second trial was drawn (the first's result given to Optuna)
        wait_until(lambda: any(r["run"] == "tpe-t0002" for r in show(root, "tpe")["trials"]), timeout=120,
                   what="the second trial", every=0.5)
        os.kill(runner.pid, signal.SIGKILL)
        runner.wait(10)
    finally:
        if runner.poll() is None:
            runner.kill()
    wb("queue", "run", "--runs-dir", str(root), timeout=300, check=True)
    rows = show(root, "tpe")["trials"]
    assert [r["run"] for r in rows] == ["tpe-t0001", "tpe-t0002", "tpe-t0003"]
    assert all(r["state"] == "finished" and r["metric"] is not None for r in rows), rows
    assert len({r["params"]["train.lr"] for r in rows}) == 3   # three draws, none repeated by the restart
    study = optuna.load_study(study_name="tpe", storage=f"sqlite:///{root / 'optuna.db'}")
    done = {t.number: t for t in study.trials}
    assert len(done) == 3 and all(t.state == optuna.trial.TrialState.COMPLETE for t in done.values())
    for r, t in zip(rows, sorted(done.values(), key=lambda t: t.number)):
        assert t.value == pytest.approx(r["metric"]) and t.params == r["params"]
    for r in rows:
        assert 1e-4 <= r["params"]["train.lr"] <= 1e-2 and 1 <= r["params"]["train.warmup_iters"] <= 20


@pytest.mark.slow
@pytest.mark.parametrize("pruner,why", [("median", "worse than the median"),
                                        ("halving", "not in the best 1/2 of the trials there (successive halving)")])
def test_the_pruner_stops_a_hopeless_trial_through_the_stop_path(tmp_path, pruner, why):
    """Decided from what was recorded, not from this machine's pace: the pruned trial reached the rung (20 % of its
    budget by its own status) and was stopped before its end, what it left is its status's budget less what it
    spent, and the value Optuna was given at the rung is an eval the run recorded, worse than the other trials'
    values there (Optuna's own figures). An eval every 4 steps, so a trial has one past step 0 by the rung (1.2 s of
    training) even on a slow machine (at step 0 every trial has the same loss). 6 s a trial: the runner watches a
    trial once its `train --detach` has returned, which on a loaded machine can take seconds, and a trainer forked
    with torch already imported (tests/support/spawner.py) trains from its first second."""
    import optuna
    root = tmp_path / "runs"
    spec = tmp_path / "prune.toml"
    spec.write_text(f"""
preset = "cpu-small"
time_budget = "6s"
set = {toml_list([*TINY, "train.eval_interval=4", "train.min_lr=1e-7"])}
pruner = {{ type = "{pruner}", startup = 2, shares = [0.2] }}
[parameters]
"train.lr" = [3e-3, 1e-2, 1e-6]
""")
    wb("sweep", str(spec), "--runs-dir", str(root), check=True)
    cp = wb("queue", "run", "--runs-dir", str(root), timeout=300, check=True)
    assert "pruning prune-t0003" in cp.stdout, cp.stdout
    res = show(root, "prune")
    rows = res["trials"]
    assert [r["state"] for r in rows] == ["finished", "finished", "pruned"], rows
    assert why in rows[2]["note"] and "at 20% of its budget" in rows[2]["note"], rows[2]["note"]
    # stopped through the stop path, with a checkpoint, between the rung and the end of its budget (its status)
    st = rundir.read_status(root / "prune-t0003")
    assert st.state == "stopped" and st.budget_s == 6.0
    assert 0.2 * st.budget_s <= st.budget_spent_s < st.budget_s, st
    assert rundir.list_checkpoints(root / "prune-t0003")[-1]["step"] == st.step
    # what pruning saved: the rest of the pruned trial's budget, beside the trial-seconds spent
    unspent = rows[2]["unspent_s"]
    assert unspent == pytest.approx(st.budget_s - st.budget_spent_s) and all(r["unspent_s"] is None
                                                                             for r in rows[:2])
    c = res["compute"]
    assert c["spent_s"] == pytest.approx(sum(r["seconds"] for r in rows))
    assert c["saved_s"] == pytest.approx(unspent) and c["full_s"] == pytest.approx(c["spent_s"] + unspent)
    assert c["saved_share"] == pytest.approx(unspent / c["full_s"])
    # the decision, from Optuna's figures: each trial's value at the rung (20), the pruned one's an eval its run
    # recorded past step 0, worse than both others' (so above their median, and not in the best half)
    study = optuna.load_study(study_name="prune", storage=f"sqlite:///{root / 'optuna.db'}")
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 2 + [optuna.trial.TrialState.PRUNED]
    # every trial has its value there, an eval its rung placed (train.eval_shares, set by the sweep on each trial)
    at_rung = [t.intermediate_values.get(20) for t in study.trials]
    assert None not in at_rung, at_rung
    step = int(rows[2]["note"].split("(step ")[1].split(")")[0].replace(",", ""))
    assert step > 0 and evals(root / "prune-t0003")[step] == pytest.approx(at_rung[2], abs=5e-5), (step, at_rung)
    assert at_rung[2] > max(at_rung[:2]), at_rung
    # the rungs are the sweep's, not the best trial's: its saved preset evaluates where its own plan says
    wb("sweep", "save-best", "prune", "--runs-dir", str(root), check=True,
       env={"WORKBENCH_PRESETS_DIR": str(tmp_path / "presets")})
    saved = (tmp_path / "presets" / "prune-best.toml").read_text()
    assert tomllib.loads(saved)["train"].get("eval_shares", "") == "" and "eval_shares" not in saved.split("\n[")[0]
    text = wb("sweep", "show", "prune", "--runs-dir", str(root), check=True).stdout
    assert "2 finished, 1 pruned" in text
    assert f"pruning saved {c['saved_share']:.0%}: {c['saved_s']:,.0f} of the {c['full_s']:,.0f}" in text
