"""Atomic, complete checkpoints and their retention.

A checkpoint is a directory ``checkpoints/step_NNNNNNN/``:

    model.pt            model state dict (no ``_orig_mod.`` prefix), torch.save
    state.pt            optimizer, GradScaler, torch CPU/CUDA/MPS RNG states
    trainer_state.json  step, tokens seen, best val loss, early-stopping counter,
                        lr scale, data-sampler state, Python / NumPy RNG states
    meta.json           the sidecar, written LAST: its presence marks completion

Everything is written into ``checkpoints/.tmp_step_NNNNNNN_<pid>/``, each file
fsynced, then the directory is renamed into place and the parent fsynced. A
SIGKILL at any moment leaves either the previous complete checkpoints or the
new one, never a half one that counts. Loading uses ``torch.load(weights_only=True)``
(no arbitrary pickle), so a checkpoint someone sends you cannot run code.
"""

from __future__ import annotations

import json
import os
import pickle
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workbench.config import Preset, load_preset_file
from workbench.errors import WorkbenchError
from workbench.faults import NO_FAULTS, Faults
from workbench.fs import atomic_dir, dir_size, fsync_dir, fsync_file
from workbench.rundir import (
    CHECKPOINTS_DIR,
    CKPT_META,
    CKPT_MODEL,
    CKPT_OPTIMIZER,
    CKPT_TRAINER_STATE,
    INIT_DIR,
    PRESET_FILE,
    TMP_PREFIX,
    best_checkpoint,
    ckpt_name,
    delete_checkpoint,
    list_checkpoints,
    select_checkpoint,
)
from workbench.train.lora import apply_lora, merge_adapters
from workbench.train.model import GPT
from workbench.train.optim import adamw_class


class CheckpointError(WorkbenchError):
    pass


def save_checkpoint(run_dir: Path, step: int, model_sd: dict, state: dict, trainer_state: dict,
                    meta: dict, faults: Faults = NO_FAULTS) -> Path:
    """Write one checkpoint atomically; returns its final path."""
    cdir = Path(run_dir) / CHECKPOINTS_DIR
    cdir.mkdir(exist_ok=True)
    name = ckpt_name(step)
    final = cdir / name
    with atomic_dir(final, f"{TMP_PREFIX}{name}_{os.getpid()}", f"{TMP_PREFIX}old_{name}_{os.getpid()}") as tmp:
        t0 = time.time()
        torch.save(model_sd, tmp / CKPT_MODEL)
        fsync_file(tmp / CKPT_MODEL)
        faults.in_save("after_model", step)
        torch.save(state, tmp / CKPT_OPTIMIZER)
        fsync_file(tmp / CKPT_OPTIMIZER)
        with open(tmp / CKPT_TRAINER_STATE, "w") as f:
            json.dump(trainer_state, f)
            f.flush()
            os.fsync(f.fileno())
        meta = dict(meta, step=step, bytes=dir_size(tmp), save_s=round(time.time() - t0, 3),
                    wall_time=time.time(), format=1)
        with open(tmp / CKPT_META, "w") as f:
            json.dump(meta, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        faults.in_save("before_rename", step)  # a step saved again (after a rollback) replaces the old one
    return final


def apply_retention(run_dir: Path, keep_last: int, milestone_interval: int, pinned: tuple[int, ...] = ()) -> list[str]:
    """Keep the last ``keep_last`` checkpoints, the best one, milestones and the ``pinned`` steps (a wsd
    schedule's decay start, where an extension goes on from); delete the rest."""
    ckpts = list_checkpoints(run_dir)
    keep = {c["step"] for c in ckpts[-keep_last:]} | set(pinned)
    best = best_checkpoint(ckpts)
    if best:
        keep.add(best["step"])
    if milestone_interval:
        keep |= {c["step"] for c in ckpts if c["step"] % milestone_interval == 0}
    removed = []
    for c in ckpts:
        if c["step"] not in keep:
            delete_checkpoint(c)
            removed.append(c["name"])
    return removed


def _load(path: Path, device: str | torch.device = "cpu") -> Any:
    try:
        try:
            return torch.load(path, map_location=device, weights_only=True)
        except pickle.UnpicklingError as e:
            if "torchao.optim" not in str(e):
                raise
            # 8-bit AdamW states (hardware.optimizer_states): torchao allows its tensor type once imported
            try:
                adamw_class("8bit")
            except ImportError:
                raise CheckpointError(f"{path} holds 8-bit optimizer states and torchao is not installed: "
                                      "pip install 'workbench[savers]'") from None
            return torch.load(path, map_location=device, weights_only=True)
    except CheckpointError:
        raise
    except FileNotFoundError:
        if not Path(path).parent.exists():
            raise CheckpointError(f"checkpoint {Path(path).parent.name} no longer exists: the trainer's retention "
                                  "(train.keep_last) deleted it; choose a newer one (`workbench runs`)") from None
        raise CheckpointError(f"checkpoint file {path} is missing; the checkpoint is incomplete") from None
    except Exception as e:  # UnpicklingError for foreign pickles, RuntimeError for truncation
        first = str(e).strip().splitlines()[0].split(". ")[0][:120] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"cannot load {path}: not a valid workbench checkpoint file ({first}); "
                              "it is truncated, corrupted, or an unsafe pickle that is refused") from None


