"""The run doctor's rules on hand-written run directories and hardware snapshots: no torch, no hardware.

Each test writes a run as the trainer would (preset.toml, status.json, metrics.jsonl) with one problem
in it, and checks that the doctor finds exactly that, with the run's numbers and a change that fits.
The GPU cases (fp32 on an Ampere card, compile off on CUDA, a throttled or shared GPU, memory near
the card's limit) run on a snapshot of a machine that is not this one.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from tests.support.rundirs import RunDir
from workbench.analysis.doctor import diagnose, diagnose_run, read_run, report
from workbench.analysis.doctor.facts import RunFacts
from workbench.config import preset_to_toml, resolve_preset
from workbench.machine import activity
from workbench.machine.activity import Activity, GpuClocks, GpuProcess, HardwareSnapshot, ProcessUse

GiB = 2**30
TINY = ["model.dim=64", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2", "model.seq_len=32",
        "model.vocab_size=512", "train.batch_size=4", "train.warmup_iters=2", "train.max_iters=100",
        "train.eval_interval=20", "hardware.compile=false"]
CPU = {"cpu": {"physical_cores": 2, "logical_cores": 2, "ram_total": 16 * GiB, "ram_available": 12 * GiB,
               "native_bf16": False}, "nvidia": [], "mps": False, "cxx": True, "calibration": {"cpu:fp32": 2e10}}
RTX4060 = {"index": 0, "name": "NVIDIA GeForce RTX 4060", "vram_total": 8 * GiB, "vram_used": GiB,
           "vram_free": 7 * GiB, "compute_capability": "8.9"}
GPU = {**CPU, "nvidia": [RTX4060]}
GPU_RUN = {"preset": "gpu-8gb", "device": "cuda:0", "params": 103_000_000, "train_tokens": 10**9}


def snap(info=CPU, act: Activity | None = None) -> HardwareSnapshot:
    return HardwareSnapshot(info=info, activity=act)


def write_run(root: Path, rid: str, overrides=(), *, preset: str = "cpu-small", steps: int = 100,
              device: str = "cpu", precision: str = "fp32", compile_: bool = False, params: int = 131_392,
              train_tokens: int = 1_000_000, val_tokens: int = 50_000, state: str = "finished",
              loss=lambda s: 6.0 * math.exp(-s / 40) + 2.0, grad=lambda s: 1.0, tps=lambda s: 5000.0,
              mem=lambda s: 300.0, extra=lambda s: {}, evals=None, events=(), status=None, start=None) -> Path:
    """A run directory as the trainer writes it (tests.support.rundirs); every value a function of the step
    where it varies; ``events`` go before the first step after theirs."""
    p = resolve_preset(preset, [*TINY, *overrides] if preset == "cpu-small" else list(overrides))
    if evals is None:
        evals = [(s, loss(s), loss(s) + 0.05) for s in range(0, steps + 1, p.train.eval_interval)]
    ev = {s: (t, v) for s, t, v in evals}
    pending = sorted(events, key=lambda e: e["step"])
    with RunDir(root, rid, preset_to_toml(p)) as r:
        r.event("start", 0, device=device, precision=precision, compile=compile_, params=params,
                tokens_per_step=p.tokens_per_step(), train_tokens=train_tokens, val_tokens=val_tokens,
                corpus="builtin", peak_flops=2e10 if device == "cpu" else None, pid=1, world_size=1, **(start or {}))
        for s in range(1, steps + 2):
            while pending and (pending[0]["step"] < s or s > steps):
                e = dict(pending.pop(0))
                r.event(e.pop("event"), e.pop("step"), **e)
            if s > steps:
                break
            memory = ({"mem_rss_mb": mem(s), "mem_peak_rss_mb": mem(s)} if device == "cpu" else
                      {"mem_allocated_mb": mem(s), "mem_reserved_mb": mem(s) * 1.1})
            r.train(s, loss(s), lr=1e-3, grad_norm=grad(s), tokens_per_s=tps(s) if s > 1 else None,
                    tokens_seen=s * p.tokens_per_step(), elapsed_s=s * 0.1, skipped=0, time=1.7e9 + s,
                    mem_mb=mem(s), memory=memory, **extra(s))
            if s in ev:
                r.eval(s, *ev[s])
        r.status(**(status or {"state": state, "step": steps, "max_iters": p.train.max_iters, "pid": 1}))
    return r.path


def codes(findings) -> list[str]:
    return [f.code for f in findings]


def test_a_healthy_run_has_no_findings(tmp_path):
    d = write_run(tmp_path, "ok")
    notes: list[str] = []
    assert diagnose_run(d, snap(), notes) == []
    assert any("not sampled" in n for n in notes)  # a finished run: no processes to look at


def test_overfitting_names_the_best_step_and_suggests_dropout_and_fewer_steps(tmp_path):
    # val bottoms out at step 40 while train keeps falling: the gap grows from 0.2 to 1.6
    evals = [(0, 6.0, 6.0), (20, 4.0, 4.2), (40, 3.0, 3.6), (60, 2.4, 3.62), (80, 2.0, 3.65), (100, 1.8, 3.7)]
    d = write_run(tmp_path, "of", evals=evals)
    [f] = diagnose_run(d, snap())
    assert f.code == "overfitting.gap" and f.kind == "overfitting"
    assert f.set == {"model.dropout": 0.1, "train.max_iters": 40}
    assert "3.600 at step 40 (best)" in f.evidence[0]
    assert f.command.startswith("workbench train ") and "preset.toml --set model.dropout=0.1 train.max_iters=40" \
        in f.command
    assert any("model.n_layers=1" in a for a in f.also)
    # the same run stopped at its best step: val was still improving, no finding
    d2 = write_run(tmp_path, "of2", evals=evals[:3], steps=40)
    assert diagnose_run(d2, snap()) == []


def test_nonfinite_steps_and_rollbacks_suggest_a_lower_learning_rate(tmp_path):
    events = [{"event": "nonfinite_skip", "step": 30, "loss": None}, {"event": "nonfinite_skip", "step": 31},
              {"event": "rollback", "step": 20, "from_step": 31, "to": "step_0000020", "lr_scale": 0.5}]
    d = write_run(tmp_path, "nan", ["train.lr=2e-3", "train.grad_clip=0"], events=events)
    [f] = diagnose_run(d, snap())
    assert f.code == "unstable.nonfinite" and f.severity == "high"
    assert f.set == {"train.lr": 0.0005, "train.grad_clip": 1.0}   # 2e-3 x the rollback's 0.5 x 0.5
    assert "steps 30, 31" in f.evidence[0] and "rolled back from step 31" in " ".join(f.evidence)


def test_spikes_in_gradient_norm_and_loss(tmp_path):
    d = write_run(tmp_path, "spiky", ["train.grad_clip=0"], grad=lambda s: 25.0 if s == 50 else 1.0 + 0.01 * (s % 3),
                  loss=lambda s: 9.0 if s == 70 else 3.0 + 0.01 * (s % 5))
    found = {f.code: f for f in diagnose_run(d, snap())}
    assert set(found) == {"unstable.grad_spikes", "unstable.loss_spikes"}
    assert found["unstable.grad_spikes"].set == {"train.grad_clip": 1.0} and found["unstable.grad_spikes"].step == 50
    assert found["unstable.loss_spikes"].step == 70 and "train.lr" in found["unstable.loss_spikes"].set


def test_a_timeline_abandoned_by_a_rollback_is_not_judged(tmp_path):
    # a loss spike at step 70, then a rollback to step 60: the spike belongs to the abandoned timeline
    d = write_run(tmp_path, "rb", loss=lambda s: 9.0 if s == 70 else 3.0,
                  events=[{"event": "rollback", "step": 60, "from_step": 72, "to": "step_0000060", "lr_scale": 0.5}])
    facts = read_run(d)
    assert facts.loss_spikes.spikes == [] and all(e.step <= 60 or e.step > 72 for e in facts.evals)


def test_memory_near_the_gpu_limit_and_out_of_memory(tmp_path):
    d = write_run(tmp_path, "full", ["train.max_iters=100", "train.warmup_iters=10"], **GPU_RUN, precision="bf16",
                  compile_=True, mem=lambda s: 7000.0, tps=lambda s: 9000.0)
    [f] = diagnose_run(d, snap(GPU))
    assert f.code == "memory.near_limit" and f.set == {"train.batch_size": 12, "train.grad_accum": 2}
    d2 = write_run(tmp_path, "oom", status={"state": "failed", "step": 3, "max_iters": 100,
                                            "error": "CUDA out of memory. Tried to allocate 2.00 GiB"})
    [f] = diagnose_run(d2, snap())
    assert f.code == "memory.oom" and f.severity == "high" and f.set == {"train.batch_size": 2,
                                                                         "train.grad_accum": 2}
    assert f.command.startswith("workbench train ")  # no checkpoint yet: a new run
    (d2 / "checkpoints" / "step_0000002").mkdir(parents=True)
    (d2 / "checkpoints" / "step_0000002" / "meta.json").write_text(json.dumps({"step": 2}))
    [f] = diagnose_run(d2, snap())
    assert f.command == "workbench resume oom --set train.batch_size=2 train.grad_accum=2"  # it can go on


def test_memory_headroom_with_accumulation_is_what_fit_would_choose(tmp_path):
    d = write_run(tmp_path, "small", ["train.batch_size=2", "train.grad_accum=8"])
    [f] = diagnose_run(d, snap())
    assert f.code == "memory.headroom" and f.set == {"train.batch_size": 16, "train.grad_accum": 1}
    # on a GPU without accumulation, a quarter of the card used: a hint, with more tokens per step
    d2 = write_run(tmp_path, "gpu", ["train.max_iters=100", "train.warmup_iters=10"], **GPU_RUN, precision="bf16",
                   compile_=True, mem=lambda s: 800.0, tps=lambda s: 9000.0)
    [f] = diagnose_run(d2, snap(GPU))
    assert f.code == "memory.headroom" and f.severity == "low" and f.set["train.batch_size"] >= 48


def test_slow_on_a_gpu_fp32_compile_off_and_below_the_estimate(tmp_path):
    d = write_run(tmp_path, "slow", ["train.max_iters=100", "train.warmup_iters=10", "hardware.precision=fp32",
                                     "hardware.compile=false"], **GPU_RUN, precision="fp32", mem=lambda s: 3000.0,
                  tps=lambda s: 300.0)
    found = diagnose_run(d, snap(GPU))
    assert codes(found) == ["slow.throughput", "slow.compile_off", "slow.fp32"]
    slow = found[0]
    assert slow.data["ratio"] < 0.25 and slow.severity == "high" and "300 tokens/s" in slow.evidence[0]
    assert found[1].set == {"hardware.compile": "auto"} and found[2].set == {"hardware.precision": "auto"}
    assert "RTX 4060" in found[2].evidence[0]


def test_a_cpu_run_on_a_machine_with_a_gpu(tmp_path):
    d = write_run(tmp_path, "cpu", ["hardware.device=cpu"])
    [f] = diagnose_run(d, snap(GPU))
    assert f.code == "slow.not_on_gpu" and f.set == {"hardware.device": "auto"}
    d2 = write_run(tmp_path, "auto")  # auto chose the CPU: torch cannot see the GPU
    [f] = diagnose_run(d2, snap(GPU))
    assert f.code == "slow.not_on_gpu" and "torch.cuda.is_available()" in f.command


def test_a_live_run_beside_busy_processes_and_a_throttled_shared_gpu(tmp_path):
    d = write_run(tmp_path, "live", ["train.max_iters=1000", "train.warmup_iters=10"], **GPU_RUN, precision="bf16",
                  compile_=True, mem=lambda s: 3000.0, tps=lambda s: 9000.0, state="running")
    act = Activity(interval_s=1.0, logical_cores=8, cpu_busy=0.9, run_pids=(100,), run_share=0.12,
                   others_share=0.6, others=(ProcessUse(4242, "ffmpeg", 0.55, "ffmpeg -i a.mkv b.mp4"),),
                   gpu_processes=(GpuProcess(0, 100, "python", 3 * GiB, 70.0), GpuProcess(0, 777, "game", GiB, 25.0)),
                   gpus=(GpuClocks(0, "NVIDIA GeForce RTX 4060", 99, ("thermal (hardware)",)),))
    found = {f.code: f for f in diagnose_run(d, snap(GPU, act))}
    assert {"slow.busy_cpu", "slow.busy_gpu", "slow.throttled"} <= set(found)
    assert "pid 4242 ffmpeg (55 %)" in found["slow.busy_cpu"].evidence[1]
    assert found["slow.busy_cpu"].command == "renice -n 19 -p 4242" and found["slow.busy_cpu"].severity == "high"
    assert "pid 777 game" in found["slow.busy_gpu"].evidence[0]
    assert found["slow.throttled"].severity == "medium"


def test_waiting_for_data(tmp_path):
    d = write_run(tmp_path, "io", extra=lambda s: {"data_fraction": 0.4})
    [f] = diagnose_run(d, snap())
    assert f.code == "slow.data_wait" and f.severity == "high" and "0.400" in f.evidence[0]


def test_data_findings_epochs_vocabulary_and_a_tiny_val_split(tmp_path):
    d = write_run(tmp_path, "data", ["train.max_iters=2000", "model.vocab_size=4096"], steps=20,
                  train_tokens=20_000, val_tokens=900)
    found = {f.code: f for f in diagnose_run(d, snap())}
    assert set(found) == {"data.epochs", "data.vocab", "data.val_split"}
    assert "12.8 times" in found["data.epochs"].title and found["data.epochs"].severity == "medium"
    assert found["data.epochs"].set == {"data.builtin_mb": 6.0 * 13}
    assert found["data.vocab"].set == {"model.vocab_size": 512}
    assert found["data.val_split"].set == {}  # 10k val tokens would be half the corpus: more text instead


def test_findings_come_most_important_first(tmp_path):
    d = write_run(tmp_path, "many", ["train.max_iters=2000"], steps=20, train_tokens=20_000,
                  events=[{"event": "nonfinite_skip", "step": 10}], extra=lambda s: {"data_fraction": 0.15})
    found = diagnose_run(d, snap())
    assert [f.severity for f in found] == sorted((f.severity for f in found), key=("high", "medium", "low").index)
    assert found[0].code == "unstable.nonfinite"


def test_facts_read_only_what_was_appended(tmp_path):
    d = write_run(tmp_path, "grow", steps=10)
    facts = RunFacts(d).refresh()
    assert facts.train_records == 10
    with open(d / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"kind": "train", "step": 11, "loss": 3.0, "tokens_seen": 1, "skipped": 0}) + "\n")
    facts.refresh()
    assert facts.train_records == 11 and facts.last_train.step == 11


def test_doctor_json_follows_the_readme_schema(tmp_path, capsys):
    from workbench.cli import main
    write_run(tmp_path, "of", evals=[(0, 6.0, 6.0), (20, 4.0, 4.2), (40, 3.0, 3.6), (60, 2.4, 3.62),
                                      (80, 2.0, 3.65), (100, 1.8, 3.7)])
    assert main(["doctor", "of", "--runs-dir", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"run", "path", "state", "step", "max_iters", "preset", "device", "checked_at", "ok",
                        "findings", "notes", "activity", "queue"}
    assert out["ok"] is False and out["activity"] is None and out["queue"] is None   # no queue.db there
    assert set(out["findings"][0]) == {"kind", "code", "severity", "title", "evidence", "change", "set", "command",
                                       "also", "step", "data"}
    assert main(["doctor", "of", "--runs-dir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "1 finding" in text and "] overfitting: " in text and "change" in text


def test_report_of_a_run_that_has_not_started(tmp_path):
    d = tmp_path / "new"
    d.mkdir()
    (d / "status.json").write_text(json.dumps({"state": "starting"}))
    notes: list[str] = []
    facts = read_run(d)
    assert diagnose(facts, snap(), notes) == [] and any("not started" in n for n in notes)
    assert report(facts, [], notes, snap())["ok"] is True


# ----------------------------------------------------------------------------- the machine's activity

def test_activity_names_a_busy_process_and_tells_the_run_apart():
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        a = activity.sample_activity(run_pid=None, interval=0.5)
        assert any(p.pid == hog.pid for p in a.others), a.others  # named (a busy CI machine gives it less than a core)
        b = activity.sample_activity(run_pid=hog.pid, interval=0.5)
        assert hog.pid in b.run_pids and b.run_share > 0 and all(p.pid != hog.pid for p in b.others)
        assert Activity.from_dict(json.loads(json.dumps(b.to_dict()))) == b
    finally:
        hog.kill()
        hog.wait()


def test_gpu_processes_and_throttle_reasons_from_nvml(monkeypatch):
    class Err(Exception):
        pass

    proc = types.SimpleNamespace(pid=4321, usedGpuMemory=2 * GiB)
    sample = types.SimpleNamespace(pid=4321, smUtil=37, memUtil=5, timeStamp=0)
    fake = types.SimpleNamespace(
        NVMLError=Err, nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: "h0", nvmlDeviceGetName=lambda h: b"NVIDIA GeForce RTX 4090",
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=98, memory=40),
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0x1 | 0x4 | 0x40,
        nvmlDeviceGetProcessUtilization=lambda h, since: [sample],
        nvmlDeviceGetComputeRunningProcesses=lambda h: [proc])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    procs, gpus, note = activity._gpu_sample()
    assert note == "" and gpus[0].throttle == ("power cap (software)", "thermal (hardware)")  # idle is not one
    assert procs == [GpuProcess(0, 4321, procs[0].name, 2 * GiB, 37.0)]


@pytest.mark.parametrize("info", [CPU, GPU])
def test_snapshot_round_trips(info):
    s = HardwareSnapshot(info=info, activity=Activity(1.0, 2, 0.5), taken=1.0)
    assert HardwareSnapshot.from_dict(json.loads(json.dumps(s.to_dict()))) == s


# ----------------------------------------------------------------------------- thresholds, closely
# Each rule with a numeric threshold, just below it (0.9x: no finding) and just above it (1.1x: the finding),
# computed as the rule computes its number. Where the threshold is on a ratio, the ratio is at 0.9x / 1.1x.

GPU_OVERRIDES = ["train.max_iters=100", "train.warmup_iters=10"]
GPU_BUSY = {**GPU_RUN, "precision": "bf16", "compile_": True, "mem": lambda s: 3000.0, "tps": lambda s: 9000.0}
RTX4060_MIB = 8 * 1024  # the card's memory in MiB: a share of it is what memory.py compares


def found_codes(d: Path, info=CPU, act: Activity | None = None) -> dict:
    return {f.code: f for f in diagnose_run(d, snap(info, act))}


@pytest.mark.parametrize("factor, fires", [(0.9, False), (1.1, True)])
def test_grad_spike_threshold_is_ten_times_the_median(tmp_path, factor, fires):
    # a flat norm of 1.0 (MAD 0): the bar is GRAD_SPIKE_FACTOR (10) x the median
    d = write_run(tmp_path, "g", grad=lambda s: 10.0 * factor if s == 50 else 1.0, loss=lambda s: 3.0)
    found = found_codes(d)
    assert ("unstable.grad_spikes" in found) is fires
    if fires:
        assert found["unstable.grad_spikes"].step == 50


def test_steps_without_a_gradient_are_no_median_for_a_spike(tmp_path):
    """A GRPO step whose groups all scored alike has no gradient (norm 0): a run of mostly such steps has a median
    of 0, and its first real step was flagged as a spike (a walk's false "unstable"); zeros are left out."""
    d = write_run(tmp_path, "g", grad=lambda s: 0.44 if s % 10 == 0 else 0.0, loss=lambda s: 0.0)
    assert "unstable.grad_spikes" not in found_codes(d)


@pytest.mark.parametrize("factor, fires", [(0.9, False), (1.1, True)])
def test_loss_spike_threshold_is_a_fifth_above_the_median(tmp_path, factor, fires):
    # a flat loss of 3.0 (MAD 0): the bar is LOSS_SPIKE_FRACTION (0.2) above the median
    d = write_run(tmp_path, "l", loss=lambda s: 3.0 * (1 + 0.2 * factor) if s == 70 else 3.0)
    found = found_codes(d)
    assert ("unstable.loss_spikes" in found) is fires
    if fires:
        assert found["unstable.loss_spikes"].step == 70


@pytest.mark.parametrize("factor, longer", [(0.9, True), (1.1, False)])
def test_trouble_within_two_warmups_lengthens_the_warmup(tmp_path, factor, longer):
    # EARLY_WARMUPS = 2: a first non-finite step at <= 2 x warmup_iters (10) is the warmup's
    step = round(2 * 10 * factor)
    d = write_run(tmp_path, "w", ["train.warmup_iters=10", "train.max_iters=2000"],
                  events=[{"event": "nonfinite_skip", "step": step}])
    f = found_codes(d)["unstable.nonfinite"]
    assert ("train.warmup_iters" in f.set) is longer
    if longer:
        assert f.set["train.warmup_iters"] == 100  # MIN_WARMUP, under a tenth of the run


@pytest.mark.parametrize("factor, fires", [(0.9, False), (1.1, True)])
def test_memory_near_limit_threshold_is_ninety_percent_of_the_card(tmp_path, factor, fires):
    # on CUDA the peak is the reserved memory (write_run logs it as 1.1 x mem); MEM_NEAR_FRACTION = 0.90
    share = 0.90 * factor
    d = write_run(tmp_path, "m", GPU_OVERRIDES, **{**GPU_BUSY, "mem": lambda s: share * RTX4060_MIB / 1.1})
    found = found_codes(d, GPU)
    assert ("memory.near_limit" in found) is fires
    if fires:
        assert found["memory.near_limit"].data["peak_bytes"] / (8 * GiB) == pytest.approx(share)


@pytest.mark.parametrize("factor, fires", [(0.9, True), (1.1, False)])
def test_gpu_headroom_hint_below_a_quarter_of_the_card(tmp_path, factor, fires):
    # GPU_ROOM_FRACTION = 0.25: with no accumulation, a hint only under a quarter of the card's memory
    share = 0.25 * factor
    d = write_run(tmp_path, "h", GPU_OVERRIDES, **{**GPU_BUSY, "mem": lambda s: share * RTX4060_MIB / 1.1})
    found = found_codes(d, GPU)
    assert ("memory.headroom" in found) is fires
    if fires:
        assert found["memory.headroom"].severity == "low" and found["memory.headroom"].set["train.batch_size"] >= 48


def expected_tokens_per_s(tmp_path: Path) -> float:
    """What the estimate expects of the GPU run (read off a run far below it)."""
    d = write_run(tmp_path, "probe", GPU_OVERRIDES, **{**GPU_BUSY, "tps": lambda s: 1.0})
    return found_codes(d, GPU)["slow.throughput"].data["expected_tokens_per_s"]


@pytest.mark.parametrize("ratio, severity", [(0.5 * 0.9, "medium"), (0.5 * 1.1, None),
                                             (0.25 * 0.9, "high"), (0.25 * 1.1, "medium")])
def test_slow_throughput_thresholds_are_half_and_a_quarter_of_the_estimate(tmp_path, ratio, severity):
    # SLOW_RATIO = 0.5 (a finding under it), SLOW_RATIO_HIGH = 0.25 (high under it)
    expected = expected_tokens_per_s(tmp_path)
    d = write_run(tmp_path, "s", GPU_OVERRIDES, **{**GPU_BUSY, "tps": lambda s: ratio * expected})
    f = found_codes(d, GPU).get("slow.throughput")
    assert (f.severity if f else None) == severity
    if f:
        assert f.data["ratio"] == pytest.approx(ratio)


@pytest.mark.parametrize("factor, judged", [(0.9, False), (1.1, True)])
def test_speed_is_judged_from_a_million_parameters(tmp_path, factor, judged):
    # SPEED_MIN_PARAMS = 1,000,000 (the start event's params): below it a note, no verdict
    d = write_run(tmp_path, "p", GPU_OVERRIDES, **{**GPU_BUSY, "params": int(1_000_000 * factor),
                                                   "tps": lambda s: 1.0})
    notes: list[str] = []
    found = {f.code for f in diagnose_run(d, snap(GPU), notes)}
    assert ("slow.throughput" in found) is judged
    assert any("not judged below" in n for n in notes) is not judged


def live_activity(others_share: float = 0.0, gpu_processes=()) -> Activity:
    return Activity(interval_s=1.0, logical_cores=8, cpu_busy=0.9, run_pids=(100,), run_share=0.12,
                    others_share=others_share,
                    others=(ProcessUse(4242, "ffmpeg", others_share, "ffmpeg -i a.mkv b.mp4"),),
                    gpu_processes=(GpuProcess(0, 100, "python", 3 * GiB, 70.0), *gpu_processes))


@pytest.mark.parametrize("share, severity", [(0.25 * 0.9, None), (0.25 * 1.1, "medium"),
                                             (0.5 * 0.9, "medium"), (0.5 * 1.1, "high")])
def test_busy_cpu_thresholds_are_a_quarter_and_half_of_the_machine(tmp_path, share, severity):
    # OTHERS_CPU_SHARE = 0.25 (a finding from it), OTHERS_CPU_HIGH = 0.5 (high from it)
    d = write_run(tmp_path, "c", ["train.max_iters=1000", "train.warmup_iters=10"], **GPU_BUSY, state="running")
    f = found_codes(d, GPU, live_activity(share)).get("slow.busy_cpu")
    assert (f.severity if f else None) == severity


@pytest.mark.parametrize("sm_pct, memory_share, fires", [
    (10.0 * 0.9, 0.0, False), (10.0 * 1.1, 0.0, True),      # GPU_OTHER_SM_PCT = 10 % of the SMs
    (0.0, 0.10 * 0.9, False), (0.0, 0.10 * 1.1, True),      # GPU_OTHER_MEMORY = a tenth of the card's memory
])
def test_busy_gpu_thresholds_on_sms_and_memory(tmp_path, sm_pct, memory_share, fires):
    d = write_run(tmp_path, "g", ["train.max_iters=1000", "train.warmup_iters=10"], **GPU_BUSY, state="running")
    other = GpuProcess(0, 777, "game", int(memory_share * 8 * GiB), sm_pct)
    found = found_codes(d, GPU, live_activity(gpu_processes=(other,)))
    assert ("slow.busy_gpu" in found) is fires
    if fires:
        assert "pid 777 game" in found["slow.busy_gpu"].evidence[0]


@pytest.mark.parametrize("fraction, severity", [(0.10 * 0.9, None), (0.10 * 1.1, "medium"),
                                                (0.3 * 0.9, "medium"), (0.3 * 1.1, "high")])
def test_data_wait_thresholds_are_a_tenth_and_three_tenths_of_a_step(tmp_path, fraction, severity):
    # DATA_WAIT_FRACTION = 0.10 (a finding from it); high from 0.3 of each step
    d = write_run(tmp_path, "io", extra=lambda s: {"data_fraction": fraction})
    f = found_codes(d).get("slow.data_wait")
    assert (f.severity if f else None) == severity


def _eval_time(elapsed: float, share: float) -> dict:
    """The run's end event with its time totals (what `workbench runs` and the doctor read)."""
    return {"event": "finish", "step": 100, "elapsed_s": elapsed, "eval_s": share * elapsed, "ckpt_s": 1.0}


@pytest.mark.parametrize("share, severity", [(0.10 * 0.9, None), (0.10 * 1.1, "low"),
                                             (0.25 * 0.9, "low"), (0.25 * 1.1, "medium")])
def test_eval_share_thresholds_are_a_tenth_and_a_quarter_of_the_wall_clock(tmp_path, share, severity):
    # EVAL_SHARE = 0.10 (a finding from it); medium from EVAL_SHARE_HIGH = 0.25. TINY evals every 20 of its 100
    # steps: 6 evals; the interval suggested puts them at ~5 % of the time.
    d = write_run(tmp_path, "ev", events=[_eval_time(600.0, share)])
    f = found_codes(d).get("slow.eval_share")
    assert (f.severity if f else None) == severity
    if f:
        per_eval, step_s = share * 600 / 6, (600 - share * 600 - 1) / 100
        interval = f.set["train.eval_interval"]
        assert 20 < interval <= 100  # at most max_iters (an eval at the end)
        assert interval == 100 or per_eval / (per_eval + interval * step_s) <= 0.05
        assert f"{100 * share:.0f} %" in f.title and f.command.startswith("workbench train")


@pytest.mark.parametrize("factor, fires", [(0.9, False), (1.1, True)])
def test_eval_share_of_a_live_run_is_judged_after_a_minute(tmp_path, factor, fires):
    # EVAL_SHARE_MIN_SECONDS = 60 of the run's wall-clock, while it runs (its step-0 eval weighs more than it will)
    d = write_run(tmp_path, "ev", state="running", events=[_eval_time(60.0 * factor, 0.5)])
    assert ("slow.eval_share" in found_codes(d)) == fires


def test_a_finished_run_is_judged_whatever_its_length(tmp_path):
    """A run that ended in under a minute with half its time in evals: that was its whole time."""
    d = write_run(tmp_path, "ev", events=[_eval_time(30.0, 0.5)])
    assert "slow.eval_share" in found_codes(d)


def test_evals_that_are_most_of_a_short_budgeted_run_are_a_finding(tmp_path):
    """A 60 s budget that took 118 s beside a busy CPU, 59 % of it in its step-0 and last evals (issue 43): it ran
    fewer steps than one eval interval and its eval batches were auto, so neither a longer interval nor auto helps;
    fewer eval batches do, and a longer budget spreads the two evals over more training."""
    d = write_run(tmp_path, "b", ["train.eval_interval=200", "train.time_budget=60s"], steps=30,
                  evals=[(0, 6.0, 6.05), (30, 4.0, 4.05)], start={"eval_iters": 8},
                  events=[{"event": "finish", "step": 30, "elapsed_s": 118.0, "eval_s": 0.59 * 118.0, "ckpt_s": 1.0}])
    f = found_codes(d).get("slow.eval_share")
    assert f is not None, "no finding"
    assert f.severity == "medium" and f.title == "59 % of the run's time goes to evals"
    assert f.set == {"train.eval_iters": 1} and "1 batch of train and of val instead of 8" in f.change
    assert any("longer" in a and "time_budget" in a for a in f.also), f.also


def test_eval_share_suggests_auto_eval_batches_where_they_are_fewer(tmp_path):
    """An explicit train.eval_iters above what auto would score for the run's val split: auto first, the longer
    interval as the other change."""
    from workbench.plan.schedule.evals import eval_batches
    d = write_run(tmp_path, "ev", ["train.eval_iters=300"], events=[_eval_time(600.0, 0.3)],
                  start={"eval_iters": 300})
    f = found_codes(d)["slow.eval_share"]
    p = resolve_preset("cpu-small", [*TINY, "train.eval_iters=0"])
    auto = eval_batches(p, 50_000)[0]
    assert auto < 300 and f.set == {"train.eval_iters": 0} and f"auto: {auto} batches" in f.change
    assert f.also and "train.eval_interval=" in f.also[0]


TINY_TOKENS_PER_STEP = 4 * 32  # TINY's batch_size x seq_len


@pytest.mark.parametrize("epochs, severity", [(1.0 * 0.9, None), (1.0 * 1.1, "low"),
                                              (4.0 * 0.9, "low"), (4.0 * 1.1, "medium")])
def test_epochs_thresholds_are_one_and_four_passes(tmp_path, epochs, severity):
    # EPOCHS_NOTE = 1 (a finding over it), EPOCHS_WARN = 4 (medium over it); 100 steps x 128 tokens planned
    planned = 100 * TINY_TOKENS_PER_STEP
    d = write_run(tmp_path, "e", train_tokens=round(planned / epochs))
    f = found_codes(d).get("data.epochs")
    assert (f.severity if f else None) == severity
    if f:
        assert f.data["epochs"] == pytest.approx(epochs, rel=1e-3) and f.data["planned_tokens"] == planned


@pytest.mark.parametrize("per_id, severity", [(100 * 0.9, "low"), (100 * 1.1, None),
                                              (20 * 0.9, "medium"), (20 * 1.1, "low")])
def test_vocabulary_thresholds_are_100_and_20_tokens_per_id(tmp_path, per_id, severity):
    # TOKENS_PER_ID = 100 (a finding under it), TOKENS_PER_ID_WARN = 20 (medium under it); a vocabulary of 4096
    d = write_run(tmp_path, "v", ["model.vocab_size=4096", "train.max_iters=10"], steps=10,
                  train_tokens=round(per_id * 4096))
    f = found_codes(d).get("data.vocab")
    assert (f.severity if f else None) == severity
    if f:
        assert f.data["tokens_per_id"] == pytest.approx(per_id, rel=1e-3)
        assert f.set["model.vocab_size"] < 4096


@pytest.mark.parametrize("factor, fires", [(0.9, True), (1.1, False)])
def test_val_split_threshold_is_ten_thousand_tokens(tmp_path, factor, fires):
    # VAL_MIN_TOKENS = 10,000
    d = write_run(tmp_path, "vs", val_tokens=round(10_000 * factor))
    assert ("data.val_split" in found_codes(d)) is fires


@pytest.mark.parametrize("factor, settable", [(0.9, True), (1.1, False)])
def test_a_larger_val_fraction_is_suggested_up_to_a_fifth_of_the_corpus(tmp_path, factor, settable):
    # VAL_FRACTION_MAX = 0.2: the share of the corpus 10,000 val tokens would take, at 0.18 and 0.22
    total = round(10_000 / (0.2 * factor))
    d = write_run(tmp_path, "vf", ["train.max_iters=10"], steps=10, train_tokens=total - 5_000, val_tokens=5_000)
    f = found_codes(d)["data.val_split"]
    if settable:
        assert f.set == {"data.val_fraction": 0.18} and f.change == "--set data.val_fraction=0.18"
    else:
        assert f.set == {} and f.change.startswith("more text: ")


def overfit_evals(middle: tuple[float, float], recent: tuple[float, float], gap_middle: float, gap_recent: float):
    """Evals at 0..100 (the middle third at 40, 60; the recent at 80, 100) with these val losses and gaps."""
    (v40, v60), (v80, v100) = middle, recent
    return [(0, 6.0, 6.0), (20, 4.0, 4.0), (40, v40 - gap_middle, v40), (60, v60 - gap_middle, v60),
            (80, v80 - gap_recent, v80), (100, v100 - gap_recent, v100)]


@pytest.mark.parametrize("factor, fires", [(0.9, False), (1.1, True)])
def test_overfitting_needs_a_last_gap_of_a_quarter_nat(tmp_path, factor, fires):
    # GAP_MIN = 0.25: the last gap at 0.225 / 0.275; it grew from 0 (growth >> 0.05), val got worse since step 40
    gap = 0.25 * factor
    d = write_run(tmp_path, "o", evals=overfit_evals((3.0, 3.0), (3.05, 3.1), 0.0, gap))
    found = found_codes(d)
    assert ("overfitting.gap" in found) is fires
    if fires:
        assert found["overfitting.gap"].data["gap_end"] == pytest.approx(gap)


@pytest.mark.parametrize("factor, fires", [(0.9, False), (1.1, True)])
def test_overfitting_needs_the_gap_to_grow_by_a_twentieth(tmp_path, factor, fires):
    # GAP_GROWTH_MIN = 0.05: the recent third's gap above the middle third's (0.5) by 0.045 / 0.055
    growth = 0.05 * factor
    d = write_run(tmp_path, "o", evals=overfit_evals((3.0, 3.0), (3.05, 3.1), 0.5, 0.5 + growth))
    found = found_codes(d)
    assert ("overfitting.gap" in found) is fires
    if fires:
        assert found["overfitting.gap"].data["gap_growth"] == pytest.approx(growth)


@pytest.mark.parametrize("factor, fires", [(0.9, True), (1.1, False)])
def test_overfitting_needs_val_to_improve_less_than_a_quarter_of_the_gap_growth(tmp_path, factor, fires):
    # PLATEAU_RATIO = 0.25: the gap grows by 0.4 (0.5 -> 0.9), the best val improves by 0.09 / 0.11 (0.1 = 0.25 x 0.4)
    gain = 0.25 * 0.4 * factor
    d = write_run(tmp_path, "o", evals=overfit_evals((3.0, 3.0), (3.0 - gain, 3.05 - gain), 0.5, 0.9))
    found = found_codes(d)
    assert ("overfitting.gap" in found) is fires
    if fires:
        assert found["overfitting.gap"].data["val_gain"] == pytest.approx(gain)


# ----------------------------------------------------------------------------- advice branches

def test_out_of_memory_at_batch_1_suggests_activation_checkpointing_then_a_shorter_sequence(tmp_path):
    failed = {"state": "failed", "step": 3, "max_iters": 100, "error": "CUDA out of memory. Tried to allocate 2.00 GiB"}
    d = write_run(tmp_path, "oom1", ["train.batch_size=1"], status=failed)
    [f] = diagnose_run(d, snap())
    assert f.code == "memory.oom" and f.set == {"hardware.activation_checkpointing": True}
    assert f.change == "--set hardware.activation_checkpointing=true"  # not "same tokens per step": it is
    # already checkpointing activations: half the sequence, a new run (model.* cannot be resumed)
    d2 = write_run(tmp_path, "oom2", ["train.batch_size=1", "hardware.activation_checkpointing=true"], status=failed)
    [f] = diagnose_run(d2, snap())
    assert f.code == "memory.oom" and f.set == {"model.seq_len": 16} and f.change == "--set model.seq_len=16"
    assert f.command.startswith("workbench train ") and f.command.endswith("preset.toml --set model.seq_len=16")


T4 = {"index": 0, "name": "Tesla T4", "vram_total": 16 * GiB, "vram_used": GiB, "vram_free": 15 * GiB,
      "compute_capability": "7.5"}


@pytest.mark.parametrize("info, precision", [(GPU, "bf16"), ({**CPU, "nvidia": [T4]}, "fp32")])
def test_nonfinite_steps_in_fp16_suggest_bf16_or_fp32_where_the_gpu_has_no_bf16(tmp_path, info, precision):
    d = write_run(tmp_path, "fp16", [*GPU_OVERRIDES, "hardware.precision=fp16"],
                  **{**GPU_BUSY, "precision": "fp16"}, events=[{"event": "nonfinite_skip", "step": 40}])
    f = found_codes(d, info)["unstable.nonfinite"]
    assert f.set["hardware.precision"] == precision
    assert f.change.endswith(f"hardware.precision={precision}") and f.change.startswith("--set train.lr=")
    # the same run in bf16: the precision is left alone
    d2 = write_run(tmp_path, "bf16", GPU_OVERRIDES, **GPU_BUSY, events=[{"event": "nonfinite_skip", "step": 40}])
    assert "hardware.precision" not in found_codes(d2, info)["unstable.nonfinite"].set


# ----------------------------------------------------------------------------- chat data

def chat_start(**kw) -> dict:
    """A start event's ``chat`` (workbench.data.chat.chat_data.ChatData.start_facts) with nothing to find, and
    ``kw``."""
    return {"chat": {"conversations": 1000, "trained_fraction": 0.3, "loss_on": "assistant", "truncated": 0,
                     "dropped": 0, "row_fill": 0.9, "packing": True, "p95_tokens": 20, **kw}}


@pytest.mark.parametrize("frac, fires", [(0.05 * 0.9, True), (0.05 * 1.1, False)])
def test_chat_trained_share_threshold_is_five_percent(tmp_path, frac, fires):
    # TRAINED_MIN = 0.05; last_assistant: the change is to train every answer
    d = write_run(tmp_path, "ct", start=chat_start(trained_fraction=frac, loss_on="last_assistant"))
    f = found_codes(d).get("data.chat_trained")
    assert (f is not None) is fires
    if f:
        assert f.set == {"train.loss_on": "assistant"} and f.data["trained_fraction"] == pytest.approx(frac)
    d2 = write_run(tmp_path, "ct2", start=chat_start(trained_fraction=0.01))
    assert found_codes(d2)["data.chat_trained"].set == {}


@pytest.mark.parametrize("share, severity", [(0.02 * 0.9, None), (0.02 * 1.1, "low"), (0.1 * 0.9, "low"),
                                             (0.1 * 1.1, "medium")])
def test_chat_truncation_thresholds_are_two_and_ten_percent(tmp_path, share, severity):
    # TRUNCATED_NOTE = 0.02, TRUNCATED_WARN = 0.10 of the training conversations cut at seq_len (32 here)
    d = write_run(tmp_path, "tr", start=chat_start(truncated=round(share * 1000), p95_tokens=50))
    f = found_codes(d).get("data.chat_truncated")
    assert (f.severity if f else None) == severity
    if f:
        assert f.set == {"model.seq_len": 64} and f.data["truncated_share"] == pytest.approx(share, abs=1e-3)


@pytest.mark.parametrize("fill, severity", [(0.5 * 1.1, None), (0.5 * 0.9, "low"), (0.25 * 0.9, "medium")])
def test_chat_padding_threshold_is_half_a_row(tmp_path, fill, severity):
    # ROW_FILL_MIN = 0.5 (medium under a quarter); unpacked rows: the change is packing
    d = write_run(tmp_path, "rf", start=chat_start(row_fill=fill, packing=False))
    f = found_codes(d).get("slow.chat_padding")
    assert (f.severity if f else None) == severity
    if f:
        assert f.set == {"data.packing": True}
