"""A run's history is never rewritten: a resume from an older checkpoint branches into a new run, a
finished run goes on for --more steps in place, and readers keep one timeline per run."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.cli import tiny, wb
from tests.support.runs import losses, read_jsonl, tree, wait_running
from workbench import rundir
from workbench.analysis.lineage import lineage
from workbench.config import parse_toml
from workbench.plan.run_plan import branch_toml
from workbench.rundir import EvalRecord, TrainRecord, current_timeline, read_metrics
from workbench.tui.rundata import RunData


def branch(run_dir: Path, ckpt: dict, root: Path, name: str | None = None) -> Path:
    """A branch as `workbench resume --checkpoint` makes one: its preset.toml (the parent's, with [parent]) made by
    the plan, the directory by the run directories' one maker."""
    data = parse_toml((run_dir / rundir.PRESET_FILE).read_text(encoding="utf-8"), str(run_dir))
    return rundir.make_branch(run_dir, ckpt, root, branch_toml(run_dir, ckpt, data), name)


def train_steps(run_dir: Path) -> list[int]:
    return [r.step for r in current_timeline(read_metrics(run_dir / "metrics.jsonl")) if isinstance(r, TrainRecord)]


def _finished_run(root: Path, name: str = "p") -> Path:
    wb("train", "cpu-small", "--name", name, "--runs-dir", str(root),
       *tiny("train.max_iters=60", "train.eval_interval=20", "train.ckpt_interval=20"), check=True)
    return root / name


def test_resuming_an_older_checkpoint_branches_and_leaves_the_parent_as_it_was(tmp_path):
    parent = _finished_run(tmp_path)
    before = tree(parent)
    # no interval checkpoints and no evals (each may save a best) in the branch: a tiny model runs ~100 steps/s, so
    # before the stop below lands it could pass three more (keep_last) and drop its copy of step 40 (seen in
    # fresh-clone CI runs: interval checkpoints once, then best ones at evals every 20 steps on a loaded machine)
    cp = wb("resume", "p", "--runs-dir", str(tmp_path), "--checkpoint", "40", "--set", "train.max_iters=100000",
            "train.ckpt_interval=100000", "train.eval_interval=100000", "--detach", check=True)
    assert "step_0000040 is not the latest checkpoint of p (step_0000060): continuing in a new run p-from-40" \
        in cp.stdout
    child = tmp_path / "p-from-40"
    assert cp.stdout.strip().splitlines()[-1] == "p-from-40"
    assert wait_running(child, 43).state == "running"
    assert wb("stop", "p-from-40", "--runs-dir", str(tmp_path)).returncode == 0
    # The parent: byte-identical, its latest checkpoint still step 60.
    assert tree(parent) == before
    assert rundir.select_checkpoint(parent, "latest")["step"] == 60
    # The child: its own preset (with its parent), its own history from the branch step on.
    assert "[parent]" in (child / "preset.toml").read_text() and lineage(tmp_path, "p-from-40") == [
        ("p", 40), ("p-from-40", None)]
    first = next(r for r in read_jsonl(child / "metrics.jsonl") if r["kind"] == "event")
    assert first["event"] == "resume" and first["step"] == 40 and first["parent"] == {"run": "p", "step": 40}
    steps = train_steps(child)
    assert steps[0] == 41 and steps == list(range(41, steps[-1] + 1))
    assert [c["step"] for c in rundir.list_checkpoints(child)][0] == 40
    # It continues step 40 of the parent itself: step 41's loss is step 40's weights on step 41's batch, the
    # parent's to the bit; and its copy of that checkpoint is the parent's files, hard-linked, not copied.
    assert losses(child)[41] == losses(parent)[41], (losses(child)[41], losses(parent)[41])
    theirs, ours = parent / "checkpoints" / "step_0000040", child / "checkpoints" / "step_0000040"
    names = sorted(f.name for f in theirs.iterdir())
    assert "model.pt" in names and sorted(f.name for f in ours.iterdir()) == names
    assert [(ours / n).stat().st_ino for n in names] == [(theirs / n).stat().st_ino for n in names]
    # `workbench runs` shows each with its own numbers, and where the branch came from.
    runs = {r["id"]: r for r in json.loads(wb("runs", "--json", "--runs-dir", str(tmp_path), check=True).stdout)}
    assert runs["p"]["step"] == 60 and runs["p"]["state"] == "finished" and runs["p"]["parent"] is None
    assert runs["p-from-40"]["parent"] == "p@40" and runs["p-from-40"]["state"] == "stopped"
    # Drawn with its ancestor, the child is one line: the parent's steps up to 40, then its own.
    data = {rid: RunData(rid) for rid in ("p", "p-from-40")}
    for rid, d in data.items():
        d.feed([r.to_dict() for r in read_metrics(tmp_path / rid / "metrics.jsonl")])
    from workbench.tui.rundata import joined
    line = joined([(data[r], upto) for r, upto in lineage(tmp_path, "p-from-40")])
    assert line.steps == list(range(1, 41)) + steps and line.eval_steps[:3] == [0, 20, 40]


def test_more_steps_continue_a_finished_run_in_place(tmp_path):
    run = _finished_run(tmp_path)
    cp = wb("resume", "p", "--runs-dir", str(tmp_path), "--more", "20", check=True)
    assert "finished at step 80" in cp.stdout
    assert not (tmp_path / "p-from-60").exists()
    steps = train_steps(run)
    assert steps == list(range(1, 81))  # one count, no gap, no repeat
    recs = read_jsonl(run / "metrics.jsonl")
    change = next(r for r in recs if r.get("event") == "preset_changed")
    assert change["changes"]["max_iters"] == [60, 80]
    train = {r["step"]: r["loss"] for r in recs if r["kind"] == "train"}
    recent = [train[s] for s in range(51, 61)]
    assert abs(train[61] - train[60]) < 3 * (max(recent) - min(recent)) + 0.05  # no jump at the join
    assert rundir.read_status(run).state == "finished" and rundir.read_status(run).step == 80


def test_a_crash_after_the_last_checkpoint_leaves_one_timeline_to_readers(tmp_path):
    """Steps 21-29 are trained, logged, then lost to a kill -9; the resume from step 20 trains them
    again. The file holds both; every reader sees each step once, from the timeline that goes on."""
    root = tmp_path
    cp = wb("train", "cpu-small", "--name", "k", "--runs-dir", str(root),
            *tiny("train.max_iters=40", "train.eval_interval=20", "train.ckpt_interval=20"),
            env={"WORKBENCH_TEST_KILL_AT_STEP": "29"})
    assert cp.returncode != 0
    d = root / "k"
    raw = [r["step"] for r in read_jsonl(d / "metrics.jsonl") if r["kind"] == "train"]
    assert raw[-1] == 29
    wb("resume", "k", "--runs-dir", str(root), check=True)
    raw = [r["step"] for r in read_jsonl(d / "metrics.jsonl") if r["kind"] == "train"]
    assert raw.count(25) == 2  # the abandoned and the current timeline, both in the file
    assert train_steps(d) == list(range(1, 41))
    evals = [r.step for r in current_timeline(read_metrics(d / "metrics.jsonl")) if isinstance(r, EvalRecord)]
    assert evals == [0, 20, 40]
    live = RunData("k")
    live.feed(read_jsonl(d / "metrics.jsonl"))
    assert live.steps == list(range(1, 41))
    csv = wb("metrics", "k", "--csv", "--runs-dir", str(root), check=True).stdout.splitlines()
    steps = [int(line.split(",")[1]) for line in csv[1:] if line.startswith("train,")]
    assert steps == list(range(1, 41))


def test_a_branch_of_a_branch_keeps_the_first_runs_name(tmp_path):
    """p at 40 is p-from-40; that branch at its step 40 again is p-from-40-2, at 40 of p's lineage, never
    p-from-40-from-40 (its [parent] says where it came from); a branch named by the user keeps its name."""
    parent = _finished_run(tmp_path)
    at40 = rundir.select_checkpoint(parent, "40")
    first = branch(parent, at40, tmp_path)
    assert first.name == "p-from-40"
    again = branch(first, rundir.select_checkpoint(first, "40"), tmp_path)
    assert again.name == "p-from-40-2"
    third = branch(again, rundir.select_checkpoint(again, "40"), tmp_path)
    assert third.name == "p-from-40-3" and lineage(tmp_path, "p-from-40-3")[0] == ("p", 40)
    mine = branch(parent, at40, tmp_path, name="mine")
    assert branch(mine, rundir.select_checkpoint(mine, "40"), tmp_path).name == "mine-from-40"


def test_a_branch_at_a_later_step_of_a_branch_names_the_branch_it_came_from(tmp_path):
    """p-from-20 trained on to 60; its step 40 is not p's step 40: the branch is p-from-20-from-40 (which run, which
    step, all the way back), never p-from-40, which reads as p's own step 40. The Runs pane proposes the same name."""
    from workbench.rundir import branch_name
    parent = _finished_run(tmp_path)
    wb("resume", "p", "--checkpoint", "20", "--runs-dir", str(tmp_path), "--set", "train.max_iters=60", check=True)
    first = tmp_path / "p-from-20"
    assert branch_name(first, 40) == "p-from-20-from-40"
    cp = wb("resume", "p-from-20", "--checkpoint", "40", "--runs-dir", str(tmp_path), "--set", "train.max_iters=45",
            check=True)
    assert "continuing in a new run p-from-20-from-40" in cp.stdout, cp.stdout
    child = tmp_path / "p-from-20-from-40"
    assert lineage(tmp_path, child.name) == [("p", 20), ("p-from-20", 40), ("p-from-20-from-40", None)]
    # unique: that branch at its own later step again adds its step, and a second one at 40 gets a number
    assert branch_name(child, 45) == "p-from-20-from-40-from-45"
    assert branch(first, rundir.select_checkpoint(first, "40"), tmp_path).name == "p-from-20-from-40-2"
    assert not (tmp_path / "p-from-40").exists() and rundir.select_checkpoint(parent, "latest")["step"] == 60
