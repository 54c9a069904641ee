"""GRPO (`train.objective = grpo`, issue 56) with a time budget and through the queue: the budget's evals are the
held-out prompts' reward, sized from one held-out prompt's rollout the run times before its step-0 eval; its steps
come from a GRPO run's measured pace or that rollout (the hardware's estimate knows nothing of generation); a run
killed with kill -9 and resumed goes on against what its checkpoint had left and ends at its budget at min_lr, its
end line with the held-out reward; `queue add` runs one to its end (listed with its held-out reward); a sweep
of GRPO trials ranks them by the held-out reward, higher first, and a sweep mixing objectives is one line; on
two processes (DDP, gloo) a run follows the queued one-process run (each rank rolls out its share of the prompts,
seeded by their place in the step)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import FACTS, REPO, TINY, wb
from tests.support.runs import read_jsonl, wait_until
from workbench import cli_client, rundir
from workbench.config import load_preset_file, resolve_preset
from workbench.plan.schedule.budget_plan import EVAL_SHARE, GRPO_EVAL_PROMPTS, budget_plan_at, plan_budget
from workbench.queue.store import QueueStore
from workbench.queue.sweep import open_study
from workbench.queue.sweep_results import load

BUDGET = 6.0
# how far from the budget a run may end (tests/train/test_time_budget.py's OVER: the last eval's estimate and one
# step; a GRPO step of this size takes 0.1-0.7 s on a loaded 2-core machine)
OVER = 4.0
LR, MIN_LR = 1e-3, 1e-5
# tiny()'s settings less its model (the facts run's, as --init-from takes it); 3 of the 12 prompts held out
GRPO = [*(s for s in TINY if not s.startswith("model.")), "model.seq_len=32", "model.dropout=0",
        "train.objective=grpo", "train.reward=exact:answer", "train.grpo_group=4", "train.grpo_max_new_tokens=6",
        "train.batch_size=3", "train.warmup_iters=1", "data.val_fraction=0.25", f"train.lr={LR}",
        f"train.min_lr={MIN_LR}", "train.schedule=cosine", "train.eval_interval=100000"]


@pytest.fixture(scope="module")
def root(tmp_path_factory, facts_run) -> Path:
    d = tmp_path_factory.mktemp("grpobudget")
    shutil.copytree(facts_run, d / "runs" / "facts")
    (d / "prompts.jsonl").write_text("".join(json.dumps({"prompt": q, "answer": f"{a}."}) + "\n" for q, a in FACTS))
    return d


def args(root: Path, name: str, *sets: str) -> list[str]:
    return ["--init-from", "facts", "--name", name, "--corpus", str(root / "prompts.jsonl"), "--runs-dir",
            str(root / "runs"), "--set", *GRPO, *sets]


def rewards(run_dir: Path, split: str) -> list[dict]:
    return [r for r in read_jsonl(run_dir / rundir.METRICS_FILE) if r.get("kind") == "reward" and r["split"] == split]


def test_a_budgeted_grpo_run_killed_and_resumed_ends_at_its_budget_at_min_lr_with_its_evals(root):
    """Killed with kill -9 past half its budget and resumed: the resumed process trains for what its checkpoint had
    left; the run ends within OVER of its budget, its last step at min_lr, its evals the held-out reward of as many
    prompts as its plan chose (at step 0 and at the end, the ones on the way within their share)."""
    out = root / "k.out"   # (a file, not a pipe nobody reads while it runs)
    with out.open("w") as f:
        proc = cli_client.popen([sys.executable, "-m", "workbench", "train", "cpu-small",
                                 *args(root, "k", "train.ckpt_interval=2"), "--time-budget", f"{BUDGET:g}s"],
                                cwd=REPO, stdout=f, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))
    d = root / "runs" / "k"

    def half_spent():
        st = rundir.read_status(d) if (d / "status.json").exists() else None
        return st is not None and (st.budget_spent_s or 0) >= BUDGET / 2 and rundir.list_checkpoints(d)
    try:
        wait_until(half_spent, timeout=120, what="half the budget spent")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    first_lines = out.read_text()
    # the CLI's first line: the hardware's estimate gives no GRPO steps (no GRPO run measured here yet); its evals
    # are the held-out reward
    assert "the steps by the run's own pace (a GRPO step's rollout is timed as it starts)" in first_lines, first_lines
    # its evals: the prompts file's 3 held-out prompts (12 prompts, data.val_fraction 0.25), not the most it could take
    assert "the reward of 3 held-out prompts x 4 completions each" in first_lines, first_lines
    last = rundir.list_checkpoints(d)[-1]
    spent = json.loads((Path(last["path"]) / "trainer_state.json").read_text())["budget_spent"]
    assert 0 < spent < BUDGET
    lr_before = {r["step"]: r["lr"] for r in read_jsonl(d / "metrics.jsonl") if r["kind"] == "train"}[last["step"]]
    res = wb("resume", "k", "--runs-dir", str(root / "runs"))
    assert res.returncode == 0, (res.stdout, res.stderr)
    st = rundir.read_status(d)
    assert st.state == "finished" and st.step == st.max_iters and abs(st.budget_spent_s - BUDGET) <= OVER, st
    recs = read_jsonl(d / "metrics.jsonl")
    began = next(r for r in recs if r.get("event") == "resume")
    assert began["step"] == last["step"]
    after = recs[recs.index(began):]
    first = next(r for r in after if r["kind"] == "train")
    finish = next(r for r in after if r.get("event") == "finish")
    assert first["step"] == last["step"] + 1
    # it ran what was left (plus its start-up, to the end of its first step, and what its clock says it ran over)
    startup, over = first["time"] - began["time"], max(0.0, st.budget_spent_s - BUDGET)
    assert finish["time"] - began["time"] <= (BUDGET - spent) + startup + over + 0.5
    # the schedule goes on where the checkpoint had it (cosine over the budget: never back at its peak), to min_lr
    lrs = [r["lr"] for r in recs if r["kind"] == "train" and r["step"] > last["step"]]
    assert lr_before < 0.9 * LR and lrs[0] <= 1.05 * lr_before, (lr_before, lrs)
    # (a step's rate is the schedule's where the step ends, by the pace: a noisy pace wobbles it by a step's share)
    assert lrs[-1] == min(lrs) and lrs[-1] <= MIN_LR + 0.05 * (LR - MIN_LR), lrs
    # its plan, as the start logged it: the timed rollout, the prompts each eval scores
    log = (d / "train.log").read_text()
    m = re.search(rf"a held-out prompt's rollout \(4 completions\) timed at [\d.e-]+ s: time budget {BUDGET:g}s: "
                  r"~\d+ steps by the estimate, warmup (\d+); evals at step 0, (?:at ([\d/]+) % and )?at the end, "
                  r"the reward of (\d+)(?: \(of at most 3\))? held-out prompts? x 4 completions each", log)
    assert m, log[:3000]
    on_the_way, prompts = len(m[2].split("/")) if m[2] else 0, int(m[3])
    assert 1 <= prompts <= 3 and int(m[1]) >= 1
    val = rewards(d, "val")
    assert all(v["prompts"] == prompts for v in val), val
    steps = [v["step"] for v in val]
    # step 0 and the end; on the way no more than planned (a busier machine skips some to keep the share)
    assert steps[0] == 0 and steps[-1] == st.step and len(val) <= 2 + on_the_way + 1, steps   # (+1: redone after
    # the kill, an eval between the checkpoint and the kill)
    assert f"finished at step {st.step}, held-out reward {val[-1]['reward']:.4f}" in log


# two micro-batches of 4 prompts a step (2 a rank on two processes), dapo over every rank's tokens, a frozen reference
QUEUED = ["train.max_iters=3", "train.batch_size=4", "train.grad_accum=2", "train.grpo_beta=0.04"]


@pytest.fixture(scope="module")
def queued(root) -> Path:
    """A GRPO run queued with `queue add` and run by `queue run`, to its end."""
    cp = wb("queue", "add", "cpu-small", *args(root, "q", *QUEUED))
    assert cp.returncode == 0, (cp.stdout, cp.stderr)
    cp = wb("queue", "run", "--runs-dir", str(root / "runs"), timeout=240)
    assert cp.returncode == 0 and "q finished" in cp.stdout, (cp.stdout, cp.stderr)
    return root / "runs" / "q"


def test_a_queued_grpo_run_runs_to_its_end_listed_with_its_held_out_reward(root, queued):
    d = queued
    st = rundir.read_status(d)
    assert st.state == "finished" and st.step == 3
    assert [r["step"] for r in rewards(d, "train")] == [1, 2, 3] and [r["step"] for r in rewards(d, "val")] == [0, 3]
    # `queue ls`: where a run's val loss would be, a GRPO run's held-out reward at its end
    listed = json.loads(wb("queue", "ls", "--json", "--runs-dir", str(root / "runs"), check=True).stdout)
    q = next(r for r in listed["runs"] if r["name"] == "q")
    assert q["metric"] == pytest.approx(rewards(d, "val")[-1]["reward"])


@pytest.fixture(scope="module")
def grpo_preset(root, queued) -> Path:
    """A preset that starts from a run (sweeps take no --init-from): the queued GRPO run's own."""
    preset = root / "grpo.toml"
    preset.write_text((queued / rundir.PRESET_FILE).read_text().replace('name = "cpu-small"', 'name = "grpo-facts"',
                                                                          1))
    assert load_preset_file(preset).train.objective == "grpo"
    return preset


