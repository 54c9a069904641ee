"""Data: a corpus much smaller than what the run will read (epochs), a vocabulary large for the corpus,
a validation split too small to measure anything. From the run's start event (train_tokens, val_tokens). Not for
an objective that trains on its own samples (GRPO: its prompts are drawn again every epoch, by design, and it has
no val loss; the reward findings are its own)."""

from __future__ import annotations

import math

from workbench.analysis.doctor.facts import Context
from workbench.analysis.doctor.finding import Finding, num, set_line
from workbench.config.objectives import objective_spec
from workbench.fmt import human_bytes

# Epochs: over one pass every token is seen again (worth noting); up to ~4 passes, repeated tokens train
# about as well as new ones, beyond that they are worth much less (Muennighoff et al. 2023, "Scaling
# Data-Constrained Language Models").
EPOCHS_NOTE = 1.0
EPOCHS_WARN = 4.0
# A vocabulary id seen fewer than ~100 times in the corpus gets an embedding trained on a handful of
# examples, and the merges that made it are rare: a smaller vocabulary shares the data better.
TOKENS_PER_ID = 100
TOKENS_PER_ID_WARN = 20
# The tokenizer (sentencepiece BPE with byte fallback) needs 256 byte pieces, the special pieces and every
# character of the corpus: ~400 for ASCII text. 512 is the smallest power of two that always has room.
MIN_VOCAB = 512
# A val split under ~10k tokens measures its loss with a standard error of several hundredths of a nat
# (per-token losses scatter by ~2 nats, and overlapping windows share tokens): smaller than the
# differences an eval is there to show.
VAL_MIN_TOKENS = 10_000
VAL_FRACTION_MAX = 0.2


def bytes_per_token(ctx: Context) -> float | None:
    """From the last eval: bits per byte = loss / ln 2 / bytes per token."""
    e = ctx.facts.evals[-1] if ctx.facts.evals else None
    if e is None or not e.val_bpb or not e.val_loss:
        return None
    return e.val_loss / math.log(2) / e.val_bpb


def check(ctx: Context) -> list[Finding]:
    f, p = ctx.facts, ctx.facts.preset
    train_tokens, val_tokens = f.start_value("train_tokens"), f.start_value("val_tokens")
    if p is not None and objective_spec(p.train.objective).samples:
        return []
    if p is None or not train_tokens:
        if f.start is not None:
            ctx.note("data: the start event has no corpus sizes (a run from before they were recorded)")
        return []
    out = []
    corpus = str(f.start_value("corpus") or "")
    planned = f.max_iters * p.tokens_per_step()
    epochs = planned / train_tokens
    if epochs > EPOCHS_NOTE:
        bpt = bytes_per_token(ctx)
        size = f" (~{human_bytes(planned * bpt)} of text at this corpus's {bpt:.2f} bytes per token)" if bpt else ""
        values: dict = {}
        if corpus.startswith("builtin"):
            values = {"data.builtin_mb": round(p.data.builtin_mb * math.ceil(epochs), 1)}
            change = set_line(values) + " (the built-in corpus, as large as one pass needs)"
        else:
            change = f"more text: --corpus {corpus or 'PATH'} MORE_PATH ... with ~{num(planned)} tokens{size}"
        also = []
        if epochs > EPOCHS_WARN:
            steps = int(EPOCHS_WARN * train_tokens / p.tokens_per_step())
            if p.train.warmup_iters < steps and not p.train.time_budget:  # a budget's steps follow the clock
                also.append(f"or fewer steps: --set train.max_iters={steps} ({EPOCHS_WARN:g} passes)")
        out.append(Finding("data", "data.epochs", "medium" if epochs > EPOCHS_WARN else "low",
                           f"the run will read its training text {epochs:.1f} times",
                           (f"{f.max_iters:,} steps x {p.tokens_per_step():,} tokens = {num(planned)} tokens "
                            f"from a training split of {num(train_tokens)} tokens ({corpus or 'the corpus'})",),
                           change, values, ctx.apply_command(values) if values else "", also=tuple(also),
                           data={"epochs": epochs, "planned_tokens": planned, "train_tokens": train_tokens}))
    per_id = train_tokens / p.model.vocab_size
    # A fine-tune (or an imported model, or a branch of either) keeps its source's tokenizer: a new vocabulary would
    # be a new model, not a change to this run.
    inherited = (p.init or {}).get("run") or (p.source or {}).get("model")
    if per_id < TOKENS_PER_ID and inherited:
        ctx.note(f"data: {per_id:.1f} training tokens per vocabulary id, but the tokenizer ({p.model.vocab_size:,} "
                 f"ids) is {inherited}'s, which a fine-tune keeps")
    elif per_id < TOKENS_PER_ID:
        vocab = 2 ** int(math.log2(max(MIN_VOCAB, train_tokens / TOKENS_PER_ID)))
        if vocab < p.model.vocab_size:
            values = {"model.vocab_size": vocab}
            out.append(Finding("data", "data.vocab", "medium" if per_id < TOKENS_PER_ID_WARN else "low",
                               f"a vocabulary of {p.model.vocab_size:,} is large for {num(train_tokens)} training "
                               "tokens",
                               (f"{per_id:.1f} tokens per vocabulary id (under {TOKENS_PER_ID}, most ids are seen "
                                "too rarely to learn)",),
                               set_line(values) + " (a new tokenizer: a new run)", values,
                               ctx.apply_command(values),
                               data={"tokens_per_id": per_id, "suggested_vocab": vocab}))
    if val_tokens is not None and val_tokens < VAL_MIN_TOKENS:
        total = train_tokens + val_tokens
        need = VAL_MIN_TOKENS / total
        if need <= VAL_FRACTION_MAX:
            values = {"data.val_fraction": math.ceil(need * 100) / 100}
            change = set_line(values)
        else:
            values = {}
            change = f"more text: the corpus ({num(total)} tokens) is too small for a useful val split"
        out.append(Finding("data", "data.val_split", "low",
                           f"the validation split is tiny: {num(val_tokens)} tokens",
                           (f"val {num(val_tokens)} of {num(total)} tokens (data.val_fraction = "
                            f"{p.data.val_fraction:g}); under {num(VAL_MIN_TOKENS)} the val loss is noisy beyond the "
                            "differences it should show",),
                           change, values, ctx.apply_command(values) if values else "",
                           data={"val_tokens": val_tokens}))
    return out
