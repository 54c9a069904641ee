"""Memory savers: 8-bit AdamW states (torchao) counted exactly by the estimate, trained and resumed bit for
bit, refused with one line where they cannot run; and `estimate` listing the savers that make a preset fit."""

from __future__ import annotations

import dataclasses
import json
import signal
from pathlib import Path

import pytest
import torch

from tests.support.cli import tiny, wb
from tests.support.runs import read_jsonl
from workbench import rundir
from workbench.config import ModelConfig, Preset, TrainConfig
from workbench.config.schema import HardwareConfig
from workbench.machine.detect import Machine
from workbench.plan.fit.memory import estimate_memory, estimate_settings
from workbench.plan.fit.recommend import fitting_savers
from workbench.plan.settings import SettingsError, check_installed, resolve_settings
from workbench.train.model import GPT
from workbench.train.optim import build_optimizer

# Tensors on both sides of torchao's rule (>= 4096 values and a multiple of 256: quantised): the norms (64) stay
# fp32; the attention and MLP matrices and the embedding are 8-bit. Few shapes: torchao compiles its step per shape.
CFG = ModelConfig(vocab_size=512, dim=64, n_layers=2, n_heads=4, n_kv_heads=4, seq_len=32, ffn_hidden=64)


def state_bytes(opt) -> int:
    """Bytes of every moment an optimizer holds (codes, scales and maps of torchao's 8-bit tensors)."""
    total = 0
    for part in opt.parts.values():
        for st in part.state.values():
            for k, v in st.items():
                if k == "step" or not isinstance(v, torch.Tensor):
                    continue
                inner = [getattr(v, a) for a in ("codes", "scale", "qmap")] if hasattr(v, "codes") else [v]
                total += sum(t.untyped_storage().nbytes() for t in inner)
    return total


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_8bit_states_are_the_bytes_the_estimate_counts(optimizer):
    """One real step of each optimizer (the states exist from the first step on): the estimate's optimizer
    component is what the tensors hold, byte for byte, in fp32 and in 8 bits, and 8 bits holds less. Under Muon
    with attention biases: the biases are AdamW's (the estimate once counted them as Muon's)."""
    t = TrainConfig(optimizer=optimizer, batch_size=2)
    cfg = CFG if optimizer == "adamw" else dataclasses.replace(CFG, attn_bias=True)
    got = {}
    for states in ("fp32", "8bit"):
        torch.manual_seed(0)
        model = GPT(cfg)
        opt = build_optimizer(model, t, fused=False, states=states)
        ids = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
        model(ids, targets=ids)[1].backward()
        opt.step(torch.amp.GradScaler("cpu", enabled=False))
        p = Preset(model=cfg, train=t, hardware=HardwareConfig(device="cpu", optimizer_states=states))
        want = estimate_memory(p, machine=Machine.assumed("cpu")).components["optimizer"]
        got[states] = state_bytes(opt)
        assert got[states] == want, states
    # AdamW alone: most of its moments become 8-bit; with Muon only the embedding's (Muon's momentum stays fp32)
    assert got["8bit"] < (0.6 if optimizer == "adamw" else 0.8) * got["fp32"]


def test_8bit_settings_and_refusals(monkeypatch):
    p = Preset(model=CFG, hardware=HardwareConfig(device="cpu", optimizer_states="8bit"))
    s = estimate_settings(p, Machine.assumed("cpu"))
    assert s.optimizer_states == "8bit" and not s.fused_optimizer and s.nonfinite_check == "host"
    assert "8-bit states" in s.describe()
    bad = Preset(model=CFG, hardware=HardwareConfig(device="cpu", optimizer_states="8bit", fused_adamw="true"))
    with pytest.raises(SettingsError, match="hardware.fused_adamw = auto or false"):
        estimate_settings(bad, Machine.assumed("cpu"))
    sharded = Preset(model=CFG, hardware=HardwareConfig(device="cpu", optimizer_states="8bit", shard=True))
    with pytest.raises(SettingsError, match="does not work with hardware.shard = true yet"):
        resolve_settings(sharded, Machine.assumed("cpu"), world_size=2)
    assert resolve_settings(sharded, Machine.assumed("cpu"), world_size=1).parallel == "none"  # one process: no shards
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "torchao" else object())
    with pytest.raises(SettingsError, match=r"needs torchao, which is not installed: pip install 'workbench\[sav"):
        check_installed(s)


