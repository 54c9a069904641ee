"""Scoring a model on eval tasks (:mod:`workbench.data.tasks.task_files`) and on held-out text, in bounded memory.

Multiple choice: each choice's log-likelihood given the context, lm-evaluation-harness's way: the
continuation is ``delimiter + choice``, trailing whitespace of the context moves into it, and its tokens
are those of ``encode(context + continuation)`` after the first ``len(encode(context))`` (so a piece that
spans the boundary is scored as the tokenizer would split the whole text). A sequence longer than the
context window keeps its last ``seq_len`` tokens. ``acc`` picks the highest summed log-likelihood,
``acc_norm`` the highest per character of the choice; ``centered`` is ``(acc - chance) / (1 - chance)``
of the task's chosen metric, 0 for guessing and 1 for always right.

Memory does not grow with the task: sequences go through the model a batch at a time, and only the
continuation positions' hidden states meet the output layer (``[continuation tokens, vocab]`` logits for
one batch, never ``[batch, seq, vocab]``); per item, only a few floats are kept.

Exact match: greedy decoding with the KV cache until a stop string or ``max_new_tokens``; the answer is
right when it equals one of the record's answers after whitespace is collapsed (``exact``) or contains
one (``contains``).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import torch
import torch.nn.functional as F

from workbench.config import TrainConfig
from workbench.data.chat.chat_templates import ChatTemplate
from workbench.data.tasks.task_files import ChoiceItem, GenItem, Task, TaskError, expand_task_specs, load_task
from workbench.rundir import TaskRecord
from workbench.train.chat_reply import reply
from workbench.train.generate import generate
from workbench.train.model import GPT

# Tokens through the model per forward (sequences padded to the batch's longest). On a CPU a small batch is
# both faster and far lighter (cpu-small, 4-way items: 2,048 tokens 50-54 items/s and 332-350 MiB peak RSS for
# 100-3,000 items; 8,192 tokens 35-48 items/s and 509-549 MiB: SDPA's [batch, heads, T, T] scores dominate).
BATCH_TOKENS = {"cpu": 2048}
GPU_BATCH_TOKENS = 16384


@dataclass
class TaskScore:
    task: Task
    values: dict[str, float]          # metric -> value
    n: int
    seconds: float
    per_item: list[dict] = field(default_factory=list)   # gen: what the model answered, for --dump

    @property
    def score(self) -> float:
        return self.values[self.task.metrics[0]]

    def records(self, step: int, **extra) -> list[TaskRecord]:
        """One task record per metric, as the trainer (metrics.jsonl) and ``workbench eval`` (tasks.jsonl)
        write them."""
        now = time.time()
        return [TaskRecord(step=step, task=self.task.name, metric=m, value=self.values[m], n=self.n, time=now,
                           extra={"source": self.task.source, "digest": self.task.digest,
                                  "seconds": round(self.seconds, 2), **extra}) for m in self.task.metrics]


def _unknown_id(tok) -> int | None:
    sp = getattr(tok, "sp", None)
    if sp is not None:
        i = sp.unk_id()
        return i if i >= 0 and sp.is_unknown(i) else None
    token_id = getattr(tok, "token_id", None)
    return token_id("<unk>") if token_id else None


class Encoder:
    """The run's tokenizer, refusing text it can only encode as "unknown"."""

    def __init__(self, tok, task: Task):
        self.tok, self.task, self.unk = tok, task, _unknown_id(tok)

    def __call__(self, text: str, line: int) -> list[int]:
        ids = self.tok.encode(text)
        if self.unk is not None and self.unk in ids:
            bad = next((c for c in text if self.unk in self.tok.encode(c)), "?")
            raise TaskError(f"task {self.task.name}, item {line}: the run's tokenizer cannot encode {bad!r} (it "
                            "becomes <unk>); drop such records or use a tokenizer with byte fallback")
        return ids


