"""workbench's training step against nanoGPT's (karpathy/nanoGPT) at the same size on the same device, one
contender after the other in one process. A benchmark, not a test.

    python bench/gpu_peers.py --nanogpt PATH [--wb NAME="PRESET k=v ..."]... [--warmup 5 --steps 20]
                              [--set k=v ...] [--json OUT] [--profile NAME]
    python bench/gpu_peers.py --nanogpt PATH --time-to-loss [--wb ...] [--steps 200 --eval-every 25]
                              [--tokens FILE.bin | --vocab 32768]
    python bench/gpu_peers.py --nanogpt PATH --smoke [--time-to-loss]    # the harness on a CPU, tiny dims

Throughput (the default mode): each contender is built, warmed up (--warmup steps: torch.compile happens here; its
seconds are printed) and timed over --steps steps on random tokens (the same generator seed for all), CUDA-synchronised
wall time. For each: ms a step, tokens/s, the ratio to nanoGPT, MFU by ONE formula for all, (6 x matrix params + 12 x
layers x dim x seq) x tokens/s / peak (peak: the GPU table's bf16 dense figure, workbench.machine.gpus; on a CPU the
matmul rate measured here), peak memory allocated since the contender was built (CUDA memory stats reset before each),
and for workbench contenders workbench's own estimate of that peak (plan.fit.memory) and its error, and the settings
line.
--profile NAME prints torch.profiler's breakdown of that contender's step (bench/profile_step.py's table).

Contenders: ``nanogpt`` is nanoGPT's own model.py imported from the checkout given (--nanogpt; never copied into this
repository): GPT(GPTConfig(n_layer, n_head, n_embd, block_size, vocab_size, dropout=0, bias=False)), its
configure_optimizers(weight_decay=0.1, learning_rate=6e-4, betas=(0.9, 0.95)) (fused AdamW on CUDA),
torch.compile(model), bf16 autocast on CUDA, the step of its train.py (GradScaler calls, off in bf16; grad clip 1.0).
Each --wb NAME="PRESET k=v ..." (default ``shipped=gpu-24gb``) is a workbench preset built as the trainer builds it
(resolve_settings for one process with the measured peak, apply_backend_flags, build, autocast) and stepped as
Trainer.train_step steps it (the learning rate set, the clip, the non-finite check on the device or the host). The
same size applies to all (--dim --layers --heads --seq --vocab --batch, the issue's by default): to workbench as
model.* / train.batch_size overrides with n_kv_heads = heads, grad_accum 1, dropout 0, and ffn_hidden = 8/3 x dim, so
its SwiGLU's three matrices hold as many weights as nanoGPT's 4x MLP (both matrix-parameter counts are printed); the
memory savers (the fused loss, activation checkpointing) are the preset's, auto unless set. Then --set (every
workbench contender), then the contender's own overrides, last wins. A contender's ``variant=NAME`` (one of
bench/profile_step.py's VARIANTS, e.g. rope-before-transpose) changes workbench's model code for that contender alone;
``native`` keeps the preset's own size and batch (gpu-8gb as shipped, say) instead of the shared one.

Compiles in parallel (a GPU): ``--only NAME`` runs one contender; with ``--barrier DIR --barrier-count N`` the N
processes started side by side compile and warm up at once (the host's cores), then wait for each other and take the
timed steps one at a time (a lock in DIR), so no timed step shares the GPU; ``--merge FILE...`` prints their table.

--time-to-loss: nanoGPT's own train.py recipe for GPT-2 small (AdamW lr 6e-4, betas 0.9/0.95, weight decay 0.1, linear
warmup of --warmup-iters then cosine to min_lr 6e-5 at --steps, grad clip 1, its GPT init, its loop) against each
workbench contender's preset recipe (its optimizer, learning rates and schedule, with train.max_iters = --steps and
train.warmup_iters = --warmup-iters unless the contender sets them), on the same tokens: one uint16 token file (--tokens
FILE.bin, or workbench's built-in corpus tokenised once by a workbench sentencepiece tokenizer of --vocab pieces, kept
in --work), its last --val-fraction held out; both draw the same training windows (one sampler seed), the same batch
shape and number of steps, and are scored on the same --eval-iters val batches every --eval-every steps. Training time
only: each contender's compile happens in --warmup steps on throwaway random tokens, after which its weights and
optimizer state are put back to their initial values, so the clock starts warm (the warm-up's seconds are printed
apart, not counted); evals are not counted either. Printed: nanoGPT's final val loss, the training seconds at which
each workbench contender first reached it (interpolated between evals; "never" if it did not) and the ratio.

--smoke (implied without CUDA): tiny dims (dim 96, 2 layers, 4 heads, seq 64, vocab 512, batch 4; dim 96 since 8/3 x
64 is no whole number), a few steps, on the CPU, compile off, fp32: the whole harness in seconds.

nanochat (karpathy/nanochat) is not a contender: its gpt.py is not available offline where this was written.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import importlib.util
import io
import math
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from workbench.config import resolve_preset
from workbench.config.schema import DataConfig
from workbench.data.preset_data import prepare_data
from workbench.data.text.tokens import WindowSampler
from workbench.data.train_data import Batch
from workbench.fs import write_json_atomic
from workbench.machine.peaks import peak_flops
from workbench.machine.probe import measured_peak, this_machine
from workbench.plan.fit.flops import matmul_params
from workbench.plan.fit.memory import estimate_memory
from workbench.plan.schedule.horizon import Horizon
from workbench.plan.settings import resolve_settings
from workbench.train.build import build
from workbench.train.dist import Dist
from workbench.train.runtime import apply_backend_flags, autocast, batch_to_device, synchronize

BENCH = Path(__file__).resolve().parent
MiB = 2**20


def bench_module(name: str):
    """Another script of bench/ (not a package) as a module: its functions are used, not copied."""
    return load_file(f"bench_{name}", BENCH / f"{name}.py")


def load_file(name: str, path: Path):
    """A Python file as the module ``name`` (registered first, as an import does: dataclasses look it up)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


