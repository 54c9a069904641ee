"""A preference run's objective in the engine: the loss of a
:class:`~workbench.data.preference.preference_data.PairBatch` or
:class:`~workbench.data.preference.preference_data.AnswerBatch` through the losses of
:mod:`workbench.train.preference_losses`, against the reference :mod:`workbench.plan.recipe.objective_plan` chose
(:class:`Reference`), with what the run logs beside the loss (:class:`~workbench.rundir.PreferenceRecord`) and the
checks that catch the peers' known bugs:

* **step 0**: the policy is the reference, so the DPO loss is ln 2 and every reward 0 (KTO: every reward 0). The
  first training batch of a fresh run is checked; anything else stops the run with one line (a reference that
  is not the starting model: the wrong weights, another adapter, a precomputed table that does not match).
* **the reference stays put** (TRL #1107, #6443: the reference was the policy itself, so every reward stayed 0
  and the accuracy 0): on the first batch after an update with a learning rate above 0, rewards that are all
  exactly 0 stop the run.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from workbench.config import Preset, TrainConfig
from workbench.data.preference.preference_data import AnswerBatch, PairBatch
from workbench.data.train_data import IGNORE, Batch
from workbench.errors import WorkbenchError
from workbench.faults import Faults
from workbench.plan.recipe.objective_plan import PRECOMPUTED, ObjectivePlan
from workbench.rundir import INIT_DIR, PreferenceRecord
from workbench.train.checkpoint import load_weights
from workbench.train.lora import adapters_off
from workbench.train.model import GPT
from workbench.train.preference_losses import (
    LN2,
    AnswerLogps,
    PreferenceLoss,
    dpo_loss,
    kto_loss,
    orpo_loss,
    simpo_loss,
)

# How far from ln 2 (and 0) the first batch may be: the reference's forward is the policy's own computation, so
# the difference is rounding (0 in fp32 on a CPU; a few 1e-4 in bf16).
STEP0_TOLERANCE = 2e-3

# Each preference objective's loss, keyed by the names of the table of objectives (workbench.config.objectives),
# whose row says the rest (its data, its reference, its beta): a paired objective's on the chosen and the rejected
# answers (with the reference's summed log-probs of each where its row has a reference), an unpaired one's on
# labelled answers. sft's loss is the model's own next-token loss (workbench.train.batches).
RefPair = tuple[torch.Tensor, torch.Tensor] | None
PairLoss = Callable[[AnswerLogps, AnswerLogps, RefPair, float, TrainConfig], PreferenceLoss]
AnswerLoss = Callable[[AnswerLogps, torch.Tensor, torch.Tensor, torch.Tensor, float, TrainConfig], PreferenceLoss]


def _dpo(chosen: AnswerLogps, rejected: AnswerLogps, ref: RefPair, beta: float, t: TrainConfig) -> PreferenceLoss:
    assert ref is not None
    return dpo_loss(chosen, rejected, ref[0], ref[1], beta, t.pref_label_smoothing, t.pref_sft_weight, t.dpop_lambda)


def _simpo(chosen: AnswerLogps, rejected: AnswerLogps, ref: RefPair, beta: float, t: TrainConfig) -> PreferenceLoss:
    return simpo_loss(chosen, rejected, beta, t.simpo_gamma, t.pref_label_smoothing, t.pref_sft_weight)


def _orpo(chosen: AnswerLogps, rejected: AnswerLogps, ref: RefPair, beta: float, t: TrainConfig) -> PreferenceLoss:
    return orpo_loss(chosen, rejected, beta)


def _kto(answers: AnswerLogps, ref: torch.Tensor, good: torch.Tensor, kl: torch.Tensor, beta: float,
         t: TrainConfig) -> PreferenceLoss:
    return kto_loss(answers, ref, good, kl, beta, t.kto_desirable_weight, t.kto_undesirable_weight)


PAIR_LOSSES: dict[str, PairLoss] = {"dpo": _dpo, "simpo": _simpo, "orpo": _orpo}
ANSWER_LOSSES: dict[str, AnswerLoss] = {"kto": _kto}


class ObjectiveCheckError(WorkbenchError):
    exit_code = 1


def answer_logps(per_token: torch.Tensor, targets: torch.Tensor) -> AnswerLogps:
    """Per-token log-probs [B, T] (0 off the answer) as :class:`AnswerLogps` over the targets that are trained."""
    m = (targets != IGNORE).to(torch.float32)
    return AnswerLogps(per_token, m, per_token.sum(-1), m.sum(-1))


class Reference:
    """The reference's summed log-probs of rows (no gradient): the model with its adapters off (LoRA), a frozen
    copy of the starting weights (full fine-tune), the values a precomputed table gave the batch
    (:mod:`workbench.train.reference`), or, with ``policy_is_reference`` (a test's fault: TRL #1107), the policy
    itself."""

    def __init__(self, kind: str, model: torch.nn.Module, frozen: torch.nn.Module | None = None,
                 policy_is_reference: bool = False):
        self.kind, self.model, self.frozen = kind, model, frozen
        self.policy_is_reference = policy_is_reference

    @torch.no_grad()
    def logps(self, inputs: torch.Tensor, targets: torch.Tensor, table: torch.Tensor | None = None) -> torch.Tensor:
        """``table``: the rows' values read from a precomputed reference (the batch carries them)."""
        if self.policy_is_reference:
            _, lp = self.model(inputs, targets, logps=True)
        elif self.kind == PRECOMPUTED:
            if table is None:
                raise ObjectiveCheckError("the reference is precomputed, but a batch came without its values")
            return table
        elif self.kind == "adapters off":
            with adapters_off(self.model):
                _, lp = self.model(inputs, targets, logps=True)
        else:
            assert self.frozen is not None
            _, lp = self.frozen(inputs, targets, logps=True)
        return lp.sum(-1)


class Objective:
    """The loss of a preference batch (``loss``), what it measured (``take``), and the two checks."""

    def __init__(self, plan: ObjectivePlan, t: TrainConfig, model: torch.nn.Module, reference: Reference | None):
        self.plan, self.t, self.model, self.reference = plan, t, model, reference
        self.spec = plan.spec
        self.pair_loss, self.answer_loss = PAIR_LOSSES.get(plan.objective), ANSWER_LOSSES.get(plan.objective)
        if self.pair_loss is None and self.answer_loss is None:
            raise ObjectiveCheckError(f"train.objective = {plan.objective} has no loss in the trainer "
                                      "(workbench.train.objective's PAIR_LOSSES, ANSWER_LOSSES)")
        self.pending: list[dict[str, torch.Tensor]] = []        # training micro-batches since the last take
        self.eval_pending: list[dict[str, torch.Tensor]] = []   # an eval's batches (no gradient)
        self.check_start = False       # the next training batch is a fresh run's first: ln 2 and zero rewards
        self.check_moved = False       # the policy was updated: its rewards may not all be 0 any more
        self.moved_verified = False
        self.prev_lr = 0.0

    def at_step(self, step: int, lr: float, fresh: bool) -> None:
        """Before training step ``step`` at ``lr`` (``fresh``: a run that starts at step 0, not a resume)."""
        self.check_start = fresh and step == 0 and self.reference is not None
        if step > 0 and self.prev_lr > 0 and not self.moved_verified and self.reference is not None:
            self.check_moved = True
        self.prev_lr = lr

    # ------------------------------------------------------------------ the loss

    def loss(self, forward: Callable, batch: Batch[torch.Tensor], loss_tokens: float | None) -> torch.Tensor:
        """The objective's mean loss over the batch's pairs (or answers); with ``loss_tokens``, their sum over it
        (an eval sums its batches)."""
        if isinstance(batch, PairBatch) and self.pair_loss is not None:
            res, stats = self._pairs(forward, batch, self.pair_loss)
        elif isinstance(batch, AnswerBatch) and self.answer_loss is not None:
            res, stats = self._answers(forward, batch, self.answer_loss)
        else:
            raise TypeError(f"train.objective = {self.plan.objective} takes preference batches, not {type(batch)}")
        (self.pending if torch.is_grad_enabled() else self.eval_pending).append(stats)
        if torch.is_grad_enabled():
            self._check(res)
        n = len(batch.inputs)
        return res.loss if loss_tokens is None else res.loss * n / loss_tokens

    def _pairs(self, forward: Callable, b: PairBatch,
               pair_loss: PairLoss) -> tuple[PreferenceLoss, dict[str, torch.Tensor]]:
        x = torch.cat([b.inputs, b.rejected_inputs])
        y = torch.cat([b.targets, b.rejected_targets])
        _, lp = forward(x, y, logps=True)  # one forward of both answers (a DDP step is one forward)
        ans = answer_logps(lp, y)
        n = len(b.inputs)
        chosen, rejected = ans.rows(slice(0, n)), ans.rows(slice(n, None))
        ref = None
        if self.spec.reference:
            assert self.reference is not None
            table = None if b.ref_chosen is None else torch.cat([b.ref_chosen, b.ref_rejected])
            ref = self.reference.logps(x, y, table)
        res = pair_loss(chosen, rejected, None if ref is None else (ref[:n], ref[n:]), self.plan.beta, self.t)
        pc, pr = chosen.take(self.plan.averaged).detach(), rejected.take(self.plan.averaged).detach()
        stats = {"loss": res.loss.detach(), "chosen_reward": res.chosen_rewards.mean(),
                 "rejected_reward": res.rejected_rewards.mean(), "margin": res.margin.mean(),
                 "accuracy": res.accuracy, "chosen_logps": pc.mean(), "rejected_logps": pr.mean()}
        if ref is not None:
            stats |= {"chosen_drift": (chosen.total.detach() - ref[:n]).mean(),
                      "rejected_drift": (rejected.total.detach() - ref[n:]).mean()}
        return res, stats

    def _answers(self, forward: Callable, b: AnswerBatch,
                 answer_loss: AnswerLoss) -> tuple[PreferenceLoss, dict[str, torch.Tensor]]:
        assert self.reference is not None
        _, lp = forward(b.inputs, b.targets, logps=True)
        ans = answer_logps(lp, b.targets)
        n = len(b.inputs)
        with torch.no_grad():  # the KL estimate: the policy's and the reference's log-probs of mismatched answers
            _, kl_lp = self.model(b.kl_inputs, b.kl_targets, logps=True)
            ref = self.reference.logps(torch.cat([b.inputs, b.kl_inputs]), torch.cat([b.targets, b.kl_targets]))
            kl = (kl_lp.sum(-1) - ref[n:]).mean()
        good = b.desirable.bool()
        res = answer_loss(ans, ref[:n], good, kl, self.plan.beta, self.t)
        drift = ans.total.detach() - ref[:n]
        nan = torch.tensor(float("nan"), device=lp.device)

        def mean(v: torch.Tensor) -> torch.Tensor:
            return v.mean() if v.numel() else nan
        stats = {"loss": res.loss.detach(), "chosen_reward": mean(res.chosen_rewards),
                 "rejected_reward": mean(res.rejected_rewards),
                 "margin": mean(res.chosen_rewards) - mean(res.rejected_rewards),
                 "chosen_logps": mean(ans.total.detach()[good]), "rejected_logps": mean(ans.total.detach()[~good]),
                 "chosen_drift": mean(drift[good]), "rejected_drift": mean(drift[~good]), "kl": kl}
        return res, stats

    # ------------------------------------------------------------------ the checks

    def _check(self, res: PreferenceLoss) -> None:
        if self.check_start:
            self.check_start = False
            rewards = torch.cat([res.chosen_rewards, res.rejected_rewards]).abs()
            worst = float(rewards.max()) if rewards.numel() else 0.0
            if self.spec.reference_margin:
                dpo_part = float(-torch.nn.functional.logsigmoid(res.margin).mean())
                bad = abs(dpo_part - LN2) > STEP0_TOLERANCE or worst > STEP0_TOLERANCE
                what = f"DPO loss {dpo_part:.6f} (ln 2 = {LN2:.6f}), largest |reward| {worst:.2e}"
            else:
                bad = worst > STEP0_TOLERANCE
                what = f"largest |reward| {worst:.2e}"
            if bad:
                kind = self.reference.kind if self.reference else "-"
                raise ObjectiveCheckError(
                    f"step-0 check failed: at step 0 the policy is its reference ({kind}), "
                    f"so every reward must be 0 and the DPO loss ln 2, but the first batch gave {what}: the "
                    "reference is not the model this run starts from; nothing was trained")
        if self.check_moved:
            self.check_moved = False
            rewards = torch.cat([res.chosen_rewards, res.rejected_rewards])
            if rewards.numel() and bool((rewards == 0).all()):
                raise ObjectiveCheckError(
                    "reference check failed: after an update every reward is still exactly 0, so the reference "
                    "moves with the policy (it is the policy itself, TRL #1107) and the objective has no "
                    "gradient to follow; stopped")
            if rewards.numel():
                self.moved_verified = True

    # ------------------------------------------------------------------ what it measured

    @staticmethod
    def _mean(items: list[dict[str, torch.Tensor]]) -> dict[str, float | None]:
        keys = {k for d in items for k in d}
        out: dict[str, float | None] = {}
        for k in sorted(keys):
            vals = [float(d[k]) for d in items if k in d]
            vals = [v for v in vals if math.isfinite(v)]
            out[k] = sum(vals) / len(vals) if vals else None
        return out

    def take(self, step: int, split: str = "train", now: float | None = None) -> PreferenceRecord | None:
        """The record of the batches measured since the last take (training's, or with ``split`` an eval's)."""
        items = self.pending if split == "train" else self.eval_pending
        if not items:
            return None
        m = self._mean(items)
        items.clear()
        kl = m.pop("kl", None)
        return PreferenceRecord(step=step, split=split, time=now, **{k: m.get(k) for k in PreferenceRecord.FIELDS},
                                extra={"kl": kl} if kl is not None else {})


def build_objective(p: Preset, plan: ObjectivePlan, model: torch.nn.Module, device: torch.device,
                    init: dict | None, dtype: torch.dtype | None, faults: Faults) -> Objective:
    """The objective of a preference run and its reference, as ``plan`` chose it: ``model`` with its adapters off
    (LoRA), or a frozen copy of the starting weights ``init`` (a full fine-tune; its matrices in the compute
    ``dtype`` on a GPU), or a table of precomputed values the batches carry (filled by
    :mod:`workbench.train.reference` before the first step), or none."""
    reference = None
    if plan.reference != "none":
        frozen = frozen_copy(p, plan, device, init, dtype) if plan.reference == "frozen copy" else None
        reference = Reference(plan.reference, model, frozen, policy_is_reference=faults.reference_is_policy)
    return Objective(plan, p.train, model, reference)


def frozen_copy(p: Preset, plan: ObjectivePlan, device: torch.device, init: dict | None,
                dtype: torch.dtype | None) -> GPT:
    """A full fine-tune's reference: a frozen copy of the weights ``init`` the run started from (its matrices in
    the compute ``dtype`` on a GPU). The preference objectives' and GRPO's (train.grpo_beta > 0)."""
    if init is None:
        raise ObjectiveCheckError(f"train.objective = {plan.objective} needs the weights the run started from "
                                  f"({INIT_DIR}/model.pt), which this run does not have")
    frozen = GPT(p.model)
    load_weights(frozen, init, f"{INIT_DIR}/model.pt")
    frozen.requires_grad_(False)
    frozen.eval()
    frozen = frozen.to(device)
    # The matrices in the compute dtype, rounded as autocast rounds the policy's (half the bytes); the
    # embedding and norms in fp32, as the policy's stay: an all-bf16 copy gave step-0 rewards of ~1e-2
    # on CUDA, and the step-0 check refused every run.
    for m in frozen.modules() if dtype is not None else ():
        if isinstance(m, torch.nn.Linear):
            m.to(dtype)
    return frozen


__all__ = ["ANSWER_LOSSES", "ObjectiveCheckError", "Objective", "PAIR_LOSSES", "Reference", "STEP0_TOLERANCE",
           "answer_logps", "build_objective", "frozen_copy"]
