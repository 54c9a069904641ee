"""The CUDA paths, tested where there is a GPU: precision auto (bf16 on Ampere and newer, fp16 with a
GradScaler before), each precision by hand, TF32, the fused loss on CUDA against the plain loss, and
the process-group paths (a --nproc 1 run; NCCL DDP on two GPUs).

Without CUDA every test here is skipped, with the reason (CI has no GPU). `bash bench/gpu_check.sh`
runs them (`pytest -m gpu`) on every GPU that becomes available.
"""

from __future__ import annotations

import signal

import pytest
import torch

from tests.support.cli import tiny, wb
from tests.support.runs import losses, read_jsonl
from workbench import rundir

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (bench/gpu_check.sh)")]

CUDA = ("hardware.device=cuda",)


def _cc() -> tuple[int, int]:
    return torch.cuda.get_device_capability()


def _start(d) -> dict:
    return next(r for r in read_jsonl(d / "metrics.jsonl") if r.get("event") in ("start", "resume"))


def _scaler_state(d) -> dict:
    ck = rundir.list_checkpoints(d)[-1]
    return torch.load(f"{ck['path']}/state.pt", weights_only=True)["scaler"]


def test_auto_picks_cuda_and_the_precision_this_gpu_supports(tmp_path):
    """device auto -> cuda; precision auto -> bf16 on compute capability 8.0+, else fp16 with a GradScaler."""
    from workbench.config import resolve_preset
    from workbench.machine.probe import this_machine
    from workbench.plan.settings import resolve_settings
    want = "bf16" if _cc() >= (8, 0) else "fp16"
    s = resolve_settings(resolve_preset("cpu-small", ["hardware.precision=auto"]), this_machine(), world_size=1)
    assert s.device_type == "cuda" and s.precision == want and s.grad_scaler == (want == "fp16"), s
    wb("train", "cpu-small", "--name", "auto", "--runs-dir", str(tmp_path),
       *tiny("train.max_iters=4", "train.ckpt_interval=4", "train.eval_interval=4", "hardware.device=auto",
             "hardware.precision=auto"), check=True)
    d = tmp_path / "auto"
    start = _start(d)
    assert start["device"].startswith("cuda") and start["precision"] == want, start
    got = losses(d)
    assert sorted(got) == [1, 2, 3, 4] and all(v is not None and v == v for v in got.values())
    assert bool(_scaler_state(d)) == (want == "fp16")  # a disabled GradScaler's state is empty
    assert rundir.read_status(d).state == "finished"


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
def test_each_precision_trains_on_cuda(tmp_path, precision):
    """fp16 scales the loss (a GradScaler whose scale is saved and restored); bf16 and fp32 do not."""
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    wb("train", "cpu-small", "--name", precision, "--runs-dir", str(tmp_path),
       *tiny("train.max_iters=10", "train.ckpt_interval=5", "train.eval_interval=5", "train.lr=3e-3", *CUDA,
             f"hardware.precision={precision}"), check=True)
    d = tmp_path / precision
    assert _start(d)["precision"] == precision
    got = losses(d)
    assert sorted(got) == list(range(1, 11)) and all(v is not None for v in got.values())
    evals = [r["val_loss"] for r in read_jsonl(d / "metrics.jsonl") if r["kind"] == "eval"]
    assert evals[-1] < evals[0]  # it learns
    scaler = _scaler_state(d)
    if precision == "fp16":
        assert scaler["scale"] > 0 and "_growth_tracker" in scaler, scaler
        # the checkpoint's weights stay fp32 (autocast only computes in fp16)
        sd = torch.load(f"{rundir.list_checkpoints(d)[-1]['path']}/model.pt", weights_only=True)
        assert all(v.dtype == torch.float32 for v in sd.values() if v.is_floating_point())
    else:
        assert scaler == {}


