"""What `workbench data inspect|prepare` show of a chat corpus: each conversation rendered through the
template with its trained tokens marked, and the counts that say whether the data will teach (trained
fraction, truncated and dropped conversations, how full the packed rows are). No torch."""

from __future__ import annotations

import itertools
import json
import sys
from typing import Any

from workbench.config import Preset
from workbench.data.chat.chat_data import ChatData, chat_options, conversation_pieces, pack, template_for, trained_count
from workbench.data.chat.chat_templates import trained_spans
from workbench.data.chat.conversations import ChatReader
from workbench.data.corpus.documents import Corpus
from workbench.data.preference.preference_data import PreferenceData
from workbench.data.preference.preference_records import KTO, OBJECTIVE_FOR
from workbench.data.preset_data import open_data_corpus, prepare_data
from workbench.data.text.tokenizer import CorpusTooSmall
from workbench.fmt import duration

GREEN, RESET = "\x1b[1;32m", "\x1b[0m"
OPEN, CLOSE = "[[", "]]"    # the trained text, when stdout is not a terminal


def marked(runs: list[tuple[str, bool]], colour: bool) -> str:
    """The conversation's text with its trained runs in colour, or between [[ and ]]."""
    a, b = (GREEN, RESET) if colour else (OPEN, CLOSE)
    return "".join(f"{a}{text}{b}" if trained else text for text, trained in runs)


def spans(runs: list[tuple[str, bool]]) -> list[list[int]]:
    """The [start, end) character spans of the trained runs in the conversation's text."""
    out, at = [], 0
    for text, trained in runs:
        if trained:
            out.append([at, at + len(text)])
        at += len(text)
    return out


def counts(data: ChatData, p: Preset) -> dict:
    """Conversations, tokens, what the loss is on, and how the train conversations fill packed rows."""
    idx = data.index
    trained = trained_count(idx, p.train.loss_on)
    rows = pack(data.lengths("train"), p.model.seq_len, p.data.packing, p.data.overlong)
    return {"format": "chat", "conversations": data.documents, "train_conversations": data.n_train,
            "val_conversations": data.documents - data.n_train, "tokens": idx["tokens"], "trained_tokens": trained,
            "trained_fraction": round(trained / max(1, idx["tokens"]), 4), "loss_on": p.train.loss_on,
            "template": data.template.source, "end_of_turn": idx["end_of_turn"],
            "skipped_records": idx["skipped_records"], "seq_len": p.model.seq_len, "packing": p.data.packing,
            "rows": rows.rows, "row_fill": round(rows.efficiency, 4), "truncated": rows.truncated,
            "dropped": rows.dropped, "cached": data.cached, "cache_dir": str(data.tokenizer_path.parent),
            "warnings": idx.get("warnings", [])}


def chat_prepared(data: ChatData, p: Preset, seconds: float, corpus: Corpus, as_json: bool) -> int:
    """`workbench data prepare` of a chat corpus: its counts (from its index: ``corpus`` is not read again)."""
    out = counts(data, p)
    if as_json:
        print(json.dumps({**out, "seconds": round(seconds, 3), "source": data.source}, indent=1))
        return 0
    over = (f"; {out['truncated']:,} longer than seq_len {out['seq_len']} (truncated)" if out["truncated"] else "") + \
        (f"; {out['dropped']:,} longer than seq_len {out['seq_len']} (dropped)" if out["dropped"] else "")
    print(f"{data.source}: {out['conversations']:,} conversations ({out['train_conversations']:,} train, "
          f"{out['val_conversations']:,} val), {out['tokens']:,} tokens; {duration(seconds)}"
          + (" (from the cache)" if data.cached else ""))
    print(f"template {out['template']} (turns end with {out['end_of_turn']}); loss on {out['loss_on']}: "
          f"{out['trained_tokens']:,} tokens ({out['trained_fraction']:.1%}){over}")
    print(f"{'packed' if out['packing'] else 'one conversation a row'}: {out['rows']:,} rows of {out['seq_len']}, "
          f"{out['row_fill']:.0%} filled" + (f"; {out['skipped_records']:,} bad records skipped"
                                             if out["skipped_records"] else ""))
    return 0


def inspect_by_characters(p: Preset, n: int, as_json: bool, small: CorpusTooSmall) -> int:
    """No tokenizer to count tokens with (none given, and the file too small to fit the preset's vocabulary): the
    first ``n`` conversations through the template with the trained characters marked (the mask comes from the
    rendering, not from the tokens), and how to see the tokens."""
    template = template_for(p.data, None, None)
    convs = list(itertools.islice(ChatReader(chat_options(p.data)).conversations(open_data_corpus(p.data).sources),
                                  n))
    shown = []
    for conv in convs:
        text, marks = trained_spans(template, conv.as_dicts(), p.train.loss_on)
        runs, at = [], 0
        for a, b in marks:
            runs += [(text[at:a], False), (text[a:b], True)]
            at = b
        shown.append([r for r in runs + [(text[at:], False)] if r[0]])
    note = (f"{str(small).split(';')[0]} of a new tokenizer, so the conversations are shown by characters: "
            f"--init-from RUN shows them in that run's tokens (a model's own template), --set "
            f"model.vocab_size={small.supported} in a tokenizer this file can fit")
    if as_json:
        print(json.dumps({"format": "chat", "tokenizer": None, "note": note, "template": template.source,
                          "loss_on": p.train.loss_on, "shown": [
                              {"index": c, "text": "".join(t for t, _ in runs), "trained_spans": spans(runs)}
                              for c, runs in enumerate(shown)]}, indent=1))
        return 0
    colour = sys.stdout.isatty()
    key = f"{GREEN}trained{RESET}" if colour else f"{OPEN}trained{CLOSE}"
    print(f"{p.data.corpus}: template {template.source}; loss on {p.train.loss_on}; {key} = in the loss")
    print(f"note: {note}")
    for c, runs in enumerate(shown):
        print(f"\n--- conversation {c + 1} ({sum(len(t) for t, _ in runs):,} characters) ---")
        print(marked(runs, colour))
    return 0


