"""`workbench pairs RUN --prompts FILE --reward R --samples K`: preference pairs from a checkpoint's own samples.

K completions of each prompt are sampled (a batch of prompts at once, their K rows in one KV cache, the prompts
left-padded: :func:`~workbench.train.generate.sample_prompts`), scored by the reward, and every
two with different rewards written as a pair (:mod:`workbench.reward.pairs`: the format, the sidecar, continuing
after a stop). A chat-tuned run (one with a chat template) answers each prompt as the user's message through its
template, as the preference trainer will render the pair, and stops at its end-of-turn token; any other run
continues the prompt's text. Either stops at the tokenizer's end-of-document token, else after --max-new-tokens.

Everything is read and checked before torch loads (the run, the checkpoint, the reward, the prompts, an earlier
pairs file); prompt i is sampled with its own generator seeded seed + i, and the batches are fixed by the prompts'
indices (:func:`batches`: a continued run samples its first batch whole again), so the same command gives the same
file, in one go or continued, bit for bit.

:func:`open_sampler` and :class:`Sampler` are shared with ``workbench eval --reward``.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from workbench import rundir
from workbench.commands.common import add_run_argument, add_sampling_options, print_progress, sampling_of
from workbench.data.chat.chat_templates import model_template
from workbench.data.text.tokenizer import load_tokenizer
from workbench.errors import WorkbenchError
from workbench.fmt import duration
from workbench.machine.detect import Machine
from workbench.plan.sampling import TEXT, Sampling
from workbench.plan.settings import resolve_device
from workbench.reward import (
    TIMEOUT_S,
    Prompt,
    RewardError,
    meta_path,
    open_pairs,
    parse_reward,
    prompt_pairs,
    read_prompts,
)

SAMPLES = 4   # the DPO paper's: 4 samples a prompt, all 6 pairs
BATCH_ROWS = 128   # rows sampled together: BATCH_ROWS // K prompts a batch (at least one)

REWARD_HELP = ("exact[:FIELD] (the completion's first line equals the record's FIELD, default answer), "
               "regex:PATTERN, contains:TEXT, length:TARGET (characters; graded 1 - |len-T|/T, at least 0), "
               "lexicon:POS_FILE[,NEG_FILE] (graded: (positive - negative words) / words), or FILE.py:FUNCTION "
               "(your FUNCTION(prompt, completion, record) -> float)")
PROMPTS_HELP = ("JSONL (plain, .gz, .zst, .xz) or parquet records with a 'prompt' (the whole record goes to the "
                "reward), or a text file of one prompt a line")

REWARDS = """\
rewards (--reward):
  exact[:FIELD]       1 if the completion's first line, stripped, equals the record's FIELD
                      (default answer; a list: any of them), else 0
  regex:PATTERN       1 if re.search(PATTERN, completion) finds it, else 0
  contains:TEXT       1 if TEXT is in the completion (case-sensitive), else 0
  length:TARGET       max(0, 1 - |characters - TARGET| / TARGET)
  lexicon:POS[,NEG]   (positive words - negative words) / words, in [-1, 1]; word lists are
                      files of one word a line, matched case-insensitively
  FILE.py:FUNCTION    your own: FUNCTION(prompt, completion, record) -> float
  A reward that raises, returns a non-number, NaN or infinity, or runs longer than
  --reward-timeout stops the command with one line naming the prompt and the completion
  (exit 2).
"""

EPILOG = REWARDS + """\
  The pairs of the prompts done so far stay, and the same command continues them.

output: every two samples of a prompt with different rewards, the higher chosen, as
  {"prompt", "chosen", "rejected", "chosen_reward", "rejected_reward"} lines (the pairs
  `train --set train.objective=dpo` reads); PATH.meta.json says how they were made.