def test_tf32_flag_is_applied_and_changes_fp32_matmuls():
    from workbench.config import resolve_preset
    from workbench.machine.probe import this_machine
    from workbench.plan.settings import resolve_settings
    from workbench.train.runtime import apply_backend_flags
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    gen = torch.Generator(device="cpu").manual_seed(0)
    a, b = (torch.randn(2048, 2048, generator=gen, dtype=torch.float64) for _ in range(2))
    exact = a @ b
    err = {}
    try:
        for tf32 in (True, False):
            p = resolve_preset("cpu-small", [*CUDA, "hardware.precision=fp32", f"hardware.tf32={str(tf32).lower()}"])
            s = resolve_settings(p, this_machine(), world_size=1)
            assert s.tf32 is tf32
            apply_backend_flags(s)
            assert torch.backends.cuda.matmul.allow_tf32 is tf32 and torch.backends.cudnn.allow_tf32 is tf32
            got = (a.float().cuda() @ b.float().cuda()).double().cpu()
            err[tf32] = ((got - exact).abs().max() / exact.abs().max()).item()
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    if _cc() >= (8, 0):  # TF32 tensor cores: 10 mantissa bits instead of 23
        assert err[True] > 10 * err[False], err
    else:
        assert err[True] == err[False], err  # no TF32 before Ampere: the flag changes nothing


def _loss_and_grads(model, x, y):
    _, loss = model(x, y)
    loss.backward()
    return loss.item(), {n: p.grad.float() for n, p in model.named_parameters()}