# ----------------------------------------------------------------------------- the size and the contenders

@dataclass(frozen=True)
class Dims:
    dim: int
    layers: int
    heads: int
    seq: int
    vocab: int
    batch: int
    ffn_hidden: int

    def flops_per_token(self, matrix_params: int) -> float:
        """The one MFU formula of this bench: 6 x matrix params + 12 x layers x dim x seq."""
        return 6.0 * matrix_params + 12.0 * self.layers * self.dim * self.seq

    def wb_overrides(self) -> list[str]:
        return [f"model.dim={self.dim}", f"model.n_layers={self.layers}", f"model.n_heads={self.heads}",
                f"model.n_kv_heads={self.heads}", f"model.seq_len={self.seq}", f"model.vocab_size={self.vocab}",
                f"model.ffn_hidden={self.ffn_hidden}", "model.dropout=0.0", f"train.batch_size={self.batch}",
                "train.grad_accum=1"]


def native_dims(p) -> Dims:
    """A preset's own size and micro-batch as Dims (a ``native`` contender)."""
    m = p.model
    return Dims(dim=m.dim, layers=m.n_layers, heads=m.n_heads, seq=m.seq_len, vocab=m.vocab_size,
                batch=p.train.batch_size, ffn_hidden=m.hidden_dim)


ISSUE_DIMS = dict(dim=768, layers=12, heads=12, seq=1024, vocab=32768, batch=32)   # issue 48's measurement
SMOKE_DIMS = dict(dim=96, layers=2, heads=4, seq=64, vocab=512, batch=4)
SMOKE_WB = ["hardware.device=cpu", "hardware.precision=fp32", "hardware.compile=false"]


@dataclass
class WbSpec:
    name: str
    preset: str
    overrides: list[str]
    variants: list[str] = field(default_factory=list)
    native: bool = False   # the preset's own size and batch, not the shared one (no like-for-like nanoGPT ratio)


def parse_wb(spec: str) -> WbSpec:
    """``NAME=PRESET k=v ... [variant=NAME]`` (or ``PRESET k=v ...``: the preset's name is the contender's)."""
    words = shlex.split(spec)
    if not words:
        raise SystemExit("gpu_peers: an empty --wb")
    variants = [w.split("=", 1)[1] for w in words[1:] if w.startswith("variant=")]
    known = bench_module("profile_step").VARIANTS
    for v in variants:
        if v not in known:
            raise SystemExit(f"gpu_peers: --wb {spec!r}: no variant {v!r}; known: {', '.join(sorted(known))}")
    native = "native" in words[1:]
    words = [w for w in words if not w.startswith("variant=") and w != "native"]
    head, overrides = words[0], words[1:]
    name, eq, preset = head.partition("=")
    if not eq or "." in name:
        name = preset = head
    if not name or not preset or name == "nanogpt":
        raise SystemExit(f"gpu_peers: --wb {spec!r}: give NAME=PRESET [k=v ...] (NAME not 'nanogpt')")
    return WbSpec(name, preset, overrides, variants, native)


@contextlib.contextmanager
def model_variants(names: list[str]):
    """bench/profile_step.py's model changes applied while a contender is built and run, then undone."""
    from workbench.train import model as model_mod
    ps = bench_module("profile_step")
    saved = (model_mod.Attention.forward, model_mod.SwiGLU.forward, model_mod.apply_rope, model_mod.RMSNorm.forward)
    try:
        for n in names:
            for change in ps.VARIANTS[n]:
                change()
        yield
    finally:
        (model_mod.Attention.forward, model_mod.SwiGLU.forward, model_mod.apply_rope,
         model_mod.RMSNorm.forward) = saved


