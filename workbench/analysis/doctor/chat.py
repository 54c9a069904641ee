"""Chat data: a run whose loss falls on a tiny share of its tokens, whose conversations are mostly cut at
seq_len (their answers lost), or whose rows are mostly padding. From the start event's ``chat``."""

from __future__ import annotations

from typing import Any

from workbench.analysis.doctor.facts import Context
from workbench.analysis.doctor.finding import Finding, set_line

# Under ~5 % of the tokens in the loss, each step teaches from a few dozen tokens of a row of hundreds: the
# answers are short beside their prompts (long system prompts, long pasted context).
TRAINED_MIN = 0.05
# Truncation cuts the end of a conversation: its last answer, the part the loss is on. A few percent is a
# tail; beyond a tenth the run trains on headers and half answers.
TRUNCATED_NOTE = 0.02
TRUNCATED_WARN = 0.10
# Rows under half full spend half of every step on padding.
ROW_FILL_MIN = 0.5


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def check(ctx: Context) -> list[Finding]:
    f, p = ctx.facts, ctx.facts.preset
    chat = f.start_value("chat")
    if p is None or not isinstance(chat, dict) or not chat.get("conversations"):
        return []
    out = []
    n = chat["conversations"]
    frac = chat["trained_fraction"]
    if frac < TRAINED_MIN:
        values: dict[str, Any] = {"train.loss_on": "assistant"} if chat["loss_on"] == "last_assistant" else {}
        change = (set_line(values) + " (every answer, not only the last)" if values else
                  "shorter prompts or longer answers in the data (a long system prompt repeated in every "
                  "conversation is most of the tokens)")
        out.append(Finding("data", "data.chat_trained", "medium",
                           f"the loss is on {frac:.1%} of the tokens",
                           (f"train.loss_on = {chat['loss_on']}: {frac:.1%} of the corpus's tokens are trained "
                            f"(under {TRAINED_MIN:.0%}: each step learns from a few answer tokens)",),
                           change, values, ctx.apply_command(values) if values else "",
                           data={"trained_fraction": frac}))
    cut = chat["truncated"] / max(1, n)
    if cut > TRUNCATED_NOTE:
        need = _pow2_at_least(int(chat["p95_tokens"]))
        values = {"model.seq_len": need} if need > p.model.seq_len else {}
        change = (set_line(values) + " (95 % of the conversations fit)" if values else
                  set_line({"data.overlong": "drop"}) + " (train on whole conversations only)")
        out.append(Finding("data", "data.chat_truncated", "medium" if cut > TRUNCATED_WARN else "low",
                           f"{cut:.0%} of the conversations are longer than model.seq_len and cut",
                           (f"{chat['truncated']:,} of {n:,} training conversations exceed {p.model.seq_len} tokens; "
                            f"95 % are within {chat['p95_tokens']:,}; a cut conversation loses its last answer",),
                           change, values, ctx.apply_command(values) if values else "",
                           also=() if not values else (set_line({"data.overlong": "drop"}) + " (or drop them)",),
                           data={"truncated_share": cut, "p95_tokens": chat["p95_tokens"]}))
    if chat["row_fill"] < ROW_FILL_MIN:
        values = {"data.packing": True} if not chat["packing"] else {}
        change = (set_line(values) + " (several conversations a row, attention kept apart)" if values else
                  set_line({"model.seq_len": _pow2_at_least(max(8, int(chat["p95_tokens"])))})
                  + " (rows as long as the conversations)")
        out.append(Finding("slow", "slow.chat_padding", "medium" if chat["row_fill"] < ROW_FILL_MIN / 2 else "low",
                           f"rows are {chat['row_fill']:.0%} conversation, the rest padding",
                           (f"{'packed' if chat['packing'] else 'one conversation a row'} into rows of "
                            f"{p.model.seq_len}: {chat['row_fill']:.0%} of each step's positions hold tokens",),
                           change, values, ctx.apply_command(values) if values else "",
                           data={"row_fill": chat["row_fill"]}))
    return out
