"""A preference run's objective, decided once: its strength (``train.pref_beta`` = 0 is the objective's own
default), whether it takes summed or length-averaged log-probs, whether it trains on pairs or on labelled
answers, and **which reference** it compares the policy with. Torch-free: the trainer, ``estimate``, ``fit``
and the start line all read :func:`objective_plan`.

The reference, chosen automatically:

* ``none``: SFT, SimPO and ORPO need none.
* ``adapters off``: a LoRA run. Its frozen weights are the model it started from, and the adapters start at
  zero, so the model with its adapters switched off *is* the policy at step 0, and stays so: no second copy of
  the weights. Started from a run that itself carried adapters (a chat-tuned LoRA run), workbench merged those
  adapters into the new run's frozen weights (``init/model.pt``), so the reference is that chat-tuned model,
  its adapter frozen into it, not the base under it (TRL keeps a separate frozen copy of the adapter for this).
* ``frozen copy``: a full fine-tune keeps a frozen copy of the weights it started from (fp32 on a CPU; on a GPU
  its matrices in bf16/fp16, as autocast casts the policy's, its embedding and norms in fp32), counted in the
  memory estimate (``train.pref_reference = live``, and KTO's).
* ``precomputed``: the reference's log-prob of every answer, computed once before training with the starting
  weights (the policy itself, before its first update), cached with the prepared data
  (:mod:`workbench.data.preference.reference_table`) and read beside each batch: no second copy of the weights and no
  reference forward a step (:mod:`workbench.train.reference`). ``auto`` takes it for a full fine-tune's DPO: the
  frozen copy costs a model's weights for the whole run and a forward every step, the table one forward pass
  over the answers (which a run of an epoch or more pays anyway), 4 bytes an answer on disk, and every later run
  on the same data from the same checkpoint (a sweep of beta, a resume) finds it cached. KTO cannot take it (its
  KL rows pair each prompt with another answer of its batch); LoRA takes it when asked (its reference costs no
  weights, only the forward a step).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from workbench.config import Preset, PresetError
from workbench.config.objectives import OBJECTIVES, ObjectiveSpec, objective_spec

# Each objective's facts (its default beta, summed or averaged log-probs, whether it needs a reference, its data)
# are the table's: workbench.config.objectives. This module decides, from them and the preset, the reference.
PRECOMPUTED = "precomputed"   # the reference of a table of log-probs (train.pref_reference)


@dataclass(frozen=True)
class ObjectivePlan:
    """What a run of ``objective`` optimises, decided once."""
    objective: str                 # train.objective: a name of the table (workbench.config.objectives)
    beta: float = 0.0              # resolved (pref_beta, or the default)
    averaged: bool = False         # length-averaged log-probs (SimPO, ORPO) instead of summed
    reference: str = "none"        # none | adapters off | frozen copy | precomputed
    reference_why: str = ""
    rows_per_item: int = 1         # forward rows per batch item: a pair is two (chosen, rejected)
    source: str = ""               # the reference's weights: "run NAME step N"

    def with_table(self, answers: int, path: str) -> ObjectivePlan:
        """A precomputed reference as its table made it: how many answers, where (the start line, the record)."""
        return replace(self, reference_why=f"{answers:,} answers, cached in {path}; {self.source}'s log-probs, "
                                           "computed once before training; no second copy of the weights")

    @property
    def spec(self) -> ObjectiveSpec:
        """The objective's row of the table."""
        return objective_spec(self.objective)

    @property
    def preference(self) -> bool:
        return self.spec.preference

    @property
    def samples(self) -> bool:
        """GRPO: the run samples its own answers and scores them with train.reward."""
        return self.spec.samples

    def describe(self) -> str:
        """One line for the start log, ``estimate`` and the run header."""
        if self.samples:
            ref = "no reference" if self.reference == "none" else f"reference: {self.reference} ({self.reference_why})"
            return f"objective {self.objective} (KL beta {self.beta:g}); {ref}"
        if not self.preference:
            return f"objective {self.objective}"
        what = f"objective {self.objective} (beta {self.beta:g}, {'length-averaged' if self.averaged else 'summed'} " \
               f"log-probs)"
        ref = "no reference" if self.reference == "none" else f"reference: {self.reference} ({self.reference_why})"
        return f"{what}; {ref}"


def objective_plan(p: Preset) -> ObjectivePlan:
    """The objective of a run of ``p`` and its reference; a PresetError for a reference objective with nothing to
    compare with (a run from random weights)."""
    t = p.train
    o, spec = t.objective, objective_spec(t.objective)
    if spec.samples:
        return _sampling_plan(p)
    if not spec.preference:
        return ObjectivePlan(o)
    beta = t.pref_beta or spec.default_beta
    rows, averaged = spec.rows_per_item, spec.averaged
    if not spec.reference:
        return ObjectivePlan(o, beta, averaged, "none", f"{o} is reference-free", rows)
    if p.init is None:
        free = [n for n, other in OBJECTIVES.items() if other.preference and not other.reference]
        raise PresetError(f"train.objective = {o} compares the model with the one it started from: start from a "
                          "trained model with --init-from RUN (a chat-tuned run, or an imported model); "
                          f"{' and '.join(free)} need no reference")
    src = f"run {p.init['run']} step {p.init['step']}"
    if t.pref_reference == "precompute" or (t.pref_reference == "auto" and t.finetune == "full"
                                            and not spec.no_precompute):
        return ObjectivePlan(o, beta, averaged, PRECOMPUTED,
                             f"every answer's log-prob under {src}, computed once before training and cached with the "
                             "prepared data; no second copy of the weights", rows, src)
    if t.finetune == "lora":
        if p.init.get("adapter"):
            why = f"{src}'s own adapter, merged into the frozen weights: no extra weights"
        else:
            why = f"{src} itself, the frozen weights under the adapters: no extra weights"
        return ObjectivePlan(o, beta, averaged, "adapters off", why, rows)
    return ObjectivePlan(o, beta, averaged, "frozen copy",
                         f"of {src}'s weights, kept beside the trained ones", rows)


def _sampling_plan(p: Preset) -> ObjectivePlan:
    """GRPO's: it samples from a trained model (--init-from), and compares with the model it started from only
    when train.grpo_beta > 0 (the k3 KL's weight): adapters off for LoRA, a frozen copy for a full fine-tune (no
    precomputed table: its answers are sampled as it trains)."""
    t, o = p.train, p.train.objective
    if p.init is None:
        raise PresetError(f"train.objective = {o} learns from the samples of a trained model: start it from a run "
                          "with --init-from RUN (a pretrained or chat-tuned run, or an imported model)")
    if t.grpo_beta == 0:
        return ObjectivePlan(o, 0.0, False, "none", "train.grpo_beta = 0: no KL term")
    src = f"run {p.init['run']} step {p.init['step']}"
    if t.finetune == "lora":
        return ObjectivePlan(o, t.grpo_beta, False, "adapters off", f"{src} itself, under the adapters: no extra "
                                                                     "weights", 1, src)
    return ObjectivePlan(o, t.grpo_beta, False, "frozen copy", f"of {src}'s weights, kept beside the trained ones",
                         1, src)


__all__ = ["ObjectivePlan", "PRECOMPUTED", "objective_plan"]
