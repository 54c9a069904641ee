"""`workbench doctor` on real tiny runs: each problem provoked, found with the run's numbers, and where a
tiny run can show it, gone once the finding's own command is run (the change applied)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import tiny, wb
from tests.support.runs import wait_running, wait_until

pytestmark = pytest.mark.slow

# Overfitting fast: 4 KB of text, a high learning rate, a val split of a fifth, evals every 5 steps.
OVERFIT = ["train.batch_size=8", "train.lr=6e-3", "train.warmup_iters=5", "train.log_interval=5",
           "train.eval_interval=5", "train.eval_iters=4", "data.val_fraction=0.2", "train.patience=0",
           "train.ckpt_interval=1000", "train.sample_prompt=''"]


def doctor(run_dir: Path, *extra: str) -> dict:
    cp = wb("doctor", run_dir.name, "--runs-dir", str(run_dir.parent), "--json", *extra, check=True)
    return json.loads(cp.stdout)


def by_code(report: dict) -> dict[str, dict]:
    return {f["code"]: f for f in report["findings"]}


def apply(finding: dict, root: Path, name: str) -> Path:
    """Run the finding's own command (a new run of the run's preset with the change), named ``name``."""
    args = shlex.split(finding["command"])
    assert args[:2] == ["workbench", "train"], finding["command"]
    wb(*args[1:], "--name", name, "--runs-dir", str(root), check=True)
    return root / name


def test_a_healthy_run_reports_nothing(trained_run):
    r = doctor(trained_run)
    assert r["ok"] is True and r["findings"] == [], r["findings"]
    out = wb("doctor", trained_run.name, "--runs-dir", str(trained_run.parent), check=True).stdout
    assert "no problems found" in out.splitlines()[0]


def test_overfitting_is_found_and_gone_with_dropout_and_fewer_steps(tmp_path):
    import textwrap as source  # any small text will do: the start of a standard-library module
    corpus = tmp_path / "small.txt"
    corpus.write_text(Path(source.__file__).read_text()[:4000])
    root = tmp_path / "runs"
    wb("train", "cpu-small", "--name", "of", "--runs-dir", str(root), "--corpus", str(corpus),
       *tiny(*OVERFIT, "train.max_iters=100"), check=True)
    f = by_code(doctor(root / "of"))["overfitting.gap"]
    assert f["set"]["model.dropout"] == 0.1 and 5 < f["set"]["train.max_iters"] < 100
    assert "(best)" in f["evidence"][0] and "gap (val - train)" in f["evidence"][1]
    assert any("model.n_layers=1" in a for a in f["also"])  # a smaller model, with its numbers
    # the change applied; evals every 2 steps (no part of the change) so that a run this short is judged
    fixed = root / "of-fixed"
    wb(*shlex.split(f["command"])[1:], "train.eval_interval=2", "--name", fixed.name, "--runs-dir", str(root),
       check=True)
    r = doctor(fixed)
    assert "overfitting.gap" not in by_code(r), by_code(r).get("overfitting.gap")
    assert not any("overfitting" in n for n in r["notes"])


def test_nan_steps_are_found_with_a_lower_learning_rate(tmp_path):
    root = tmp_path / "runs"
    wb("train", "cpu-small", "--name", "nan", "--runs-dir", str(root),
       *tiny("train.max_iters=12", "train.eval_interval=6", "train.lr=1e-3"), env={"WORKBENCH_TEST_NAN_STEPS": "5,6"},
       check=True)
    f = by_code(doctor(root / "nan"))["unstable.nonfinite"]
    assert f["data"]["steps"] == [5, 6] and "steps 5, 6" in f["evidence"][0]
    assert f["set"]["train.lr"] == 0.0005  # the run's 1e-3, halved
    assert f["command"].startswith("workbench train ") and "--set train.lr=0.0005" in f["command"]


def test_memory_headroom_is_what_fit_would_choose_and_gone_when_applied(tmp_path):
    root = tmp_path / "runs"
    wb("train", "cpu-small", "--name", "mem", "--runs-dir", str(root),
       *tiny("train.batch_size=1", "train.grad_accum=8", "train.max_iters=6", "train.eval_interval=6"), check=True)
    f = by_code(doctor(root / "mem"))["memory.headroom"]
    assert f["set"] == {"train.batch_size": 8, "train.grad_accum": 1}  # the same 8 sequences a step
    assert "batch_size 1 x grad_accum 8" in " ".join(f["evidence"])
    assert "memory.headroom" not in by_code(doctor(apply(f, root, "mem-fixed")))


def test_a_competing_process_is_named_with_its_pid(tmp_path):
    root = tmp_path / "runs"
    wb("train", "cpu-small", "--name", "busy", "--runs-dir", str(root), "--detach", *tiny("train.max_iters=5000"),
       check=True)
    hogs: list[subprocess.Popen] = []
    try:
        assert wait_running(root / "busy", 2).state == "running"
        # a spinning process a core, each seen spinning (a second of CPU) before the doctor looks: under CI's
        # load a hog half a second old had not yet taken its share (one for two cores fell under the rule's 25 %;
        # two a core were each under the 3 % a process needs to be named)
        import psutil
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
        for h in hogs:
            p = psutil.Process(h.pid)
            wait_until(lambda p=p: sum(p.cpu_times()[:2]) >= 1.0, 60, f"hog {h.pid} spinning")
        r = doctor(root / "busy", "--interval", "1.5")
    finally:
        for h in hogs:
            h.kill()
            h.wait()
        wb("stop", "busy", "--runs-dir", str(root))
    f = by_code(r).get("slow.busy_cpu")
    assert f is not None, (r["state"], r.get("activity"), r.get("notes"), sorted(by_code(r)))
    named = {p["pid"] for p in f["data"]["processes"]}
    assert named & {h.pid for h in hogs}, f
    assert r["activity"]["run_share"] > 0 and r["state"] == "running"
    # the evidence lists the busiest five by pid; a quiet machine has the spinning ones at the top
    assert "busiest: pid " in f["evidence"][1] and f["change"].startswith("stop pid ")