def inspect_chat(p: Preset, n: int, as_json: bool) -> int:
    """`workbench data inspect --chat`: the first ``n`` conversations as the trainer sees them."""
    try:
        data = prepare_data(p.data, p.model.vocab_size, p.model.seq_len, log=lambda m: print(m, file=sys.stderr),
                            loss_on=p.train.loss_on)
    except CorpusTooSmall as e:
        if p.data.tokenizer:
            raise
        return inspect_by_characters(p, n, as_json, e)
    assert isinstance(data, ChatData)  # a chat corpus of one source (the caller's corpus_kind) prepares as one
    shown = [(c, conversation_pieces(data, c, p.train.loss_on)) for c in range(min(n, data.documents))]
    lengths = data.lengths("train").tolist() + data.lengths("val").tolist()
    if as_json:
        print(json.dumps({**counts(data, p), "shown": [
            {"index": c, "tokens": lengths[c], "text": "".join(t for t, _ in runs), "trained_spans": spans(runs),
             "longer_than_seq_len": lengths[c] - 1 > p.model.seq_len} for c, runs in shown]}, indent=1))
        return 0
    colour = sys.stdout.isatty()
    out = counts(data, p)
    key = f"{GREEN}trained{RESET}" if colour else f"{OPEN}trained{CLOSE}"
    print(f"{data.source}: {out['conversations']:,} conversations; template {out['template']}; loss on "
          f"{out['loss_on']} ({out['trained_fraction']:.1%} of tokens); {key} = in the loss")
    for c, runs in shown:
        long = lengths[c] - 1 > p.model.seq_len
        what = "truncated" if p.data.overlong == "truncate" else "dropped"
        note = f"; longer than seq_len {p.model.seq_len}: {what}" if long else ""
        print(f"\n--- conversation {c + 1} ({lengths[c]:,} tokens{note}) ---")
        print(marked(runs, colour))
    return 0


def inspect_preference(p: Preset, kind: str, n: int, as_json: bool) -> int:
    """`workbench data inspect` of preference records: the first ``n`` pairs (or labelled answers) as the trainer
    sees them: the prompt once, then the chosen and the rejected answer (or the answer and its label) with their
    trained tokens marked."""
    data = prepare_data(p.data, p.model.vocab_size, p.model.seq_len, log=lambda m: print(m, file=sys.stderr),
                        objective=OBJECTIVE_FOR[kind])  # shown whatever the preset's objective
    assert isinstance(data, PreferenceData)
    items: list[dict[str, Any]] = []
    for i in range(min(n, data.items)):
        convs = [conversation_pieces(data, c, "last_assistant") for c in data.conversations(i)]
        prompt = "".join(t for t, trained in itertools.takewhile(lambda r: not r[1], convs[0]))
        answers = ["".join(t for t, _ in runs)[len(prompt):] for runs in convs]
        items.append({"index": i, "prompt": prompt, "answers": answers,
                      "trained": [[t for t, trained in runs if trained] for runs in convs],
                      "label": bool(data.tags[i]) if data.kind == KTO else None, "runs": convs})
    if as_json:
        print(json.dumps({"format": data.kind, "source": data.source, "items": data.items,
                          "template": data.template.source,
                          "shown": [{k: v for k, v in it.items() if k != "runs"} for it in items]}, indent=1))
        return 0
    colour = sys.stdout.isatty()
    key = f"{GREEN}trained{RESET}" if colour else f"{OPEN}trained{CLOSE}"
    what = "pairs" if data.kind == "pairs" else "labelled answers"
    print(f"{data.source}: {data.items:,} {what}; template {data.template.source}; {key} = in the loss")
    for it in items:
        print(f"\n--- {'pair' if data.kind == 'pairs' else 'answer'} {it['index'] + 1} ---")
        print("prompt:   " + it["prompt"].replace("\n", "\n          "))
        names = ["chosen:   ", "rejected: "] if data.kind == "pairs" else \
            [f"{'good' if it['label'] else 'bad'}:     "]
        for name, runs, prompt in zip(names, it["runs"], [it["prompt"]] * 2):
            rest, skip = [], len(prompt)
            for t, trained in runs:  # the answer's runs, after the shared prompt
                cut = min(skip, len(t))
                skip -= cut
                if t[cut:]:
                    rest.append((t[cut:], trained))
            print(name + marked(rest, colour).rstrip("\n"))
    return 0