@pytest.mark.parametrize("dtype", [None, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_fused_loss_on_cuda_equals_the_plain_loss(dtype):
    """The chunked loss's values and gradients against F.cross_entropy on full logits, on the GPU, in
    fp32 and under autocast; a vocabulary and chunk like a real preset's, the last chunk uneven."""
    if dtype is torch.bfloat16 and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    from workbench.config import ModelConfig
    from workbench.train.model import GPT
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=8192, dim=128, n_layers=2, n_heads=4, n_kv_heads=2, seq_len=128, dropout=0.0)
    plain = GPT(cfg).cuda()
    fused = GPT(cfg, loss_chunk_tokens=300).cuda()  # 4 x 128 = 512 tokens: chunks of 300 and 212
    fused.load_state_dict(plain.state_dict())
    x, y = (torch.randint(0, 8192, (4, 128), device="cuda") for _ in range(2))
    with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
        logits, _ = fused(x, y)
        assert logits is None  # the full logits never exist
        fused.zero_grad(set_to_none=True)
        a, ga = _loss_and_grads(plain, x, y)
        b, gb = _loss_and_grads(fused, x, y)
    tol = (1e-5, 1e-4) if dtype is None else (2e-3, 5e-2)  # as the CPU test (tests/test_model.py)
    assert abs(a - b) < (1e-4 if dtype is None else 2e-2), (a, b)
    assert ga["tok_emb.weight"].abs().sum() > 0
    for n in ga:
        torch.testing.assert_close(ga[n], gb[n], atol=tol[0], rtol=tol[1], msg=n)


def test_a_one_process_run_on_cuda(tmp_path):
    """--nproc 1: one process on the GPU. (One process never starts a process group, so NCCL itself
    needs two GPUs: the next test.)"""
    wb("train", "cpu-small", "--name", "one", "--runs-dir", str(tmp_path), "--nproc", "1",
       *tiny("train.max_iters=4", "train.ckpt_interval=4", "train.eval_interval=4", *CUDA), check=True)
    d = tmp_path / "one"
    start = _start(d)
    assert start["device"].startswith("cuda") and start["world_size"] == 1 and start["parallel"] == "none"
    assert sorted(losses(d)) == [1, 2, 3, 4] and rundir.read_status(d).state == "finished"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL with one process per GPU needs two GPUs")
def test_nccl_ddp_on_two_gpus_follows_one_process(tmp_path):
    common = ("train.max_iters=4", "train.ckpt_interval=4", "train.eval_interval=4", "train.lr_decay_iters=4",
              *CUDA, "hardware.precision=fp32", "hardware.tf32=false")
    wb("train", "cpu-small", "--name", "one", "--runs-dir", str(tmp_path), *tiny(*common), check=True)
    wb("train", "cpu-small", "--name", "two", "--runs-dir", str(tmp_path), "--nproc", "2", *tiny(*common), check=True)
    start = _start(tmp_path / "two")
    assert start["world_size"] == 2 and start["parallel"] == "ddp", start
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert sorted(one) == sorted(two) == [1, 2, 3, 4]
    for s in one:
        assert two[s] == pytest.approx(one[s], rel=1e-4), s
    assert rundir.read_status(tmp_path / "two").state == "finished"


def test_8bit_optimizer_states_on_cuda(tmp_path):
    """torchao's AdamW8bit on the GPU (where its step is a Triton kernel): the run trains, its losses stay within
    a few parts in a thousand of fp32 states, and the checkpoint holds the smaller states."""
    pytest.importorskip("torchao", reason="hardware.optimizer_states = 8bit needs torchao (pip install "
                                          "'workbench[savers]')")
    run = tiny("train.max_iters=6", "train.ckpt_interval=6", "train.eval_interval=6", *CUDA)
    for states in ("fp32", "8bit"):
        wb("train", "cpu-small", "--name", states, "--runs-dir", str(tmp_path), *run,
           f"hardware.optimizer_states={states}", check=True)
    a, b = losses(tmp_path / "fp32"), losses(tmp_path / "8bit")
    assert sorted(b) == list(range(1, 7)) and all(abs(a[s] - b[s]) < 5e-3 * a[s] for s in a)
    size = {n: rundir.list_checkpoints(tmp_path / n)[-1]["bytes"] for n in ("fp32", "8bit")}
    assert size["8bit"] < 0.75 * size["fp32"], size


def _offload_bytes(opt) -> tuple[int, int]:
    """(pinned host bytes: each offloaded weight's copy, its gradient's and AdamW's moments; the moments left on
    the device) of torchao's CPUOffloadOptimizer after a step."""
    host = sum(2 * p.untyped_storage().nbytes() for p in opt.param_d2h_map.values())
    for inner in opt.optim_dict.values():
        host += sum(v.untyped_storage().nbytes() for st in inner.state.values() for k, v in st.items()
                    if k != "step")
    dev = sum(v.untyped_storage().nbytes() for st in (opt.d_opt.state.values() if opt.d_opt else [])
              for k, v in st.items() if k != "step")
    return host, dev


def test_offloaded_states_are_what_the_estimate_counts_and_step_as_adamw_does():
    """hardware.optimizer_states = offload: the host's pinned bytes and the device's remaining moments are the
    estimate's, byte for byte; and a clipped step (the clip factor applied to the host's gradient copies, taken
    before the clip) moves the weights as torch's AdamW on the GPU does, where an unclipped step does not."""
    pytest.importorskip("torchao", reason="hardware.optimizer_states = offload needs torchao")
    import dataclasses

    from workbench.config import ModelConfig, Preset, TrainConfig
    from workbench.config.schema import HardwareConfig
    from workbench.machine.detect import Machine
    from workbench.plan.fit.memory import estimate_memory
    from workbench.train.model import GPT
    from workbench.train.optim import build_optimizer
    cfg = ModelConfig(vocab_size=512, dim=64, n_layers=2, n_heads=4, n_kv_heads=4, seq_len=32, ffn_hidden=64)
    t = TrainConfig(batch_size=2, grad_clip=0.05)
    torch.backends.cuda.matmul.allow_tf32 = False
    ids = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), device="cuda")
    weights = {}
    for states, clip in (("fp32", 0.05), ("offload", 0.05), ("fp32", 0.0)):
        torch.manual_seed(0)
        model = GPT(cfg).cuda()
        opt = build_optimizer(model, t, fused=states == "fp32", states=states)
        for _ in range(3):
            model(ids, targets=ids)[1].backward()
            if clip:
                opt.clip_grad_norm_(list(model.parameters()), clip)
            opt.step(torch.amp.GradScaler("cuda", enabled=False))
            opt.zero_grad()
        weights[(states, clip)] = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()
        if states == "offload":
            host, dev = _offload_bytes(opt.adamw)
            p = Preset(model=cfg, train=t, hardware=HardwareConfig(device="cuda", optimizer_states="offload",
                                                                   precision="fp32"))
            est = estimate_memory(p, machine=Machine.assumed("cuda"))
            assert (host, dev) == (est.host_offload, est.components["optimizer"])
            fp32 = estimate_memory(dataclasses.replace(p, hardware=HardwareConfig(device="cuda", precision="fp32")),
                                   machine=Machine.assumed("cuda"))
            assert est.checkpoint_bytes == fp32.checkpoint_bytes
    same = (weights[("offload", 0.05)] - weights[("fp32", 0.05)]).abs().max().item()
    unclipped = (weights[("fp32", 0.0)] - weights[("fp32", 0.05)]).abs().max().item()
    assert same < 1e-6 < 1e-2 * unclipped, (same, unclipped)


