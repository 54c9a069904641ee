"""A GRPO run in the trainer (``train.objective = grpo``): the component the loop asks when its objective samples.

Each step draws ``batch_size`` prompts a micro-batch (:class:`~workbench.reward.prompt_data.PromptSampler`: the
epoch order a checkpoint keeps), rolls out ``train.grpo_group`` completions of each from the policy as it is
(:func:`~workbench.train.grpo_step.rollout`, every micro-batch's prompts together, each seeded by the run's seed,
the step and its place in the step), scores them with ``train.reward`` (decoded; the prompt's whole record goes to
the reward), and takes one policy-gradient loss a micro-batch (:func:`~workbench.train.grpo_step.rollout_loss`;
dapo's count of completion tokens is the whole step's). With ``train.grpo_beta`` > 0 the k3 KL is taken against
the reference the plan chose: the model with its adapters off (LoRA) or a frozen copy of the starting weights.

**Several processes** (hardware.nproc > 1, DDP): every rank draws the step's prompts (the same epoch order) and rolls
out its share of each micro-batch's (its ``batch_size / world`` of them), each seeded by its place in the whole step,
so the rollouts do not depend on the number of ranks (but for the rounding of a batch's logits); a group is one
prompt's completions, so its advantages stay within a rank; the gradients are all-reduced once a step (the last
micro-batch), as a loss's. ``dapo`` and ``bnpo`` divide by the completion tokens of every rank (one all-reduce of
the counts), so each rank's loss is its sum over that total times the ranks (DDP averages): the single process's
loss and gradient. The logged stats are the mean over ranks of each rank's; every rank rolls out the held-out
prompts for the eval (rank 0 records it). Sharded runs (FSDP) are refused.

A reward that fails (raises, returns what is not a finite number, runs past its time limit) stops the run with
its one line (exit 2); the checkpoints before stay.

What it logs (:class:`~workbench.rundir.RewardRecord`): each logged step, the mean over the steps since the last
of the mean reward, its spread, the share of groups without signal, the KL (beta > 0), the completion length and
the share of clipped tokens. **Its eval** is the reward, not a loss (a GRPO run has no targets to score): the
held-out prompts (``data.val_fraction`` of the file, at most :data:`EVAL_PROMPTS`), ``grpo_group`` completions
each from seeds fixed for the run, so evals differ only by the weights; a split ``val`` record. No val loss, so no
"best" checkpoint and no early stopping by it: checkpoints follow ``train.ckpt_interval`` and the run's end.
With ``train.time_budget`` an eval scores the first of those prompts that fit the evals' share of the budget
(``plan.schedule.budget_plan.plan_budget``, sized from one held-out prompt's rollout timed before the step-0 eval).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

import torch

from workbench.config import Preset
from workbench.plan.recipe.objective_plan import ObjectivePlan
from workbench.plan.schedule.budget_plan import GRPO_EVAL_PROMPTS
from workbench.reward import parse_reward
from workbench.reward.prompt_data import PromptData
from workbench.rundir import RewardRecord
from workbench.train.build import Built
from workbench.train.dist import Dist
from workbench.train.grpo_step import GRPOSettings, GRPOStats, Rollouts, reference_logps, rollout, rollout_loss
from workbench.train.objective import frozen_copy

EVAL_PROMPTS = GRPO_EVAL_PROMPTS   # held-out prompts an eval rolls out (the first of them)
AUTO_MAX_NEW_TOKENS = 64   # train.grpo_max_new_tokens = 0: this, at most half the window
EVAL_STEP = -1          # the "step" of the eval's rollout seeds: the same at every eval


def grpo_settings(p: Preset) -> GRPOSettings:
    t = p.train
    new = t.grpo_max_new_tokens or min(AUTO_MAX_NEW_TOKENS, p.model.seq_len // 2)   # 0: auto (the schema's doc)
    return GRPOSettings(group=t.grpo_group, max_new_tokens=new, clip=t.grpo_clip,
                        clip_high=t.grpo_clip_high or None, beta=t.grpo_beta, loss_type=t.grpo_loss,
                        scale_std=t.grpo_scale_std)


def reward_summary(r: RewardRecord) -> str:
    """The log line's tail for a GRPO step: reward and spread, groups without signal, KL, completion length."""
    out = f", reward {r.reward:.3f} (sd {r.reward_std:.3f}), no signal {r.no_signal:.0%}"
    if r.kl is not None:
        out += f", kl {r.kl:.4f}"
    return out + f", len {r.completion_len:.1f}"