def sweep_spec(root: Path, name: str, preset: Path, params: str, extra: str = "") -> Path:
    spec = root / f"{name}.toml"
    spec.write_text(f'name = "{name}"\npreset = "{preset}"\nmethod = "grid"\nset = ["train.max_iters=4"]\n'
                    f'corpus = ["{root / "prompts.jsonl"}"]\n{extra}[parameters]\n{params}\n')
    return spec


def test_a_sweep_of_grpo_trials_ranks_them_by_the_held_out_reward(root, grpo_preset):
    """A grid of two GRPO trials (train.lr), with a median pruner at half their steps: ranked by val_reward, higher
    first; the pruner is told each trial's held-out reward at its rung; `sweep show --json` and `save-best` name
    the metric and pick the trial whose held-out reward, read from its run, is the higher."""
    spec = sweep_spec(root, "gs", grpo_preset, '"train.lr" = [1e-4, 0.1]',
                      'pruner = { type = "median", startup = 2, shares = [0.5] }\n')
    runs = root / "runs"
    cp = wb("sweep", str(spec), "--runs-dir", str(runs))
    assert cp.returncode == 0 and "ranked by val_reward (maximize)" in cp.stdout, (cp.stdout, cp.stderr)
    cp = wb("queue", "run", "--runs-dir", str(runs), timeout=240)
    assert cp.returncode == 0 and "gs-t0002 finished, val_reward" in cp.stdout, (cp.stdout, cp.stderr)
    reached = {t: rewards(runs / t, "val") for t in ("gs-t0001", "gs-t0002")}
    for t, evals in reached.items():
        assert [r["step"] for r in evals] == [0, 2, 4], (t, evals)   # step 0, the rung (half of 4), the end
    end = {t: evals[-1]["reward"] for t, evals in reached.items()}
    assert end["gs-t0001"] != end["gs-t0002"], end   # (the two learning rates must reach different rewards)
    top = max(end, key=end.__getitem__)
    shown = json.loads(wb("sweep", "show", "gs", "--json", "--runs-dir", str(runs), check=True).stdout)
    assert (shown["sweep"]["metric"], shown["sweep"]["goal"]) == ("val_reward", "maximize"), shown["sweep"]
    trials = {t["run"]: t for t in shown["trials"]}
    assert {t: trials[t]["metric"] for t in end} == pytest.approx(end)
    assert trials[top]["rank"] == 1 and shown["best"]["run"] == top, shown
    # what the pruner saw at its rung: each trial's held-out reward at step 2
    store = QueueStore(runs)
    study = open_study(runs, load(store, "gs"))
    store.close()
    assert study.direction.name == "MAXIMIZE"
    seen = {t.number: t.intermediate_values for t in study.trials}
    assert seen == {k: {50: pytest.approx(reached[t][1]["reward"])} for k, t in enumerate(sorted(reached))}, seen
    cp = wb("sweep", "save-best", "gs", "--runs-dir", str(runs), env={"WORKBENCH_PRESETS_DIR": str(root / "presets")})
    assert cp.returncode == 0 and f"best trial {top}" in cp.stdout and "val_reward" in cp.stdout, (cp.stdout,
                                                                                                  cp.stderr)