def choice_requests(item: ChoiceItem, task: Task, enc: Encoder, prefix: int) -> list[tuple[list[int], list[int]]]:
    """(context ids, continuation ids) for each choice of ``item``."""
    out = []
    for choice in item.choices:
        context, cont = item.context, task.delimiter + choice
        n_space = len(context) - len(context.rstrip())
        if n_space:
            context, cont = context[:-n_space], context[-n_space:] + cont
        whole = enc(context + cont, item.line)
        ctx = enc(context, item.line) if context else []
        cont_ids = whole[len(ctx):]
        if not cont_ids:
            raise TaskError(f"task {task.name}, item {item.line}: choice {choice!r} encodes to no tokens after its "
                            "context; give choices with text in them")
        out.append((ctx if ctx else [prefix], cont_ids))
    return out


@torch.no_grad()
def continuation_logprobs(model: GPT, requests: list[tuple[list[int], list[int]]], device: torch.device,
                          autocast: contextlib.AbstractContextManager) -> list[float]:
    """The summed log-probability of each request's continuation given its context, one forward for all."""
    L = model.cfg.seq_len
    rows, spans = [], []
    for ctx, cont in requests:
        full = (ctx + cont)[-(L + 1):]
        n = min(len(cont), len(full) - 1)
        rows.append(full)
        spans.append(n)
    T = max(len(r) for r in rows) - 1
    x = torch.zeros(len(rows), T, dtype=torch.long)
    y = torch.zeros(len(rows), T, dtype=torch.long)
    pick = torch.zeros(len(rows), T, dtype=torch.bool)
    for i, (r, n) in enumerate(zip(rows, spans)):
        t = torch.tensor(r)
        x[i, :len(r) - 1], y[i, :len(r) - 1] = t[:-1], t[1:]
        pick[i, len(r) - 1 - n:len(r) - 1] = True
    x, y, pick = x.to(device), y.to(device), pick.to(device)
    with autocast:
        h = model.hidden(x)[pick]                       # [continuation tokens, dim]
        logits = F.linear(h, model.output_weight())
    logp = logits.float().log_softmax(-1).gather(1, y[pick].unsqueeze(1)).squeeze(1)
    row = torch.arange(len(rows), device=device).unsqueeze(1).expand(-1, T)[pick]
    sums = torch.zeros(len(rows), device=device, dtype=torch.float64).index_add_(0, row, logp.double())
    return sums.tolist()


def _batches(requests: Iterable[tuple[int, tuple[list[int], list[int]]]], L: int, budget: int
             ) -> Iterator[list[tuple[int, tuple[list[int], list[int]]]]]:
    batch, longest = [], 0
    for req in requests:
        n = min(len(req[1][0]) + len(req[1][1]), L + 1)
        if batch and max(longest, n) * (len(batch) + 1) > budget:
            yield batch
            batch, longest = [], 0
        batch.append(req)
        longest = max(longest, n)
    if batch:
        yield batch


def score_choices(model: GPT, tok, task: Task, device: torch.device,
                  autocast: contextlib.AbstractContextManager, batch_tokens: int | None = None,
                  on_progress: Callable[[int], None] | None = None) -> TaskScore:
    """Accuracy (summed and per character), centered accuracy of the task's metric, over its items."""
    t0 = time.time()
    batch_tokens = batch_tokens or BATCH_TOKENS.get(torch.device(device).type, GPU_BATCH_TOKENS)
    enc = Encoder(tok, task)
    prefix = tok.eod_id if tok.eod_id is not None else 0
    was_training = model.training
    model.eval()
    right = {"acc": 0, "acc_norm": 0}
    pending: dict[int, list[float]] = {}
    done = 0

    def requests():
        for k, item in enumerate(task.items):
            for j, req in enumerate(choice_requests(item, task, enc, prefix)):
                yield (k, j), req

    def finish(k: int) -> None:
        nonlocal done
        item, lls = task.items[k], pending.pop(k)
        per_char = [ll / max(1, len(c)) for ll, c in zip(lls, item.choices)]
        right["acc"] += max(range(len(lls)), key=lambda j: (lls[j], -j)) == item.gold
        right["acc_norm"] += max(range(len(lls)), key=lambda j: (per_char[j], -j)) == item.gold
        done += 1

    try:
        for batch in _batches(((key, req) for key, req in requests()), model.cfg.seq_len, batch_tokens):
            sums = continuation_logprobs(model, [req for _, req in batch], device, autocast)
            for ((k, j), _), ll in zip(batch, sums):
                pending.setdefault(k, []).append(ll)
                if len(pending[k]) == len(task.items[k].choices):
                    finish(k)
            if on_progress:
                on_progress(done)
    finally:
        model.train(was_training)
    n = len(task.items)
    acc, acc_norm = right["acc"] / n, right["acc_norm"] / n
    chance = task.chance
    chosen = acc_norm if task.metric == "acc_norm" else acc
    centered = (chosen - chance) / (1 - chance) if chance < 1 else 0.0
    return TaskScore(task, {"centered": centered, "acc": acc, "acc_norm": acc_norm}, n, time.time() - t0)