class Barrier:
    """Processes started side by side (--only, --barrier): each compiles and warms up at once, then waits until all
    are ready and takes the timed steps under a lock, one process at a time."""

    def __init__(self, directory: str | None, count: int, name: str):
        self.dir, self.count, self.name, self.lock = (Path(directory) if directory else None), count, name, None

    def ready_then_lock(self, timeout: float = 900.0) -> None:
        if self.dir is None:
            return
        import fcntl
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / f"{self.name}.ready").touch()
        t0 = time.time()
        while len(list(self.dir.glob("*.ready"))) < self.count:
            if time.time() - t0 > timeout:
                print(f"gpu_peers: {self.name}: the others were not ready in {timeout:.0f} s; timing anyway",
                      flush=True)
                break
            time.sleep(0.5)
        self.lock = open(self.dir / "lock", "w")
        fcntl.flock(self.lock, fcntl.LOCK_EX)

    def release(self) -> None:
        if self.lock is not None:
            import fcntl
            fcntl.flock(self.lock, fcntl.LOCK_UN)
            self.lock.close()
            self.lock = None


@dataclass
class Contender:
    """One row: how to step it, score it and put it back; what it is."""
    name: str
    kind: str                                   # nanogpt | workbench
    matrix_params: int
    settings: str
    step: Callable                              # (batch, it, fetch) -> (loss tensor, next batch)
    evaluate: Callable                          # (val batches) -> mean val loss
    modules: tuple                              # (model, optimizer): snapshot and restore
    estimate_bytes: int | None = None
    info: dict = field(default_factory=dict)

    @property
    def compiled(self) -> bool:
        return bool(self.info.get("compile")) or self.info.get("compile_mode", "off") != "off"


def load_nanogpt(path: Path):
    """nanoGPT's model.py from its checkout (imported from the file, under a name of its own)."""
    f = path / "model.py" if path.is_dir() else path
    if not f.is_file():
        raise SystemExit(f"gpu_peers: no nanoGPT model.py at {f} (--nanogpt: a checkout of karpathy/nanoGPT)")
    mod = load_file("peer_nanogpt_model", f)
    for need in ("GPT", "GPTConfig"):
        if not hasattr(mod, need):
            raise SystemExit(f"gpu_peers: {f} has no {need}: not nanoGPT's model.py")
    return mod


def linear_weights(model: torch.nn.Module) -> int:
    """The weights of a model's Linear layers, a tied one once: the matrix params of the MFU formula."""
    return sum({id(m.weight): m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)}.values())


def nanogpt_schedule(steps: int, warmup: int, lr: float = 6e-4, min_lr: float = 6e-5) -> Callable[[int], float]:
    """nanoGPT train.py's get_lr with max_iters = lr_decay_iters = ``steps``."""
    def get_lr(it: int) -> float:
        if it < warmup:
            return lr * (it + 1) / (warmup + 1)
        if it > steps:
            return min_lr
        ratio = (it - warmup) / max(1, steps - warmup)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)
    return get_lr


def build_nanogpt(mod, d: Dims, dev: torch.device, smoke: bool, get_lr: Callable[[int], float]) -> Contender:
    """As nanoGPT's train.py builds it: seed 1337, TF32 allowed, the model, configure_optimizers, compile, autocast."""
    torch.manual_seed(1337)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    said = io.StringIO()
    with contextlib.redirect_stdout(said):  # its parameter and optimizer-group prints
        cfg = mod.GPTConfig(n_layer=d.layers, n_head=d.heads, n_embd=d.dim, block_size=d.seq, vocab_size=d.vocab,
                            dropout=0.0, bias=False)
        model = mod.GPT(cfg).to(dev)
        optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), dev.type)
    fused = "using fused AdamW: True" in said.getvalue()
    compiled = dev.type == "cuda" and not smoke
    fwd = torch.compile(model) if compiled else model
    amp = dev.type == "cuda" and not smoke
    ctx = torch.autocast(dev.type, dtype=torch.bfloat16) if amp else contextlib.nullcontext()
    scaler = torch.amp.GradScaler(dev.type, enabled=False)  # train.py: enabled only for float16

    def step(batch, it, fetch):
        # train.py's iteration, gradient_accumulation_steps = 1
        lr = get_lr(it)
        for g in optimizer.param_groups:
            g["lr"] = lr
        x, y = batch
        with ctx:
            _logits, loss = fwd(x, y)
        nxt = fetch()  # "immediately async prefetch next batch while model is doing the forward pass on the GPU"
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        return loss, nxt

    @torch.no_grad()
    def evaluate(batches) -> float:
        # train.py's estimate_loss: the compiled model in eval mode, the mean of the batches' losses
        fwd.eval()
        losses = []
        for x, y in batches:
            with ctx:
                losses.append(fwd(x, y)[1].float())
        fwd.train()
        return torch.stack(losses).mean().item()

    what = ["compile" if compiled else "eager", "bf16 autocast" if amp else "fp32",
            "fused AdamW" if fused else "AdamW", "plain loss"]
    info = {"fused_adamw": fused, "compile": compiled, "params": sum(q.numel() for q in model.parameters())}
    return Contender("nanogpt", "nanogpt", linear_weights(model), ", ".join(what), step, evaluate, (model, optimizer),
                     info=info)