def test_offload_settings_estimate_and_refusals():
    """hardware.optimizer_states = offload on a CUDA GPU: no fused device kernel, the host check, said in the
    settings' line; the estimate keeps only the small tensors' moments on the GPU and counts 16 pinned host bytes
    a value for the rest (its exact match with torchao's tensors is tests/train/test_gpu.py's); a checkpoint holds
    the same states as fp32's. Refused, one line each, on a CPU, over several processes and with fp16."""
    cuda = Machine.assumed("cuda")
    hw = dict(device="cuda", precision="bf16")
    p = Preset(model=CFG, hardware=HardwareConfig(**hw, optimizer_states="offload"))
    s = estimate_settings(p, cuda)
    assert s.optimizer_states == "offload" and not s.fused_optimizer and s.nonfinite_check == "host"
    assert "AdamW, states on the CPU" in s.describe()
    off, fp32 = (estimate_memory(Preset(model=CFG, hardware=HardwareConfig(**hw, optimizer_states=st)), machine=cuda)
                 for st in ("offload", "fp32"))
    n = off.params
    small = 2 * CFG.n_layers * CFG.dim + CFG.dim  # the RMSNorms' weights: under torchao's 4,096 values
    assert off.components["optimizer"] == 8 * small and fp32.components["optimizer"] == 8 * n
    assert off.host_offload == 16 * (n - small) and fp32.host_offload == 0
    assert off.checkpoint_bytes == fp32.checkpoint_bytes and off.total < fp32.total
    for hw_bad, world, msg in ((dict(device="cpu"), 1, "on cpu they already live in this memory"),
                               (hw, 2, "works with one process only"),
                               (dict(device="cuda", precision="fp16"), 1, "does not support fp16"),
                               (dict(hw, fused_adamw="true"), 1, "hardware.fused_adamw = auto or false")):
        bad = Preset(model=CFG, train=TrainConfig(batch_size=4),
                     hardware=HardwareConfig(**hw_bad, optimizer_states="offload"))
        with pytest.raises(SettingsError, match=msg):
            resolve_settings(bad, Machine.assumed(hw_bad["device"]), world_size=world)


def test_8bit_run_trains_and_resumes_bitwise_after_kill_minus_nine(tmp_path):
    """The loss falls; a checkpoint's optimizer state is smaller than its fp32 weights (fp32 moments would be
    twice them); a kill -9 between checkpoints resumes to every step's loss bit for bit (the quantised moments
    are saved and loaded)."""
    root = str(tmp_path)
    run = tiny("train.max_iters=8", "train.lr_decay_iters=8", "train.ckpt_interval=4", "train.eval_interval=8",
               "model.dropout=0.1", "train.patience=0", "train.sample_prompt=''", "hardware.optimizer_states=8bit",
               "model.n_kv_heads=4", "model.ffn_hidden=64")  # every matrix 64 x 64: fewer shapes to compile
    cp = wb("train", "cpu-small", "--name", "straight", "--runs-dir", root, *run, check=True)
    straight = {r["step"]: r["loss"] for r in read_jsonl(tmp_path / "straight" / "metrics.jsonl")
                if r["kind"] == "train"}
    assert sorted(straight) == list(range(1, 9)) and straight[8] < straight[1]
    # the run says what it uses, and torchao's notes to its own developers stay off the user's terminal
    assert "8-bit AdamW states" in cp.stdout
    assert "OptimState8bit" not in cp.stdout + cp.stderr and "KernelPreference" not in cp.stdout + cp.stderr
    ck = Path(rundir.list_checkpoints(tmp_path / "straight")[-1]["path"])
    assert (ck / "state.pt").stat().st_size < 0.75 * (ck / "model.pt").stat().st_size
    cp = wb("train", "cpu-small", "--name", "r", "--runs-dir", root, *run, env={"WORKBENCH_TEST_KILL_AT_STEP": "7"})
    assert cp.returncode == -signal.SIGKILL
    res = wb("resume", "r", "--runs-dir", root, check=True)
    assert "resumed from checkpoint step_0000004" in res.stdout
    after = {r["step"]: r["loss"] for r in read_jsonl(tmp_path / "r" / "metrics.jsonl") if r["kind"] == "train"}
    assert after == straight


def applied(preset_name: str, base: list[str], option: dict, device: str, machine, init=None) -> int:
    """The memory estimate of the preset with the option's --set strings applied as a user would (parsed from
    text, the same overrides as `train --set`)."""
    from workbench.config import resolve_preset
    from workbench.plan.fit.memory import estimate_memory
    p = resolve_preset(preset_name, [*base, *option["set"]])
    if init is not None:
        p = dataclasses.replace(p, init=init)
    return estimate_memory(p, device=device, machine=machine).total


