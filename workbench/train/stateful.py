"""The trainer's state as a pair, as torchtitan keeps it: :func:`state_dict` gathers everything a
checkpoint holds for a run to continue exactly (weights, optimizer, GradScaler, every rank's RNG, the
sampler, :class:`~workbench.train.state.TrainerState`), :func:`load_state_dict` puts a checkpoint back.
The trainer calls both with its parts; the checkpointer only ever sees the dict."""

from __future__ import annotations

from typing import Any, Callable

import torch

from workbench.config import Preset
from workbench.data.text.tokens import WindowSampler
from workbench.train.build import Built
from workbench.train.checkpoint import (
    Checkpoint,
    CheckpointError,
    check_model_compatible,
    check_model_compatible_keys,
    gather_sharded_state,
    load_sharded_state,
)
from workbench.train.dist import Dist
from workbench.train.lora import adapter_state_dict
from workbench.train.state import HostRng, TrainerState, set_torch_rng, torch_rng


def model_checkpoint_state(model: torch.nn.Module, p: Preset) -> dict:
    """What a checkpoint's model.pt holds: the whole state dict, or a LoRA run's adapters alone."""
    return adapter_state_dict(model) if p.train.finetune == "lora" else model.state_dict()


def state_dict(built: Built, sampler: WindowSampler, st: TrainerState, p: Preset, dist: Dist, sharded: bool,
               elapsed_s: float, horizon: dict[str, Any]) -> dict[str, Any] | None:
    """{"model", "state" (optimizer, scaler, RNGs), "trainer_state", "meta"} on rank 0, None elsewhere
    (``horizon``: the run's horizon's state, kept in the trainer state: ``Horizon.from_state`` reads it back).
    Collective: every rank's RNG state is gathered, and FSDP's shards onto rank 0's CPU."""
    rank_rng = dist.gather(torch_rng())
    if sharded:
        model_sd, optim_sd = gather_sharded_state(built.model, built.optimizer.adamw)  # (Muon refuses sharding)
    if not dist.is_main:
        return None
    if not sharded:
        model_sd, optim_sd = model_checkpoint_state(built.model, p), built.optimizer.state_dict()
    state = {"optimizer": optim_sd, "scaler": built.scaler.state_dict(), "rng": rank_rng[0]}
    if dist.enabled:
        state["rank_rng"] = rank_rng
    st.sampler = sampler.state()
    st.host_rng = HostRng.capture()
    st.train_preset = vars(p.train)
    meta = {"tokens_seen": st.tokens_seen, "elapsed_s": round(elapsed_s, 2), "preset": p.name,
            "best_val_loss": st.best_val, "model": vars(p.model), "world_size": dist.world,
            "finetune": p.train.finetune}
    return {"model": model_sd, "state": state, "trainer_state": dict(st.to_dict(), elapsed_s=elapsed_s, **horizon),
            "meta": meta}


def load_state_dict(ck: Checkpoint, built: Built, sampler: WindowSampler, st: TrainerState, p: Preset, dist: Dist,
                    sharded: bool) -> Callable[[], None]:
    """Load ``ck`` into the built model, optimizer and scaler, the sampler and ``st`` (in place: the loop's
    parts hold it); returns the function that restores the RNGs (called last, once nothing else draws
    random numbers)."""
    lora = p.train.finetune == "lora"
    where = f"checkpoint {ck.meta['name']}"
    if lora:  # the adapters alone, beside the frozen weights the model was built with
        check_model_compatible_keys(adapter_state_dict(built.model), ck.model, where)
    else:
        check_model_compatible(built.model, ck.model, where)
    if sharded:
        load_sharded_state(built.model, None, ck.model, None)
    else:
        built.model.load_state_dict(ck.model, strict=not lora)
    step = ck.trainer_state["step"]
    try:
        if sharded:
            load_sharded_state(built.model, built.optimizer.adamw, None, ck.state["optimizer"])
        else:
            built.optimizer.load_state_dict(ck.state["optimizer"])
        if ck.state.get("scaler"):
            built.scaler.load_state_dict(ck.state["scaler"])
        ranks = ck.state.get("rank_rng")
        if ranks and len(ranks) == dist.world:
            rng = ranks[dist.rank]
        else:
            rng = ck.state["rng"]
            if dist.enabled:  # another world size: rank-specific dropout streams cannot continue
                torch.manual_seed(p.train.seed + dist.rank + 7919 * step)
                rng = torch_rng()
    except (KeyError, ValueError, RuntimeError, TypeError) as e:
        raise CheckpointError(f"checkpoint {ck.meta['name']} does not match this run's optimizer: {e}") from None
    st.replace_with(TrainerState.from_dict(ck.trainer_state))
    sampler.set_state(st.sampler)
    host = st.host_rng

    def restore_rng() -> None:
        set_torch_rng(rng)
        if host is not None:
            host.restore()
    return restore_rng


def preset_changes(st: TrainerState, p: Preset) -> dict[str, list]:
    """[train] keys changed since the checkpoint ``st`` came from: {key: [old, new]} (resume records them)."""
    old = st.train_preset
    moving = {"max_iters"} if p.train.time_budget else set()  # a budgeted run's end step is re-estimated
    return {k: [old[k], v] for k, v in vars(p.train).items() if k in old and old[k] != v and k not in moving}
