"""`workbench fit PRESET`: the largest micro-batch that fits this machine, same tokens per step.

On CUDA and MPS it is a real probe: a few forward/backward/AdamW steps of the
preset's model per trial, micro-batch sizes doubled until one fails (out of
memory, or peak memory above the margin) and then bisected; memory is freed
between trials. On CPU it is the estimate (``workbench.estimate``) against the
available RAM. Gradient accumulation is raised so that batch_size x grad_accum
x seq_len (tokens per optimizer step) stays what the preset says (or as close
as the divisors allow, and then it says so). The result is written as a NEW
user preset, never over an existing file unless --force, never over the source.
"""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path
from typing import Any, Callable

from workbench import estimate as est
from workbench.config import (Preset, PresetError, check_preset_name, preset_from_dict, preset_to_toml,
                              resolve_preset, user_presets_dir)
from workbench.errors import WorkbenchError
from workbench.commands.common import add_set_option

MARGIN = 0.10  # keep this share of device memory free (fragmentation, eval, a longer run)

OOM_MARKERS = ("CUDA out of memory", "MPS backend out of memory", "out of memory")


def register(sub) -> None:
    p = sub.add_parser("fit", help="find the largest micro-batch that fits and write it as a new preset",
                       description=__doc__.split("\n\n")[0] + " Writes presets/<NAME>.toml.")
    p.add_argument("preset", help="preset name or path to a .toml file")
    add_set_option(p)
    p.add_argument("--out", default=None, metavar="NAME", help="name of the new preset (default: <preset>-fit)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"],
                   help="device to fit (default: auto = cuda > mps > cpu)")
    p.add_argument("--margin", type=float, default=MARGIN,
                   help=f"share of device memory kept free (default {MARGIN})")
    p.add_argument("--steps", type=int, default=3, help="optimizer steps per probe trial (default 3)")
    p.add_argument("--force", action="store_true", help="overwrite an existing user preset of that name")
    p.set_defaults(func=run)


# ----------------------------------------------------------------------------- pure logic

def is_oom_error(e: BaseException) -> bool:
    """CUDA ("CUDA out of memory", torch.OutOfMemoryError) and MPS ("MPS backend out of memory")."""
    try:
        import torch
        if isinstance(e, torch.OutOfMemoryError):
            return True
    except (ImportError, AttributeError):
        pass
    text = str(e)
    return any(m.lower() in text.lower() for m in OOM_MARKERS)


def search_batch(trial: Callable[[int], bool], cap: int, start: int = 1) -> tuple[int, list[tuple[int, bool]]]:
    """Largest b in [1, cap] with trial(b) True, assuming trial is monotone (fits below, fails above).

    Powers of two from ``start`` until a failure or ``cap``, then bisection between the last
    success and the first failure. Returns (best, [(b, ok), ...]); best is 0 if nothing fits.
    """
    tried: list[tuple[int, bool]] = []

    def t(b: int) -> bool:
        ok = trial(b)
        tried.append((b, ok))
        return ok

    lo, hi = 0, None  # lo fits, hi fails
    b = max(1, min(start, cap))
    while True:
        if t(b):
            lo = b
            if b >= cap:
                return lo, tried
            b = min(b * 2, cap)
        else:
            hi = b
            break
    if lo == 0 and hi > 1:  # the starting size failed: go down by halves first
        b = hi // 2
        while b >= 1:
            if t(b):
                lo = b
                break
            hi = b
            b //= 2
        if lo == 0:
            return 0, tried
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if t(mid):
            lo = mid
        else:
            hi = mid
    return lo, tried


def plan_accumulation(sequences_per_step: int, max_batch: int) -> tuple[int, int, str]:
    """(batch_size, grad_accum, note) with batch_size <= max_batch and batch_size x grad_accum
    == sequences_per_step when a divisor close to max_batch allows it; otherwise as close as
    possible, and the note says by how much tokens per step change."""
    E = sequences_per_step
    if max_batch >= E:
        return E, 1, ""
    best_div = max(d for d in range(1, max_batch + 1) if E % d == 0)
    if best_div * 2 >= max_batch:  # an exact split costs at most half the micro-batch
        return best_div, E // best_div, ""
    b = max_batch
    a = max(1, round(E / b))
    change = (b * a - E) / E * 100
    note = (f"{E} sequences per step has no divisor near {max_batch} (the largest is {best_div}); "
            f"using {b} x {a} = {b * a} sequences per step ({change:+.1f} % tokens per step)")
    return b, a, note


def fitted_preset(src: Preset, batch: int, accum: int, name: str, device: str | None,
                  note: str) -> Preset:
    d = src.to_dict()
    d["name"] = name
    d["train"]["batch_size"] = batch
    d["train"]["grad_accum"] = accum
    if device:
        d["hardware"]["device"] = device
    d["description"] = (f"{src.name} fitted by `workbench fit`: batch {batch} x accum {accum}"
                        + (f" ({note})" if note else "") + (f". {src.description}" if src.description else ""))
    return preset_from_dict(d, f"fitted preset {name}")


