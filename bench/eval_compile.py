"""Should an eval run through the compiled model? A GPU (or the CPU), random tokens, the trainer's compile modes.

    python bench/eval_compile.py [--preset gpu-8gb] [--batches 5] [--rounds 3] [--set k=v ...]
    python bench/eval_compile.py --device cpu --preset cpu-small --batches 14 --modes "all but the loss"

For each compile mode the trainer uses (plan.settings.compile_mode: whole model, all but the loss, per block)
the model is built and compiled as workbench.train.build does it, trained a few steps (the training graph's
compile), then evaluated ``--batches`` batches under no_grad in eval mode (as workbench.train.evaluation does):
eagerly (the trainer's eval) and through the compiled code (which compiles an inference graph at its first
call). Prints the first call (its compile) and the median of the next ``--rounds`` calls (the ways alternating),
and where compiling the eval pays back: after (compile - eager first) / (eager - compiled) evals of ``--batches``
(a trainer's eval scores them for train and for val: twice that). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.config import resolve_preset  # noqa: E402
from workbench.train.model import GPT, fused_cross_entropy  # noqa: E402

DEV = "cuda"


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def timed(fn) -> float:
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def run_mode(p, mode: str, batches: int, rounds: int) -> dict:
    torch._dynamo.reset()
    ac, chunk = {"whole model": (False, 0), "all but the loss": (False, 8192), "per block": (True, 8192)}[mode]
    chunk = 512 if DEV == "cpu" and chunk else chunk  # the CPU's chunk (plan.settings.auto_loss_chunk)
    model = GPT(p.model, activation_checkpointing=ac, loss_chunk_tokens=chunk).to(DEV)
    train_forward = model
    if mode == "per block":
        for block in model.layers:
            block.compile()
    elif mode == "all but the loss":
        model.compile_hidden()
    else:
        train_forward = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    amp = torch.autocast(DEV, dtype=torch.bfloat16, enabled=DEV == "cuda")  # fp32 on a CPU
    B, T, V = p.train.batch_size, p.model.seq_len, p.model.vocab_size
    g = torch.Generator(device=DEV).manual_seed(0)
    data = [torch.randint(0, V, (B, T + 1), device=DEV, generator=g) for _ in range(batches)]

    def step():
        x = data[0]
        with amp:
            loss = train_forward(x[:, :-1], x[:, 1:])[1]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    train_first = timed(step)
    train_steady = statistics.median(timed(step) for _ in range(3))

    @torch.no_grad()
    def evaluate(fwd, hidden_compiled: bool = False):
        model.eval()
        nats = torch.zeros((), device=DEV)
        for w in data:
            with amp:
                if hidden_compiled:  # the compiled hidden states under no_grad, the loss as the model does it
                    h = model._hidden_compiled(w[:, :-1], None, None, None)
                    n = h.shape[0] * h.shape[1]
                    nats += fused_cross_entropy(h.reshape(n, -1), model.output_weight(), w[:, 1:].reshape(-1),
                                                chunk, 1.0).float()
                else:
                    nats += fwd(w[:, :-1], w[:, 1:], loss_tokens=1.0)[1].float()
        model.train()
        return nats.item()

    out = {"mode": mode, "train_first": train_first, "train_steady": train_steady}
    if mode == "per block":
        # the blocks are compiled in place: the model's own eval already runs them (an inference graph each)
        ways = {"eval (the model, blocks compiled)": lambda: evaluate(model)}
    elif mode == "all but the loss":
        ways = {"eval eager": lambda: evaluate(model),
                "eval compiled hidden": lambda: evaluate(model, hidden_compiled=True)}
    else:
        ways = {"eval eager": lambda: evaluate(model), "eval compiled": lambda: evaluate(train_forward)}
    first = {name: timed(fn) for name, fn in ways.items()}
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds):  # alternating, so a busy machine slows each alike
        for name, fn in ways.items():
            times[name].append(timed(fn))
    for name in ways:
        out[name] = (first[name], statistics.median(times[name]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="gpu-8gb")
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="whole model,all but the loss,per block")
    ap.add_argument("--set", nargs="*", default=[])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    a = ap.parse_args()
    global DEV
    DEV = a.device
    p = resolve_preset(a.preset, a.set)
    p = dataclasses.replace(p, model=dataclasses.replace(p.model, dropout=0.0))
    name = torch.cuda.get_device_name() if DEV == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"{name}, torch {torch.__version__}; {a.preset}: dim {p.model.dim}, "
          f"{p.model.n_layers} layers, batch {p.train.batch_size} x {p.model.seq_len}; {a.batches} eval batches")
    for mode in a.modes.split(","):
        r = run_mode(p, mode, a.batches, a.rounds)
        if DEV == "cuda":
            torch.cuda.empty_cache()
        print(f"{mode}: train step first {r['train_first']:.1f} s (compile), then {r['train_steady'] * 1e3:.0f} ms")
        for k, v in r.items():
            if isinstance(v, tuple):
                print(f"  {k}: first {v[0]:.2f} s, then {v[1] * 1e3:.0f} ms ({v[1] / a.batches * 1e3:.1f} ms a batch)")
        keys = [k for k, v in r.items() if isinstance(v, tuple)]
        if len(keys) == 2:
            (e1, e), (c1, c) = r[keys[0]], r[keys[1]]
            gain = e - c
            print(f"  compiled eval: {gain * 1e3:+.0f} ms an eval; pays back after "
                  + (f"{(c1 - e1) / gain:.0f} evals" if gain > 0 else "never"))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