def test_offloaded_states_train_and_resume_bitwise_after_kill_minus_nine(tmp_path):
    """A run with its AdamW states on the CPU trains as one with them on the GPU (fp32, to a few parts in a
    million), and killed with kill -9 after a checkpoint and resumed it gives the straight run's losses bit for bit."""
    pytest.importorskip("torchao", reason="hardware.optimizer_states = offload needs torchao")
    common = ("train.max_iters=8", "train.ckpt_interval=4", "train.eval_interval=4", "train.lr_decay_iters=8",
              "train.grad_clip=0.5", *CUDA, "hardware.precision=fp32", "hardware.tf32=false",
              "hardware.compile=false", "hardware.deterministic=true")
    out = {}
    for name in ("fp32", "offload"):
        out[name] = wb("train", "cpu-small", "--name", name, "--runs-dir", str(tmp_path),
                       *tiny(*common, f"hardware.optimizer_states={name}"), check=True).stdout
    a, b = losses(tmp_path / "fp32"), losses(tmp_path / "offload")
    assert sorted(b) == list(range(1, 9)) and all(abs(a[s] - b[s]) < 1e-5 * a[s] for s in a), (a, b)
    assert "AdamW states on the CPU" in out["offload"] and "AdamW states on the CPU" not in out["fp32"]
    cp = wb("train", "cpu-small", "--name", "killed", "--runs-dir", str(tmp_path),
            *tiny(*common, "hardware.optimizer_states=offload"), env={"WORKBENCH_TEST_KILL_AT_STEP": "6"})
    assert cp.returncode == -signal.SIGKILL
    assert "resumed from checkpoint step_0000004" in wb("resume", "killed", "--runs-dir", str(tmp_path),
                                                        check=True).stdout
    assert losses(tmp_path / "killed") == b
    # a fine-tune: the source's weights are loaded after the optimizer is built; the host must step those
    for name in ("fp32", "offload"):
        wb("train", "cpu-small", "--name", f"ft-{name}", "--runs-dir", str(tmp_path), "--init-from", "fp32",
           "--set", "train.max_iters=4", "train.ckpt_interval=4", "train.eval_interval=4", "train.grad_clip=0.5",
           "train.warmup_iters=1", "train.log_interval=1", *common[5:], f"hardware.optimizer_states={name}", check=True)
    a, b = losses(tmp_path / "ft-fp32"), losses(tmp_path / "ft-offload")
    assert sorted(b) == [1, 2, 3, 4] and all(abs(a[s] - b[s]) < 1e-5 * a[s] for s in a), (a, b)


def test_packed_conversations_train_alike_with_flex_attention_and_sdpa_with_the_mask(tmp_path):
    """Packed chat rows on CUDA: auto picks flex attention (model.dropout = 0) and its training steps (forward
    and backward: flex has no backward on a CPU) give the losses of SDPA with the [B, 1, T, T] mask
    (the memory-efficient kernel), in fp32 to a few parts in a hundred thousand."""
    from tests.support.chat import conversations, write_jsonl
    chat = write_jsonl(tmp_path / "chat.jsonl", conversations(400, seed=1))
    common = ("model.seq_len=128", "model.vocab_size=400", "model.dropout=0.0", "train.max_iters=6",
              "train.ckpt_interval=6", "train.eval_interval=6", *CUDA, "hardware.precision=fp32",
              "hardware.tf32=false", "hardware.compile=false")
    for name, kernel in (("flex", "auto"), ("sdpa", "efficient")):
        wb("train", "cpu-small", "--corpus", str(chat), "--name", name, "--runs-dir", str(tmp_path),
           *tiny(*common, f"hardware.attention_kernel={kernel}"), check=True)
    assert _start(tmp_path / "flex")["chat"]["packing"]
    assert "flex attention for packed rows" in (tmp_path / "flex" / "train.log").read_text()
    assert "flex attention" not in (tmp_path / "sdpa" / "train.log").read_text()
    a, b = losses(tmp_path / "flex"), losses(tmp_path / "sdpa")
    assert sorted(a) == list(range(1, 7)) and all(abs(a[s] - b[s]) < 5e-5 * b[s] for s in a), (a, b)


def test_fit_probes_the_gpu_with_the_steps_given(tmp_path):
    """`fit --steps`: on a GPU each trial is a real probe of that many optimizer steps (on a CPU fit decides from
    the estimate, which takes no steps: this flag has its effect only here)."""
    r = wb("fit", "cpu-small", "--device", "cuda", "--steps", "2", "--out", "probed",
           env={"WORKBENCH_PRESETS_DIR": str(tmp_path)}, check=True)
    assert "real probe, 2 steps per trial" in r.stdout, r.stdout
    assert (tmp_path / "probed.toml").is_file()
