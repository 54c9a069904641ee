"""The objectives a run can optimise (``train.objective``), one row each: the one table every layer asks.

What a row says is a fact about the objective, decided here once: the corpus kinds it trains on, how many forward
rows a batch item costs, summed or length-averaged answer log-probs, whether it compares the policy with a
reference model, its default strength (``train.pref_beta`` = 0), the ``train.*`` keys that belong to it, and a
line for help and docs. The schema takes its choices from it, ``data`` which corpus it needs, ``plan`` its
reference and the estimate's rows, the doctor which failures to look for; the trainer's losses are one registry
keyed by its names (:data:`workbench.train.objective.PAIR_LOSSES`, ``ANSWER_LOSSES``). A new objective is a row
here and a loss there.

In the config layer, the lowest that needs it (the schema takes its choices from it); imports only
:mod:`workbench.errors`, neither torch nor textual.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.errors import WorkbenchError

# The kinds of corpus a run trains on. data.format's own (text, chat) and the preference records'; their readers
# and descriptions are the data layer's (workbench.data.corpus.kinds).
TEXT, CHAT, PAIRS, KTO = "text", "chat", "pairs", "kto"
# GRPO's: a prompts file (JSONL records with a ``prompt`` and the fields its reward reads, or text one prompt a
# line), read by the reward package's reader (workbench.reward.prompts), not prepared into tokens.
PROMPTS = "prompts"

# The two families the one training loop knows: the next-token loss of the model (text, or chat answers), and the
# preference losses on answer log-probs (workbench.train.objective), and the policy gradient on the model's own
# scored samples (GRPO: workbench.train.grpo_step).
SFT_FAMILY, PREFERENCE_FAMILY, REWARD_FAMILY = "sft", "preference", "reward"

# GRPO's loss normalisations (TRL's loss_type names; the formulas are workbench.train.grpo's LOSS_TYPES).
GRPO_LOSSES = ("dapo", "grpo", "bnpo", "dr_grpo")

# SimPO's target margin γ (train.simpo_gamma): 1.0 with its default β 2.0, the paper's γ/β = 0.5.
DEFAULT_SIMPO_GAMMA = 1.0


@dataclass(frozen=True)
class ObjectiveSpec:
    """One objective's facts."""
    name: str                   # train.objective's value
    summary: str                # what it optimises, in a few words (help, docs)
    family: str                 # SFT_FAMILY, PREFERENCE_FAMILY or REWARD_FAMILY
    data: tuple[str, ...]       # the corpus kinds it trains on (TEXT, CHAT, PAIRS, KTO, PROMPTS)
    rows_per_item: int = 1      # forward rows a batch item costs: a pair is two (its chosen and rejected answer)
    averaged: bool = False      # length-averaged answer log-probs, rather than summed over the answer
    reference: bool = False     # compares the policy with a reference: the model the run started from (GRPO's
                                # only with train.grpo_beta > 0: plan.recipe.objective_plan decides)
    default_beta: float = 0.0   # its strength when train.pref_beta = 0
    keys: tuple[str, ...] = ()  # the objective-specific train.* keys it reads (pref_beta, simpo_gamma, kto_*, ...)
    # DPO's form: −log σ of the margin of rewards taken against the reference, so its loss at step 0 (the policy
    # its own reference, every reward 0) is ln 2, and both rewards may fall while the margin widens.
    reference_margin: bool = False
    no_precompute: str = ""     # why a table of precomputed reference log-probs cannot serve it ("": it can)
    # GRPO takes prompts and a reward function (train.reward), and samples its answers on-policy.
    takes_reward: bool = False  # scored by a reward function (workbench.reward), not by labelled data
    samples: bool = False       # generates its own answers while it trains (on-policy)

    @property
    def preference(self) -> bool:
        """A preference objective: its batches go through the objective's loss, not the model's next-token loss."""
        return self.family == PREFERENCE_FAMILY


SFT = "sft"     # the default: a run that optimises the model's own next-token loss

# The rows, in the order the schema lists them (and hints name them: "set train.objective = dpo (or simpo, orpo)").
_ROWS = (
    ObjectiveSpec(SFT, "next-token cross-entropy (text, or chat answers)", SFT_FAMILY, (TEXT, CHAT)),
    ObjectiveSpec("dpo", "sigmoid DPO against a frozen reference: summed answer log-probs", PREFERENCE_FAMILY,
                  (PAIRS,), rows_per_item=2, reference=True, default_beta=0.1,
                  keys=("pref_beta", "pref_label_smoothing", "pref_sft_weight", "pref_reference", "dpop_lambda"),
                  reference_margin=True),
    ObjectiveSpec("simpo", "reference-free, length-averaged, margin simpo_gamma", PREFERENCE_FAMILY, (PAIRS,),
                  rows_per_item=2, averaged=True, default_beta=2.0,
                  keys=("pref_beta", "pref_label_smoothing", "pref_sft_weight", "simpo_gamma")),
    ObjectiveSpec("orpo", "reference-free: the chosen answers' SFT loss plus an odds-ratio term", PREFERENCE_FAMILY,
                  (PAIRS,), rows_per_item=2, averaged=True, default_beta=0.1, keys=("pref_beta",)),
    ObjectiveSpec("kto", "unpaired: each labelled answer good or bad, against a reference", PREFERENCE_FAMILY,
                  (KTO,), reference=True, default_beta=0.1,
                  keys=("pref_beta", "pref_reference", "kto_desirable_weight", "kto_undesirable_weight"),
                  no_precompute="its KL estimate pairs each prompt with another answer of its batch, which a table "
                                "of each answer's log-prob cannot hold"),
    ObjectiveSpec("grpo", "group-relative policy gradient on the model's own samples, scored by train.reward",
                  REWARD_FAMILY, (PROMPTS,),
                  keys=("reward", "grpo_group", "grpo_clip", "grpo_clip_high", "grpo_beta", "grpo_max_new_tokens",
                        "grpo_loss", "grpo_scale_std"),
                  takes_reward=True, samples=True),
)
OBJECTIVES: dict[str, ObjectiveSpec] = {o.name: o for o in _ROWS}
OBJECTIVE_NAMES = tuple(OBJECTIVES)


class UnknownObjectiveError(WorkbenchError):
    """A name the table does not hold (a preset is checked against the schema's choices before this)."""


def objective_spec(name: str) -> ObjectiveSpec:
    """The row of ``name``; one line naming the objectives there are for any other."""
    try:
        return OBJECTIVES[name]
    except KeyError:
        raise UnknownObjectiveError(f"train.objective = {name!r} is not one of {', '.join(OBJECTIVE_NAMES)}") \
            from None


def objectives_on(kind: str) -> tuple[str, ...]:
    """The objectives that train on a corpus of ``kind``, in the table's order (the first is the one suggested)."""
    return tuple(o.name for o in _ROWS if kind in o.data)


def key_readers(key: str) -> tuple[str, ...]:
    """The objectives a ``train.*`` key of one objective's own belongs to (``dpop_lambda``: dpo)."""
    return tuple(o.name for o in _ROWS if key in o.keys)


__all__ = ["CHAT", "DEFAULT_SIMPO_GAMMA", "GRPO_LOSSES", "KTO", "OBJECTIVES", "OBJECTIVE_NAMES", "ObjectiveSpec",
           "PAIRS", "PREFERENCE_FAMILY", "PROMPTS", "REWARD_FAMILY", "SFT", "SFT_FAMILY", "TEXT",
           "UnknownObjectiveError", "key_readers", "objective_spec", "objectives_on"]
