"""workbench fit: the search, tokens per step kept constant, the CPU fit end to end, the probe."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.commands import fit
from workbench.config import load_preset_file, resolve_preset
from workbench.errors import WorkbenchError
from workbench.machine.detect import Machine
from workbench.plan.fit.batch import plan_accumulation, search_batch
from workbench.plan.settings import resolve_settings
from workbench.train.batch_probe import Prober
from workbench.train.runtime import is_oom

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("threshold", [1, 2, 3, 7, 8, 24, 63, 100])
@pytest.mark.parametrize("start", [1, 16])
def test_search_finds_the_largest_size_that_fits(threshold, start):
    best, tried = search_batch(lambda b: b <= threshold, cap=100, start=start)
    assert best == threshold
    assert len(tried) <= 16  # doubling then bisection, not a linear scan
    assert all(ok == (b <= threshold) for b, ok in tried)


def test_search_reports_nothing_fits():
    best, tried = search_batch(lambda b: False, cap=64, start=8)
    assert best == 0 and tried[-1] == (1, False)


@pytest.mark.parametrize("seqs", [1, 6, 24, 64, 96, 97, 128])
@pytest.mark.parametrize("max_batch", [1, 3, 5, 8, 13, 32, 200])
def test_plan_keeps_tokens_per_step(seqs, max_batch):
    b, a, note = plan_accumulation(seqs, max_batch)
    assert 1 <= b <= max(1, max_batch)
    if not note:
        assert b * a == seqs  # exactly the same tokens per optimizer step
    else:
        assert f"{b} x {a} = {b * a}" in note  # and it says so when it cannot be exact
    if seqs % max_batch == 0 or max_batch >= seqs:
        assert b == min(seqs, max_batch) and not note


def _args(tmp_path, **kw):
    d = dict(preset="cpu-small", overrides=[], init_from=None, runs_dir=tmp_path / "runs", out=None, device="cpu",
             margin=0.1, steps=2, force=False)
    d.update(kw)
    return argparse.Namespace(**d)


def test_cpu_fit_writes_new_preset_with_same_tokens_per_step(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORKBENCH_PRESETS_DIR", str(tmp_path))
    # 4096 x 256 tokens x 8192 vocab cannot fit in RAM as one micro-batch (~140 GB of logits)
    over = ["train.batch_size=4096", "train.grad_accum=1"]
    src = resolve_preset("cpu-small", over)
    assert fit.run(_args(tmp_path, overrides=over)) == 0
    out = tmp_path / "cpu-small-fit.toml"
    new = load_preset_file(out)
    assert new.name == "cpu-small-fit"
    assert new.train.batch_size < 4096 and new.train.grad_accum > 1
    text = capsys.readouterr().out
    assert "wrote" in text and "tokens per step" in text
    # the largest exact split of 4096 sequences at or below the largest batch that fits
    best = int(re.search(r"largest micro-batch that fits: (\d+)", text).group(1))
    assert new.train.batch_size == max(d for d in range(1, best + 1) if 4096 % d == 0) > 1, (new.train, best)
    assert new.tokens_per_step() == src.tokens_per_step()
    assert new.model == src.model and new.data == src.data
    assert out.read_text().startswith("# Written by `workbench fit cpu-small`")
    # never over an existing file without --force
    with pytest.raises(WorkbenchError, match="already exists"):
        fit.run(_args(tmp_path, overrides=over))
    assert fit.run(_args(tmp_path, overrides=over, force=True)) == 0


def test_fit_never_writes_over_its_source(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_PRESETS_DIR", str(tmp_path))
    src = tmp_path / "mine.toml"
    src.write_text((ROOT / "presets" / "cpu-small.toml").read_text().replace('"cpu-small"', '"mine"'))
    with pytest.raises(WorkbenchError, match="being fitted"):
        fit.run(_args(tmp_path, preset="mine", out="mine", force=True))
    with pytest.raises(WorkbenchError, match="not allowed"):
        fit.run(_args(tmp_path, out="../escape"))


def test_oom_messages_are_recognised():
    assert is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_oom(RuntimeError("MPS backend out of memory (MPS allocated: 17.00 GB)"))
    import torch
    assert is_oom(torch.OutOfMemoryError("boom"))
    assert not is_oom(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


def test_probe_runs_real_steps_on_cpu():
    p = resolve_preset("cpu-small", ["model.dim=64", "model.n_layers=1", "model.vocab_size=256",
                                     "model.seq_len=32", "model.n_heads=4", "model.n_kv_heads=2"])
    prober = Prober(p, resolve_settings(p, Machine(), world_size=1))
    r = prober.trial(4, steps=2)
    assert r["ok"] and not r["oom"] and r["tokens_per_s"] > 0


def test_the_probe_of_packed_conversations_runs_the_masked_attention(tmp_path):
    """With packed conversations the probe's rows hold four, positions restarting in each (the trainer's mask)."""
    import torch

    from tests.support.chat import conversations, write_jsonl
    from workbench.train.batch_probe import packed_inputs
    got = packed_inputs(3, 32, torch.device("cpu"))
    assert got["segments"].shape == got["positions"].shape == (3, 32)
    assert got["segments"][0].tolist() == [i // 8 for i in range(32)]
    assert got["positions"][2].tolist() == [i % 8 for i in range(32)]
    chat = str(write_jsonl(tmp_path / "chat.jsonl", conversations(5, seed=0)))
    p = resolve_preset("cpu-small", ["model.dim=64", "model.n_layers=1", "model.vocab_size=256", "model.seq_len=32",
                                     "model.n_heads=4", "model.n_kv_heads=2", f"data.corpus={chat}"])
    s = resolve_settings(p, Machine(), world_size=1)
    assert s.packed
    r = Prober(p, s).trial(4, steps=2)
    assert r["ok"] and not r["oom"] and r["tokens_per_s"] > 0


def _cli(*argv, env=None):
    return subprocess.run([sys.executable, "-m", "workbench", *argv], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120)


def test_cli_fit_bad_input_is_one_line(tmp_path):
    env = dict(os.environ, WORKBENCH_PRESETS_DIR=str(tmp_path))
    r = _cli("fit", "cpu-small", "--device", "cpu", "--margin", "2", env=env)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "--margin" in r.stderr
    r = _cli("fit", "no-such-preset", env=env)
    assert r.returncode == 2 and "unknown preset" in r.stderr


def test_cli_fit_writes_a_preset_at_the_largest_batch_that_fits(tmp_path):
    """`workbench fit` end to end on this CPU: the search ends within one step (the batch it reports fits,
    one more does not), each trial's verdict is the memory estimate against the RAM it names, and the
    preset written keeps the tokens per step with the largest exact split at or below that batch."""
    from workbench.fmt import human_bytes
    from workbench.machine.probe import this_machine
    from workbench.plan.fit.memory import estimate_memory, what_if
    env = dict(os.environ, WORKBENCH_PRESETS_DIR=str(tmp_path))
    # ~104 GiB in one micro-batch: cannot fit. compile off: `auto` decides from this CPU's matmul rate, measured
    # in each process, and a load that flips it between the CLI and this test moves every estimate by ~0.1 GiB
    over = ["train.batch_size=4096", "train.grad_accum=1", "hardware.compile=false"]
    r = _cli("fit", "cpu-small", "--device", "cpu", "--set", *over, env=env)
    assert r.returncode == 0, r.stderr
    trials = {int(b): (shown, verdict == "fits")
              for b, shown, verdict in re.findall(r"batch\s+(\d+): estimate (.+?) (fits|too big)", r.stdout)}
    m = re.search(r"largest micro-batch that fits: (\d+) \(estimate against ([\d.]+) GiB available RAM "
                  r"\(keeping 10% free\)\)", r.stdout)
    assert m and trials, r.stdout
    best, ram = int(m.group(1)), float(m.group(2)) * 2**30
    assert 1 < best < 4096
    # within one step of the search: best fits, best + 1 was tried and does not
    assert trials[best][1] and not trials[best + 1][1], trials
    assert all(ok == (b <= best) for b, (_shown, ok) in trials.items()), trials  # one threshold
    # each verdict is the estimate at that batch against 90 % of the RAM (given to 3 figures)
    src = what_if(resolve_preset("cpu-small", over), device="cpu")
    machine = this_machine()

    def estimate(b: int) -> float:
        settings = resolve_settings(what_if(src, batch_size=b), machine, world_size=1)
        return estimate_memory(src, settings=settings).total

    for b, (shown, _ok) in trials.items():
        assert shown == human_bytes(estimate(b)), (b, shown)
    assert estimate(best) <= 0.9 * (ram + 0.05 * 2**30) and estimate(best + 1) > 0.9 * (ram - 0.05 * 2**30)
    new = load_preset_file(tmp_path / "cpu-small-fit.toml")
    b, a = new.train.batch_size, new.train.grad_accum
    assert b * a == 4096 and b == max(d for d in range(1, best + 1) if 4096 % d == 0), (b, a, best)
    assert f"Largest micro-batch that fits: {best} (" in (tmp_path / "cpu-small-fit.toml").read_text()


def test_cli_hw_json_and_estimate_json():
    r = _cli("hw", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert "nvidia" in info and info["recommendation"]["preset"]
    r = _cli("estimate", "cpu-small", "--json", "--no-calibrate", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["params"]["total"] == 5048832  # with QK-norm: 4 layers x 2 x head_dim 32 more than plain
    assert rep["memory"]["total"] > rep["memory"]["peak_allocated"] > 0
    r = _cli("estimate", "cpu-small", "--set", "train.batch_size=0")
    assert r.returncode == 2 and "batch_size" in r.stderr
