"""The training loop: one readable loop, in the spirit of nanoGPT's.

``python -m workbench.train RUN_DIR [--resume [--checkpoint SEL]]`` runs it on a
run directory whose ``preset.toml`` the launcher wrote. Everything it reports
goes into the run directory (see workbench/rundir.py).

Order of one iteration (it matters for exact resume):
    lr for this step -> grad_accum micro-batches forward/backward ->
    unscale + clip -> finite check (skip the update if not) -> optimizer step ->
    step += 1 -> log -> eval (+ sample) -> checkpoint -> stop request?
A checkpoint is taken after all of that, so the state it holds is exactly the
state the next iteration starts from.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import signal
import sys
import time
import traceback
from pathlib import Path

import numpy as np

# Read before torch can set it: inductor writes its default cache dir into the environment.
_USER_INDUCTOR_CACHE = os.environ.get("TORCHINDUCTOR_CACHE_DIR")

import torch  # noqa: E402

from workbench import rundir
from workbench.config import Preset, load_preset_file
from workbench.errors import WorkbenchError
from workbench.train.checkpoint import (CheckpointError, apply_retention, check_model_compatible,
                                        gather_sharded_state, load_model_state, load_sharded_state,
                                        load_training_state, rng_state, save_checkpoint, set_rng_state)
from workbench.train.data import TokenData, WindowSampler, prepare_data
from workbench.train.dist import Dist
from workbench.estimate import auto_loss_chunk
from workbench.train.model import GPT, configure_optimizer

ROLLBACK_LR_FACTOR = 0.5
MAX_ROLLBACKS = 2


class _NoMetrics:
    """What ranks other than 0 write to: nothing."""

    def write(self, record: dict) -> None:
        pass

    def close(self) -> None:
        pass


class TrainError(WorkbenchError):
    exit_code = 1  # the run failed (bad input is caught before a run starts and exits 2)


# ----------------------------------------------------------------------------- device / precision

# hardware.compile = auto compiles a CPU run expected to take at least this long (eager).
CPU_COMPILE_MIN_SECONDS = 600


def compile_wanted(setting: str, device_type: str, eager_seconds_left: float | None) -> bool:
    """torch.compile or not. auto: on for CUDA; on a CPU when the rest of the run would take
    10 minutes or more eager, so the compile pays back (cpu-small: 18 s cold for +4-6 %
    tokens/s, i.e. after ~7 minutes; a resume compiles warm from the run's cache); off on MPS."""
    if setting != "auto":
        return setting == "true"
    if device_type == "cuda":
        return True
    return device_type == "cpu" and eager_seconds_left is not None and eager_seconds_left >= CPU_COMPILE_MIN_SECONDS


def eager_seconds(p: Preset, steps: int, peak: float | None) -> float | None:
    """Rough eager run time from FLOPs at 70 % of the peak (the CPU loop reaches 70-85 %)."""
    fpt = flops_per_token(p)
    if not (fpt and peak):
        return None
    return steps * p.tokens_per_step() * fpt / (0.7 * peak)


def pick_device(want: str) -> torch.device:
    if want == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if want.startswith("cuda") and not torch.cuda.is_available():
        raise TrainError(f"hardware.device = {want!r} but CUDA is not available here; "
                         "use --set hardware.device=auto (or cpu)")
    if want == "mps" and not torch.backends.mps.is_available():
        raise TrainError("hardware.device = 'mps' but MPS is not available here; use --set hardware.device=auto")
    return torch.device(want)


def pick_precision(want: str, device: torch.device) -> str:
    if want != "auto":
        if want == "fp16" and device.type == "cpu":
            raise TrainError("hardware.precision = 'fp16' is not supported on CPU; use fp32 (or bf16)")
        return want
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if device.type == "mps":
        return "bf16"
    return "fp32"  # bf16 autocast on a CPU without native bf16 is ~28x slower


def lr_at(step: int, p: Preset) -> float:
    """Linear warmup to lr, then cosine decay to min_lr at lr_decay_iters (default max_iters)."""
    t = p.train
    decay_end = t.lr_decay_iters or t.max_iters
    if step < t.warmup_iters:
        return t.lr * (step + 1) / (t.warmup_iters + 1)
    if step >= decay_end:
        return t.min_lr
    frac = (step - t.warmup_iters) / max(1, decay_end - t.warmup_iters)
    return t.min_lr + 0.5 * (1.0 + math.cos(math.pi * frac)) * (t.lr - t.min_lr)


def memory_mb(device: torch.device) -> dict:
    """mem_mb is the headline figure: peak allocated on CUDA, allocated on MPS, process RSS on CPU."""
    import resource

    import psutil
    rss = psutil.Process().memory_info().rss / 2**20
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        peak = torch.cuda.max_memory_allocated(device) / 2**20
        return {"mem_mb": peak, "mem_allocated_mb": peak,
                "mem_reserved_mb": torch.cuda.max_memory_reserved(device) / 2**20,
                "mem_device_used_mb": (total - free) / 2**20, "mem_rss_mb": rss}
    if device.type == "mps":
        alloc = torch.mps.current_allocated_memory() / 2**20
        return {"mem_mb": alloc, "mem_allocated_mb": alloc, "mem_rss_mb": rss}
    # RSS after the step misses the activations' peak inside it; the peak RSS catches it.
    return {"mem_mb": rss, "mem_rss_mb": rss, "mem_peak_rss_mb": peak_rss}


def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def peak_flops_for(device: torch.device, precision: str) -> float | None:
    """The hardware's peak FLOP/s for MFU: the GPU table, else a short measured calibration."""
    try:
        from workbench import hardware
    except ImportError:
        return None
    try:
        if device.type == "cuda":
            peak = hardware.peak_flops(torch.cuda.get_device_name(device), precision)
            if peak:
                return peak
        return hardware.measure_matmul_flops(str(device), precision)
    except Exception:
        return None


def flops_per_token(p: Preset) -> float | None:
    try:
        from workbench.estimate import flops_per_token as fpt
        return fpt(p.model)
    except Exception:
        return None


# ----------------------------------------------------------------------------- trainer

class Trainer:
    def __init__(self, run_dir: Path, resume: bool = False, checkpoint: str | None = None,
                 echo: bool = True):
        self.run_dir = Path(run_dir)
        self.resume, self.ckpt_selector, self.echo = resume, checkpoint, echo
        self.stop_requested = False
        self.stop_agreed = False
        self.log_file = None  # opened once the run's lock is held
        self.metrics: rundir.MetricsWriter | None = None
        self.dist = Dist()

    # -- output
    def log(self, msg: str) -> None:
        if not self.dist.is_main:
            return
        line = f"{time.strftime('%H:%M:%S')} {msg}"
        print(line, flush=True)  # detached: stdout *is* train.log
        if self.log_file:
            self.log_file.write(line + "\n")
            self.log_file.flush()

    def event(self, event: str, **kw) -> None:
        self.metrics.write({"kind": "event", "event": event, "step": self.step, "time": time.time(), **kw})

    def _status(self, **fields) -> None:
        if self.dist.is_main:
            rundir.write_status(self.run_dir, **fields)

    def _on_signal(self, signum, _frame) -> None:
        if self.stop_requested and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: give up waiting
        self.stop_requested = True
        self.log(f"received {signal.Signals(signum).name}: finishing this step, saving a checkpoint, then stopping")

    # -- setup
    def setup(self) -> None:
        rd = self.run_dir
        self.preset = p = load_preset_file(rd / "preset.toml")
        main = self.dist.is_main
        removed = []
        if main:  # rank 0 alone owns the run directory
            self.lock = rundir.RunLock(rd).acquire()
            if self.echo:
                self.log_file = open(rd / "train.log", "a", encoding="utf-8")
            removed = rundir.clean_stale_temporaries(rd)
            self.metrics = rundir.MetricsWriter(rd / "metrics.jsonl")
        else:
            self.metrics = _NoMetrics()
        self.step = 0
        self.started = time.time()
        # A resume keeps the run's original start time and records when it resumed.
        when = {"resumed": self.started} if self.resume else {"started": self.started}
        self._status(state="starting", pid=os.getpid(), pid_start=rundir.process_start_time(os.getpid()),
                     max_iters=p.train.max_iters, error=None, compiling=False, world_size=self.dist.world, **when)
        if removed:
            self.log(f"removed incomplete checkpoint temporaries: {', '.join(removed)}")

        h = p.hardware
        if h.num_threads:
            torch.set_num_threads(h.num_threads)
        self.device = self.dist.device_for(pick_device(h.device))
        self.dist.init(self.device)
        self.precision = pick_precision(h.precision, self.device)
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = h.tf32
            torch.backends.cudnn.allow_tf32 = h.tf32
        self.amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)
        self.autocast = (torch.autocast(self.device.type, dtype=self.amp_dtype) if self.amp_dtype
                         else contextlib.nullcontext())
        if self.precision == "bf16" and self.device.type == "cpu":
            self.log("warning: bf16 autocast on CPU is much slower than fp32 unless the CPU has native bf16")

        torch.manual_seed(p.train.seed + self.dist.rank)  # distinct dropout per rank; DDP syncs the weights
        random.seed(p.train.seed)
        np.random.seed(p.train.seed % 2**32)

        self.data: TokenData = prepare_data(p.data, p.model.vocab_size, p.model.seq_len, log=self.log)
        tok_copy = rd / "tokenizer.model"
        if main and not tok_copy.exists():
            self.data.tokenizer.save(tok_copy)
        # One generator draws the global batch on every rank; each rank trains on its own slice. So N
        # ranks see exactly the data of one process, and one sampler state resumes them all.
        if p.train.batch_size % self.dist.world:
            raise TrainError(f"train.batch_size = {p.train.batch_size} does not split over {self.dist.world} "
                             "processes; use a multiple")
        self.sampler = WindowSampler(self.data.train, p.model.seq_len, p.train.batch_size, p.train.seed)

        chunk = auto_loss_chunk(p.train.batch_size // self.dist.world, p.model.seq_len, p.model.vocab_size,
                                h.chunked_loss, self.device.type)
        self.model = GPT(p.model, activation_checkpointing=h.activation_checkpointing,
                         loss_chunk_tokens=chunk).to(self.device)
        # Fused AdamW: one kernel over all parameters; on CPU too (+1 % for cpu-small, same state dict).
        fused = h.fused_adamw == "true" or (h.fused_adamw == "auto" and self.device.type in ("cuda", "cpu"))
        self.optimizer = configure_optimizer(self.model, p.train.lr, p.train.weight_decay,
                                             (p.train.beta1, p.train.beta2), fused=fused)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")
        self.tokens_seen = 0
        self.best_val = None
        self.bad_evals = 0
        self.lr_scale = 1.0
        self.rollbacks = 0
        self.skipped_total = 0
        self.consecutive_skips = 0

        if self.resume:
            self._restore(self.ckpt_selector)

        self.tokens_per_step = p.tokens_per_step()
        self.fpt = flops_per_token(p)
        self.peak = peak_flops_for(self.device, self.precision)
        want_compile = compile_wanted(h.compile, self.device.type,
                                      eager_seconds(p, p.train.max_iters - self.step, self.peak))
        self.compiled = False
        self.compile_mode = "off"
        self.fwd_model = self.model
        if want_compile:
            cache = rd / "cache" / "inductor"
            cache.mkdir(parents=True, exist_ok=True)
            if not _USER_INDUCTOR_CACHE:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
            # Measured on an H100 (gpu-8gb, bf16): compiling the whole model is fastest
            # (358k tok/s) but its graph ignores activation checkpointing and the chunked loss
            # (9.6 GB peak vs 3.5 GB eager). Compiling each block in place keeps checkpointing
            # outside the compiled graphs (3.3 GB, 247k tok/s). With the fused loss (hand-written,
            # chunked) everything before it is one compiled graph. Either way the state dict
            # keeps plain names.
            if h.activation_checkpointing:
                for block in self.model.layers:
                    block.compile()
                self.compile_mode = "per block"
            elif chunk:
                self.model.compile_hidden()
                self.compile_mode = "all but the loss"
            else:
                self.compile_mode = "whole model"
            self.compiled = True
        self.eval_model = self.model
        self.parallel = "none"
        if self.dist.enabled and h.shard:
            if self.precision == "fp16":
                raise TrainError("hardware.shard = true does not support fp16 (its GradScaler would decide to skip "
                                 "a step on each rank's shard alone); use hardware.precision = bf16 or fp32")
            # FSDP2 shards the model in place (self.model is the sharded module; evals and samples are
            # collectives now). Its parameters are new objects, so the optimizer is built again over them
            # and takes over any state a resume loaded into the first one.
            self.parallel = "fsdp"
            restored = self.optimizer.state_dict() if self.resume else None
            self.dist.shard(self.model)
            self.optimizer = configure_optimizer(self.model, p.train.lr, p.train.weight_decay,
                                                 (p.train.beta1, p.train.beta2),
                                                 fused=bool(self.optimizer.defaults.get("fused")))
            if restored:
                load_sharded_state(self.model, self.optimizer, None, restored)
                del restored
        elif self.dist.enabled:
            from torch.nn.parallel import DistributedDataParallel as DDP
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.fwd_model = DDP(self.model, device_ids=ids, broadcast_buffers=False)
            self.parallel = "ddp"
        if self.compile_mode == "whole model":
            self.fwd_model = torch.compile(self.fwd_model)
            if not self.dist.enabled:
                self.eval_model = self.fwd_model
        n_params = self.model.num_params()
        if self.resume:
            self._apply_restored_rng()  # last: setup above (e.g. the FLOP/s calibration) draws random numbers
        layout = {"fsdp": f" x {self.dist.world} processes, sharded (FSDP2)",
                  "ddp": f" x {self.dist.world} processes, replicated (DDP)"}.get(self.parallel, "")
        self.log(f"run {rd.name}: preset {p.name}, {n_params / 1e6:.2f} M params, device {self.device}{layout}, "
                 f"precision {self.precision}, compile {self.compile_mode if self.compiled else 'off'}, "
                 f"{self.tokens_per_step:,} tokens/step, corpus {self.data.source}"
                 + (" (tokenizer and tokens from cache)" if self.data.cached else ""))
        self.event("resume" if self.resume else "start", params=n_params, device=str(self.device),
                   precision=self.precision, compile=self.compiled, compile_mode=self.compile_mode,
                   loss_chunk_tokens=self.model.loss_chunk_tokens, tokens_per_step=self.tokens_per_step,
                   corpus=self.data.source, train_tokens=int(self.data.n_train),
                   val_tokens=int(len(self.data.tokens) - self.data.n_train),
                   peak_flops=self.peak, pid=os.getpid(), world_size=self.dist.world, parallel=self.parallel)

    def _read_checkpoint(self, selector: str | None):
        meta = rundir.select_checkpoint(self.run_dir, selector)
        path = Path(meta["path"])
        # On CPU: RNG states must stay CPU tensors; load_state_dict moves the rest where it belongs.
        return meta, load_model_state(path), *load_training_state(path)

    def _restore(self, selector: str | None) -> None:
        # Rank 0 reads the checkpoint and sends it to the others (other nodes may not see the files).
        got = self._read_checkpoint(selector) if self.dist.is_main else None
        meta, sd, state, ts = self.dist.broadcast(got)
        check_model_compatible(self.model, sd, f"checkpoint {meta['name']}")
        sharded = getattr(self, "parallel", "none") == "fsdp"  # a rollback; at start-up sharding comes later
        if sharded:
            load_sharded_state(self.model, None, sd, None)
        else:
            self.model.load_state_dict(sd)
        try:
            if sharded:
                load_sharded_state(self.model, self.optimizer, None, state["optimizer"])
            else:
                self.optimizer.load_state_dict(state["optimizer"])
            if state.get("scaler"):
                self.scaler.load_state_dict(state["scaler"])
            ranks = state.get("rank_rng")
            if ranks and len(ranks) == self.dist.world:
                self._restored_rng = ranks[self.dist.rank]
            else:
                self._restored_rng = state["rng"]
                if self.dist.enabled:  # another world size: rank-specific dropout streams cannot continue
                    torch.manual_seed(self.preset.train.seed + self.dist.rank + 7919 * ts["step"])
                    self._restored_rng = rng_state()
        except (KeyError, ValueError, RuntimeError, TypeError) as e:
            raise CheckpointError(f"checkpoint {meta['name']} does not match this run's optimizer: {e}") from None
        self.step = ts["step"]
        self.tokens_seen = ts["tokens_seen"]
        self.best_val = ts["best_val"]
        self.bad_evals = ts["bad_evals"]
        self.lr_scale = ts.get("lr_scale", 1.0)
        self.rollbacks = ts.get("rollbacks", 0)
        self.skipped_total = ts.get("skipped_total", 0)
        self.sampler.set_state(ts["sampler"])
        self._restored_host_rng = (ts["python_rng"], ts["numpy_rng"])
        self.elapsed_before = ts.get("elapsed_s", 0.0)
        # Safe changes since the checkpoint (schedule length, intervals) are allowed and recorded.
        old = ts.get("train_preset", {})
        changed = {k: (old[k], v) for k, v in vars(self.preset.train).items() if k in old and old[k] != v}
        self.log(f"resumed from checkpoint {meta['name']} (step {self.step})")
        if changed:
            self.event("preset_changed", changes={k: [a, b] for k, (a, b) in changed.items()})
            self.log("preset changes since that checkpoint: "
                     + ", ".join(f"train.{k} {a!r} -> {b!r}" for k, (a, b) in changed.items()))
        self.resumed_from = meta["name"]

    def _apply_restored_rng(self) -> None:
        set_rng_state(self._restored_rng)
        py, nps = self._restored_host_rng
        random.setstate((py[0], tuple(py[1]), py[2]))
        np.random.set_state((nps[0], np.array(nps[1], dtype=np.uint32), *nps[2:]))

    # -- checkpoints
    def save(self, train_loss: float | None, val_loss: float | None, reason: str) -> None:
        # Collective: every rank's RNG state goes into the checkpoint, which rank 0 writes.
        rank_rng = self.dist.gather(rng_state())
        if self.parallel == "fsdp":  # also collective: the shards are gathered whole onto rank 0's CPU
            sd, optim_sd = gather_sharded_state(self.model, self.optimizer)
        if not self.dist.is_main:
            return
        if self.parallel != "fsdp":
            sd, optim_sd = self.model.state_dict(), self.optimizer.state_dict()
        state = {"optimizer": optim_sd, "scaler": self.scaler.state_dict(),
                 "rng": rank_rng[0]}
        if self.dist.enabled:
            state["rank_rng"] = rank_rng
        py = random.getstate()
        nps = np.random.get_state()
        ts = {"step": self.step, "tokens_seen": self.tokens_seen, "best_val": self.best_val,
              "bad_evals": self.bad_evals, "lr_scale": self.lr_scale, "rollbacks": self.rollbacks,
              "skipped_total": self.skipped_total, "sampler": self.sampler.state(),
              "python_rng": [py[0], list(py[1]), py[2]],
              "numpy_rng": [nps[0], nps[1].tolist(), int(nps[2]), int(nps[3]), float(nps[4])],
              "elapsed_s": self.elapsed(), "train_preset": vars(self.preset.train)}
        meta = {"train_loss": train_loss, "val_loss": val_loss, "tokens_seen": self.tokens_seen,
                "elapsed_s": round(self.elapsed(), 2), "reason": reason, "preset": self.preset.name,
                "best_val_loss": self.best_val, "model": vars(self.preset.model), "world_size": self.dist.world}
        t0 = time.time()
        try:
            path = save_checkpoint(self.run_dir, self.step, sd, state, ts, meta)
        except OSError as e:
            prev = rundir.list_checkpoints(self.run_dir)
            keep = f"; checkpoint {prev[-1]['name']} is intact" if prev else ""
            raise TrainError(f"could not save checkpoint at step {self.step}: {e.strerror or e} "
                             f"(disk full?){keep}; free space, then `workbench resume {self.run_dir.name}`") from None
        removed = apply_retention(self.run_dir, self.preset.train.keep_last, self.preset.train.milestone_interval)
        dt = time.time() - t0
        self.ckpt_time += dt
        self.event("checkpoint", name=path.name, reason=reason, seconds=round(dt, 3), removed=removed)
        self.log(f"saved checkpoint {path.name} ({reason}, {dt:.2f} s)")

    def elapsed(self) -> float:
        return getattr(self, "elapsed_before", 0.0) + (time.time() - self.started)

    # -- evaluation
    @torch.no_grad()
    def evaluate(self) -> tuple[float, float]:
        """Mean loss over eval_iters fixed windows of train and of val (the same windows every eval).
        Under DDP each rank takes its slice of the same global batches and the means are averaged."""
        p = self.preset
        self.model.eval()
        out = []
        for split, tokens in (("train", self.data.train), ("val", self.data.val)):
            s = WindowSampler(tokens, p.model.seq_len, p.train.batch_size, seed=p.train.seed + 1)
            losses = []
            for _ in range(p.train.eval_iters):
                x, y = self._to_device(*self._slice(*s.next_batch()))
                with self.autocast:
                    loss = self.eval_model(x, y)[1]
                losses.append(loss.float())
            out.append(self.dist.sum_(torch.stack(losses).mean()).item() / self.dist.world)
        self.model.train()
        return out[0], out[1]

    def write_sample(self) -> None:
        p = self.preset.train
        # Sharded, each forward is a collective: every rank generates (the same number of forwards), rank 0 writes.
        if not p.sample_prompt or not (self.dist.is_main or self.parallel == "fsdp"):
            return
        from workbench.train.sample import generate_text
        text = generate_text(self.model, self.data.tokenizer, p.sample_prompt, p.sample_tokens,
                             temperature=0.8, top_k=50, seed=self.step, autocast_dtype=self.amp_dtype)
        self.model.train()
        if not self.dist.is_main:
            return
        import json
        with open(self.run_dir / "samples.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": self.step, "prompt": p.sample_prompt, "text": text,
                                "time": time.time()}) + "\n")

    def _to_device(self, x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        if self.device.type == "cuda":
            return (xt.pin_memory().to(self.device, non_blocking=True),
                    yt.pin_memory().to(self.device, non_blocking=True))
        return xt.to(self.device), yt.to(self.device)

    def _nan_hook(self) -> bool:
        """Test hook: WORKBENCH_TEST_NAN_STEPS=3,4,5 poisons the loss at those steps (once each,
        unless WORKBENCH_TEST_NAN_ALWAYS=1)."""
        spec = os.environ.get("WORKBENCH_TEST_NAN_STEPS")
        if not spec:
            return False
        steps = {int(s) for s in spec.split(",") if s.strip()}
        done = getattr(self, "_poisoned", set())
        self._poisoned = done
        nxt = self.step + 1
        if nxt in steps and (nxt not in done or os.environ.get("WORKBENCH_TEST_NAN_ALWAYS") == "1"):
            done.add(nxt)
            return True
        return False

    def _step_hooks(self) -> None:
        """Test hooks (environment variables) that kill or signal this process after a given step."""
        env = os.environ
        if env.get("WORKBENCH_TEST_SIGTERM_AT_STEP") == str(self.step):
            os.kill(os.getpid(), signal.SIGTERM)
        if env.get("WORKBENCH_TEST_KILL_AT_STEP") == str(self.step):
            os.kill(os.getpid(), signal.SIGKILL)
        if env.get("WORKBENCH_TEST_OOM_AT_STEP") == str(self.step):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (test hook)")

    # -- the loop
    def train(self) -> str:
        p, t = self.preset, self.preset.train
        self.model.train()
        self.ckpt_time = 0.0
        self._status(state="running", compiling=self.compiled, step=self.step)
        if self.step == 0 and not self.resume:
            tl, vl = self.evaluate()
            self.metrics.write({"kind": "eval", "step": 0, "train_loss": tl, "val_loss": vl, "time": time.time()})
            self.log(f"step 0: train loss {tl:.4f}, val loss {vl:.4f}")
        window_t0, window_tokens, window_steps = None, 0, 0
        last_loss = None
        state = "finished"
        while self.step < t.max_iters:
            lr = lr_at(self.step, p) * self.lr_scale
            for g in self.optimizer.param_groups:
                g["lr"] = lr
            poison = self._nan_hook()
            loss_sum = torch.zeros((), device=self.device)
            for micro in range(t.grad_accum):
                x, y = self._to_device(*self._next_batch())
                # DDP: gradients are all-reduced once, on the last micro-batch. FSDP2 likewise
                # reduce-scatters only then (earlier micro-batches accumulate unsharded gradients).
                if self.parallel == "fsdp":
                    self.model.set_requires_gradient_sync(micro == t.grad_accum - 1)
                sync = (contextlib.nullcontext() if self.parallel != "ddp" or micro == t.grad_accum - 1
                        else self.fwd_model.no_sync())
                with sync:
                    with self.autocast:
                        loss = self.fwd_model(x, y)[1]  # drop the logits now: they would live through backward
                    if poison:
                        loss = loss * float("nan")
                    loss = loss / t.grad_accum
                    self.scaler.scale(loss).backward()
                loss_sum += loss.detach()
            self.scaler.unscale_(self.optimizer)
            if t.grad_clip > 0:
                grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.grad_clip)
            else:
                grad_norm = torch.linalg.vector_norm(
                    torch.stack([q.grad.detach().norm() for q in self.model.parameters() if q.grad is not None]))
            # One host sync per step: the non-finite guard needs to know before the update. Under DDP
            # the same sync averages the loss over ranks and agrees on a stop request.
            if self.dist.enabled:
                vec = self.dist.sum_(torch.stack([loss_sum.float(), torch.tensor(
                    float(self.stop_requested), device=self.device)]))
                loss_val = vec[0].item() / self.dist.world
                self.stop_agreed = bool(vec[1].item() > 0)
            else:
                loss_val = loss_sum.item()
            gn = float(grad_norm)
            finite = math.isfinite(loss_val) and (math.isfinite(gn) or self.precision == "fp16")
            if finite:
                self.scaler.step(self.optimizer)
                self.scaler.update()
                self.consecutive_skips = 0
            else:
                self.skipped_total += 1
                self.consecutive_skips += 1
                if self.precision == "fp16":
                    self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
            self.step += 1
            self.tokens_seen += self.tokens_per_step
            if not finite:
                self.event("nonfinite_skip", loss=None if not math.isfinite(loss_val) else loss_val,
                           grad_norm=None if not math.isfinite(gn) else gn, consecutive=self.consecutive_skips)
                self.log(f"step {self.step}: non-finite loss or gradient norm, update skipped "
                         f"({self.consecutive_skips} in a row, {self.skipped_total} in all)")
                if self.consecutive_skips >= t.max_skips:
                    self._rollback_or_fail()
                    window_t0 = None
                    continue
            else:
                last_loss = loss_val

            # Throughput: the first step after start (compile, warm-up) is left out of the rate.
            now = time.time()
            if window_t0 is None:
                window_t0, window_tokens, window_steps = now, 0, 0
                if self.compiled and not getattr(self, "_compile_reported", False):
                    self._compile_reported = True
                    self.event("compile_done", seconds=round(now - self.started, 1))
                    self._status(compiling=False)
            else:
                window_tokens += self.tokens_per_step
                window_steps += 1

            if self.step % t.log_interval == 0 or self.step == t.max_iters:
                tps = window_tokens / (now - window_t0) if window_steps else None
                rec = {"kind": "train", "step": self.step, "loss": loss_val if finite else None, "lr": lr,
                       "grad_norm": gn if math.isfinite(gn) else None, "tokens_per_s": tps,
                       "tokens_seen": self.tokens_seen, "elapsed_s": round(self.elapsed(), 3),
                       "skipped": self.skipped_total, "time": now, **memory_mb(self.device)}
                # peak is one process's (one GPU, or the CPU share it measured); tps is global.
                peak = self.peak * self.dist.world if self.peak else None
                rec["mfu"] = (tps * self.fpt / peak) if (tps and self.fpt and peak) else None
                self.metrics.write(rec)
                self._status(step=self.step, tokens_seen=self.tokens_seen)
                tps_s = f"{tps:,.0f} tok/s" if tps else "warming up"
                self.log(f"step {self.step}/{t.max_iters}: loss {loss_val:.4f}, lr {lr:.2e}, "
                         f"grad norm {gn:.3f}, {tps_s}, mem {rec['mem_mb']:.0f} MB")
                if window_steps:
                    window_t0, window_tokens, window_steps = now, 0, 0

            self._step_hooks()
            saved = False
            if self.step % t.eval_interval == 0 or self.step == t.max_iters:
                tl, vl = self.evaluate()
                self.metrics.write({"kind": "eval", "step": self.step, "train_loss": tl, "val_loss": vl,
                                    "time": time.time()})
                improved = self.best_val is None or vl < self.best_val - t.min_delta
                self.log(f"step {self.step}: train loss {tl:.4f}, val loss {vl:.4f}"
                         + (" (best)" if improved else ""))
                if improved:
                    self.best_val, self.bad_evals = vl, 0
                    self._status(best_val_loss=vl)
                else:
                    self.bad_evals += 1
                self.write_sample()
                if improved or self.step % t.ckpt_interval == 0 or self.step == t.max_iters:
                    self.save(last_loss, vl, "best" if improved else "interval")
                    saved = True
                if t.patience and self.bad_evals >= t.patience:
                    self.log(f"early stop: val loss has not improved for {t.patience} evals "
                             f"(best {self.best_val:.4f})")
                    self.event("early_stop", best_val_loss=self.best_val)
                    state = "early_stopped"
                    break
                window_t0 = None  # leave eval time out of the rate
            if not saved and (self.step % t.ckpt_interval == 0 or self.step == t.max_iters):
                self.save(last_loss, None, "interval")
                saved = True
                window_t0 = None
            if self.stop_agreed if self.dist.enabled else self.stop_requested:
                if not saved:
                    self.save(last_loss, None, "stop")
                state = "stopped"
                self.event("stop")
                break
            if window_t0 is None:
                window_t0, window_tokens, window_steps = time.time(), 0, 0
        return state

    def _next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        return self._slice(*self.sampler.next_batch())

    def _slice(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """This rank's part of a global batch (all of it in a single process)."""
        if self.dist.enabled:
            b, r = self.preset.train.batch_size // self.dist.world, self.dist.rank
            x, y = x[r * b:(r + 1) * b], y[r * b:(r + 1) * b]
        return x, y

    def _rollback_or_fail(self) -> None:
        t = self.preset.train
        ckpts = self.dist.broadcast(rundir.list_checkpoints(self.run_dir) if self.dist.is_main else None)
        hint = ("lower train.lr, use hardware.precision = bf16 or fp32 instead of fp16, "
                "or set train.grad_clip = 1.0")
        if not ckpts or self.rollbacks >= MAX_ROLLBACKS:
            why = "no checkpoint to roll back to" if not ckpts else f"{self.rollbacks} rollbacks did not help"
            raise TrainError(f"{t.max_skips} consecutive non-finite steps at step {self.step} ({why}); try: {hint}")
        new_scale = self.lr_scale * ROLLBACK_LR_FACTOR
        rollbacks, skipped = self.rollbacks + 1, self.skipped_total
        from_step = self.step
        self._restore(ckpts[-1]["name"])
        self._apply_restored_rng()
        self.lr_scale, self.rollbacks, self.skipped_total = new_scale, rollbacks, skipped
        self.consecutive_skips = 0
        self.event("rollback", from_step=from_step, to=ckpts[-1]["name"], lr_scale=new_scale)
        self.log(f"rolled back to {ckpts[-1]['name']} with learning rate x{new_scale:g} "
                 f"after {t.max_skips} non-finite steps")

    # -- entry
    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        try:
            self.setup()
            state = self.train()
            self.metrics.write({"kind": "event", "event": "finish" if state == "finished" else state,
                                "step": self.step, "time": time.time()})
            self._status(state=state, step=self.step, compiling=False, finished=time.time(),
                         ckpt_seconds=round(self.ckpt_time, 3), best_val_loss=self.best_val)
            self.log(f"{state} at step {self.step}" + (f", best val loss {self.best_val:.4f}"
                                                     if self.best_val is not None else ""))
            self._clean_exit = True
            return 0
        except BaseException as e:  # noqa: BLE001 - every failure must reach status.json
            if isinstance(e, WorkbenchError):
                msg = str(e)
            elif is_oom(e):
                msg = self._oom_message()
            elif isinstance(e, KeyboardInterrupt):
                msg = "interrupted twice; stopped without saving (the last checkpoint is intact)"
            elif self.dist.enabled and isinstance(e, (RuntimeError, OSError)):
                msg = (f"rank {self.dist.rank}: another rank of this run stopped (its process died or was killed: "
                       f"{type(e).__name__} in a collective); see train.log for which, then "
                       f"`workbench resume {self.run_dir.name}`")
                self.log(traceback.format_exc())
            else:
                msg = f"{type(e).__name__}: {e} (traceback in train.log)"
                self.log(traceback.format_exc())
            if getattr(self, "lock", None):  # never touch the files of a run another trainer holds
                try:
                    rundir.write_status(self.run_dir, state="failed", error=msg, compiling=False,
                                        step=getattr(self, "step", 0))
                    if self.metrics:
                        self.metrics.write({"kind": "event", "event": "error", "step": getattr(self, "step", 0),
                                            "message": msg, "time": time.time()})
                except Exception:
                    pass
            if getattr(self, "lock", None):
                self.log(f"error: {msg}")
            raise TrainError(msg) from None
        finally:
            if getattr(self, "lock", None):
                self.lock.release()
            if self.metrics:
                self.metrics.close()
            if getattr(self, "parallel", None) == "fsdp":
                # FSDP2's state holds the gloo/NCCL group: free it before the group is destroyed, not in the
                # interpreter's exit (where gloo at times aborts a rank: "terminate called ...").
                for name in ("model", "fwd_model", "eval_model", "optimizer"):
                    self.__dict__.pop(name, None)
                import gc
                gc.collect()
            self.dist.close(clean=getattr(self, "_clean_exit", False))

    def _oom_message(self) -> str:
        t = self.preset.train
        half = max(1, t.batch_size // 2)
        est = ""
        try:
            from workbench.estimate import estimate_memory
            m = estimate_memory(self.preset, self.precision, self.device.type, batch_size=half)
            est = f" (estimated {m['total'] / 2**30:.1f} GiB at batch_size {half})"
        except Exception:  # the advice stands without the number
            pass
        return (f"out of memory on {self.device} at batch_size {t.batch_size} x seq_len "
                f"{self.preset.model.seq_len}; lower train.batch_size (raise train.grad_accum to keep the "
                f"tokens per step){est}, lower model.seq_len, or set hardware.activation_checkpointing = true; "
                f"`workbench fit {self.preset.name}` finds a batch that fits")


def main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m workbench.train",
                                 description="Run the trainer on a run directory (the launcher writes preset.toml).")
    ap.add_argument("run_dir")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--detached", action="store_true", help="stdout is train.log already")
    args = ap.parse_args(argv)
    try:
        return Trainer(Path(args.run_dir), args.resume, args.checkpoint, echo=not args.detached).run()
    except WorkbenchError as e:
        print(f"workbench: error: {e}", file=sys.stderr)
        return 1