"""


def add_reward_options(p: Any, prompts_required: bool) -> None:
    """--reward, --prompts and --reward-timeout (``p``: a parser or an argument group)."""
    p.add_argument("--reward", default=None, required=prompts_required, metavar="R", help=REWARD_HELP)
    p.add_argument("--prompts", default=None, required=prompts_required, metavar="FILE", help=PROMPTS_HELP)
    p.add_argument("--reward-timeout", type=float, default=TIMEOUT_S, metavar="S",
                   help=f"the longest one reward call may take, in seconds (default {TIMEOUT_S:g})")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("pairs", help="preference pairs from a checkpoint's own samples, scored by a reward",
                       description="Sample K completions of each prompt from a run's checkpoint, score them with a "
                                   "reward, and write every two with different rewards as a preference pair "
                                   "(chosen = the higher reward). Run it again to continue after a stop.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_argument(p, checkpoint=True)
    add_reward_options(p, prompts_required=True)
    p.add_argument("--samples", type=int, default=SAMPLES, metavar="K",
                   help=f"completions sampled a prompt (default {SAMPLES}: up to {SAMPLES * (SAMPLES - 1) // 2} pairs)")
    p.add_argument("--out", default=None, metavar="PATH",
                   help="the pairs file (default RUN-CHECKPOINT-pairs.jsonl here); an unfinished one is continued")
    add_sampling_options(p, TEXT)
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda or mps")
    p.set_defaults(func=run)


@dataclass
class Sampler:
    """A loaded checkpoint that completes prompts K at a time (torch and the engine imported by
    :func:`open_sampler`)."""
    model: Any
    tok: Any
    encoder: Any            # a ChatEncoder for a chat-tuned run, else None: the prompt's text is continued
    stops: frozenset[int]
    sampling: Sampling
    device: str

    @property
    def chat(self) -> bool:
        return self.encoder is not None

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        if self.encoder is None:
            return list(self.tok.encode(prompt.text))
        messages = ([{"role": "system", "content": prompt.system}] if prompt.system else []) + \
            [{"role": "user", "content": prompt.text}]
        return list(self.encoder.prompt_ids(messages))

    def complete_many(self, prompts: list[Prompt], k: int, seeds: list[int]) -> list[list[str]]:
        """``k`` completions of each prompt, the prompts' rows sampled together (left-padded in one KV cache), each
        prompt from its own generator seeded by its entry of ``seeds``: what the prompt alone would get, to the
        rounding of a padded batch."""
        from workbench.train.generate import sample_prompts  # generation's batched case (torch: imported here)
        rows = sample_prompts(self.model, [self.prompt_ids(p) for p in prompts], k, self.sampling, seeds, self.stops)
        return [[self.tok.decode(ids) for ids in r] for r in rows]


def batches(start: int, total: int, k: int) -> list[range]:
    """The batches of prompt indices sampled together, from the one holding prompt ``start`` to ``total``:
    ``BATCH_ROWS // k`` prompts each, counted from prompt 0, so that a continued run samples the same batches as one
    go (the same rows together, the same numbers); the caller skips the prompts before ``start``."""
    size = max(1, BATCH_ROWS // k)
    return [range(a, min(a + size, total)) for a in range(start // size * size, total, size)]


def sampler_for(run_dir: Path, model: Any, tok: Any, sampling: Sampling, device: str) -> Sampler:
    """A loaded model of ``run_dir`` as a :class:`Sampler`: with the run's chat template if it has one, stopping at
    its end-of-turn token and the end-of-document token."""
    from workbench.data.chat.conversations import ChatEncoder

    template = model_template(run_dir)
    encoder = ChatEncoder(template, tok) if template is not None else None
    stops = {tok.eod_id} if tok.eod_id is not None else set()
    if encoder is not None:
        stops.add(encoder.end_id)
    return Sampler(model, tok, encoder, frozenset(stops), sampling, device)


def open_sampler(run_dir: Path, step: int, sampling: Sampling, device_arg: str) -> Sampler:
    """The run's checkpoint at ``step`` loaded as a :class:`Sampler` (torch imported here, lazily)."""
    import torch

    from workbench.machine.probe import this_machine
    from workbench.train.checkpoint import load_run_model

    tok = load_tokenizer(run_dir)
    device = resolve_device(device_arg, Machine() if device_arg == "cpu" else this_machine())
    model = load_run_model(run_dir, step, device).model
    if device == "cpu" and model.num_params() < 50e6:
        torch.set_num_threads(1)  # a chain of tiny ops: one thread is faster (commands/sample.py measured it)
    return sampler_for(run_dir, model, tok, sampling, str(device))


def check_sampling(sampling: Sampling, k: int, what: str) -> None:
    if k < 1:
        raise WorkbenchError("--samples must be at least 1")
    if sampling.temperature == 0 and k > 1:
        raise WorkbenchError(f"--temperature 0 is greedy: the {k} samples of a prompt would be the same, so {what}; "
                             "give a temperature above 0 (default 0.8)")