class GRPORun:
    """GRPO's side of a run: the settings, the reward, the reference, the stats since the last log line."""

    def __init__(self, p: Preset, plan: ObjectivePlan, data: PromptData, model: torch.nn.Module,
                 device: torch.device, init: dict | None, dtype: torch.dtype | None):
        self.settings = grpo_settings(p)
        self.seed = p.train.seed
        self.data = data
        self.reward = parse_reward(p.train.reward)
        frozen = frozen_copy(p, plan, device, init, dtype) if plan.reference == "frozen copy" else None
        self.reference = reference_logps(model, frozen) if plan.reference != "none" else None
        self.pending: list[GRPOStats] = []      # each step's stats since the last log line
        self.last_reward: float | None = None    # the last eval's held-out reward (the run's end line)

    @property
    def held(self) -> list[int]:
        """The held-out prompts' indices."""
        return list(range(self.data.n_train, len(self.data.ids)))

    @torch.no_grad()
    def time_one_prompt(self, model: torch.nn.Module) -> float:
        """Seconds of one held-out prompt's rollout (its G completions, with its reward), as an eval samples it:
        what a time budget sizes its evals from (0.0 without held-out prompts). Twice, the second timed: the first
        pays for any first-call cost (on a busy CPU it took 3.8 s, the next one 0.3 s)."""
        if not self.held:
            return 0.0
        for _ in range(2):
            t0 = time.perf_counter()
            self.rollouts(model, self.held[:1], EVAL_STEP)
        return time.perf_counter() - t0

    def score(self, indices: list[int]):
        """The score of a completion of the ``i``-th prompt of ``indices``: the reward of its text."""
        def one(i: int, ids: list[int]) -> float:
            prompt = self.data.items[indices[i]]
            return self.reward.score(prompt.text, self.data.tokenizer.decode(ids), prompt.record)
        return one

    def rollouts(self, model: torch.nn.Module, indices: list[int], step: int,
                 places: list[int] | None = None) -> Rollouts:
        r = rollout(model, [self.data.ids[i] for i in indices], self.score(indices), self.settings, self.seed, step,
                    self.data.stops, places)
        model.train()   # sampling put it in eval mode
        return r

    def forward_backward(self, built: Built, batches: list[list[int]], step: int,
                         autocast: contextlib.AbstractContextManager, poison: bool = False,
                         dist: Dist | None = None) -> torch.Tensor:
        """One step: the rollouts of every micro-batch's prompts (this rank's share of them: ``dist``), then each
        micro-batch's loss forward and backward; their loss, summed (``poison``: a test's non-finite loss)."""
        world, rank = (dist.world, dist.rank) if dist is not None and dist.enabled else (1, 0)
        size = len(batches[0])
        share = size // world          # (train.batch_size splits over the ranks: plan.settings checks it)
        # this rank's prompts of each micro-batch, with their place in the step (what seeds their rollouts)
        mine = [(k * size + rank * share + m, b[rank * share + m]) for k, b in enumerate(batches)
                for m in range(share)]
        r = self.rollouts(built.model, [i for _, i in mine], step, [j for j, _ in mine])
        rows = share * self.settings.group
        settings, scale = self.settings, 1.0
        counts = r.mask.view(len(batches), rows, -1).sum((1, 2))          # each micro-batch's completion tokens
        tokens: torch.Tensor | None = counts.sum()
        if world > 1 and settings.loss_type in ("dapo", "bnpo"):
            # over every rank's tokens (the step's, dapo; the micro-batch's, bnpo: its sum over that count is dapo's
            # formula), times the ranks that DDP's mean divides by
            counts = dist.sum_(counts.clone())
            tokens, scale = counts.sum(), float(world)
            settings = dataclasses.replace(settings, loss_type="dapo")
        loss_sum = torch.zeros((), device=r.inputs.device)
        stats = []
        ddp = world > 1 and isinstance(built.train_forward, torch.nn.parallel.DistributedDataParallel)
        for k in range(len(batches)):
            last = k == len(batches) - 1
            n = counts[k] if self.settings.loss_type == "bnpo" and world > 1 else tokens
            # DDP all-reduces the gradients once, on the last micro-batch
            with built.train_forward.no_sync() if ddp and not last else contextlib.nullcontext():
                with autocast:
                    loss, st = rollout_loss(built.train_forward, r.rows(k * rows, (k + 1) * rows), settings,
                                            self.reference, tokens=n)
                if poison:
                    loss = loss * float("nan")
                if self.settings.loss_type != "dapo":   # dapo's sum is over the step's tokens already
                    loss = loss / len(batches)
                loss = loss * scale
                built.scaler.scale(loss).backward()
            loss_sum += loss.detach()
            stats.append(dataclasses.replace(st, loss=st.loss * scale))
        self.pending.append(_rank_mean(_mean_stats(stats), dist if world > 1 else None, r.inputs.device))
        return loss_sum

    def take(self, step: int, now: float | None = None) -> RewardRecord | None:
        """The train record of the steps since the last (None if none)."""
        if not self.pending:
            return None
        m, self.pending = _mean_stats(self.pending), []
        return RewardRecord(step=step, split="train", reward=m.reward_mean, reward_std=m.reward_std,
                            no_signal=m.no_signal, kl=m.kl, completion_len=m.completion_len, clipped=m.clipped,
                            loss=m.loss, time=now)

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, step: int, prompts: int = 0) -> tuple[RewardRecord | None, str]:
        """The held-out prompts' reward (a ``val`` record) and the log line; None without held-out prompts.
        ``prompts``: how many of them (a time budget's plan; 0: EVAL_PROMPTS)."""
        held = self.held[:prompts or EVAL_PROMPTS]
        if not held:
            return None, f"step {step}: no held-out prompts to score (a prompts file of one prompt)"
        t0 = time.time()
        r = self.rollouts(model, held, EVAL_STEP)
        rewards = r.rewards.float()
        groups = rewards.view(-1, self.settings.group)
        no_signal = float((groups.max(1).values == groups.min(1).values).float().mean())
        rec = RewardRecord(step=step, split="val", reward=float(rewards.mean()), reward_std=float(rewards.std()),
                           no_signal=no_signal, completion_len=float(r.mask.sum(-1).mean()), time=time.time(),
                           extra={"prompts": len(held), "seconds": round(time.time() - t0, 3)})
        self.last_reward = rec.reward
        return rec, (f"step {step}: held-out reward {rec.reward:.4f} (sd {rec.reward_std:.3f}, {len(held)} prompts "
                     f"x {self.settings.group}, no signal {no_signal:.0%})")


def _rank_mean(st: GRPOStats, dist: Dist | None, device: torch.device) -> GRPOStats:
    """A step's stats, the mean over the ranks of each rank's (one all-reduce; as they are in one process)."""
    if dist is None:
        return st
    names = [k for k in GRPOStats.__dataclass_fields__ if getattr(st, k) is not None]
    vec = dist.sum_(torch.tensor([float(getattr(st, k)) for k in names], dtype=torch.float64, device=device))
    return dataclasses.replace(st, **{k: float(v) / dist.world for k, v in zip(names, vec.tolist())})


def _mean_stats(stats: list[GRPOStats]) -> GRPOStats:
    def mean(xs: list[float | None]) -> float | None:
        xs = [x for x in xs if x is not None]
        return sum(xs) / len(xs) if xs else None
    return GRPOStats(**{k: mean([getattr(s, k) for s in stats]) for k in GRPOStats.__dataclass_fields__})


__all__ = ["EVAL_PROMPTS", "GRPORun", "grpo_settings", "reward_summary"]
