"""Starting a run from another run's weights (``--init-from RUN[:CHECKPOINT]``), and which fine-tuning
method fits this machine. Torch-free.

A run started from a checkpoint takes its [model] section from the source run, except the training
context and dropout (``seq_len``, ``dropout``: the weights mean the same with any value), which come with
[train], [data] and [hardware] from the preset given; any other ``--set model.*`` that disagrees with the
source is refused.
It records ``[init]`` (run, step) and the source model's ``[source]`` table, and encodes its corpus with
the source run's tokenizer (``data.tokenizer``). Its directory gets ``init/model.pt`` (a hard link to the
source checkpoint's weights, :attr:`InitSource.weights`; made by ``workbench.rundir.start_from``) and a copy of
the tokenizer files, so it keeps working if the source run is deleted.

Methods (``compare_methods``): full fine-tuning (every weight trained: fp32 weights, gradients and AdamW
states, ~16 bytes a parameter before activations), LoRA (the frozen weights in the training precision,
adapters and their optimizer state), and LoRA with activation checkpointing. The first that fits is
recommended: full when it fits (it adapts every weight), else LoRA, else LoRA with checkpointing.

Its learning rate (``finetune_lr``, one table ``FINETUNE_RATES`` for every objective and method): a fine-tuning rate,
not the preset's from-scratch one, unless --set train.lr; said in ``train``'s first line (``finetune_lr_note``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from workbench.config import Preset, PresetError, load_preset_file, overridden_keys, parse_override, preset_from_dict
from workbench.config.objectives import PREFERENCE_FAMILY, REWARD_FAMILY, SFT_FAMILY, objective_spec
from workbench.data.text.tokenizer import tokenizer_file
from workbench.machine.detect import Machine
from workbench.plan.fit import memory as est
from workbench.rundir import (
    CKPT_MODEL,
    PRESET_FILE,
    RunError,
    resolve_run,
    select_checkpoint,
)

# Model keys a run started from a checkpoint may change: the weights mean the same with any value.
FREE_MODEL_KEYS = ("seq_len", "dropout")


@dataclasses.dataclass
class InitSource:
    """The run and checkpoint a new run starts from."""
    run_dir: Path
    ckpt: dict          # the checkpoint's sidecar (with its path)
    preset: Preset      # the source run's preset

    @property
    def run(self) -> str:
        return self.run_dir.name

    @property
    def lora(self) -> bool:
        """The source checkpoint holds LoRA adapters (its weights are those merged into its own init)."""
        return self.preset.train.finetune == "lora" and self.ckpt.get("reason") != "import"

    @property
    def weights(self) -> Path | None:
        """The weights a run started from this source links as its init/model.pt; None for a LoRA source, whose
        adapters are merged into its own init first (``workbench.train.checkpoint.save_merged_init``)."""
        return None if self.lora else Path(self.ckpt["path"]) / CKPT_MODEL


def parse_init_from(root: Path, spec: str) -> InitSource:
    """``RUN`` or ``RUN:CHECKPOINT`` (latest, best or a step) -> the source run and checkpoint."""
    run, _, sel = spec.partition(":")
    if not run:
        raise RunError(f"--init-from {spec!r}: give a run id (`workbench runs`), optionally :CHECKPOINT")
    run_dir = resolve_run(root, run)
    ckpt = select_checkpoint(run_dir, sel or "latest")
    return InitSource(run_dir, ckpt, load_preset_file(run_dir / PRESET_FILE))


def check_model_overrides(src: InitSource, overrides: list[str]) -> None:
    """Refuse, in one line, a --set model.* (other than seq_len, dropout) that disagrees with the source's."""
    theirs = dataclasses.asdict(src.preset.model)
    for item in overrides:
        sec, key, value = parse_override(item)
        if sec != "model" or key in FREE_MODEL_KEYS:
            continue
        if value != theirs[key] and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                           and float(value) == float(theirs[key])):
            raise PresetError(f"--init-from {src.run}: --set model.{key}={value} disagrees with the source run's "
                              f"model.{key} = {theirs[key]!r}; the model comes from {src.run} (only "
                              f"{' and '.join('model.' + k for k in FREE_MODEL_KEYS)} may change)")


