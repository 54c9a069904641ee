"""`workbench fit PRESET`: the largest micro-batch that fits this machine, same tokens per step.

The measurement is ``workbench.train.batch_probe.find_batch`` (a real probe on CUDA and MPS, the
memory estimate on a CPU). Gradient accumulation is raised so that batch_size x grad_accum x
seq_len (tokens per optimizer step) stays what the preset says (or as close as the divisors
allow, and then it says so). The result is written as a NEW user preset, never over an
existing file unless --force, never over the source.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from workbench.commands.common import add_init_from_option, add_set_option
from workbench.config import preset_source_path, resolve_preset, save_user_preset, user_preset_path
from workbench.errors import WorkbenchError
from workbench.fmt import human_bytes
from workbench.plan.fit.batch import fitted_preset, plan_accumulation
from workbench.plan.run_plan import NewRun, plan_new_run

MARGIN = 0.10  # keep this share of device memory free (fragmentation, eval, a longer run)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("fit", help="find the largest micro-batch that fits and write it as a new preset",
                       description="Find the largest micro-batch of PRESET that fits this machine (a real probe "
                                   "on CUDA/MPS, the estimate on CPU), keep tokens per step with grad_accum, and "
                                   "write presets/<NAME>.toml.")
    p.add_argument("preset", help="preset name or path to a .toml file")
    add_init_from_option(p)
    add_set_option(p)
    p.add_argument("--out", default=None, metavar="NAME", help="name of the new preset (default: <preset>-fit)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"],
                   help="device to fit (default: auto = cuda > mps > cpu)")
    p.add_argument("--margin", type=float, default=MARGIN,
                   help=f"share of device memory kept free (default {MARGIN})")
    p.add_argument("--steps", type=int, default=3, help="optimizer steps per probe trial (default 3)")
    p.add_argument("--force", action="store_true", help="overwrite an existing user preset of that name")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # fit the run `train` would make (with --init-from: its model is the source's)
    src = plan_new_run(NewRun(args.preset, tuple(args.overrides), init_from=args.init_from), args.runs_dir).preset
    source = resolve_preset(args.preset, args.overrides) if args.init_from else None
    if not 0 <= args.margin < 0.9:
        raise WorkbenchError(f"--margin {args.margin} must be between 0 and 0.9 (e.g. 0.1 keeps 10 % free)")
    if args.steps < 1:
        raise WorkbenchError(f"--steps {args.steps} must be at least 1")
    out_name = args.out or f"{src.name}-fit"
    source_path = preset_source_path(args.preset)
    target = user_preset_path(out_name)
    if target.exists() and not args.force:  # fail before a long probe
        raise WorkbenchError(f"{target} already exists; choose another name with --out NAME "
                             "or overwrite it with --force")
    if source_path is not None and target.resolve() == source_path.resolve():
        raise WorkbenchError(f"{target} is the preset being fitted; choose another name with --out NAME")

    from workbench.machine.probe import measured_peak, this_machine  # imports torch: keep `--help` fast
    from workbench.train.batch_probe import find_batch, fit_target
    T = src.model.seq_len
    seqs = src.train.batch_size * src.train.grad_accum
    machine = this_machine()
    target_preset, s = fit_target(src, args.device, machine, measured_peak)
    print(f"fitting {src.name} on {s.device} ({s.precision}): {seqs} sequences x {T} tokens = "
          f"{seqs * T:,} tokens per optimizer step to keep")
    r = find_batch(target_preset, s, machine, args.margin, args.steps,
                   on_trial=lambda b, desc: print(f"  batch {b:>4}: {desc}", flush=True))
    if r.best == 0:
        raise WorkbenchError(
            f"even batch_size 1 does not fit {src.name} on {s.device}; set hardware.activation_checkpointing = true, "
            f"lower model.seq_len (now {T}), use bf16 (hardware.precision), or a smaller model "
            f"(`workbench estimate {src.name} --device {s.device_type}` shows where the memory goes)")
    batch, accum, note = plan_accumulation(seqs, r.best)
    new = fitted_preset(src, batch, accum, out_name, None if args.device == "auto" else s.device, note)
    if src.hardware.activation_checkpointing == "auto":  # as probed: auto's choice at the preset's own batch
        new = dataclasses.replace(new, hardware=dataclasses.replace(
            new.hardware, activation_checkpointing="true" if s.activation_checkpointing else "false"))
    if source is not None:  # a preset to train with --init-from again: the source's model comes with that
        new = dataclasses.replace(new, model=source.model, init=None, source=None,
                                  data=dataclasses.replace(new.data, tokenizer=source.data.tokenizer))
    header = (f"Written by `workbench fit {src.name}` on {time.strftime('%Y-%m-%d %H:%M')} for {s.device} "
              f"({s.precision}).\n"
              f"Largest micro-batch that fits: {r.best} ({r.how}).\n"
              f"batch_size {batch} x grad_accum {accum} x seq_len {T} = {batch * accum * T:,} tokens per step "
              f"(source: {src.train.batch_size} x {src.train.grad_accum} x {T} = {seqs * T:,}).")
    if r.measured and r.measured.get("peak_reserved"):
        header += f"\nMeasured peak at batch {r.best}: {human_bytes(r.measured['peak_reserved'])} reserved."
    path = save_user_preset(new, header, args.force, source_path)
    print(f"largest micro-batch that fits: {r.best} ({r.how})")
    print(f"batch_size {src.train.batch_size} -> {batch}, grad_accum {src.train.grad_accum} -> {accum}: "
          f"{batch * accum * T:,} tokens per step (was {seqs * T:,})")
    if note:
        print(f"note: {note}")
    how = f" --init-from {args.init_from}" if args.init_from else ""
    print(f"wrote {path}  (train with: workbench train {new.name}{how})")
    return 0
