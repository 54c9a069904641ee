"""The optimizer of a run: AdamW alone, or Muon for the hidden matrices and AdamW for the rest.

``train.optimizer = "muon"`` follows modded-nanogpt and nanochat: the 2-D weights inside the blocks
(attention's wq/wk/wv/wo, the MLP's w1/w2/w3) are updated by :class:`Muon` (Nesterov momentum, then
Newton-Schulz iterations that orthogonalise the update: ``train.muon_ns`` names their coefficients,
``NS_SCHEDULES``); the token embedding, the output head and every 1-D parameter (the norms) by AdamW at
``train.lr``. Each group keeps its peak learning
rate in ``base_lr``; the schedule scales them all by the same factor.

A checkpoint of an AdamW-only run holds AdamW's state dict as it always did; one with Muon holds
``{"adamw": ..., "muon": ...}``.

``hardware.optimizer_states = "8bit"`` swaps AdamW for torchao's ``AdamW8bit`` (the same update; each
moment of a tensor of 4096 values or more is kept as uint8 codes of a dynamic map with one fp32 scale
per 256 values, ~2 bytes a parameter for both instead of 8). Its step is compiled per tensor shape
(torch.compile, on every device: the first step of a run pays for it). Its learning rates are tensors,
which :meth:`Optimizers.set_lr` fills in place; its state dict holds torchao's tensor subclass, which
torchao registers for ``torch.load(weights_only=True)``.

``hardware.optimizer_states = "offload"`` keeps AdamW's moments, and a copy of each weight and gradient, in
the host's pinned memory and runs AdamW's step on the CPU (torchao's ``CPUOffloadOptimizer``, CUDA only):
each gradient is copied to the host as backward makes it, each updated weight back before the next
forward. Its state dict is ``{"offloaded": [...], "on-device": ...}`` (tensors under 4096 values stay on
the GPU). The host steps its own copy of each weight, taken from the device before the first step and after
every load (init weights, a resume, a rollback). Gradient clipping scales the device's gradients after the
copies were taken, so
:meth:`Optimizers.clip_grad_norm_` hands the clip factor to :class:`OffloadAdamW`, which applies it to the
host's copies before their step.

Why not ``torch.optim.Muon``: it runs the Newton-Schulz iterations in bfloat16 on every device. On a
CPU, bf16 matmuls are far slower than fp32 (~28x on the 2-core machine this was built on), and the
tiny test model trained at 495 tokens/s with it against ~9,000 with AdamW. :class:`Muon` below is the
same update (Keller Jordan's: Nesterov momentum, five quintic Newton-Schulz steps with his
coefficients, decoupled weight decay, the update scaled by sqrt(max(1, rows/cols))) with the
iterations in bf16 on GPUs and fp32 on a CPU.
"""

from __future__ import annotations

import logging
import warnings

import torch

from workbench.config import TrainConfig
from workbench.train.model import GPT

HIDDEN = ("attn.wq.", "attn.wk.", "attn.wv.", "attn.wo.", "mlp.w1.", "mlp.w2.", "mlp.w3.")


def is_hidden_matrix(name: str, p: torch.Tensor) -> bool:
    """A weight Muon updates: a 2-D matrix inside a block (not the embedding, head or a norm)."""
    return p.dim() == 2 and name.startswith("layers.") and any(h in name for h in HIDDEN)


NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # Keller Jordan's quintic, as torch.optim.Muon uses