def init_preset(p: Preset, src: InitSource, overrides: list[str]) -> Preset:
    """``p`` (the preset given, overrides applied) as a run that starts from ``src``: its [model] from the
    source, [init] and [source] recorded, the source's tokenizer named in [data]."""
    check_model_overrides(src, overrides)
    model = dataclasses.replace(src.preset.model, **{k: getattr(p.model, k) for k in FREE_MODEL_KEYS})
    tok = tokenizer_file(src.run_dir)
    if tok is None:
        raise RunError(f"run {src.run} has no tokenizer.json or tokenizer.model to encode the new corpus with")
    source = dict(src.preset.source) if src.preset.source else {"model": f"run {src.run}"}
    data = dataclasses.replace(p.data, tokenizer=str(tok))
    step = int(src.ckpt["step"])
    what = "LoRA" if p.train.finetune == "lora" else "full"
    train = p.train
    if train.optimizer == "muon" and "train.optimizer" not in overridden_keys(overrides):
        # cpu-small's and medium's Muon + wsd is a recipe for training from scratch: a fine-tune takes AdamW
        # (LoRA's adapters are low-rank factors, not whole matrices; a full fine-tune moves pretrained weights,
        # which Muon's fixed-size updates at muon_lr would overwrite) unless --set train.optimizer=muon says so
        train = dataclasses.replace(train, optimizer="adamw")
    train = finetune_lr(train, overrides)  # a fine-tuning rate, not the preset's from-scratch one
    init = {"run": src.run, "step": step, **({"adapter": True} if src.lora else {})}
    out = dataclasses.replace(p, model=model, data=data, train=train, init=init,
                              source=source,
                              description=f"{what} fine-tune of {Path(source['model']).name} (run {src.run} step "
                                          f"{step}) with preset {p.name}")
    return preset_from_dict(out.to_dict(), f"{p.name} --init-from {src.run}", name=p.name)  # the rules again


# A fine-tune's learning rate. The presets' rates are for training from scratch, and a full fine-tune at them
# overwrites what the model knew:
# - preference (DPO, KTO, SimPO, ORPO), full: cpu-small's 3e-3 dropped a DPO run's chosen answers by 57 nats in 20
#   steps; on bench/preference.py's task plain DPO kept more of the model at 3e-5 than at 1e-4 (three seeds, README:
#   "Preference tuning"). Flat after warmup.
# - SFT: bench/finetune_lr.py at 400 steps, three seeds (docs/reference/fine-tuning.md, "Learning rate"): one
#   cpu-small pretrained 400 steps (loss 4.80 on its own text; guessing is 9.01), chat-tuned at each rate, full and
#   LoRA rank 8, greedy exact match on 200 held-out conversations, mean of seeds 1337, 1 and 2. The rule: the rate
#   with the best held-out score, unless a lower one scores within the seeds' spread and keeps more of the
#   pretraining; never one that leaves the model near guessing on its own text (a larger pretrained model has more
#   to lose). Full 1e-3: 47.8 % (44.5-49.5), text +1.83 nats; 2e-3 scored no better, 47.3 % (45.5-48.5), at +3.59
#   (9.63 on one seed: worse than guessing); 3e-4 (the rule until now, chosen at 150 steps where only the colour
#   look-ups are learned) kept the most (+0.62) but scored 14.7 % (13.0-16.0): it does not learn to reverse words
#   in 400 steps (8 % against 1e-3's 88 %). LoRA 1e-3 kept: 7.3 % (6.5-8.0), +1.48 nats, against the preset's 3e-3,
#   7.3 % (6.5-8.5) at +2.26; at rank 8 neither rate tried learns reverse or sort in 400 steps. min_lr is scaled
#   with the rate (the preset's decay kept). Measured on a 5 M model only: a larger one is not measured here.
# - LoRA with a preference objective: the preset's (not measured here).
PREFERENCE_MAX_LR = 3e-5
SFT_MAX_LR = 1e-3
LORA_SFT_MAX_LR = 1e-3
# - GRPO (full and LoRA): 3e-4, between a rate that collapses and one that moves nothing (2026-11-29, one seed each;
#   until then GRPO took the preset's from-scratch rate). bench/chat_rl.py from the 400-step chat-tuned cpu-small
#   (48.6 % held-out exact match), 240 s of GRPO with the exact reward: lr 1e-3 collapsed it to 7.2 %, 1e-4 left it
#   at 48.4 %; a walk's GRPO run on sums at the preset's 3e-3 collapsed (reward 0.23 -> 0, completions 5 -> 60
#   tokens) while 3e-4 held. 3e-4 itself is not measured on the chat bench; LoRA not measured at all.
GRPO_MAX_LR = 3e-4


