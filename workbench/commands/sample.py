"""`workbench sample`: stream text from a run's checkpoint to stdout."""

from __future__ import annotations

import argparse
import sys
import time

from workbench import rundir
from workbench.commands.common import add_run_argument, add_sampling_options, sampling_of
from workbench.data.text.tokenizer import load_tokenizer
from workbench.machine.detect import Machine
from workbench.plan.sampling import TEXT
from workbench.plan.settings import resolve_device


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("sample", help="generate text from a run's checkpoint")
    add_run_argument(p, checkpoint=True)
    p.add_argument("--prompt", default="", help="text to continue (cropped from the left to the context)")
    add_sampling_options(p, TEXT)
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, mps or auto")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    root = args.runs_dir
    run_dir = rundir.resolve_run(root, args.run)
    ckpt = rundir.select_checkpoint(run_dir, args.checkpoint)
    sampling = sampling_of(args)
    t0 = time.time()
    # lazily: torch and the engine load only once the arguments are known to be good
    import torch

    from workbench.machine.probe import this_machine
    from workbench.train.checkpoint import load_run_model
    from workbench.train.generate import generate_text

    tok = load_tokenizer(run_dir)
    # Every machine has a CPU: asking torch about GPUs is only worth it when one is wanted.
    device = resolve_device(args.device, Machine() if args.device == "cpu" else this_machine())
    loaded = load_run_model(run_dir, ckpt["step"], device)
    model, p = loaded.model, loaded.preset
    if device == "cpu" and model.num_params() < 50e6:
        # One token at a time is a chain of tiny ops: one thread is faster, and far faster when
        # another process (a trainer) is using the cores (measured: 9 us vs 7.6 ms per attention).
        torch.set_num_threads(1)
    n_prompt = len(tok.encode(args.prompt))
    if n_prompt >= p.model.seq_len:
        print(f"note: the prompt is {n_prompt} tokens; only its last {p.model.seq_len - 1} fit the context",
              file=sys.stderr)
    print(f"[{run_dir.name} {ckpt['name']}, loaded in {time.time() - t0:.2f} s]", file=sys.stderr, flush=True)
    sys.stdout.write(args.prompt)
    sys.stdout.flush()

    def emit(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    generate_text(model, tok, args.prompt, sampling.max_new_tokens, on_text=emit, **sampling.generate_args())
    sys.stdout.write("\n")
    return 0