def normalise(text: str) -> str:
    return " ".join(text.split())


@torch.no_grad()
def answer(model: GPT, tok, item: GenItem, task: Task, enc: Encoder, autocast_dtype: torch.dtype | None,
           template: ChatTemplate | None = None) -> str:
    """The model's greedy answer to one prompt, up to the first stop string; a chat item's, its reply through
    ``template`` up to the end-of-turn token."""
    if item.messages:
        if template is None:
            raise TaskError(f"task {task.name} is conversations: score it on a run trained on chat data (one with a "
                            "chat template)")
        messages = [{"role": r, "content": c} for r, c in item.messages]
        return reply(model, tok, template, messages, task.max_new_tokens, autocast_dtype=autocast_dtype).text
    ids: list[int] = []
    text = ""
    prompt = enc(item.prompt, item.line) or [tok.eod_id if tok.eod_id is not None else 0]
    for tid in generate(model, prompt, task.max_new_tokens, temperature=0.0, autocast_dtype=autocast_dtype):
        if tid == tok.eod_id:
            break
        ids.append(tid)
        text = tok.decode(ids)
        cut = min((i for s in task.until if (i := text.find(s)) >= 0), default=-1)
        if cut >= 0:
            return text[:cut]
    return text


def score_generation(model: GPT, tok, task: Task, autocast_dtype: torch.dtype | None = None,
                     on_progress: Callable[[int], None] | None = None,
                     template: ChatTemplate | None = None) -> TaskScore:
    t0 = time.time()
    enc = Encoder(tok, task)
    was_training = model.training
    exact = contains = 0
    per_item = []
    try:
        for k, item in enumerate(task.items):
            out = answer(model, tok, item, task, enc, autocast_dtype, template)
            got = normalise(out)
            em = any(got == normalise(a) for a in item.answers)
            has = any(normalise(a) in got for a in item.answers)
            exact += em
            contains += has
            per_item.append({"line": item.line, "prompt": item.prompt, "answers": list(item.answers), "output": out,
                             "exact": em, "contains": has,
                             **({"messages": [list(m) for m in item.messages]} if item.messages else {})})
            if on_progress:
                on_progress(k + 1)
    finally:
        model.train(was_training)
    n = len(task.items)
    return TaskScore(task, {"exact": exact / n, "contains": contains / n}, n, time.time() - t0, per_item)


def load_eval_tasks(t: TrainConfig) -> list[Task]:
    """``train.eval_tasks``, each its first ``train.task_limit`` items."""
    specs = [t.eval_tasks] if isinstance(t.eval_tasks, str) else list(t.eval_tasks)
    return [load_task(s, limit=t.task_limit) for s in expand_task_specs([s for s in specs if s.strip()])]