@dataclasses.dataclass(frozen=True)
class FineTuneRate:
    """One row of :data:`FINETUNE_RATES`: the rate a fine-tune of this objective and method takes."""
    family: str             # the objective's family (workbench.config.objectives): SFT, PREFERENCE or REWARD_FAMILY
    finetune: str           # full | lora
    max_lr: float | None    # train.lr at the most (a lower rate the preset chose is kept); None: the preset's
    flat: bool              # min_lr at most the rate (flat after warmup), else scaled with it (the preset's decay)
    said: str               # in the fine-tune's first line: "adamw lr 3e-05 (SAID; --set train.lr to change)"


FINETUNE_RATES = (
    FineTuneRate(PREFERENCE_FAMILY, "full", PREFERENCE_MAX_LR, True, "a full preference fine-tune's at most"),
    FineTuneRate(SFT_FAMILY, "full", SFT_MAX_LR, False, "a full fine-tune's at most"),
    FineTuneRate(SFT_FAMILY, "lora", LORA_SFT_MAX_LR, False, "a LoRA fine-tune's at most"),
    FineTuneRate(PREFERENCE_FAMILY, "lora", None, False, "the preset's: a LoRA preference fine-tune keeps it"),
    FineTuneRate(REWARD_FAMILY, "full", GRPO_MAX_LR, False, "a GRPO fine-tune's at most"),
    FineTuneRate(REWARD_FAMILY, "lora", GRPO_MAX_LR, False, "a GRPO fine-tune's at most"),
)


def finetune_lr_rule(train: Any, overrides: list[str]) -> FineTuneRate | None:
    """The row of :data:`FINETUNE_RATES` for this fine-tune (its objective and method), or None where a --set chose
    ``train.lr``."""
    if "train.lr" in overridden_keys(overrides):
        return None
    family = objective_spec(train.objective).family
    return next((r for r in FINETUNE_RATES if (r.family, r.finetune) == (family, train.finetune)), None)


def finetune_lr(train: Any, overrides: list[str]) -> Any:
    """A fine-tune's ``train`` with ``lr`` at most its rule's (:func:`finetune_lr_rule`) unless --set says otherwise;
    a lower rate the preset chose is kept. The rest of the schedule follows by one factor: ``min_lr`` (at most the
    new rate for a flat rule; unless --set chose it) and, where Muon was asked for, ``muon_lr`` (unless --set chose
    it), so "the rate" is the scale of the whole schedule."""
    rule = finetune_lr_rule(train, overrides)
    if rule is None or rule.max_lr is None or train.lr <= rule.max_lr:
        return train
    factor, asked = rule.max_lr / train.lr, overridden_keys(overrides)

    def scaled(x: float) -> float:  # 3 significant figures: 1e-05 in preset.toml, not 1.0000000000000002e-05
        return float(f"{x * factor:.3g}")
    min_lr = (train.min_lr if "train.min_lr" in asked
              else min(train.min_lr, rule.max_lr) if rule.flat else scaled(train.min_lr))
    muon_lr = scaled(train.muon_lr) if train.optimizer == "muon" and "train.muon_lr" not in asked else train.muon_lr
    return dataclasses.replace(train, lr=rule.max_lr, min_lr=min_lr, muon_lr=muon_lr)