def build_workbench(spec: WbSpec, overrides: list[str], machine, cache: Path) -> Contender:
    """As the trainer builds it (Trainer.setup) for one process, stepped as Trainer.train_step steps it."""
    p = resolve_preset(spec.preset, [*overrides, *spec.overrides])
    s = resolve_settings(p, machine, world_size=1, peak=measured_peak)
    apply_backend_flags(s)
    dev = torch.device(s.device)
    torch.manual_seed(p.train.seed)
    b = build(p, s, dev, Dist(), cache)
    amp = autocast(s)
    t = p.train
    horizon = Horizon.of(p)  # the trainer's schedule (the bench has no time budget)

    def step(batch, it, fetch):
        b.optimizer.set_lr(horizon.lr_factor(it))
        loss_sum = torch.zeros((), device=dev)
        x, y = batch
        with amp:
            loss = b.train_forward(x, y, positions=None, segments=None, loss_tokens=None)[1]
        b.scaler.scale(loss).backward()
        loss_sum += loss.detach()
        b.optimizer.unscale_(b.scaler)
        params = b.model.parameters()
        if t.grad_clip > 0:
            grad_norm = b.optimizer.clip_grad_norm_(params, t.grad_clip)
        else:
            grad_norm = torch.linalg.vector_norm(torch.stack([q.grad.detach().norm() for q in params
                                                              if q.grad is not None]))
        if s.nonfinite_check == "device":
            b.optimizer.step_unless(~(torch.isfinite(loss_sum) & torch.isfinite(grad_norm)))
        else:  # the host check: one sync a step
            finite = math.isfinite(loss_sum.item()) and (math.isfinite(float(grad_norm)) or s.grad_scaler)
            if finite:
                b.optimizer.step(b.scaler)
            if finite or s.grad_scaler:
                b.scaler.update()
        b.optimizer.zero_grad(set_to_none=True)
        return loss_sum, fetch()  # the trainer draws the next step's batch when that step begins

    @torch.no_grad()
    def evaluate(batches) -> float:
        # the trainer's evaluate: the model itself (not the compiled step), in eval mode
        b.model.eval()
        losses = []
        for x, y in batches:
            with amp:
                losses.append(b.model(x, y)[1].float())
        b.model.train()
        return torch.stack(losses).mean().item()

    est = estimate_memory(p, settings=s).peak_allocated
    c = Contender(spec.name, "workbench", matmul_params(p.model), s.describe(), step, evaluate,
                  (b.model, b.optimizer), estimate_bytes=est,
                  info={"preset": spec.preset, "overrides": spec.overrides, "params": b.model.num_params(),
                        "optimizer": t.optimizer, "schedule": t.schedule, "lr": t.lr, "min_lr": t.min_lr,
                        "warmup_iters": t.warmup_iters, "qk_norm": p.model.qk_norm,
                        "loss_chunk_tokens": s.loss_chunk_tokens, "compile_mode": s.compile_mode,
                        "nonfinite_check": s.nonfinite_check, "attention_kernel": s.attention_kernel})
    return c


# ----------------------------------------------------------------------------- running them

def free(dev: torch.device) -> None:
    """Between contenders: nothing of the last one left, compiled graphs included; fresh memory stats."""
    gc.collect()
    torch._dynamo.reset()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def restore_backend_defaults(defaults: dict) -> None:
    """The SDPA backends and TF32 flags as the process started: one contender's flags are not the next one's."""
    torch.backends.cuda.matmul.allow_tf32 = defaults["tf32"]
    torch.backends.cudnn.allow_tf32 = defaults["cudnn_tf32"]
    torch.backends.cuda.enable_flash_sdp(defaults["flash"])
    torch.backends.cuda.enable_cudnn_sdp(defaults["cudnn"])
    torch.backends.cuda.enable_mem_efficient_sdp(defaults["efficient"])


