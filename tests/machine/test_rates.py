"""The matmul rates kept per machine (workbench.machine.rates): the best measured is the peak, a figure
measured only beside busy processes is uncertain until a quiet one confirms or beats it, and the estimates
that cannot load torch (`estimate --no-calibrate`, the TUI's new-run form) use the cached peak, labelled."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import tiny, wb
from workbench.machine import rates
from workbench.machine.detect import calibration, detect, machine_identity
from workbench.machine.rates import Calibration, best_rates, known_rates, rate_key, remember, settle

QUIET, BUSY = 0.05, 0.8   # other processes' share of the CPU while measuring


def _settle(measured: float, busy: float, known: dict | None) -> tuple[Calibration, dict]:
    return settle("cpu", "fp32", 2, measured, busy, known)


def test_the_peak_is_the_best_rate_measured_and_load_never_lowers_it():
    cal, entry = _settle(200e9, QUIET, None)                     # first, quiet: the peak
    assert (cal.flops, cal.uncertain, entry["busy"]) == (200e9, False, False)
    cal, after = _settle(51e9, BUSY, entry)                      # beside a hog: the peak stays
    assert (cal.flops, cal.measured, cal.best_before, cal.uncertain) == (200e9, 51e9, 200e9, False)
    assert after == entry
    assert cal.describe() == ("200.0 GFLOP/s, the best fp32 matmul rate measured on this machine "
                              "(51.0 GFLOP/s now, with other processes using 80% of the CPU)")
    cal, after = _settle(210e9, QUIET, entry)                    # a better one raises it
    assert (cal.flops, after["flops"]) == (210e9, 210e9)
    assert cal.describe() == "210.0 GFLOP/s, this machine's fp32 matmul rate (210.0 GFLOP/s now)"


def test_a_peak_measured_only_beside_busy_processes_is_uncertain_until_a_quiet_one():
    cal, entry = _settle(51e9, BUSY, None)                       # nothing better known: say so
    assert cal.uncertain and entry["busy"]
    assert "uncertain, MFU may read high" in cal.describe() and "80% of the CPU" in cal.describe()
    cal, entry2 = _settle(60e9, BUSY, entry)                     # busy again, higher: still uncertain
    assert (cal.flops, cal.uncertain) == (60e9, True)
    cal, confirmed = _settle(57e9, QUIET, entry2)                # quiet and within 10 %: confirmed
    assert (cal.flops, cal.uncertain, confirmed["busy"]) == (60e9, False, False)
    cal, _ = _settle(40e9, QUIET, entry2)                        # quiet but far below: the best stays uncertain
    assert (cal.flops, cal.uncertain) == (60e9, True)
    cal, raised = _settle(197e9, QUIET, entry2)                  # quiet and above: the new peak, certain
    assert (cal.flops, cal.uncertain, raised["busy"]) == (197e9, False, False)
    cal, _ = _settle(250e9, BUSY, raised)                        # busy, yet above a quiet best: near the peak
    assert (cal.flops, cal.uncertain) == (250e9, False)


def test_the_cache_keeps_each_machine_and_thread_count_apart(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path))
    me = machine_identity()
    assert me.count(";") == 2 and "logical cores" in me and "torch " in me
    assert calibration() == {} and detect()["calibration"] == {}
    remember(me, rate_key("cpu", "fp32", 1), {"flops": 120e9, "busy": False})
    remember(me, rate_key("cpu", "fp32", 2), {"flops": 100e9, "busy": False})   # a run's default: every core
    remember(me, rate_key("mps", "bf16"), {"flops": 3e12, "busy": False})
    remember("Another CPU; 64 logical cores; torch 2.5.0", rate_key("cpu", "fp32", 64), {"flops": 2e12})
    assert set(known_rates(me)) == {"cpu:fp32:1t", "cpu:fp32:2t", "mps:bf16"}
    assert best_rates(me) == {"cpu:fp32": 100e9, "mps:bf16": 3e12}
    assert detect()["calibration"] == {"cpu:fp32": 100e9, "mps:bf16": 3e12}
    (tmp_path / rates.RATES_FILE).write_text("{not json")           # a broken cache is an empty one
    assert calibration() == {}
    remember(me, "cpu:fp32:2t", {"flops": 1e11, "busy": False})       # and is rewritten
    assert json.loads((tmp_path / rates.RATES_FILE).read_text())[me]["cpu:fp32:2t"]["flops"] == 1e11


@pytest.fixture
def no_runs(tmp_path):
    (tmp_path / "runs").mkdir()
    return tmp_path / "runs"


def test_estimate_without_torch_uses_the_cached_rate_and_says_so(tmp_path, no_runs):
    """`workbench estimate --no-calibrate` with no previous run: the time from this machine's cached matmul rate,
    labelled; with nothing cached, unknown, and what to do about it."""
    cache = tmp_path / "cache"
    args = ("estimate", "cpu-small", "--no-calibrate", "--device", "cpu", "--runs-dir", str(no_runs))
    r = wb(*args, env={"WORKBENCH_CACHE_DIR": str(cache)}, check=True)
    assert ("throughput: unknown (no previous run of this preset here, and no matmul rate measured on this machine: "
            "leave out --no-calibrate, or give --tokens-per-s)") in r.stdout, r.stdout
    assert "time to max_iters" not in r.stdout

    cache.mkdir(exist_ok=True)
    (cache / rates.RATES_FILE).write_text(json.dumps(
        {machine_identity(): {"cpu:fp32:2t": {"flops": 100e9, "busy": False}}}))
    r = wb(*args, "--json", env={"WORKBENCH_CACHE_DIR": str(cache)}, check=True)
    out = json.loads(r.stdout)
    assert out["settings"]["peak_flops"] == 100e9 and out["previous_run"] is None
    assert out["tokens_per_s_basis"] == "estimate from this machine's measured matmul rate"
    assert out["tokens_per_s_source"].startswith("estimate: 0.1 TFLOP/s (this machine's measured matmul rate) x 50% "
                                                 "assumed efficiency"), out["tokens_per_s_source"]
    assert out["tokens_per_s"] == pytest.approx(100e9 * 0.5 / out["flops_per_token"])
    assert out["time"]["total_s"] > 0


def test_a_budgeted_train_plans_at_the_peak_kept_for_its_threads_and_imports_torch_only_to_measure(
        tmp_path, monkeypatch, shared_cache):
    """`train --time-budget` needs this machine's speed for its first line (the steps the budget buys). Where a
    peak is kept for the threads the trainer will use (here OMP_NUM_THREADS) it plans at that one without loading
    torch (1.3 s of CPU at every budgeted start: each trial of a sweep); where none is, it measures and keeps it."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (shared_cache / "data").mkdir(exist_ok=True)
    (cache / "data").symlink_to(shared_cache / "data", target_is_directory=True)
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(cache))
    here = machine_identity()
    remember(here, rate_key("cpu", "fp32", 1), {"flops": 2e6, "busy": False, "others_busy": 0.0, "at": 0})
    runs = tmp_path / "runs"

    def train(threads: int, budget: str):
        return wb("train", "cpu-small", "--detach", "--time-budget", budget, "--name", f"t{threads}", "--runs-dir",
                  str(runs), *tiny(), env={"OMP_NUM_THREADS": str(threads), "PYTHONPROFILEIMPORTTIME": "1"},
                  fresh=True)

    def imported_torch(cp) -> bool:
        return any(line.split("|")[-1].strip() == "torch" for line in cp.stderr.splitlines())

    # one thread: the kept 2 MFLOP/s buys nothing in a minute, so the run is refused before anything starts
    cp = train(1, "1m")
    assert cp.returncode == 2 and "budget buys ~0 steps here" in cp.stderr, cp.stderr[-2000:]
    assert not imported_torch(cp) and not (runs / "t1").exists()
    # two threads: nothing kept for them, so this machine's rate is measured (torch loaded) and kept
    cp = train(2, "2s")
    assert imported_torch(cp), cp.stdout + cp.stderr[-300:]
    assert known_rates(here)[rate_key("cpu", "fp32", 2)]["flops"] > 1e9
    if cp.returncode == 0:  # the measured rate buys a run: it started, and ends at its 2 s budget
        wb("stop", "t2", "--runs-dir", str(runs))
    else:
        assert "budget buys" in cp.stderr, cp.stderr[-2000:]