def finetune_lr_note(train: Any, overrides: list[str]) -> str:
    """What the fine-tune's first line says after its rate: " (a full fine-tune's at most; --set train.lr to change)"
    where its rule set the rate, "" where --set or a lower preset rate did."""
    rule = finetune_lr_rule(train, overrides)
    if rule is None or (rule.max_lr is not None and train.lr != rule.max_lr):
        return ""
    return f" ({rule.said}; --set train.lr to change)"


# ----------------------------------------------------------------------------- which method fits

METHODS = (("full", "full fine-tuning", {"finetune": "full"}, False),
           ("lora", "LoRA", {"finetune": "lora"}, False),
           ("lora+ac", "LoRA + activation checkpointing", {"finetune": "lora"}, True))


def method_preset(p: Preset, finetune: str, activation_checkpointing: bool) -> Preset:
    t = dataclasses.replace(p.train, finetune=finetune,
                            optimizer="adamw" if finetune == "lora" else p.train.optimizer)
    # full: the preset's own choice (auto turns checkpointing on where the estimate needs it); LoRA alone
    # and LoRA + checkpointing: as the method says
    ac = "true" if activation_checkpointing else (p.hardware.activation_checkpointing if finetune == "full"
                                                   else "false")
    h = dataclasses.replace(p.hardware, activation_checkpointing=ac)
    return dataclasses.replace(p, train=t, hardware=h)


def compare_methods(p: Preset, machine: Machine) -> dict[str, Any]:
    """Memory of full / LoRA / LoRA + activation checkpointing for ``p`` on ``machine``, whether each
    fits, and the recommendation (the first that fits, in that order)."""
    device = machine.best_device() if p.hardware.device == "auto" else p.hardware.device
    avail, what = machine.memory(device) if machine.has(device) else (None, "")
    rows: list[dict[str, Any]] = []
    for key, label, train_kw, ac in METHODS:
        q = method_preset(p, train_kw["finetune"], ac)
        try:
            mem = est.estimate_memory(q, machine=machine)
        except PresetError as e:
            rows.append({"method": key, "label": label, "error": str(e)})
            continue
        c = mem.components
        rows.append({"method": key, "label": label, "total": mem.total, "fits": est.fits(mem, avail),
                     "trainable": mem.trainable_params, "weights": c["weights"],
                     "gradients": mem.model_states - c["weights"] - c["optimizer"], "optimizer": c["optimizer"],
                     "activations": mem.activations_total, "precision": mem.precision,
                     "checkpoint_bytes": mem.checkpoint_bytes})
    fitting = [r for r in rows if r.get("fits")]
    rec = fitting[0]["method"] if fitting else None
    if rec is None:
        why = ("none fits: lower train.batch_size (with grad_accum) or model.seq_len, or use a GPU"
               if avail else f"no {device} memory figure here")
    else:
        why = {"full": "full fine-tuning fits: it adapts every weight",
               "lora": "full fine-tuning does not fit; LoRA does (frozen weights, small adapters)",
               "lora+ac": "only LoRA with activation checkpointing fits (slower: each block's forward runs "
                          "twice)"}[rec]
    return {"device": device, "available": avail, "available_what": what, "rows": rows, "recommended": rec,
            "why": why, "params": rows[0].get("trainable") if rows else None}


def method_overrides(method: str) -> list[str]:
    """The --set values that select a method of ``compare_methods``."""
    return {"full": ["train.finetune=full"], "lora": ["train.finetune=lora"],
            "lora+ac": ["train.finetune=lora", "hardware.activation_checkpointing=true"]}[method]