def to_device(xy: tuple[np.ndarray, np.ndarray], dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """x and y as nanoGPT's get_batch makes them (contiguous: its loss views the targets) and as the trainer moves
    them (pinned, copied asynchronously to a GPU)."""
    b = batch_to_device(Batch(*(np.ascontiguousarray(a) for a in xy)), dev)
    return b.inputs, b.targets


def random_batches(d: Dims, dev: torch.device, seed: int) -> Callable[[], tuple]:
    """(x, y) on the device from random tokens: the same stream for every contender given the same seed."""
    rng = np.random.Generator(np.random.PCG64(seed))

    def fetch():
        w = rng.integers(0, d.vocab, size=(d.batch, d.seq + 1), dtype=np.int64)
        return to_device((w[:, :-1], w[:, 1:]), dev)
    return fetch


def window_batches(tokens: np.ndarray, d: Dims, dev: torch.device, seed: int) -> Callable[[], tuple]:
    sampler = WindowSampler(tokens, d.seq, d.batch, seed)
    return lambda: to_device(((b := sampler.next_batch()).inputs, b.targets), dev)


def peak_memory(dev: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated() / MiB if dev.type == "cuda" else None


def fmt(v, spec: str, none: str = "n/a") -> str:
    return none if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def throughput(c: Contender, d: Dims, dev: torch.device, args, peak: float | None,
               barrier: Barrier | None = None) -> dict:
    fetch = random_batches(d, dev, seed=0)
    batch = fetch()
    t0 = time.perf_counter()
    for it in range(args.warmup):
        _loss, batch = c.step(batch, it, fetch)
    synchronize(dev)
    warm = time.perf_counter() - t0
    warm_peak = peak_memory(dev)
    if barrier is not None:
        barrier.ready_then_lock()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for it in range(args.warmup, args.warmup + args.steps):
        loss, batch = c.step(batch, it, fetch)
    synchronize(dev)
    dt = (time.perf_counter() - t0) / args.steps
    tps = d.batch * d.seq / dt
    fpt = d.flops_per_token(c.matrix_params)
    timed_peak = peak_memory(dev)
    peak_mib = None if timed_peak is None else max(timed_peak, warm_peak)
    est = c.estimate_bytes / MiB if c.estimate_bytes else None
    row = {"name": c.name, "kind": c.kind, "settings": c.settings, "matrix_params": c.matrix_params,
           "flops_per_token": fpt, "warmup_steps": args.warmup, "warmup_s": round(warm, 2), "steps": args.steps,
           "ms_per_step": dt * 1e3, "tokens_per_s": tps, "mfu": tps * fpt / peak if peak else None,
           "last_loss": loss.item(), "peak_allocated_mib": peak_mib, "peak_timed_mib": timed_peak,
           "estimate_mib": est, "estimate_error": (est - peak_mib) / peak_mib if est and peak_mib else None, **c.info}
    if args.profile == c.name:
        state = {"batch": batch, "it": args.warmup + args.steps}

        def one():
            _l, state["batch"] = c.step(state["batch"], state["it"], fetch)
            state["it"] += 1
        print(f"-- profile of {c.name} ({args.steps} steps)", flush=True)
        bench_module("profile_step").profile_table(one, args.steps, dev, dt)
    if barrier is not None:
        barrier.release()
    return row


def print_table(rows: list[dict], base: float | None) -> None:
    print(f"\n{'contender':14s} {'ms/step':>8s} {'tokens/s':>11s} {'vs nanoGPT':>10s} {'MFU':>7s} "
          f"{'peak MiB':>9s} {'estimate MiB (error)':>21s}  settings")
    for r in rows:
        ratio = r["tokens_per_s"] / base if base else None
        est = (f"{r['estimate_mib']:,.0f} ({fmt(r['estimate_error'], '+.1%', '-')})" if r["estimate_mib"] else "-")
        print(f"{r['name']:14s} {r['ms_per_step']:8.1f} {r['tokens_per_s']:11,.0f} {fmt(ratio, '10.2f'):>10s} "
              f"{fmt(r['mfu'], '.1%'):>7s} {fmt(r['peak_allocated_mib'], ',.0f'):>9s} {est:>21s}  {r['settings']}")


# ----------------------------------------------------------------------------- time to loss

def token_file(args, d: Dims) -> Path:
    """The one uint16 token file both contenders read: --tokens, or the built-in corpus tokenised once."""
    if args.tokens:
        return Path(args.tokens)
    out = Path(args.work) / f"builtin-{args.builtin_mb:g}mb-tok{args.tokenizer_mb:g}mb-v{d.vocab}.bin"
    if not out.exists():
        data = prepare_data(DataConfig(corpus="builtin", builtin_mb=args.builtin_mb,
                                       tokenizer_sample_mb=args.tokenizer_mb), d.vocab, d.seq)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        np.asarray(data.tokens, dtype=np.uint16).tofile(tmp)
        tmp.replace(out)
    return out


def snapshot(c: Contender):
    """The weights and optimizer state as built, to put back after the warm-up (compile) steps."""
    model, opt = c.modules
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    opt_state = copy.deepcopy(opt.state_dict())

    def restore():
        with torch.no_grad():
            model.load_state_dict(weights)
        opt.load_state_dict(opt_state)
    return restore


def train_to_loss(c: Contender, d: Dims, dev: torch.device, args, train_tokens: np.ndarray, val: list) -> dict:
    """--steps steps from the shared window stream, an eval of the shared val batches every --eval-every steps
    (and at the end), on a clock that counts the training steps alone."""
    restore = snapshot(c)
    as_built = c.evaluate(val)
    junk = random_batches(d, dev, seed=12345)
    batch = junk()
    t0 = time.perf_counter()
    for it in range(args.warmup):
        _l, batch = c.step(batch, it, junk)
    synchronize(dev)
    warm = time.perf_counter() - t0
    restore()
    fetch = window_batches(train_tokens, d, dev, seed=args.seed)
    batch = fetch()
    evals, losses, clock = [], [], 0.0
    synchronize(dev)
    since = time.perf_counter()
    for it in range(args.steps + 1):
        if it % args.eval_every == 0 or it == args.steps:
            synchronize(dev)
            clock += time.perf_counter() - since
            vl = c.evaluate(val)
            if it == 0 and abs(vl - as_built) > 1e-4:
                raise SystemExit(f"gpu_peers: {c.name}'s val loss after its warm-up and restore, {vl:.6f}, is not the "
                                 f"model's as built, {as_built:.6f}: the restore failed")
            evals.append((it, round(clock, 3), vl))
            print(f"   {c.name} step {it}: val loss {vl:.4f} at {clock:.1f} s", flush=True)
            synchronize(dev)
            since = time.perf_counter()
        if it == args.steps:
            break
        loss, batch = c.step(batch, it, fetch)
        if (it + 1) % args.log_every == 0:
            losses.append((it + 1, loss.item()))  # nanoGPT's log line, the trainer's settle: a sync, counted
    seen = args.steps * d.batch * d.seq
    return {"name": c.name, "kind": c.kind, "settings": c.settings, "matrix_params": c.matrix_params,
            "warmup_steps": args.warmup, "warmup_s": round(warm, 2), "train_s": round(clock, 3),
            "tokens_per_s": seen / clock, "epochs": seen / len(train_tokens), "evals": evals,
            "train_losses": losses, "final_val_loss": evals[-1][2], **c.info}


# ----------------------------------------------------------------------------- main

def merge(files: list[str], json_out: str | None) -> int:
    """The table of several --only runs' JSON files (nanoGPT's row first: the ratios are to it)."""
    import json
    parts = [json.loads(Path(f).read_text()) for f in files]
    rows = [r for p in parts for r in p["contenders"]]
    if not rows:
        raise SystemExit("gpu_peers: --merge: no contender finished")
    rows.sort(key=lambda r: r["kind"] != "nanogpt")
    base = rows[0]["tokens_per_s"] if rows[0]["kind"] == "nanogpt" else None
    for r in rows:
        r["vs_nanogpt"] = r["tokens_per_s"] / base if base else None
    out = {k: v for k, v in parts[0].items() if k != "contenders"} | {"contenders": rows, "merged": files}
    print(f"{out['device']}, torch {out['torch']} (CUDA {out['cuda']}); dims {out['dims']}")
    print_table(rows, base)
    print(f"MFU = (6 x matrix params + 12 x layers x dim x seq) x tokens/s / {fmt(out['peak_flops'], '.4g')} FLOP/s "
          f"({out['peak_source']}); peak MiB: torch.cuda.max_memory_allocated since the contender was built")
    if json_out:
        write_json_atomic(json_out, out)
    return 0


def main() -> int:
    if "--merge" in sys.argv:
        ap = argparse.ArgumentParser()
        ap.add_argument("--merge", nargs="+", required=True)
        ap.add_argument("--json", default=None)
        a = ap.parse_args()
        return merge(a.merge, a.json)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nanogpt", required=True, type=Path, help="a checkout of karpathy/nanoGPT (its model.py)")
    ap.add_argument("--only", default=None, metavar="NAME", help="run this contender alone (nanogpt or a --wb name)")
    ap.add_argument("--barrier", default=None, metavar="DIR",
                    help="with --only: wait in DIR for --barrier-count processes to warm up, then time one at a time")
    ap.add_argument("--barrier-count", type=int, default=1)
    ap.add_argument("--wb", action="append", default=[], metavar='NAME="PRESET k=v ..."',
                    help="a workbench contender (repeatable; default shipped=gpu-24gb)")
    ap.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="k=v",
                    help="overrides for every workbench contender, after the shared size")
    for k, v in ISSUE_DIMS.items():
        ap.add_argument(f"--{k}", type=int, default=None, help=f"default {v} ({SMOKE_DIMS[k]} with --smoke)")
    ap.add_argument("--ffn-hidden", type=int, default=None,
                    help="workbench's model.ffn_hidden (default 8/3 x dim: nanoGPT's matrix params)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 20; --time-to-loss 200; smoke 4/30)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps first, the compile among them "
                                                            "(default 5; smoke 1)")
    ap.add_argument("--json", default=None, help="write the results here (after every contender)")
    ap.add_argument("--profile", default=None, metavar="NAME", help="torch.profiler's breakdown for this contender")
    ap.add_argument("--smoke", action="store_true", help="tiny dims on the CPU, fp32, no compile (implied off CUDA)")
    ttl = ap.add_argument_group("--time-to-loss")
    ttl.add_argument("--time-to-loss", action="store_true")
    ttl.add_argument("--eval-every", type=int, default=None, help="default 25 (smoke 10)")
    ttl.add_argument("--eval-iters", type=int, default=None, help="val batches (default 16; smoke 2)")
    ttl.add_argument("--warmup-iters", type=int, default=None,
                     help="learning-rate warmup of both recipes (default --steps / 10)")
    ttl.add_argument("--tokens", default=None, help="a uint16 token file (nanoGPT's .bin format) instead of the "
                                                    "built-in corpus; --vocab must cover its ids")
    ttl.add_argument("--val-fraction", type=float, default=0.05, help="the token file's last share held out")
    ttl.add_argument("--builtin-mb", type=float, default=None, help="MB of the built-in corpus (default 24; smoke 0.3)")
    ttl.add_argument("--tokenizer-mb", type=float, default=None, help="its tokenizer's sample (default 8; smoke 0.3)")
    ttl.add_argument("--work", default="/tmp/wb-peers", help="where the token file is kept")
    ttl.add_argument("--seed", type=int, default=1337, help="the training windows' sampler seed (val: seed + 1)")
    ttl.add_argument("--log-every", type=int, default=10, help="read the loss back every N steps (a sync)")
    args = ap.parse_args()

    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        print("gpu_peers: no CUDA here: --smoke (tiny dims on the CPU, fp32, no compile)")
        args.smoke = True
    base = SMOKE_DIMS if args.smoke else ISSUE_DIMS
    dims = {k: getattr(args, k) or v for k, v in base.items()}
    ffn = args.ffn_hidden or (8 * dims["dim"] // 3 if 8 * dims["dim"] % 3 == 0 else None)
    if ffn is None:
        raise SystemExit(f"gpu_peers: 8/3 x dim {dims['dim']} is no whole number: give --ffn-hidden")
    d = Dims(**dims, ffn_hidden=ffn)
    ttl_mode = args.time_to_loss
    if ttl_mode and d.vocab > 2**16:
        raise SystemExit(f"gpu_peers: --vocab {d.vocab} does not fit the uint16 token file")
    smoke = args.smoke
    args.steps = args.steps or ((30 if ttl_mode else 4) if smoke else (200 if ttl_mode else 20))
    args.warmup = args.warmup if args.warmup is not None else (1 if smoke else 5)
    if args.steps < 1 or args.warmup < 0:
        raise SystemExit("gpu_peers: --steps must be at least 1 and --warmup at least 0")
    args.eval_every = args.eval_every or (10 if smoke else 25)
    args.eval_iters = args.eval_iters or (2 if smoke else 16)
    args.warmup_iters = args.warmup_iters if args.warmup_iters is not None else max(1, args.steps // 10)
    args.builtin_mb = args.builtin_mb or (0.3 if smoke else 24.0)
    args.tokenizer_mb = args.tokenizer_mb or (0.3 if smoke else 8.0)
    specs = [parse_wb(w) for w in (args.wb or ["shipped=gpu-24gb"])]
    names = ["nanogpt"] + [s.name for s in specs]
    if len(set(names)) != len(names):
        raise SystemExit(f"gpu_peers: contender names must differ: {', '.join(names)}")
    if args.profile and (args.profile not in names or ttl_mode):
        raise SystemExit(f"gpu_peers: --profile takes one of {', '.join(names)} (throughput mode)")
    if args.only:
        if args.only not in names:
            raise SystemExit(f"gpu_peers: --only takes one of {', '.join(names)}")
        names = [args.only]
    barrier = Barrier(args.barrier, args.barrier_count, args.only or "all") if args.barrier and not ttl_mode else None

    shared = d.wb_overrides() + (SMOKE_WB if smoke else []) + args.overrides
    if ttl_mode:
        shared += [f"train.max_iters={args.steps}", f"train.warmup_iters={args.warmup_iters}"]
    dev = torch.device("cpu" if smoke else "cuda")
    gpu = torch.cuda.get_device_name() if dev.type == "cuda" else None
    if gpu:
        peak, peak_src = peak_flops(gpu, "bf16"), "the GPU table's bf16 dense peak"
    else:
        peak, peak_src = measured_peak("cpu", "fp32"), "the CPU's fp32 matmul rate measured now"
    nano = load_nanogpt(args.nanogpt)
    machine = this_machine()
    cache = Path(args.work) / "inductor"
    defaults = {"tf32": torch.backends.cuda.matmul.allow_tf32, "cudnn_tf32": torch.backends.cudnn.allow_tf32,
                "flash": torch.backends.cuda.flash_sdp_enabled(), "cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
                "efficient": torch.backends.cuda.mem_efficient_sdp_enabled()}
    out = {"mode": "time-to-loss" if ttl_mode else "throughput", "smoke": smoke, "device": gpu or "cpu",
           "torch": torch.__version__, "cuda": torch.version.cuda, "peak_flops": peak, "peak_source": peak_src,
           "dims": asdict(d), "shared_overrides": shared, "nanogpt": str(args.nanogpt),
           "contenders": [], "done": False}
    print(f"{out['device']}, torch {torch.__version__} (CUDA {torch.version.cuda}); peak {fmt(peak, '.4g')} FLOP/s "
          f"({peak_src}); dim {d.dim}, {d.layers} layers, {d.heads} heads, seq {d.seq}, vocab {d.vocab}, "
          f"batch {d.batch} ({d.batch * d.seq:,} tokens a step), workbench ffn_hidden {d.ffn_hidden}")
    print(f"workbench overrides for every contender: {' '.join(shared)}")

    def save():
        if args.json:
            write_json_atomic(args.json, out)

    val: list = []
    train_tokens = None
    if ttl_mode:
        path = token_file(args, d)
        tokens = np.memmap(path, dtype=np.uint16, mode="r")
        top = int(tokens.max())
        if top >= d.vocab:
            raise SystemExit(f"gpu_peers: {path} holds token id {top}, beyond --vocab {d.vocab}")
        n_val = max(int(len(tokens) * args.val_fraction), d.seq + 1)
        train_tokens, val_tokens = tokens[:len(tokens) - n_val], tokens[len(tokens) - n_val:]
        val_fetch = window_batches(val_tokens, d, dev, seed=args.seed + 1)
        val = [val_fetch() for _ in range(args.eval_iters)]
        out.update(tokens=str(path), train_tokens=len(train_tokens), val_tokens=len(val_tokens),
                   steps=args.steps, eval_every=args.eval_every, eval_iters=args.eval_iters,
                   warmup_iters=args.warmup_iters,
                   clock="training steps only: each contender's compile (its warm-up steps on random tokens, after "
                         "which its weights and optimizer state are restored) and the evals are not counted")
        print(f"tokens: {path} ({len(train_tokens):,} train, {len(val_tokens):,} val); {args.steps} steps "
              f"({args.steps * d.batch * d.seq / len(train_tokens):.2f} epochs of the train split), warmup "
              f"{args.warmup_iters} steps, eval every {args.eval_every} steps on {args.eval_iters} val batches")

    rows: list[dict] = []
    for name in names:
        free(dev)
        restore_backend_defaults(defaults)
        if name == "nanogpt":
            get_lr = nanogpt_schedule(args.steps if ttl_mode else args.warmup + args.steps, args.warmup_iters or 0)
            c = build_nanogpt(nano, d, dev, smoke, get_lr)
            variants: list[str] = []
            dc = d
        else:
            spec = next(s for s in specs if s.name == name)
            variants = spec.variants
            own = (SMOKE_WB if smoke else []) + args.overrides if spec.native else shared
            dc = native_dims(resolve_preset(spec.preset, [*own, *spec.overrides])) if spec.native else d
        with model_variants(variants):
            if name != "nanogpt":
                c = build_workbench(spec, own, machine, cache)
            print(f"-- {name}: {c.settings}{''.join(' + ' + v for v in variants)}; {c.matrix_params:,} matrix params",
                  flush=True)
            warm = f"warm-up ({args.warmup} steps{', the compile among them' if c.compiled else ''})"
            row = (train_to_loss(c, dc, dev, args, train_tokens, val) if ttl_mode else
                   throughput(c, dc, dev, args, peak, barrier))
        row["variants"] = variants
        row["dims"] = asdict(dc)
        c = None
        rows.append(row)
        out["contenders"] = rows
        if ttl_mode:
            print(f"   {name}: final val loss {row['final_val_loss']:.4f} at {row['train_s']:.1f} s of training "
                  f"({row['tokens_per_s']:,.0f} tokens/s); {warm} {row['warmup_s']:.1f} s, not counted",
                  flush=True)
        else:
            print(f"   {name}: {warm} {row['warmup_s']:.1f} s; "
                  f"{row['ms_per_step']:.1f} ms/step, {row['tokens_per_s']:,.0f} tokens/s", flush=True)
        save()

    nano_row = rows[0]
    if nano_row["kind"] != "nanogpt":  # --only a workbench contender: its row alone (--merge makes the table)
        out["done"] = True
        save()
        return 0
    counts = ", ".join(f"{r['name']} {r['matrix_params']:,}" for r in rows)
    same = len({r["matrix_params"] for r in rows}) == 1
    print(f"\nmatrix params (nanoGPT: its Linear weights; workbench: plan.flops.matmul_params): {counts}"
          + ("" if same else "  -- NOT the same size"))
    if ttl_mode:
        time_to = bench_module("time_to_loss").time_to
        target = nano_row["final_val_loss"]
        out["target"] = target
        curve = [(t, loss, None) for _step, t, loss in nano_row["evals"]]
        t_nano = time_to(curve, target)
        print(f"nanoGPT's final val loss {target:.4f}, reached at {t_nano:.1f} s of training "
              f"(compile and evals not counted)")
        for r in rows:
            t = time_to([(t, loss, None) for _step, t, loss in r["evals"]], target)
            r["time_to_target_s"] = t
            r["sooner"] = t_nano / t if t else None
            if r["kind"] != "nanogpt":
                shown = "never" if t is None else f"{t:.1f} s: {t_nano / t:.2f}x nanoGPT's {t_nano:.1f} s"
                print(f"  {r['name']}: reached it {shown} (final val loss {r['final_val_loss']:.4f})")
    else:
        print_table(rows, nano_row["tokens_per_s"])
        for r in rows:
            r["vs_nanogpt"] = r["tokens_per_s"] / nano_row["tokens_per_s"]
        print(f"MFU = (6 x matrix params + 12 x layers x dim x seq) x tokens/s / {fmt(peak, '.4g')} FLOP/s "
              f"({peak_src}); peak MiB: torch.cuda.max_memory_allocated since the contender was built")
    out["done"] = True
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