def test_estimate_lists_the_savers_that_make_a_preset_fit(capsys):
    """gpu-24gb on an 8 GB card: each listed combination fits by the estimate, the cheapest (a smaller
    micro-batch alone, same tokens per step) first; the CLI prints them and gives them in its JSON."""
    from workbench.cli import main
    from workbench.config import resolve_preset
    from workbench.machine.gpus import find_gpu
    from workbench.plan.compare import machine_with
    gpu = find_gpu("RTX 4060")
    p = resolve_preset("gpu-24gb")
    machine = machine_with(gpu)
    options = fitting_savers(p, "cuda", gpu.memory_bytes, machine)
    assert options and all(o["total"] <= 0.9 * gpu.memory_bytes for o in options)
    for o in options:  # each option's --set strings, applied, give the memory it promises
        assert applied("gpu-24gb", [], o, "cuda", machine) == o["total"], o
    # a smaller micro-batch alone: auto's memory savers (the fused loss, checkpointing) are already on there
    assert options[0]["set"] == ["train.batch_size=2", "train.grad_accum=32"] and options[0]["speed"] == 1.0
    assert any("hardware.optimizer_states=8bit" in o["set"] for o in options)
    capsys.readouterr()
    assert main(["estimate", "gpu-24gb", "--gpu", "RTX 4060", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["fits"] is False and [o["set"] for o in r["savers"]] == [o["set"] for o in options]
    assert main(["estimate", "gpu-24gb", "--gpu", "RTX 4060"]) == 0
    out = capsys.readouterr().out
    assert "to fit, by estimate (memory savers, cheapest in speed first):" in out
    assert "--set hardware.optimizer_states=8bit" in out


def test_compare_says_which_savers_make_a_preset_fit_where_no_batch_does():
    """datacenter-80gb (~386 M) on 8 GB cards: no micro-batch fits as it is, and the row says which savers make
    it fit, at a memory estimate under 90 % of the card."""
    from workbench.config import resolve_preset
    from workbench.machine.gpus import find_gpu
    from workbench.plan.compare import compare
    r = compare(resolve_preset("datacenter-80gb"), [find_gpu("RTX 4060"), find_gpu("H100")])
    small, big = sorted(r["rows"], key=lambda x: x["memory"])
    assert small["fit_batch"] == 0 and small["savers"] and big["savers"] == []
    o = small["savers"][0]  # AdamW's states off the card: 8-bit (x0.52 on an H100) or on the host (x0.52)
    assert o["set"][0] in ("hardware.optimizer_states=8bit", "hardware.optimizer_states=offload"), o
    assert o["total"] <= 0.9 * small["available"]
    assert {"hardware.optimizer_states=offload", "hardware.fused_adamw=auto"} <= {x for o in small["savers"]
                                                                                for x in o["set"]}
    from workbench.plan.compare import machine_with
    for o in small["savers"]:
        assert applied("datacenter-80gb", [], o, "cuda", machine_with(find_gpu("RTX 4060"))) == o["total"], o
    assert "fits with --set " + " ".join(small["savers"][0]["set"]) in small["batch_note"]
    # offload is CUDA's and needs bf16 or fp32: never offered on a CPU, nor on a T4 (fp16, no bf16)
    t4 = fitting_savers(resolve_preset("datacenter-80gb", ["hardware.precision=fp16"]), "cuda", 8 * 2**30,
                        machine_with(find_gpu("T4")))  # as --compare estimates a GPU without bf16
    assert t4 and all("hardware.optimizer_states=offload" not in o["set"] for o in t4)
    cpu = fitting_savers(resolve_preset("datacenter-80gb", ["hardware.device=cpu"]), "cpu", 8 * 2**30,
                         Machine.assumed("cpu"))
    assert cpu and all("hardware.optimizer_states=offload" not in o["set"] for o in cpu)


def test_lora_is_offered_for_a_full_fine_tune_that_fits_no_other_way():
    """A ~0.9 B model fine-tuned on an 8 GB card: every weight trained does not fit with any saver (~10 bytes a
    parameter even with 8-bit states; 8 with the states on the host, and the accumulation that keeps the tokens a
    step holds the gradients and every weight's cast), LoRA does; a preset that trains from scratch is never
    offered LoRA."""
    from workbench.config import resolve_preset
    from workbench.machine.gpus import find_gpu
    from workbench.plan.compare import machine_with
    gpu = find_gpu("RTX 4060")
    big = resolve_preset("gpu-8gb", ["model.dim=2048", "model.n_layers=16", "model.n_heads=16", "model.n_kv_heads=8",
                                     "train.batch_size=4", "model.seq_len=1024"])
    ft = dataclasses.replace(big, init={"run": "base", "step": 0})
    options = fitting_savers(ft, "cuda", gpu.memory_bytes, machine_with(gpu))
    assert options and all("train.finetune=lora" in o["set"] for o in options), options
    assert options[0]["speed"] == 1.5 and options[0]["total"] <= 0.9 * gpu.memory_bytes
    base = ["model.dim=2048", "model.n_layers=16", "model.n_heads=16", "model.n_kv_heads=8", "train.batch_size=4",
            "model.seq_len=1024"]
    for o in options:
        assert applied("gpu-8gb", base, o, "cuda", machine_with(gpu), init={"run": "base", "step": 0}) == o["total"]
    assert fitting_savers(big, "cuda", gpu.memory_bytes, machine_with(gpu)) == []