def run(args: argparse.Namespace) -> int:
    run_dir = rundir.resolve_run(args.runs_dir, args.run)
    ckpt = rundir.select_checkpoint(run_dir, args.checkpoint)
    sampling = sampling_of(args)
    if args.samples < 2:
        raise WorkbenchError("--samples must be at least 2: a pair needs two samples of a prompt")
    check_sampling(sampling, args.samples, "there would be no pairs")
    reward = parse_reward(args.reward, args.reward_timeout)
    prompts = read_prompts(args.prompts)
    for p in prompts.items:
        reward.check_record(p.record, p.where)
    out = Path(args.out or f"{run_dir.name}-{ckpt['name']}-pairs.jsonl")
    if out.is_dir():
        raise RewardError(f"--out {out} is a directory; give a file name, e.g. {out / 'pairs.jsonl'}")
    if not out.parent.is_dir():
        raise RewardError(f"--out {out}: there is no directory {out.parent}; make it first, or give another path")
    settings = {"run": run_dir.name, "checkpoint": ckpt["name"], "step": ckpt["step"],
                "prompts_sha256": prompts.sha256, "reward": {k: v for k, v in reward.describe().items()
                                                             if k != "timeout_s"},
                "samples": args.samples, "sampling": asdict(sampling)}
    pf = open_pairs(out, settings, len(prompts.items))
    if pf.complete:
        print(f"{out} is complete: {pf.pairs:,} pairs from {pf.total:,} prompts ({meta_path(out).name} says how "
              "they were made); delete both to make them again")
        return 0
    if pf.done:
        print(f"continuing {out} after {pf.done:,} of {pf.total:,} prompts ({pf.pairs:,} pairs so far)",
              file=sys.stderr, flush=True)

    t0 = time.time()
    sampler = open_sampler(run_dir, ckpt["step"], sampling, args.device)
    pf.info = {"run_dir": str(run_dir), "prompts": str(Path(args.prompts).resolve()), "device": sampler.device,
               "chat": sampler.chat, "reward_timeout_s": reward.timeout_s}
    first, shown = pf.done, time.monotonic()
    for batch in batches(pf.done, pf.total, args.samples):
        sampled = sampler.complete_many([prompts.items[i] for i in batch], args.samples,
                                        [sampling.seed + i for i in batch])
        for i, completions in zip(batch, sampled):
            if i < pf.done:
                continue    # a continued run's first batch: sampled again whole, written already
            p = prompts.items[i]
            rewards = [reward.score(p.text, c, p.record) for c in completions]
            pf.add(prompt_pairs(p, completions, rewards), rewards)
        now = time.monotonic()
        if now - shown >= 2 or pf.complete:
            shown = now
            rate = (pf.done - first) / max(time.time() - t0, 1e-9)
            eta = f", ETA {duration((pf.total - pf.done) / rate)}" if rate > 0 and not pf.complete else ""
            print_progress(f"pairs {pf.done}/{pf.total} prompts, {pf.pairs:,} pairs, mean reward "
                           f"{pf.mean_reward:.3f}, {rate:.2f} prompts/s{eta}")
    mean = f"{pf.mean_reward:.3f}" if pf.mean_reward is not None else "-"
    print(f"wrote {pf.pairs:,} pairs from {pf.total:,} prompts x {args.samples} samples to {out} (mean reward {mean}; "
          f"{pf.no_signal:,} prompts with every sample scored the same, {pf.skipped:,} pairs left out as equal or "
          f"empty answers; {meta_path(out).name}: how they were made) in {duration(time.time() - t0)}")
    if not sampler.chat:
        print(f"  note: {run_dir.name} is not chat-tuned (no chat template): its samples continue each prompt's text, "
              "while preference training renders a pair through a chat template; a chat-tuned run's pairs are its "
              "own replies")
    if not pf.pairs:  # nothing to train on: say why and what would give pairs, not a command that would fail
        print(f"  no pair: every prompt's {args.samples} samples scored alike; more samples (--samples), a higher "
              "--temperature or a graded reward (one that tells a better answer from a worse) give some")
        return 0
    print(f"  train on them: workbench train {preset_name(run_dir)} --init-from {run_dir.name}:{ckpt['step']} "
          f"--corpus {out} --set train.objective=dpo")
    return 0


def preset_name(run_dir: Path) -> str:
    import tomllib
    try:
        return str(tomllib.loads((run_dir / rundir.PRESET_FILE).read_text()).get("name") or "PRESET")
    except (OSError, tomllib.TOMLDecodeError):
        return "PRESET"
