"""The simplest honest training loop for the same model, data and batch as a workbench preset.

    python bench/reference_loop.py cpu-small [--set k=v ...] [--steps 30]

Setup borrows workbench's preset, tokens and model class (so the model and data are
exactly the same); the timed inner loop is plain PyTorch: random windows, forward,
backward, clip, AdamW step, zero_grad. No workbench code runs inside it. Prints
one line with tokens/s (median of per-interval rates after the first interval).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset")
    ap.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--log-every", type=int, default=5)
    args = ap.parse_args()

    from workbench.config import resolve_preset
    from workbench.data.preset_data import prepare_data
    from workbench.train.model import GPT

    p = resolve_preset(args.preset, args.overrides)
    data = prepare_data(p.data, p.model.vocab_size, p.model.seq_len, log=lambda m: None)
    tokens = torch.from_numpy(data.train.astype("int64"))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = GPT(p.model).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=p.train.lr, betas=(p.train.beta1, p.train.beta2),
                            weight_decay=p.train.weight_decay)
    B, T = p.train.batch_size, p.model.seq_len

    # ---- the timed loop: plain PyTorch
    rates, t0 = [], time.perf_counter()
    for step in range(1, args.steps + 1):
        ix = torch.randint(len(tokens) - T - 1, (B,))
        x = torch.stack([tokens[i:i + T] for i in ix]).to(device)
        y = torch.stack([tokens[i + 1:i + T + 1] for i in ix]).to(device)
        logits = F.linear(model.hidden(x), model.output_weight())  # embedding, blocks, final norm
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % args.log_every == 0:
            loss.item()
            now = time.perf_counter()
            rates.append(args.log_every * B * T / (now - t0))
            t0 = now
    tps = statistics.median(rates[1:] or rates)
    print(f"reference {args.preset} {' '.join(args.overrides)}: {tps:,.0f} tokens/s, device {device}, fp32")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
