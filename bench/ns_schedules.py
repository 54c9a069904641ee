"""Muon's Newton-Schulz schedules: where the minimax ones come from, and how near U V^T each gets.

    python bench/ns_schedules.py                       # the greedy minimax quintics for 4 and 3 steps
    python bench/ns_schedules.py --checkpoint runs/R/checkpoints/step_0000060   # error on a Muon run's buffers

The greedy construction of "The Polar Express" (Amsel et al., arXiv 2505.16932): the singular values of the
normalised matrix lie in [l, u]; each step takes the odd quintic p(x) = a x + b x^3 + c x^5 minimising
max |1 - p(x)| over [l, u] (a linear programme on a dense grid, scipy's HiGHS), then [l, u] becomes p's range
over it. Started from l = 3e-3 for four steps and 1e-2 for three, these are ``workbench.train.optim``'s
"minimax-4" and "minimax-3" (rounded to 6 decimals).

With ``--checkpoint``, every Muon momentum buffer in that checkpoint's ``state.pt`` is orthogonalised by each
schedule and compared with its exact U V^T (from an SVD): the relative Frobenius error, median over the
matrices, and the cost in matrix products relative to Jordan's five steps. Without it, synthetic matrices
with power-law spectra stand in. Needs scipy (installed with lm-eval).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np
import torch

from workbench.train.optim import NS_SCHEDULES, orthogonalize


def minimax_quintic(lo: float, hi: float, n: int = 4000) -> tuple[tuple[float, float, float], float]:
    """The odd quintic nearest 1 in the max norm over [lo, hi], and that max error."""
    from scipy.optimize import linprog
    xs = np.concatenate([np.geomspace(lo, hi, n), np.linspace(lo, hi, n)])
    a = np.stack([xs, xs ** 3, xs ** 5], 1)
    ones = np.ones((len(xs), 1))
    # variables (a, b, c, t): minimise t subject to -t <= 1 - p(x) <= t
    r = linprog([0, 0, 0, 1], A_ub=np.vstack([np.hstack([-a, -ones]), np.hstack([a, -ones])]),
                b_ub=np.concatenate([-ones[:, 0], ones[:, 0]]), bounds=[(None, None)] * 3 + [(0, None)],
                method="highs")
    return tuple(float(v) for v in r.x[:3]), float(r.x[3])


def greedy(lo: float, steps: int) -> list[tuple[float, float, float]]:
    hi, out = 1.0, []
    for i in range(steps):
        (a, b, c), err = minimax_quintic(lo, hi)
        xs = np.geomspace(lo, hi, 200_000)
        p = a * xs + b * xs ** 3 + c * xs ** 5
        lo, hi = float(p.min()), float(p.max())
        out.append((a, b, c))
        print(f"  step {i + 1}: ({a:.6f}, {b:.6f}, {c:.6f})  max error {err:.4f}  -> singular values in "
              f"[{lo:.4f}, {hi:.4f}]")
    return out


def buffers(checkpoint: Path | None) -> list[torch.Tensor]:
    if checkpoint is None:
        gen = torch.Generator().manual_seed(0)
        out = []
        for rows, cols in ((256, 256), (704, 256), (128, 256)):
            k = min(rows, cols)
            u, _ = torch.linalg.qr(torch.randn(rows, k, generator=gen))
            v, _ = torch.linalg.qr(torch.randn(cols, k, generator=gen))
            for alpha in (0.5, 1.0):
                out.append(u @ torch.diag(torch.arange(1, k + 1).float() ** -alpha) @ v.T)
        return out
    state = torch.load(checkpoint / "state.pt", map_location="cpu", weights_only=False)
    found = []

    def walk(d):
        if isinstance(d, dict):
            if "momentum_buffer" in d and d["momentum_buffer"].dim() == 2:
                found.append(d["momentum_buffer"].float())
            for v in d.values():
                walk(v)
    walk(state)
    if not found:
        raise SystemExit(f"ns_schedules: no Muon momentum buffer in {checkpoint / 'state.pt'} (a Muon run's?)")
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, default=None)
    args = ap.parse_args()
    for lo, steps in ((3e-3, 4), (1e-2, 3)):
        print(f"greedy minimax, {steps} steps from singular values down to {lo}:")
        greedy(lo, steps)
    mats = buffers(args.checkpoint)
    print(f"\nrelative error to U V^T over {len(mats)} matrices "
          f"({'the checkpoint’s Muon buffers' if args.checkpoint else 'synthetic power-law spectra'}):")
    exact = []
    for m in mats:
        u, _s, vh = torch.linalg.svd(m, full_matrices=False)
        exact.append(u @ vh)
    for name, (coefficients, _pad) in NS_SCHEDULES.items():
        errs = [float((orthogonalize(m, schedule=name) - o).norm() / o.norm()) for m, o in zip(mats, exact)]
        print(f"  {name:14s} median {statistics.median(errs):.3f}  worst {max(errs):.3f}  "
              f"products x{len(coefficients) / 5:.1f} of jordan's")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