# Newton-Schulz schedules: one (a, b, c) per iteration, x <- a x + b (x x^T) x + c (x x^T)^2 x. A matrix is first
# divided by its Frobenius norm (``pad`` times it), so its singular values lie in (0, 1]; each quintic pushes them
# towards 1. "jordan": Keller Jordan's fixed quintic, five times (the singular values end in ~[0.7, 1.2]).
# "polar-express": the five minimax quintics of Amsel et al., "The Polar Express" (arXiv 2505.16932), as published
# with their 1.01 safety factor: the same cost as "jordan", the update ~2x nearer U V^T on this project's Muon
# buffers (relative error 0.09 against 0.19). "minimax-4" and "minimax-3": the same greedy minimax construction
# for four and three steps, computed by ``bench/ns_schedules.py`` for singular values down to 3e-3 and 1e-2 (the
# range a cpu-small momentum buffer's bulk spans): four steps are as near U V^T as Jordan's five (0.14 against
# 0.19) for 4/5 of the products; three are not (~0.45).
_PE = ((8.156554524902461, -22.48329292557795, 15.878769915207462),
       (4.042929935166739, -2.808917465908714, 0.5000178451051316),
       (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
       (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
       (2.3465413258596377, -1.7097828382687081, 0.42323551169305323))
NS_SCHEDULES: dict[str, tuple[tuple[tuple[float, float, float], ...], float]] = {
    "jordan": ((NS_COEFFICIENTS,) * 5, 1.0),
    "polar-express": (tuple((a / 1.01, b / 1.01 ** 3, c / 1.01 ** 5) for a, b, c in _PE), 1.01),
    "minimax-4": (((8.383674, -24.765907, 18.357083), (4.043422, -3.011406, 0.569512),
                   (3.505574, -2.626656, 0.52572), (2.49012, -1.834278, 0.436835)), 1.0),
    "minimax-3": (((8.093369, -23.620432, 17.446152), (3.636585, -2.721926, 0.536546),
                   (2.6613, -1.977155, 0.452616)), 1.0),
}


def orthogonalize(g: torch.Tensor, steps: int = 5, eps: float = 1e-7, schedule: str = "jordan") -> torch.Tensor:
    """Newton-Schulz: about U V^T of g = U S V^T (the singular values pushed towards 1). ``g`` is one matrix
    [r, c] or a stack of same-shaped matrices [k, r, c], each orthogonalised on its own (one batched product
    per iteration instead of k: on an H100, gpu-8gb's 84 matrices took 44.6 ms one at a time, 7.4 ms stacked).
    ``schedule`` names the coefficients (``NS_SCHEDULES``); ``steps`` applies to "jordan" only (the others are
    as many steps as they have quintics)."""
    coefficients, pad = NS_SCHEDULES[schedule]
    if schedule == "jordan":
        coefficients = (NS_COEFFICIENTS,) * steps
    x = g.to(torch.bfloat16 if g.device.type in ("cuda", "mps") else torch.float32)
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) * pad + eps)  # spectral norm at most 1
    mm_add = torch.addmm if x.dim() == 2 else torch.baddbmm  # beta * input + alpha * (p @ q) in one call
    for a, b, c in coefficients:
        m = x @ x.mT
        m = mm_add(m, m, m, beta=b, alpha=c)  # b m + c m^2
        x = mm_add(x, m, x, beta=a)           # a x + (b m + c m^2) x: cpu-small's 28 matrices 118 -> 90 ms
    return (x.mT if tall else x).to(g.dtype)


