"""A full fine-tune's precomputed reference (train.pref_reference, workbench/train/reference.py), on real tiny runs
from a chat-tuned run: the table equals a live computation; a run with it trains as the frozen copy's does (ln 2
and zero rewards at step 0, the same losses); a corrupted, truncated or wrong table is refused at start with one
line; kill -9 and resume is bitwise and computes nothing again; the estimate drops the frozen copy's bytes."""

from __future__ import annotations

import json
import math
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support.chat import conversations, pair_records, write_jsonl
from tests.support.cli import tiny, wb
from tests.support.runs import losses, read_jsonl
from workbench import rundir

LN2 = math.log(2)
STEPS = ["model.seq_len=64", "train.eval_interval=4", "train.ckpt_interval=4", "train.eval_iters=1",
         "train.objective=dpo", "train.lr=3e-3"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A runs directory with a chat-tuned run (sft) and 120 pairs of its task."""
    root = tmp_path_factory.mktemp("ref-runs")
    chats = write_jsonl(root.parent / "chats.jsonl", conversations(200, seed=2))
    pairs = write_jsonl(root.parent / "pairs.jsonl", pair_records(120))
    wb("train", "cpu-small", "--name", "sft", "--corpus", str(chats), "--runs-dir", str(root),
       *tiny("model.seq_len=64", "train.eval_iters=1", "train.max_iters=24", "train.eval_interval=24",
             "train.ckpt_interval=24", "train.lr=3e-3"), check=True)
    return {"root": root, "pairs": pairs}


def train(base, name, *sets, env=None):
    return wb("train", "cpu-small", "--init-from", "sft", "--name", name, "--corpus", str(base["pairs"]),
              "--runs-dir", str(base["root"]), *tiny(*STEPS, *sets), env=env)


def start_of(run_dir):
    return next(r for r in read_jsonl(run_dir / rundir.METRICS_FILE) if r.get("event") == "start")


def prefs(run_dir):
    return [r for r in read_jsonl(run_dir / rundir.METRICS_FILE) if r.get("kind") == "pref" and r["split"] == "train"]


def table_of(run_dir):
    """The table a run used, and its sidecar (from the path its start record states)."""
    why = start_of(run_dir)["objective"]["reference_why"]
    path = Path(why.split("cached in ")[1].split("; ")[0])
    return path, path.with_suffix(".json")


@pytest.fixture(scope="module")
def pair_runs(base):
    """The same DPO run twice: with a frozen copy (live) and precomputed (auto, a full fine-tune's default)."""
    out = {}
    for name, ref in (("copy", "live"), ("pre", "auto")):
        cp = train(base, name, f"train.pref_reference={ref}", "train.max_iters=6")
        assert cp.returncode == 0, (cp.stdout, cp.stderr)
        out[name] = cp
    return out


def test_precomputed_table_equals_a_live_reference(base, pair_runs):
    """64 random rows of the table against the frozen copy's own forward (objective.Reference, the live path)."""
    d = base["root"] / "pre"
    assert "reference: precomputed (240 answers, cached in " in pair_runs["pre"].stdout
    assert "computing the log-prob of each of 240 answers once" in pair_runs["pre"].stdout
    assert "reference: frozen copy" in pair_runs["copy"].stdout
    obj = start_of(d)["objective"]
    assert obj["reference"] == "precomputed" and obj["reference_why"].startswith("240 answers, cached in ")
    assert "run sft step 24's log-probs, computed once before training; no second copy" in obj["reference_why"]
    path, side = table_of(d)
    assert path.parent.name.startswith("pairs-") and json.loads(side.read_text())["rows"] == 240

    from workbench.config import load_preset_file
    from workbench.data.preset_data import prepare_data
    from workbench.train.checkpoint import load_init_weights
    from workbench.train.model import GPT
    from workbench.train.objective import Reference
    p = load_preset_file(d / rundir.PRESET_FILE)
    frozen = GPT(p.model)
    frozen.load_state_dict(load_init_weights(d))
    frozen.eval()
    data = prepare_data(p.data, p.model.vocab_size, p.model.seq_len, log=lambda m: None, run_dir=d,
                        objective="dpo")
    table = np.fromfile(path, dtype="<f4")
    rows = np.random.default_rng(7).choice(len(table), 64, replace=False)
    x, y = data.rows(rows.tolist(), p.model.seq_len)
    live = Reference("frozen copy", frozen, frozen).logps(torch.from_numpy(x), torch.from_numpy(y)).numpy()
    assert np.abs(live - table[rows]).max() < 1e-3
    assert np.abs(table).min() > 0.1  # real log-probs, not zeros


def test_precomputed_trains_as_the_frozen_copy(base, pair_runs):
    """The same step-0 ln 2 and zero rewards, the same per-step losses (fp32 rounding apart)."""
    want, got = losses(base["root"] / "copy"), losses(base["root"] / "pre")
    assert len(want) == 6 and want.keys() == got.keys()
    for step in want:
        assert got[step] == pytest.approx(want[step], rel=1e-5, abs=1e-6), step
    ev = next(r for r in read_jsonl(base["root"] / "pre" / rundir.METRICS_FILE) if r.get("kind") == "eval")
    assert ev["step"] == 0 and ev["val_loss"] == pytest.approx(LN2, abs=1e-6)  # the eval batches read the table too
    first = prefs(base["root"] / "pre")[0]
    assert first["loss"] == pytest.approx(LN2, abs=1e-6)
    assert abs(first["chosen_reward"]) < 1e-6 and abs(first["rejected_reward"]) < 1e-6
    assert prefs(base["root"] / "pre")[-1]["margin"] > 0
    for a, b in zip(prefs(base["root"] / "copy"), prefs(base["root"] / "pre")):
        assert b["margin"] == pytest.approx(a["margin"], abs=1e-5) and b["accuracy"] == a["accuracy"]


@pytest.mark.parametrize("damage", ["flip", "truncate", "values"])
def test_a_damaged_table_is_refused_at_start(base, pair_runs, damage):
    """A byte flipped, the file cut short, or values that are not the reference's (a table with a valid digest
    made from something else): exit 2, one line naming the file and the fix; nothing trained."""
    path, side = table_of(base["root"] / "pre")
    keep = path.read_bytes(), side.read_bytes()
    try:
        raw = bytearray(keep[0])
        if damage == "flip":
            raw[100] ^= 0x40
            path.write_bytes(bytes(raw))
            said = "do not match the sha256 their sidecar recorded"
        elif damage == "truncate":
            path.write_bytes(bytes(raw[:-10]))
            said = "hold 237 rows"
        else:
            vals = np.frombuffer(bytes(raw), dtype="<f4") - 0.01  # every answer 0.01 nats off
            path.write_bytes(vals.astype("<f4").tobytes())
            import hashlib
            meta = json.loads(keep[1])
            meta["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
            side.write_text(json.dumps(meta))
            said = "do not match the reference model: answer"
        cp = train(base, f"bad-{damage}", "train.max_iters=4")
        assert cp.returncode == 2, (cp.stdout, cp.stderr)
        err = cp.stderr.strip()
        assert "\n" not in err and said in err and str(path) in err, err
        assert f"rm {path.with_suffix('')}.*" in err and "--set train.pref_reference=live" in err
        assert not losses(base["root"] / f"bad-{damage}")
    finally:
        path.write_bytes(keep[0])
        side.write_bytes(keep[1])


def test_kill_minus_nine_with_a_precomputed_reference_resumes_bitwise(base, pair_runs):
    """The table from the first run is used as it is: kill -9 at step 6, resume from step 4: every loss bit for
    bit, the table re-checked against the starting weights (loaded before the checkpoint's) and never rewritten."""
    sets = ["train.max_iters=10", "train.lr_decay_iters=10", "train.ckpt_interval=4", "train.eval_interval=10"]
    path, _side = table_of(base["root"] / "pre")
    made = path.stat().st_mtime_ns
    assert train(base, "straight", *sets).returncode == 0
    want = losses(base["root"] / "straight")
    cp = train(base, "killed", *sets, env={"WORKBENCH_TEST_KILL_AT_STEP": "6"})
    assert cp.returncode == -signal.SIGKILL
    d = base["root"] / "killed"
    res = wb("resume", "killed", "--runs-dir", str(base["root"]), check=True)
    assert "resumed from checkpoint step_0000004" in res.stdout
    assert "reference: precomputed (240 answers, cached in " in res.stdout
    assert losses(d) == want and len(want) == 10
    log = (d / rundir.LOG_FILE).read_text()
    assert "computing the log-prob" not in log and "step-0" not in log
    assert path.stat().st_mtime_ns == made


def test_a_lost_table_is_computed_again_on_resume_from_the_starting_weights(base, pair_runs, tmp_path):
    """The cache cleared between kill and resume: the resume computes the table again from init/model.pt (not
    from the checkpoint it resumes), so it equals the first one bit for bit."""
    path, side = table_of(base["root"] / "pre")
    first = path.read_bytes()
    cp = train(base, "lost", "train.max_iters=8", "train.ckpt_interval=4", env={"WORKBENCH_TEST_KILL_AT_STEP": "6"})
    assert cp.returncode == -signal.SIGKILL
    moved = tmp_path / "kept"
    moved.mkdir()
    for f in (path, side):
        shutil.move(f, moved / f.name)
    try:
        res = wb("resume", "lost", "--runs-dir", str(base["root"]), check=True)
        assert "computing the log-prob of each of 240 answers" in res.stdout
        assert path.read_bytes() == first
    finally:
        for f in (path, side):
            shutil.copy(moved / f.name, f)


def test_the_estimate_drops_the_frozen_copy(base):
    from workbench.config import resolve_preset
    from workbench.plan.fit.memory import estimate_memory
    preset = str(base["root"] / "sft" / rundir.PRESET_FILE)
    init = ["train.objective=dpo"]
    copy = estimate_memory(_with_init(resolve_preset(preset, [*init, "train.pref_reference=live"])))
    pre = estimate_memory(_with_init(resolve_preset(preset, init)))
    assert copy.reference == "frozen copy" and copy.components["reference"] == 4 * copy.params
    assert pre.reference == "precomputed" and pre.components["reference"] == 0
    assert copy.total - pre.total >= 4 * copy.params
    out = wb("estimate", "cpu-small", "--init-from", "sft", "--runs-dir", str(base["root"]),
             *tiny("model.seq_len=64", "train.objective=dpo"), check=True).stdout
    assert "reference: precomputed (" in out and "no second copy of the weights" in out


def _with_init(p):
    import dataclasses
    return dataclasses.replace(p, init={"run": "sft", "step": 24})


def test_kto_cannot_take_a_precomputed_reference(base):
    cp = wb("train", "cpu-small", "--init-from", "sft", "--name", "kto-pre", "--corpus", str(base["pairs"]),
            "--runs-dir", str(base["root"]), *tiny("train.objective=kto", "train.pref_reference=precompute"))
    assert cp.returncode == 2 and "\n" not in cp.stderr.strip()
    assert "train.pref_reference = precompute cannot serve kto" in cp.stderr
    assert not (base["root"] / "kto-pre").exists()