def strip_compile_prefix(sd: dict) -> dict:
    return {k.removeprefix("_orig_mod."): v for k, v in sd.items()}


def load_model_state(ckpt_path: Path, device="cpu") -> dict:
    sd = _load(Path(ckpt_path) / CKPT_MODEL, device)
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError(f"{ckpt_path}/{CKPT_MODEL} is not a model state dict")
    return strip_compile_prefix(sd)


def load_training_state(ckpt_path: Path, device="cpu") -> tuple[dict, dict]:
    state = _load(Path(ckpt_path) / CKPT_OPTIMIZER, device)
    try:
        trainer_state = json.loads((Path(ckpt_path) / CKPT_TRAINER_STATE).read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read {ckpt_path}/{CKPT_TRAINER_STATE}: {e}") from None
    return state, trainer_state


def check_model_compatible(model: torch.nn.Module, sd: dict, where: str) -> None:
    """Refuse, naming the keys, a state dict whose tensors don't match the model's."""
    check_model_compatible_keys(model.state_dict(), sd, where)


def check_model_compatible_keys(own: dict, sd: dict, where: str) -> None:
    """Refuse, naming the keys, a state dict whose tensors don't match ``own``'s names and shapes."""
    missing = [k for k in own if k not in sd]
    extra = [k for k in sd if k not in own]
    shapes = [f"{k} {tuple(sd[k].shape)} vs {tuple(v.shape)}" for k, v in own.items()
              if k in sd and tuple(sd[k].shape) != tuple(v.shape)]
    if missing or extra or shapes:
        parts = []
        if shapes:
            parts.append("shape differs: " + "; ".join(shapes[:3]) + (" ..." if len(shapes) > 3 else ""))
        if missing:
            parts.append("missing: " + ", ".join(missing[:3]) + (" ..." if len(missing) > 3 else ""))
        if extra:
            parts.append("unexpected: " + ", ".join(extra[:3]) + (" ..." if len(extra) > 3 else ""))
        raise CheckpointError(f"{where} does not fit this model ({'; '.join(parts)})")


def load_weights(model: torch.nn.Module, sd: dict, where: str) -> None:
    """Load a checkpoint's weights into ``model`` (strict), refusing one of another shape first."""
    check_model_compatible(model, sd, where)
    model.load_state_dict(sd)


@dataclass
class Checkpoint:
    """Everything one checkpoint holds, read by rank 0 and handed to the others."""
    meta: dict              # the sidecar, with its path and name
    model: dict             # the weights
    state: dict             # optimizer, GradScaler, torch RNG (state.pt)
    trainer_state: dict     # trainer_state.json (see workbench.train.state.TrainerState)


def read_checkpoint(run_dir: Path, selector: str | int | None = "latest") -> Checkpoint:
    meta = select_checkpoint(run_dir, selector)
    path = Path(meta["path"])
    return Checkpoint(meta, load_model_state(path), *load_training_state(path))


def load_init_weights(run_dir: Path) -> dict:
    """The weights a run started from (``init/model.pt``: train --init-from, import)."""
    path = Path(run_dir) / INIT_DIR
    if not (path / CKPT_MODEL).is_file():
        raise CheckpointError(f"run {Path(run_dir).name} has no {INIT_DIR}/{CKPT_MODEL}, the weights it started from "
                              "(a LoRA run's checkpoints hold only its adapters); it cannot be loaded")
    return load_model_state(path)


def save_merged_init(run_dir: Path, src_dir: Path, step: int) -> None:
    """``run_dir``'s init/model.pt from a LoRA run's checkpoint: its adapters merged into its weights."""
    loaded = load_run_model(src_dir, step, shapes_only=True)
    path = Path(run_dir) / INIT_DIR
    path.mkdir(exist_ok=True)
    torch.save(loaded.state_dict, path / CKPT_MODEL)
    fsync_file(path / CKPT_MODEL)
    fsync_dir(path)


def check_adapters(preset: Preset, sd: dict, where: str) -> None:
    """Refuse, naming the keys, adapters that are not those the preset's LoRA settings make."""
    with torch.device("meta"):
        model = GPT(preset.model)
        apply_lora(model, preset.train)
    own = {k: v for k, v in model.state_dict().items() if k.endswith((".lora_a", ".lora_b"))}
    check_model_compatible_keys(own, sd, where)


@dataclass
class LoadedModel:
    preset: Preset
    meta: dict              # the checkpoint's sidecar
    model: GPT              # weights loaded; on the meta device (shapes only) when asked
    state_dict: dict        # the weights as read (CPU tensors); a LoRA run's merged into its base weights


def load_run_model(run_dir: Path, checkpoint: str | int | None = "latest", device: str | torch.device = "cpu",
                   shapes_only: bool = False, training_state: bool = False) -> LoadedModel:
    """The one way to get a run's checkpoint into a model (sample, export, resume checks).

    ``shapes_only`` builds the model on the meta device and only checks that the weights fit it
    (no memory, no init time: export and resume); ``training_state`` also reads and checks the
    optimizer state file, so a truncated or unsafe one is refused before anything starts.
    A LoRA run's checkpoint (adapters only) is merged into the weights it started from: the model
    is a plain GPT with ``W + (alpha / r) B A`` (what export writes, and what sampling runs fastest)."""
    run_dir = Path(run_dir)
    meta = select_checkpoint(run_dir, checkpoint)
    preset = load_preset_file(run_dir / PRESET_FILE)
    sd = load_model_state(meta["path"])
    if training_state:
        load_training_state(meta["path"])
    where = f"checkpoint {meta['name']}"
    if preset.train.finetune == "lora":
        check_adapters(preset, sd, where)
        sd = merge_adapters(load_init_weights(run_dir), sd, preset.train)
        where = f"{INIT_DIR}/{CKPT_MODEL} with the adapters of {where}"
    if shapes_only:
        with torch.device("meta"):
            model = GPT(preset.model)
        check_model_compatible(model, sd, where)
    else:
        model = GPT(preset.model)
        load_weights(model, sd, where)
        model.to(device)
    return LoadedModel(preset, meta, model, sd)


# ----------------------------------------------------------------------------- sharded (FSDP2) runs
# On disk a sharded run's checkpoint is the same as a single process's: the whole model's state dict and
# the optimizer's own state_dict() layout (parameters numbered 0..n-1 through the param groups in order).
# torch.distributed.checkpoint's full state dicts name parameters instead; these convert between the two.

def optimizer_state_by_name(model: torch.nn.Module, optimizer: torch.optim.Optimizer, sd: dict) -> dict:
    """An optimizer state dict in the numbered layout -> keyed by parameter name, for ``optimizer``
    over ``model`` (the numbers follow ``optimizer``'s param groups, as they did when it was saved)."""
    names = {id(p): n for n, p in model.named_parameters()}
    groups = sd["param_groups"]
    if len(groups) != len(optimizer.param_groups):
        raise ValueError(f"{len(groups)} parameter groups, this optimizer has {len(optimizer.param_groups)}")
    to_name: dict[int, str] = {}
    out_groups = []
    for g, own in zip(groups, optimizer.param_groups):
        if len(g["params"]) != len(own["params"]):
            raise ValueError(f"a parameter group of {len(g['params'])} tensors, "
                             f"this optimizer's has {len(own['params'])}")
        fqns = [names[id(p)] for p in own["params"]]
        to_name.update(zip(g["params"], fqns))
        out_groups.append(dict(g, params=fqns))
    return {"state": {to_name[i]: st for i, st in sd["state"].items()}, "param_groups": out_groups}


def optimizer_state_by_index(sd: dict) -> dict:
    """The inverse of :func:`optimizer_state_by_name`: parameter names -> their numbers in group order."""
    index: dict[str, int] = {}
    groups = []
    for g in sd["param_groups"]:
        ids = [index.setdefault(name, len(index)) for name in g["params"]]
        groups.append(dict(g, params=ids))
    return {"state": {index[name]: st for name, st in sd["state"].items()}, "param_groups": groups}


def gather_sharded_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """Collective (every rank calls it): the whole model's and optimizer's state dicts of an FSDP2 model,
    gathered onto rank 0's CPU in the plain on-disk layout; the other ranks get empty dicts."""
    # lazily: distributed checkpointing takes ~0.6 s to import; sharded runs only
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    msd = get_model_state_dict(model, options=opts)
    osd = get_optimizer_state_dict(model, optimizer, options=opts)
    return msd, (optimizer_state_by_index(osd) if osd else {})


def load_sharded_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, model_sd: dict | None,
                       optimizer_sd: dict | None) -> None:
    """Collective: load whole (plain-layout) state dicts, held by every rank, into an FSDP2 model and
    its optimizer; each rank keeps its own shards."""
    # lazily: distributed checkpointing takes ~0.6 s to import; sharded runs only
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict
    opts = StateDictOptions(full_state_dict=True)
    if model_sd is not None:
        set_model_state_dict(model, model_sd, options=opts)
    if optimizer is not None and optimizer_sd is not None:
        set_optimizer_state_dict(model, optimizer, optimizer_state_by_name(model, optimizer, optimizer_sd),
                                 options=opts)
