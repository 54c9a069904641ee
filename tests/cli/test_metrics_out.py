"""`workbench metrics`: CSV of the train/eval records, TensorBoard event files converted after the fact."""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
from pathlib import Path

import pytest

from tests.support.cli import wb
from tests.support.runs import read_jsonl
from workbench.commands.metrics import COLUMNS

REPO = Path(__file__).resolve().parents[2]


def records(run: Path) -> list[dict]:
    return [r for r in read_jsonl(run / "metrics.jsonl") if r.get("kind") in ("train", "eval")]


def parse(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text)))


def same(cell: str, value) -> bool:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return cell == ""
    if isinstance(value, float):
        return float(cell) == value  # repr() round-trips exactly
    return cell == str(value)


def test_csv_has_every_train_and_eval_record(trained_run):
    cp = wb("metrics", str(trained_run), "--csv")
    assert cp.returncode == 0, cp.stderr
    rows = parse(cp.stdout)
    recs = records(trained_run)
    assert len(rows) == len(recs) == sum(r["kind"] == "train" for r in recs) + sum(r["kind"] == "eval" for r in recs)
    assert list(rows[0].keys())[:len(COLUMNS)] == COLUMNS
    assert {r["kind"] for r in rows} == {"train", "eval"}  # events are left out
    for row, rec in zip(rows, recs):
        for k, v in rec.items():
            assert same(row[k], v), (k, row[k], v)
        for k in set(row) - set(rec):
            assert row[k] == ""


def test_csv_out_file_equals_stdout(trained_run, tmp_path):
    out = tmp_path / "m.csv"
    cp = wb("metrics", str(trained_run), "--csv", "--out", str(out))
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout == ""
    assert out.read_text() == wb("metrics", str(trained_run), "--csv").stdout


def test_csv_odd_records(tmp_path):
    """None and non-finite values → empty cells; unknown keys become extra columns; a half line is skipped."""
    run = tmp_path / "r"
    run.mkdir()
    (run / "preset.toml").write_text("")
    lines = [{"kind": "eval", "step": 0, "train_loss": 5.0, "val_loss": 5.25, "time": 1.0},
             {"kind": "event", "event": "start", "step": 0},
             {"kind": "train", "step": 1, "loss": None, "lr": 1e-3, "grad_norm": None, "custom": "x,y"},
             {"kind": "train", "step": 2, "loss": 4.5, "lr": 2e-3, "nested": {"a": 1}}]
    text = "\n".join(json.dumps(x) for x in lines) + '\n{"kind": "train", "step": 3, "lo'
    (run / "metrics.jsonl").write_text(text)
    cp = wb("metrics", str(run), "--csv")
    assert cp.returncode == 0, cp.stderr
    rows = parse(cp.stdout)
    assert [(r["kind"], r["step"]) for r in rows] == [("eval", "0"), ("train", "1"), ("train", "2")]
    assert rows[1]["loss"] == "" and rows[1]["custom"] == "x,y" and rows[1]["val_loss"] == ""
    assert rows[2]["nested"] == '{"a":1}' and float(rows[2]["loss"]) == 4.5


def test_tensorboard_event_files(trained_run, tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is optional (pip install tensorboard)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    run = tmp_path / "runs" / "r"
    shutil.copytree(trained_run, run)
    for _ in range(2):  # idempotent: the second conversion replaces the first
        cp = wb("metrics", "r", "--tensorboard", "--runs-dir", str(tmp_path / "runs"))
        assert cp.returncode == 0, cp.stderr
        assert "tensorboard --logdir" in cp.stdout
    files = list((run / "tb").iterdir())
    assert len(files) == 1 and files[0].name.startswith("events.out.tfevents.")
    assert not [p for p in run.iterdir() if p.name.startswith(".tb")]
    ea = EventAccumulator(str(run / "tb"))
    ea.Reload()
    recs = records(run)
    train = [r for r in recs if r["kind"] == "train" and r.get("loss") is not None]
    evals = [r for r in recs if r["kind"] == "eval"]
    got = [(e.step, e.value) for e in ea.Scalars("train/loss")]
    assert got == [(r["step"], pytest.approx(r["loss"], rel=1e-6)) for r in train]
    assert [(e.step, e.value) for e in ea.Scalars("eval/val_loss")] == \
        [(r["step"], pytest.approx(r["val_loss"], rel=1e-6)) for r in evals]
    assert {"train/lr", "eval/train_loss", "perf/tokens_per_s"} <= set(ea.Tags()["scalars"])


def test_tensorboard_missing_says_how_to_install(trained_run, tmp_path):
    # A `tensorboard` that cannot be imported, first on the path.
    fake = tmp_path / "shadow" / "tensorboard"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no tensorboard here')\n")
    run = tmp_path / "runs" / "r"
    shutil.copytree(trained_run, run)
    cp = wb("metrics", "r", "--tensorboard", "--runs-dir", str(tmp_path / "runs"),
            env={"PYTHONPATH": f"{tmp_path / 'shadow'}:{REPO}"})
    lines = cp.stderr.strip().splitlines()
    assert cp.returncode == 2, cp.stderr
    assert len(lines) == 1 and lines[0].startswith("workbench: error: ") and "pip install tensorboard" in lines[0]
    assert not (run / "tb").exists()


@pytest.mark.parametrize("args,message", [
    (["--csv", "--out", "{ws}/nodir/m.csv"], "cannot write"),
    (["--tensorboard", "--out", "x.csv"], "--out goes with --csv"),
    (["--csv"], "has no metrics.jsonl yet"),
])
def test_metrics_bad_input(tmp_path, trained_run, args, message):
    ws = tmp_path / "ws"
    run = ws / "runs" / "r"
    shutil.copytree(trained_run, run)
    if message == "has no metrics.jsonl yet":
        (run / "metrics.jsonl").unlink()
    before = sorted(str(p) for p in ws.rglob("*"))
    cp = wb("metrics", "r", *[a.format(ws=ws) for a in args], "--runs-dir", str(ws / "runs"), cwd=ws)
    lines = cp.stderr.strip().splitlines()
    assert cp.returncode == 2, cp.stderr
    assert len(lines) == 1 and lines[0].startswith("workbench: error: ") and message in lines[0], cp.stderr
    assert sorted(str(p) for p in ws.rglob("*")) == before
