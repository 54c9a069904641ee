"""What autograd keeps for backward, measured with saved-tensor hooks (the estimator's activation counts
are checked against it)."""

from __future__ import annotations

import torch


def saved_bytes(block, x: torch.Tensor, cos, sin, dtype, mask: torch.Tensor | None = None) -> int:
    """Bytes of the activations autograd keeps for one block's backward (parameters left out); ``mask``: a
    packed row's attention mask [B, 1, T, T] (bool, so itself not counted: the estimate counts it once)."""
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params and t.dtype.is_floating_point and t.numel() > 4096:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            block(x, cos, sin, None, 0, mask)
    return sum(seen.values())