def write_preset(p: Preset, header: str, force: bool, source_path: Path | None) -> Path:
    """Write ``presets/<name>.toml`` in the user presets dir atomically; never over the source."""
    check_preset_name(p.name)
    out_dir = user_presets_dir()
    path = out_dir / f"{p.name}.toml"
    if source_path is not None and path.resolve() == source_path.resolve():
        raise WorkbenchError(f"{path} is the preset being fitted; choose another name with --out NAME")
    if path.exists() and not force:
        raise WorkbenchError(f"{path} already exists; choose another name with --out NAME or overwrite it with --force")
    out_dir.mkdir(parents=True, exist_ok=True)
    text = "".join(f"# {line}\n" for line in header.splitlines()) + preset_to_toml(p)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


# ----------------------------------------------------------------------------- the real probe

class Prober:
    """Runs a few real training steps of ``preset`` at a given micro-batch and reports peak memory.

    The model and AdamW (with its states) are built once and kept, as in training.
    """

    def __init__(self, preset: Preset, device: str, precision: str, micro_batches: int = 2):
        import torch
        from workbench.train.model import GPT, configure_optimizer
        self.torch = torch
        self.preset = preset
        self.device = torch.device(device)
        self.precision = precision
        self.micro_batches = micro_batches  # 2 when the preset accumulates: gradients stay resident
        h = preset.hardware
        self.model = GPT(preset.model, activation_checkpointing=h.activation_checkpointing).to(self.device)
        fused = h.fused_adamw == "true" or (h.fused_adamw == "auto" and self.device.type == "cuda")
        self.optimizer = configure_optimizer(self.model, preset.train.lr, preset.train.weight_decay,
                                             (preset.train.beta1, preset.train.beta2), fused=fused)
        amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        self.amp = amp

    def _sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)
        elif self.device.type == "mps":
            self.torch.mps.synchronize()

    def free(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        gc.collect()
        if self.device.type == "cuda":
            self.torch.cuda.empty_cache()
        elif self.device.type == "mps":
            self.torch.mps.empty_cache()

    def device_total(self) -> int | None:
        if self.device.type == "cuda":
            free, total = self.torch.cuda.mem_get_info(self.device)
            return total
        if self.device.type == "mps":
            return self.torch.mps.recommended_max_memory()
        return None

    def trial(self, batch: int, steps: int = 3) -> dict[str, Any]:
        """{"ok", "oom", "peak_allocated", "peak_reserved", "tokens_per_s", "error"}"""
        torch = self.torch
        T, V = self.preset.model.seq_len, self.preset.model.vocab_size
        self.free()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        out: dict[str, Any] = {"batch": batch, "ok": False, "oom": False}
        try:
            gen = torch.Generator(device="cpu").manual_seed(batch)
            times = []
            for _ in range(steps):
                t0 = time.perf_counter()
                for _ in range(self.micro_batches):
                    x = torch.randint(0, V, (batch, T), generator=gen).to(self.device)
                    with torch.autocast(self.device.type, dtype=self.amp, enabled=self.amp is not None):
                        _, loss = self.model(x, x)  # as the loop does: the logits stay alive until the next forward
                    (loss / self.micro_batches).backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                self._sync()
                times.append(time.perf_counter() - t0)
                del x, loss, _
            timed = times[1:] or times
            out["tokens_per_s"] = batch * T * self.micro_batches * len(timed) / sum(timed)
            out["ok"] = True
        except Exception as e:  # noqa: BLE001 - an OOM can surface as RuntimeError or OutOfMemoryError
            if not is_oom_error(e):
                raise
            out["oom"] = True
            out["error"] = str(e).splitlines()[0][:200]
        if self.device.type == "cuda":
            out["peak_allocated"] = torch.cuda.max_memory_allocated(self.device)
            out["peak_reserved"] = torch.cuda.max_memory_reserved(self.device)
        elif self.device.type == "mps":
            out["peak_allocated"] = torch.mps.driver_allocated_memory()
            out["peak_reserved"] = out["peak_allocated"]
        self.free()
        return out


# ----------------------------------------------------------------------------- the command

def _resolve_device(want: str) -> str:
    if want != "auto":
        return want
    from workbench import hardware
    return hardware.best_device(hardware.detect(use_torch=True))


def run(args) -> int:
    src = resolve_preset(args.preset, args.overrides)
    if not 0 <= args.margin < 0.9:
        raise WorkbenchError(f"--margin {args.margin} must be between 0 and 0.9 (e.g. 0.1 keeps 10 % free)")
    if args.steps < 1:
        raise WorkbenchError(f"--steps {args.steps} must be at least 1")
    out_name = args.out or f"{src.name}-fit"
    check_preset_name(out_name)
    from workbench.config import preset_paths
    source_path = None
    if args.preset.endswith(".toml") or os.sep in args.preset:
        source_path = Path(args.preset)
    elif args.preset in preset_paths():
        source_path = preset_paths()[args.preset][0]
    target = user_presets_dir() / f"{out_name}.toml"
    if target.exists() and not args.force:  # fail before a long probe
        raise WorkbenchError(f"{target} already exists; choose another name with --out NAME or overwrite it with --force")
    if source_path is not None and target.resolve() == source_path.resolve():
        raise WorkbenchError(f"{target} is the preset being fitted; choose another name with --out NAME")

    device = _resolve_device(args.device)
    if device == "cuda":
        _check_cuda()
    precision = est.resolve_precision(None, src, device)
    T = src.model.seq_len
    seqs = src.train.batch_size * src.train.grad_accum
    print(f"fitting {src.name} on {device} ({precision}): {seqs} sequences x {T} tokens = "
          f"{seqs * T:,} tokens per optimizer step to keep")

    rows: list[tuple[int, str]] = []
    if device == "cpu":
        from workbench import hardware
        info = hardware.detect(use_torch=False)
        avail, what = hardware.device_memory(info, "cpu")
        limit = (1 - args.margin) * avail

        def trial(b: int) -> bool:
            m = est.estimate_memory(src, precision, "cpu", batch_size=b)
            ok = m["total"] <= limit
            rows.append((b, f"estimate {est.human_bytes(m['total'])} {'fits' if ok else 'too big'}"))
            return ok
        best, _ = search_batch(trial, cap=seqs, start=min(src.train.batch_size, seqs))
        how = f"estimate against {est.human_bytes(avail)} {what} (keeping {args.margin:.0%} free)"
        measured = None
    else:
        prober = Prober(src, device, precision, micro_batches=2 if src.train.grad_accum > 1 else 1)
        total = prober.device_total()
        limit = (1 - args.margin) * total if total else None
        results: dict[int, dict] = {}

        def trial(b: int) -> bool:
            r = prober.trial(b, args.steps)
            results[b] = r
            peak = r.get("peak_reserved")
            ok = r["ok"] and (limit is None or peak is None or peak <= limit)
            if r["oom"]:
                desc = "out of memory"
            else:
                desc = (f"peak {est.human_bytes(peak)}" + ("" if ok else " over the margin")
                        + f", {r.get('tokens_per_s', 0):,.0f} tokens/s")
            rows.append((b, desc))
            print(f"  batch {b:>4}: {desc}", flush=True)
            return ok
        best, _ = search_batch(trial, cap=seqs, start=min(src.train.batch_size, seqs))
        how = (f"real probe, {args.steps} steps per trial, peak reserved memory within "
               f"{1 - args.margin:.0%} of {est.human_bytes(total)}")
        measured = results.get(best)
    if device == "cpu":
        for b, desc in rows:
            print(f"  batch {b:>4}: {desc}")
    if best == 0:
        raise WorkbenchError(
            f"even batch_size 1 does not fit {src.name} on {device}; set hardware.activation_checkpointing = true, "
            f"lower model.seq_len (now {T}), use bf16 (hardware.precision), or a smaller model "
            f"(`workbench estimate {src.name} --device {device}` shows where the memory goes)")
    batch, accum, note = plan_accumulation(seqs, best)
    new = fitted_preset(src, batch, accum, out_name, None if args.device == "auto" else device, note)
    header = (f"Written by `workbench fit {src.name}` on {time.strftime('%Y-%m-%d %H:%M')} for {device} ({precision}).\n"
              f"Largest micro-batch that fits: {best} ({how}).\n"
              f"batch_size {batch} x grad_accum {accum} x seq_len {T} = {batch * accum * T:,} tokens per step "
              f"(source: {src.train.batch_size} x {src.train.grad_accum} x {T} = {seqs * T:,}).")
    if measured and measured.get("peak_reserved"):
        header += f"\nMeasured peak at batch {best}: {est.human_bytes(measured['peak_reserved'])} reserved."
    path = write_preset(new, header, args.force, source_path)
    print(f"largest micro-batch that fits: {best} ({how})")
    print(f"batch_size {src.train.batch_size} -> {batch}, grad_accum {src.train.grad_accum} -> {accum}: "
          f"{batch * accum * T:,} tokens per step (was {seqs * T:,})")
    if note:
        print(f"note: {note}")
    print(f"wrote {path}  (train with: workbench train {new.name})")
    return 0


def _check_cuda() -> None:
    import torch
    if not torch.cuda.is_available():
        raise WorkbenchError("--device cuda but CUDA is not available here; use --device auto or cpu")
