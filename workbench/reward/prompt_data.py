"""A prompts file as the data a GRPO run trains on (``train.objective = grpo``, ``data.corpus`` the prompts file):
the prompts read by :func:`workbench.reward.prompts.read_prompts`, encoded once with the run's tokenizer (through
its chat template when the run it starts from is chat-tuned, as ``workbench pairs`` renders them), split into the
prompts trained on and the last ``data.val_fraction`` held out (the eval's reward), and drawn ``batch_size`` a step
in the data layer's epoch order (:class:`~workbench.data.train_data.EpochOrder`), so what a checkpoint keeps of the
sampler is two integers and a resumed run draws exactly the prompts the run it continues would have.

Torch-free (the engine's side of a step is :mod:`workbench.train.grpo_run`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.config import Preset
from workbench.data.chat.chat_templates import ChatTemplate, model_template
from workbench.data.chat.conversations import ChatEncoder
from workbench.data.preset_data import given_tokenizer
from workbench.data.text.tokenizer import tokenizer_file
from workbench.data.train_data import EpochOrder
from workbench.reward.builtin import RewardError
from workbench.reward.prompts import Prompt, Prompts, held_out_count, read_prompts

FORMAT = "prompts"


class PromptSampler:
    """``batch`` prompt indices a step from ``indices``, in an epoch order seeded ``seed``; resumable."""

    def __init__(self, indices: range, batch: int, seed: int):
        self.indices, self.batch = indices, batch
        self.order = EpochOrder(len(indices), seed)

    def next_batch(self) -> list[int]:
        return [self.indices[i] for i in self.order.take(self.batch)]

    def state(self) -> dict[str, int]:
        return self.order.state()

    def set_state(self, st: dict) -> None:
        self.order.set_state(st)


@dataclass
class PromptData:
    """The prompts of a GRPO run, encoded (the run's :class:`~workbench.data.train_data.TrainData`)."""
    prompts: Prompts
    tokenizer: Any
    tokenizer_path: Path
    ids: list[list[int]]                # each prompt's ids, as the policy is given them
    stops: frozenset[int]               # a completion ends at the end-of-document (or end-of-turn) token
    n_train: int                        # prompts [0, n_train) are trained on, the rest held out
    chat_template: ChatTemplate | None = None
    format: str = FORMAT
    cached: bool = True                 # nothing to prepare: the file is read at each start

    @property
    def source(self) -> str:
        return f"prompts file {self.prompts.path}"

    @property
    def template(self) -> ChatTemplate | None:
        return self.chat_template

    @property
    def items(self) -> tuple[Prompt, ...]:
        return self.prompts.items

    @property
    def n_val(self) -> int:
        return len(self.ids) - self.n_train

    def sampler(self, part: str, p: Preset, seed: int) -> PromptSampler:
        part_range = range(0, self.n_train) if part == "train" else range(self.n_train, len(self.ids))
        return PromptSampler(part_range, p.train.batch_size, seed)

    def split_tokens(self) -> tuple[int, int]:
        return (sum(map(len, self.ids[:self.n_train])), sum(map(len, self.ids[self.n_train:])))

    def check(self, p: Preset) -> None:
        """Nothing beyond what reading the file checked (plan.run_plan.checked_reward did, before the run)."""

    def start_lines(self, sampler: Any, p: Preset) -> list[str]:
        chat = ", rendered through the run's chat template" if self.chat_template is not None else ""
        return [f"prompts: {self.n_train} trained on, {self.n_val} held out for the eval's reward{chat}; "
                f"{p.train.batch_size} a step, {p.train.grpo_group} completions each"]

    def start_facts(self, sampler: Any, p: Preset) -> dict[str, Any]:
        return {FORMAT: {"train": self.n_train, "val": self.n_val, "sha256": self.prompts.sha256}}


def prompt_data(p: Preset, run_dir: Path | None = None) -> PromptData:
    """The prompts file ``data.corpus`` of a GRPO run, read and encoded with the tokenizer ``data.tokenizer``
    names (a run started with --init-from: its source's; ``run_dir``'s own copy first) and, where that run
    directory has a chat template, through it."""
    corpus = p.data.corpus
    if not isinstance(corpus, str) or corpus == "builtin":
        raise RewardError(f"train.objective = {p.train.objective} trains on one prompts file; give it with --corpus")
    tok = given_tokenizer(p.data, p.model.vocab_size, run_dir)
    if tok is None:
        raise RewardError(f"train.objective = {p.train.objective} samples from a trained model with its tokenizer: "
                          "start it with --init-from RUN")
    prompts = read_prompts(corpus)
    template = model_template(run_dir) if run_dir is not None else None
    encoder = ChatEncoder(template, tok) if template is not None else None
    stops = {tok.eod_id} if tok.eod_id is not None else set()
    if encoder is not None:
        stops.add(encoder.end_id)

    def encode(prompt: Prompt) -> list[int]:
        if encoder is None:
            return list(tok.encode(prompt.text))
        messages = ([{"role": "system", "content": prompt.system}] if prompt.system else []) + \
            [{"role": "user", "content": prompt.text}]
        return list(encoder.prompt_ids(messages))

    ids = [encode(x) for x in prompts.items]
    n = len(ids)
    n_val = held_out_count(n, p.data.val_fraction)
    own = tokenizer_file(run_dir) if run_dir is not None else None
    return PromptData(prompts, tok, own or Path(p.data.tokenizer), ids, frozenset(stops), n - n_val, template)


__all__ = ["FORMAT", "PromptData", "PromptSampler", "prompt_data"]
