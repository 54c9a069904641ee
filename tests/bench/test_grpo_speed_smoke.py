"""bench/grpo_speed.py --quick runs for real: a tiny model pretrained and exported through the CLI, TRL's
GRPOTrainer and workbench's GRPO step interleaved, and the table with both sides' columns."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_quick_bench_times_both_sides(tmp_path):
    cp = subprocess.run([sys.executable, str(ROOT / "bench" / "grpo_speed.py"), "--quick", "--out", str(tmp_path)],
                        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    out = cp.stdout
    assert "| side" in out and "s / step" in out and "completions / s" in out and "generation share" in out
    rows = {line.split("|")[1].strip(): line.split("|")[2:5] for line in out.splitlines()
            if line.startswith("| TRL") or line.startswith("| workbench")}
    assert set(rows) == {"TRL GRPOTrainer", "workbench"}
    for step, cps, share in rows.values():
        assert float(step) > 0 and float(cps) > 0 and 0 < float(share.strip().rstrip("%")) <= 100
    assert "workbench speed-up (TRL s / workbench s, paired): median" in out
    assert (tmp_path / "hf" / "model.safetensors").is_file()     # TRL loaded the export
