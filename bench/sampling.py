"""Sampling speed: KV-cache generation vs recomputing the whole context for every new token.

    python bench/sampling.py [PRESET] [--set k=v ...] [--new-tokens 256] [--prompt-tokens 16]

Builds the preset's model with random weights (speed does not depend on them), then
generates the same greedy tokens both ways and prints the ratio, plus the time to
the first token including building the model (a proxy for `workbench sample`'s load).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset", nargs="?", default="cpu-small")
    ap.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[])
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    args = ap.parse_args()
    t_start = time.perf_counter()
    import torch

    from tests.support.oracles import generate_recomputed
    from workbench.config import resolve_preset
    from workbench.train.generate import generate
    from workbench.train.model import GPT

    p = resolve_preset(args.preset, args.overrides)
    torch.manual_seed(0)
    model = GPT(p.model).eval()
    if model.num_params() < 50e6:
        torch.set_num_threads(1)  # as `workbench sample` does for small models on CPU
    prompt = torch.randint(0, p.model.vocab_size, (args.prompt_tokens,)).tolist()
    gen = generate(model, prompt, args.new_tokens, temperature=0)
    next(gen)
    first = time.perf_counter() - t_start
    rest = list(gen)
    t0 = time.perf_counter()
    fast = list(generate(model, prompt, args.new_tokens, temperature=0))
    t_fast = time.perf_counter() - t0
    t0 = time.perf_counter()
    slow = list(generate_recomputed(model, prompt, args.new_tokens, temperature=0))
    t_slow = time.perf_counter() - t0
    first_diff = next((i for i, (a, b) in enumerate(zip(fast, slow)) if a != b), None)
    same = "same tokens" if fast == slow else f"tokens differ at {first_diff}"
    print(f"{args.preset}: {args.new_tokens} new tokens: KV cache {t_fast:.2f} s "
          f"({args.new_tokens / t_fast:,.0f} tok/s), "
          f"recompute {t_slow:.2f} s ({args.new_tokens / t_slow:,.0f} tok/s), ratio {t_slow / t_fast:.1f}x ({same}); "
          f"first token {first:.2f} s after start (imports + model build){'' if rest else ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
