"""What earlier runs measured, for the estimate: a run that trained beside other processes is not this machine's
speed while a quiet one exists, and when it is the only one the estimate says so."""

from __future__ import annotations

import json
import os
import shutil

from tests.support.cli import TINY, wb
from workbench.analysis.history import previous_run
from workbench.config import resolve_preset


def _as_if(run_dir, share: float, slower: float = 1.0) -> None:
    """The run's start as its calibration records it with other processes using ``share`` of the CPU (what they
    used when the test ran is the other test worker's business), its steps ``slower`` times slower."""
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("event") == "start":
            r["calibration"] = dict(r.get("calibration") or {}, others_busy=share)
        if r.get("kind") == "train" and r.get("tokens_per_s"):
            r["tokens_per_s"] /= slower
        out.append(json.dumps(r))
    (run_dir / "metrics.jsonl").write_text("\n".join(out) + "\n")


def test_a_run_measured_beside_other_processes_gives_way_to_a_quiet_one_and_says_so_alone(tmp_path):
    runs = tmp_path / "runs"
    wb("train", "cpu-small", "--runs-dir", str(runs), "--name", "quiet", "--set", *TINY, "train.max_iters=8",
       check=True)
    _as_if(runs / "quiet", 0.0)
    p = resolve_preset(str(runs / "quiet" / "preset.toml"))
    quiet = previous_run(p, runs, "cpu")
    assert quiet["run"] == "quiet" and quiet["others_busy"] == 0.0
    # a newer run of the same preset that started with other processes using 45 % of the CPU, 3x slower
    shutil.copytree(runs / "quiet", runs / "busy")
    _as_if(runs / "busy", 0.45, 3.0)
    later = (runs / "quiet" / "metrics.jsonl").stat().st_mtime + 60
    os.utime(runs / "busy" / "metrics.jsonl", (later, later))
    assert previous_run(p, runs, "cpu")["run"] == "quiet"         # newer, but not this machine's speed
    est = json.loads(wb("estimate", str(runs / "quiet" / "preset.toml"), "--runs-dir", str(runs), "--json",
                        check=True).stdout)
    assert est["previous_run"]["run"] == "quiet" and est["tokens_per_s_basis"] == "measured"
    # the busy run alone: used (the best there is) and labelled
    shutil.rmtree(runs / "quiet")
    busy = previous_run(p, runs, "cpu")
    assert busy["run"] == "busy" and busy["tokens_per_s"] < quiet["tokens_per_s"] / 2
    est = json.loads(wb("estimate", str(runs / "busy" / "preset.toml"), "--runs-dir", str(runs), "--json",
                        check=True).stdout)
    assert est["tokens_per_s_basis"] == "measured beside other processes"
    assert "started with other processes using 45% of the CPU" in est["tokens_per_s_source"]