def test_a_sweep_mixing_grpo_and_other_objectives_is_one_line(root, grpo_preset):
    spec = sweep_spec(root, "mixed", grpo_preset, '"train.objective" = ["grpo", "sft"]')
    cp = wb("sweep", str(spec), "--runs-dir", str(root / "runs"))
    assert cp.returncode == 2 and cp.stderr.count("\n") == 1, (cp.stdout, cp.stderr)
    assert "its trials mix train.objective = grpo (ranked by the held-out reward, val_reward) with sft" in cp.stderr
    assert "mixed" not in wb("sweep", "ls", "--runs-dir", str(root / "runs"), check=True).stdout  # nothing queued


@pytest.mark.slow
def test_two_processes_follow_one_process(root, queued):
    """The same run on two processes (hardware.nproc = 2, DDP on gloo): the same rewards, completion lengths and
    held-out reward (the same samples), the gradient norms and KL but for the all-reduce's rounding."""
    cp = wb("train", "cpu-small", *args(root, "two", *QUEUED, "hardware.nproc=2"))
    assert cp.returncode == 0, (cp.stdout, cp.stderr)

    def records(d: Path, kind: str) -> dict[tuple[int, str], dict]:
        return {(r["step"], r.get("split", "")): r for r in read_jsonl(d / rundir.METRICS_FILE)
                if r.get("kind") == kind}
    one, two = records(queued, "reward"), records(root / "runs" / "two", "reward")
    assert sorted(one) == sorted(two) and len(one) == 3 + 2             # a train record a step; evals at 0 and 3
    for k, r in one.items():
        assert two[k]["reward"] == r["reward"] and two[k]["completion_len"] == r["completion_len"], k
        if r["kl"] is not None:
            assert two[k]["kl"] == pytest.approx(r["kl"], rel=1e-4, abs=1e-7), k
    g1, g2 = records(queued, "train"), records(root / "runs" / "two", "train")
    assert sorted(g1) == sorted(g2) == [(1, ""), (2, ""), (3, "")]
    for k, r in g1.items():
        assert g2[k]["grad_norm"] == pytest.approx(r["grad_norm"], rel=1e-4), k
    start = next(r for r in read_jsonl(root / "runs" / "two" / rundir.METRICS_FILE) if r.get("event") == "start")
    assert start["world_size"] == 2