class TaskScorer:
    """``train.eval_tasks`` while training: when they are due (step 0, every ``train.task_eval_every`` steps or,
    with 0, each checkpoint interval, and the end) and their scores as task records with one log line."""

    def __init__(self, t: TrainConfig, checkpoint_due: Callable[[int], str | None], is_end: Callable[[int], bool]):
        self.t, self.checkpoint_due, self.is_end = t, checkpoint_due, is_end
        self.tasks = load_eval_tasks(t)

    def due(self, step: int) -> bool:
        t = self.t
        return bool(self.tasks) and (step == 0 or self.is_end(step) or (
            step % t.task_eval_every == 0 if t.task_eval_every else self.checkpoint_due(step) is not None))

    def score(self, step: int, model: GPT, tok, device: torch.device, autocast: contextlib.AbstractContextManager,
              autocast_dtype: torch.dtype | None, template: ChatTemplate | None = None
              ) -> tuple[list[TaskRecord], str]:
        """(the records, the log line) of every task scored on ``model`` now."""
        t0 = time.time()
        with torch.compiler.set_stance("force_eager"):  # variable-length batches: no recompiles
            scores = [score_task(model, tok, task, device, autocast, autocast_dtype, template=template)
                      for task in self.tasks]
        line = (f"step {step}: tasks " + ", ".join(f"{sc.task.name} {sc.score:.3f}" for sc in scores)
                + f" ({scores[0].task.metrics[0]}; {time.time() - t0:.1f} s)")
        return [r for sc in scores for r in sc.records(step)], line


def score_task(model: GPT, tok, task: Task, device: torch.device,
               autocast: contextlib.AbstractContextManager | None = None, autocast_dtype: torch.dtype | None = None,
               on_progress: Callable[[int], None] | None = None, template: ChatTemplate | None = None) -> TaskScore:
    """``template``: the run's chat template (chat tasks answer through it)."""
    autocast = autocast or contextlib.nullcontext()
    if task.kind == "mc":
        return score_choices(model, tok, task, device, autocast, on_progress=on_progress)
    return score_generation(model, tok, task, autocast_dtype, on_progress=on_progress, template=template)


@torch.no_grad()
def text_bpb(model: GPT, tok, documents: Iterable[str], device: torch.device,
             autocast: contextlib.AbstractContextManager | None = None, max_windows: int = 200,
             batch_size: int = 8) -> tuple[float, float, int]:
    """(bits per byte, loss in nats per token, tokens scored) of the model on ``documents``: their tokens,
    each document ended by the end-of-document token, cut into windows of ``seq_len + 1`` tokens that
    overlap by one (every token after the first is predicted once), at most ``max_windows``."""
    autocast = autocast or contextlib.nullcontext()
    L = model.cfg.seq_len
    token_bytes = torch.from_numpy(tok.byte_lengths()).to(device)
    was_training = model.training
    model.eval()
    nats = torch.zeros((), device=device, dtype=torch.float64)
    nbytes = torch.zeros((), device=device, dtype=torch.float64)
    tokens = 0
    buf: list[int] = []
    windows: list[list[int]] = []
    n_windows = 0

    def flush() -> None:
        nonlocal nats, nbytes, tokens
        t = torch.tensor(windows, device=device)
        x, y = t[:, :-1], t[:, 1:]
        with autocast:
            h = model.hidden(x)
        for i in range(len(windows)):  # one window's logits at a time
            logits = F.linear(h[i], model.output_weight()).float()
            nats += F.cross_entropy(logits, y[i], reduction="sum").double()
        nbytes += token_bytes[y].sum().double()
        tokens += y.numel()
        windows.clear()

    try:
        for doc in documents:
            buf += tok.encode(doc) + ([tok.eod_id] if tok.eod_id is not None else [])
            while len(buf) >= L + 1 and n_windows < max_windows:
                windows.append(buf[:L + 1])
                buf = buf[L:]
                n_windows += 1
                if len(windows) == batch_size:
                    flush()
            if n_windows >= max_windows:
                break
        if windows:
            flush()
        if n_windows < max_windows and len(buf) >= 2:
            windows.append(buf)  # the last, shorter window: a batch of its own
            flush()
    finally:
        model.train(was_training)
    if tokens == 0:
        raise TaskError("the corpus has too little text to score (fewer than two tokens)")
    return nats.item() / math.log(2) / max(1.0, nbytes.item()), nats.item() / tokens, tokens


__all__ = ["TaskScore", "TaskScorer", "choice_requests", "continuation_logprobs", "load_eval_tasks", "normalise",
           "score_choices", "score_generation", "score_task", "text_bpb"]
