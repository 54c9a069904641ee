"""The non-finite check on the device (hardware.nonfinite_check = device): the fused AdamW kernel
skips a bad update itself and the loop reads each step's loss a step late, so a GPU never waits
for the CPU between steps. It must train exactly as the host check does: same losses, same skipped
steps, same weights, same rollbacks, whatever the log interval. Fused AdamW runs on a CPU too, so
these run here; on CUDA the same code path is what bench/gpu_check.sh times."""

from __future__ import annotations

import pytest
import torch

from tests.support.cli import tiny, wb
from tests.support.runs import read_jsonl
from workbench import rundir
from workbench.config import resolve_preset
from workbench.machine.probe import this_machine
from workbench.plan.settings import SettingsError, resolve_settings
from workbench.train.checkpoint import load_model_state


def _run(tmp_path, name: str, check: str, *extra: str, nan: str = "") -> dict:
    env = {"WORKBENCH_TEST_NAN_STEPS": nan} if nan else {}
    wb("train", "cpu-small", "--name", name, "--runs-dir", str(tmp_path),
       *tiny(f"hardware.nonfinite_check={check}", *extra), env=env, check=True)
    d = tmp_path / name
    recs = read_jsonl(d / "metrics.jsonl")
    start = next(r for r in recs if r.get("event") == "start")
    last = rundir.list_checkpoints(d)[-1]
    return {"recs": recs, "start": start, "weights": load_model_state(last["path"]), "last": last["step"],
            "train": {r["step"]: (r["loss"], r["skipped"]) for r in recs if r["kind"] == "train"},
            "skips": [(r["step"], r["consecutive"]) for r in recs if r.get("event") == "nonfinite_skip"],
            "rollbacks": [(r["to"], r["step"]) for r in recs if r.get("event") == "rollback"],
            "status": rundir.read_status(d)}


def _same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_auto_checks_on_the_device_only_where_the_fused_kernel_does_the_whole_update():
    m = this_machine()
    def check(*over):
        p = resolve_preset("cpu-small", ["train.optimizer=adamw", *over])
        return resolve_settings(p, m, world_size=1).nonfinite_check
    assert check() == "device"                                              # fused AdamW, one process
    assert check("hardware.fused_adamw=false") == "host"
    assert check("train.optimizer=muon") == "host"
    assert check("hardware.nonfinite_check=host") == "host"
    p = resolve_preset("cpu-small", ["hardware.nproc=2", "train.batch_size=8", "train.optimizer=adamw"])
    assert resolve_settings(p, m, world_size=2).nonfinite_check == "host"  # DDP: the loss is averaged on the host
    with pytest.raises(SettingsError, match="nonfinite_check = 'device' needs one process, fused AdamW"):
        check("hardware.nonfinite_check=device", "train.optimizer=muon")


def test_the_device_check_skips_the_same_steps_and_trains_the_same_weights(tmp_path):
    """NaN at steps 6 and 7, logged every 5 steps: the device check learns of each a step late, yet
    the skipped steps, the counts, every logged loss and the final weights are those of the host check."""
    args = ("train.max_iters=12", "train.log_interval=5", "train.ckpt_interval=12", "train.eval_interval=100")
    host = _run(tmp_path, "host", "host", *args, nan="6,7")
    dev = _run(tmp_path, "dev", "device", *args, nan="6,7")
    assert host["skips"] == dev["skips"] == [(6, 1), (7, 2)]
    assert host["train"] == dev["train"] and sorted(dev["train"]) == [1, 5, 10, 12]  # (the first step: logged at once)
    assert dev["train"][10][1] == 2
    assert host["last"] == dev["last"] == 12 and _same_weights(host["weights"], dev["weights"])


def test_the_device_check_rolls_back_a_step_late_to_the_same_place(tmp_path):
    """Three NaN steps in a row (5, 6, 7; max_skips 3), nothing logged in between: the device check
    reads the third at step 8 instead of 7, after step 8 (finite) ran. It still rolls back (step 8
    is not saved although a checkpoint is due there), to the same checkpoint, and ends with the
    same weights: the step it took in between is undone with the rest."""
    args = ("train.max_iters=14", "train.log_interval=100", "train.ckpt_interval=4", "train.eval_interval=100",
            "train.max_skips=3")
    host = _run(tmp_path, "host", "host", *args, nan="5,6,7")
    dev = _run(tmp_path, "dev", "device", *args, nan="5,6,7")
    assert host["rollbacks"] == dev["rollbacks"] == [("step_0000004", 4)]
    from_step = [[r["from_step"] for r in x["recs"] if r.get("event") == "rollback"] for x in (host, dev)]
    assert from_step == [[7], [8]], from_step
    assert host["skips"] == dev["skips"] == [(5, 1), (6, 2), (7, 3)]
    assert dev["status"].state == "finished" and host["train"][14] == dev["train"][14]
    assert _same_weights(host["weights"], dev["weights"])