def test_a_grpo_budgets_plan_counts_held_out_prompts_and_steps_only_from_a_grpo_runs_pace():
    """The plan (plan.schedule.budget_plan, torch-free): evals of held-out prompts (G completions each) sized to the
    share, and steps only from a speed measured on a GRPO run or given, never from the hardware's estimate."""
    p = resolve_preset("cpu-small", ["train.objective=grpo", "train.reward=exact:answer", "train.grpo_group=4",
                                     "train.time_budget=60s", "train.batch_size=3", "train.eval_interval=50",
                                     "model.dropout=0"])
    # one held-out prompt's rollout 0.25 s, a step 0.9 s: the share (6 s) pays for 5 evals of 4 prompts of 20 held
    plan = plan_budget(p, 60.0, 0.9, 0.25, held_prompts=20)
    assert plan.group == 4 and plan.auto_iters == 20 and plan.eval_iters == 4 and plan.evals_on_the_way == 3
    assert plan.eval_s == pytest.approx(5 * 4 * 0.25) and plan.eval_s <= EVAL_SHARE * 60
    assert plan.steps == int((60 - plan.eval_s) / 0.9)
    assert "the reward of 4 (of at most 20) held-out prompts x 4 completions each" in plan.describe()
    assert budget_plan_at(p, 500.0, basis="estimate").steps is None          # the hardware's: no GRPO steps
    measured = budget_plan_at(p, 500.0, basis="measured")
    assert measured.steps == int((60 - measured.eval_s) / (p.tokens_per_step() / 500.0))
    assert measured.auto_iters == GRPO_EVAL_PROMPTS and "held-out prompts" in measured.describe()
    too_short = plan_budget(p, 3.0, 0.9, 0.25, held_prompts=20)
    assert too_short.problem and "one held-out prompt's 4 completions take ~0.25 s here" in too_short.problem