class Muon(torch.optim.Optimizer):
    """Muon for 2-D parameters (see the module docstring for why not torch.optim.Muon). On a GPU the matrices
    of a parameter group that share a shape are orthogonalised together (``orthogonalize`` on their stack);
    on a CPU one at a time (the same numbers, bit for bit; stacked was no faster there)."""

    def __init__(self, params, lr: float = 0.02, weight_decay: float = 0.0, momentum: float = 0.95,
                 nesterov: bool = True, ns_steps: int = 5, eps: float = 1e-7, ns_schedule: str = "jordan"):
        if ns_schedule not in NS_SCHEDULES:
            raise ValueError(f"unknown Newton-Schulz schedule {ns_schedule!r}; one of {', '.join(NS_SCHEDULES)}")
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                                      ns_steps=ns_steps, eps=eps))
        self.ns_schedule = ns_schedule  # not in the groups: a checkpoint's groups replace them, this follows the config
        for g in self.param_groups:
            for p in g["params"]:
                if p.dim() != 2:
                    raise ValueError(f"Muon updates matrices only; got a parameter of shape {tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for g in self.param_groups:
            mu = g["momentum"]
            by_shape: dict[tuple, list[tuple[torch.Tensor, torch.Tensor]]] = {}
            for p in g["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].get("momentum_buffer")
                if buf is None:
                    buf = self.state[p]["momentum_buffer"] = torch.zeros_like(p.grad)
                buf.mul_(mu).add_(p.grad)
                update = p.grad.add(buf, alpha=mu) if g["nesterov"] else buf
                by_shape.setdefault((tuple(p.shape), p.dtype, p.device), []).append((p, update))
            for (_, _, device), pairs in by_shape.items():
                if device.type == "cpu":  # stacking gains nothing here (cpu-small x0.99, medium x0.83)
                    ortho = [orthogonalize(u, g["ns_steps"], g["eps"], self.ns_schedule) for _, u in pairs]
                else:
                    ortho = orthogonalize(torch.stack([u for _, u in pairs]), g["ns_steps"], g["eps"],
                                          self.ns_schedule)
                for (p, _), o in zip(pairs, ortho):
                    p.mul_(1 - g["lr"] * g["weight_decay"])
                    p.add_(o, alpha=-g["lr"] * max(1.0, p.size(0) / p.size(1)) ** 0.5)
        return loss


class Optimizers:
    """One or two torch optimizers stepped as one (the loop, checkpoints and the scaler see this)."""

    def __init__(self, parts: dict[str, torch.optim.Optimizer]):
        self.parts = parts
        for opt in parts.values():
            for g in opt.param_groups:
                g.setdefault("base_lr", float(g["lr"]))

    @property
    def param_groups(self) -> list[dict]:
        return [g for opt in self.parts.values() for g in opt.param_groups]

    @property
    def adamw(self) -> torch.optim.Optimizer:
        return self.parts["adamw"]

    def set_lr(self, factor: float) -> None:
        for g in self.param_groups:
            if isinstance(g["lr"], torch.Tensor):  # torchao's AdamW8bit reads its lr tensor in its compiled step
                g["lr"].fill_(g["base_lr"] * factor)
            else:
                g["lr"] = g["base_lr"] * factor

    def unscale_(self, scaler: torch.amp.GradScaler) -> None:
        for opt in self.parts.values():
            scaler.unscale_(opt)

    def clip_grad_norm_(self, params, max_norm: float) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` over ``params`` (the total norm before clipping). With the
        states offloaded the host's copies of the gradients were taken before the clip: the copies are
        waited for (the clip must not change a gradient being copied) and the factor handed on."""
        offloaded = [opt for opt in self.parts.values() if isinstance(opt, OffloadAdamW)]
        for opt in offloaded:
            torch.cuda.current_stream().wait_stream(opt.stream)
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        for opt in offloaded:
            opt.host_grad_scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        return norm

    def step(self, scaler: torch.amp.GradScaler) -> None:
        for opt in self.parts.values():
            scaler.step(opt)

    def step_unless(self, bad: torch.Tensor) -> None:
        """The update, skipped by the fused AdamW kernel itself where ``bad`` (a 0-d bool tensor on the
        device) is true: its ``found_inf`` argument, which also takes back the step count. No host sync.
        AdamW alone (plan.settings.nonfinite_check allows this only then)."""
        if set(self.parts) != {"adamw"} or not self.adamw.defaults.get("fused"):
            raise RuntimeError("step_unless needs fused AdamW alone")
        opt = self.adamw
        opt.found_inf = bad.float()
        try:
            opt.step()
        finally:
            del opt.found_inf

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.parts.values():
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        if set(self.parts) == {"adamw"}:
            return self.adamw.state_dict()  # the format of every AdamW checkpoint so far
        return {name: opt.state_dict() for name, opt in self.parts.items()}

    def load_state_dict(self, sd: dict) -> None:
        saved_muon = set(sd) == {"adamw", "muon"}
        saved_offload = "offloaded" in (sd["adamw"] if saved_muon else sd)
        if saved_offload != isinstance(self.adamw, OffloadAdamW):
            raise ValueError(f"the checkpoint's AdamW states were {'offloaded' if saved_offload else 'on the device'}"
                             f", this run {'offloads' if isinstance(self.adamw, OffloadAdamW) else 'does not offload'}"
                             " them (hardware.optimizer_states): resume with the setting the run was saved with")
        if saved_muon != ("muon" in self.parts):
            raise ValueError(f"the checkpoint was trained with {'Muon and AdamW' if saved_muon else 'AdamW'}, this "
                             f"run uses {'Muon and AdamW' if 'muon' in self.parts else 'AdamW'} "
                             "(train.optimizer)")
        if saved_muon:
            for name, opt in self.parts.items():
                opt.load_state_dict(sd[name])
        else:
            self.adamw.load_state_dict(sd)


def adamw_class(states: str) -> type[torch.optim.Optimizer]:
    """torch's AdamW, torchao's AdamW8bit for ``hardware.optimizer_states = "8bit"`` or :class:`OffloadAdamW`
    for ``offload`` (torchao imported only then; on a machine without CUDA torchao logs that its CUDA kernels
    did not load, which says nothing here)."""
    if states == "offload":
        return offload_class()
    if states != "8bit":
        return torch.optim.AdamW
    # torchao's import tells torch about its enums in a way torch now logs as deprecated, and its state
    # tensor has no stable hash for one of compile's caches: notes for torchao's developers, not for a user
    # watching a run (the step is compiled either way).
    logs = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.ERROR)
    try:  # lazily: torchao is optional, for 8-bit or offloaded optimizer states only
        from torchao.optim import AdamW8bit
    finally:
        for log, level in zip(logs, levels):
            log.setLevel(level)
    warnings.filterwarnings("ignore", message=r"OptimState8bit does not implement _stable_hash_for_caching")
    return AdamW8bit


class OffloadAdamW:
    """Marker base: :func:`offload_class` builds the real class on torchao's ``CPUOffloadOptimizer`` (imported
    only where it is used), so ``isinstance`` checks work without torchao."""

    stream: torch.cuda.Stream
    host_grad_scale: torch.Tensor | None = None


_OFFLOAD: type | None = None


def offload_class() -> type[torch.optim.Optimizer]:
    """torchao's ``CPUOffloadOptimizer`` with torch's AdamW on the host (fused on the CPU), whose step first
    scales the host's gradient copies by the clip factor (:meth:`Optimizers.clip_grad_norm_`)."""
    global _OFFLOAD
    if _OFFLOAD is not None:
        return _OFFLOAD
    adamw_class("8bit")  # torchao's import, its log notes quietened
    from torchao.optim import CPUOffloadOptimizer  # lazily, as in adamw_class

    class CPUOffloadAdamW(CPUOffloadOptimizer, OffloadAdamW):
        def __init__(self, params, **kw):
            kw.pop("fused", None)  # the device kernel's flag: the host step is CPU AdamW's own fused one
            super().__init__(params, torch.optim.AdamW, offload_gradients=False, **kw)
            self.host_grad_scale = None
            self.host_weights_stale = True  # the device's weights may be loaded after this (init, resume)

        def load_state_dict(self, state_dict):
            super().load_state_dict(state_dict)
            self.host_weights_stale = True  # a resume or a rollback: the model's weights were just loaded

        @property
        def param_groups(self):
            """The inner optimizers' groups as they are now (torchao's list keeps the on-device groups it was
            built with, which a load_state_dict replaces: the schedule would no longer reach them)."""
            return [*(self.d_opt.param_groups if self.d_opt else []),
                    *(g for opt in self.optim_dict.values() for g in opt.param_groups)]

        @torch.no_grad()
        def step(self, closure=None):
            scale = None if self.host_grad_scale is None else float(self.host_grad_scale)
            self.host_grad_scale = None
            if self.host_weights_stale:  # the host steps its copy of each weight: take the device's first
                for p_device, p_host in self.param_d2h_map.items():
                    p_host.copy_(p_device.detach())
                self.host_weights_stale = False
            if self.d_opt is not None:  # tensors under minimal_size: their gradients were clipped in place
                self.d_opt.step()
            for p_device, copied in self.queue.items():
                copied.synchronize()
                p_host = self.param_d2h_map[p_device]
                if scale is not None and scale < 1.0:
                    p_host.grad.mul_(scale)
                self.optim_dict[p_device].step()
                with torch.cuda.stream(self.stream):
                    p_device.copy_(p_host, non_blocking=True)
            self.stream.synchronize()  # the weights are back before the next forward
            self.queue.clear()

    _OFFLOAD = CPUOffloadAdamW
    return _OFFLOAD


def build_optimizer(model: GPT | torch.nn.Module, t: TrainConfig, fused: bool, states: str = "fp32") -> Optimizers:
    """AdamW (weight decay on matrices, none on norms), or Muon + AdamW as the module docstring says;
    AdamW's moments in fp32 or 8 bits (``states``)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    kw = {"fused": True} if fused else {}
    adamw_cls = adamw_class(states)
    if t.optimizer != "muon":
        decay = [p for _n, p in named if p.dim() >= 2]
        no_decay = [p for _n, p in named if p.dim() < 2]
        adamw = adamw_cls([{"params": decay, "weight_decay": t.weight_decay},
                           {"params": no_decay, "weight_decay": 0.0}], lr=t.lr, betas=(t.beta1, t.beta2), **kw)
        return Optimizers({"adamw": adamw})
    hidden = [p for n, p in named if is_hidden_matrix(n, p)]
    other_2d = [p for n, p in named if p.dim() >= 2 and not is_hidden_matrix(n, p)]
    other_1d = [p for n, p in named if p.dim() < 2]
    adamw = adamw_cls([{"params": other_2d, "weight_decay": t.weight_decay},
                       {"params": other_1d, "weight_decay": 0.0}], lr=t.lr, betas=(t.beta1, t.beta2), **kw)
    muon = Muon(hidden, lr=t.muon_lr, weight_decay=t.muon_weight_decay, momentum=t.muon_momentum, nesterov=True,
                ns_schedule=t.muon_ns)
    return Optimizers({"adamw": adamw, "muon": muon})
