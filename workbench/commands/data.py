"""`workbench data prepare|inspect`: a corpus's tokenizer and tokens ahead of a run, and a look at
the documents the trainer will see."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Callable, Iterator

from workbench.commands.chat_preview import chat_prepared, inspect_chat, inspect_preference
from workbench.commands.common import TerminalProgress, add_json_option, add_set_option
from workbench.config import Preset, resolve_preset
from workbench.data.chat.chat_data import corpus_kind
from workbench.data.corpus.documents import Corpus
from workbench.data.mixture.mixture_data import MixtureData, active_sources, mixture_facts, mixture_lines, source_corpus
from workbench.data.preference.preference_records import KINDS
from workbench.data.preset_data import open_data_corpus, prepare_data
from workbench.data.text.tokens import TokenData
from workbench.errors import WorkbenchError
from workbench.fmt import duration, human_bytes
from workbench.plan.run_plan import NewRun, corpus_values, plan_new_run


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("data", help="prepare a corpus ahead of a run, or look at its documents")
    ds = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, func, help_text in (
            ("prepare", cmd_prepare, "train the tokenizer and encode the corpus into the cache (resumable)"),
            ("inspect", cmd_inspect, "print the first documents as the trainer will see them")):
        s = ds.add_parser(name, help=help_text, description=help_text)
        s.add_argument("corpus", nargs="+", help="text files, directories, .jsonl/.json, .parquet (optionally "
                                                 ".gz/.zst/.xz), globs (quoted), or builtin")
        s.add_argument("--preset", default="cpu-small",
                       help="the preset whose [data] and vocabulary to use (default cpu-small)")
        add_set_option(s)
        s.add_argument("--init-from", metavar="RUN[:STEP]", default=None,
                       help="the tokenizer and chat template of that run, as `train --init-from` would use them "
                            "(a run of yours, or a model brought in by `workbench import`)")
        s.set_defaults(func=func)
        if name == "prepare":
            s.add_argument("--vocab-size", type=int, default=None, help="tokenizer vocabulary (default: the preset's)")
            s.add_argument("--workers", type=int, default=None,
                           help="encoding processes (default: one per core this process may use)")
            add_json_option(s, "print the result as JSON")
        else:
            s.add_argument("-n", "--documents", type=int, default=3, help="how many documents (default 3)")
            s.add_argument("--chars", type=int, default=600, help="characters shown of each (default 600)")
            s.add_argument("--chat", action="store_true",
                           help="conversations (data.format = chat; auto-detected too): each rendered through the "
                                "chat template, its trained tokens highlighted (colour on a terminal, [[ ]] when "
                                "piped)")
            add_json_option(s, "print as JSON (conversations: the text and the trained spans)")


def _preset(args: argparse.Namespace) -> Preset:
    """The preset with the corpus given (it wins over a --set data.corpus), --vocab-size, and with --init-from
    the tokenizer (and so the template) `train --init-from` would use: the run plan's own."""
    if args.init_from:
        if getattr(args, "vocab_size", None):
            raise WorkbenchError("--vocab-size and --init-from: the vocabulary is that run's; leave --vocab-size out")
        req = NewRun(args.preset, tuple(args.overrides or ()), tuple(args.corpus), args.init_from)
        return plan_new_run(req, args.runs_dir).preset
    values = corpus_values(args.corpus)
    if getattr(args, "vocab_size", None):
        values["model"] = {"vocab_size": args.vocab_size}
    return resolve_preset(args.preset, args.overrides, values)


def cmd_prepare(args: argparse.Namespace) -> int:
    if args.workers is not None and args.workers < 1:
        raise WorkbenchError(f"--workers {args.workers} must be at least 1")
    p = _preset(args)
    corpus = open_data_corpus(p.data)
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if args.json else (lambda m: print(m, flush=True))
    progress = TerminalProgress()
    t0 = time.time()
    try:
        data = prepare_data(p.data, p.model.vocab_size, p.model.seq_len, log=log, progress=progress,
                            workers=args.workers, loss_on=p.train.loss_on)
    finally:
        progress.close()
    seconds = time.time() - t0
    if isinstance(data, MixtureData):
        return mixture_prepared(data, p, seconds, args.json)
    return PREPARED[data.format](data, p, seconds, corpus, args.json)


def mixture_prepared(data: MixtureData, p: Preset, seconds: float, as_json: bool) -> int:
    """`workbench data prepare` of a mixture: each source's tokens and the realized mixture over the preset's run."""
    if as_json:
        print(json.dumps({**mixture_facts(data, p), "seconds": round(seconds, 3)}, indent=1))
        return 0
    for name, d in zip(data.names, data.parts):
        tr, va = d.split_tokens()
        print(f"{name}: {d.source}: {tr + va:,} tokens (train {tr:,}, val {va:,}); cached in "
              f"{d.tokenizer_path.parent}")
    print(f"one {data.tokenizer.vocab_size:,}-piece tokenizer for all; {duration(seconds)}"
          + (" (from the cache)" if data.cached else ""))
    print("\n".join(mixture_lines(data, p)))
    return 0


def text_prepared(data: TokenData, p: Preset, seconds: float, corpus: Corpus, as_json: bool) -> int:
    """`workbench data prepare` of a text corpus: its documents, tokens and speed."""
    idx = data.index or {}
    enc = (idx.get("seconds") or {}).get("encode") or seconds
    out = {"documents": idx.get("documents", 0), "tokens": int(len(data.tokens)), "bytes": corpus.total_bytes,
           "chars": idx.get("chars"), "chars_per_token": round((idx.get("chars") or 0) / max(1, len(data.tokens)), 3),
           "seconds": round(seconds, 3),
           "mb_per_s": None if data.cached else round(corpus.total_bytes / 1e6 / seconds, 3),
           "encode_seconds": None if data.cached else enc,
           "encode_mb_per_s": None if data.cached else round(corpus.total_bytes / 1e6 / enc, 3),
           "cached": data.cached, "vocab_size": data.tokenizer.vocab_size, "source": data.source,
           "train_tokens": int(data.n_train), "val_tokens": int(len(data.tokens) - data.n_train),
           "cache_dir": str(data.tokenizer_path.parent), "workers": idx.get("workers"),
           "warnings": idx.get("warnings", [])}
    if as_json:
        print(json.dumps(out, indent=1))
        return 0
    how = ("from the cache (nothing read)" if data.cached else
           f"{out['mb_per_s']:.2f} MB/s; encoding {out['encode_mb_per_s']:.2f} MB/s on {out['workers']} process(es)")
    docs = f"{out['documents']:,} document{'s' if out['documents'] != 1 else ''}"
    print(f"{out['source']}: {docs}, {out['tokens']:,} tokens, {human_bytes(out['bytes'])}, "
          f"{out['chars_per_token']:.2f} chars/token; {duration(seconds)} ({how})")
    print(f"train {out['train_tokens']:,} tokens, val {out['val_tokens']:,} (the last documents, "
          f"~{p.data.val_fraction:.0%} of the tokens); cached in {out['cache_dir']}")
    return 0


# What `data prepare` prints of each kind of data (its data.format): (data, preset, seconds, corpus, --json).
PREPARED: dict[str, Callable[..., int]] = {"text": text_prepared, "chat": chat_prepared}


def cmd_inspect(args: argparse.Namespace) -> int:
    if args.documents < 1 or args.chars < 1:
        raise WorkbenchError("-n and --chars must be at least 1")
    if args.chat:
        args.overrides = [*(args.overrides or []), "data.format=chat"]
    p = _preset(args)
    if len(active_sources(p.data)) > 1:
        return inspect_mixture(p, args)
    corpus = open_data_corpus(p.data)
    if (kind := corpus_kind(p.data, corpus)) in KINDS:
        return inspect_preference(p, kind, args.documents, args.json)
    if kind == "chat":
        return inspect_chat(p, args.documents, args.json)
    if args.json:
        print(json.dumps({"format": "text", "source": corpus.description, "files": len(corpus.sources),
                          "bytes": corpus.total_bytes, "text_field": p.data.text_field,
                          "shown": [{"index": i, "text": text[: args.chars], "cut": len(text) > args.chars}
                                    for i, text in enumerate(_documents(corpus, args.documents, args.chars))]},
                         indent=1))
        return 0
    print(f"{corpus.description}: {len(corpus.sources)} file(s), {human_bytes(corpus.total_bytes)}; "
          f"text field {p.data.text_field!r}")
    for i, text in enumerate(_documents(corpus, args.documents, args.chars)):
        print(f"\n--- document {i + 1} ({len(text):,}{'+' if len(text) > args.chars else ''} chars) ---")
        print(text[: args.chars] + (" [...]" if len(text) > args.chars else ""))
    return 0


def inspect_mixture(p: Preset, args: argparse.Namespace) -> int:
    """`workbench data inspect` of a mixture: the realized mixture over a run of the preset (its sources prepared,
    or read from the cache), then each source's first documents."""
    def log(m: str) -> None:
        print(m, file=sys.stderr, flush=True)
    data = prepare_data(p.data, p.model.vocab_size, p.model.seq_len, log=log, loss_on=p.train.loss_on,
                        objective=p.train.objective)
    assert isinstance(data, MixtureData)
    if data.format == "chat":  # each source's first conversations as the trainer sees them, [trained] marked
        from workbench.commands.chat_preview import marked
        from workbench.data.chat.chat_data import conversation_pieces
        shown = {n: [marked(conversation_pieces(d, c, p.train.loss_on), False) for c in range(min(args.documents,
                                                                                                 d.documents))]
                 for n, d in zip(data.names, data.parts)}
    else:
        shown = {src["name"]: list(_documents(source_corpus(p.data, src), args.documents, args.chars))
                 for src in active_sources(p.data)}
    if args.json:
        facts = mixture_facts(data, p)
        for f in facts["sources"]:
            f["shown"] = [{"index": i, "text": t[: args.chars], "cut": len(t) > args.chars}
                          for i, t in enumerate(shown[f["name"]])]
        print(json.dumps(facts, indent=1))
        return 0
    print("\n".join(mixture_lines(data, p)))
    for name, texts in shown.items():
        for i, text in enumerate(texts):
            print(f"\n--- {name}: document {i + 1} ({len(text):,}{'+' if len(text) > args.chars else ''} chars) ---")
            print(text[: args.chars] + (" [...]" if len(text) > args.chars else ""))
    return 0


def _documents(corpus: Corpus, n: int, chars: int) -> Iterator[str]:
    """The first ``n`` documents, each cut at ``chars`` + 1 characters (so a longer one shows it is)."""
    shown, text = 0, ""
    for piece, end in corpus.pieces():
        text += piece[: max(0, chars + 1 - len(text))]
        if end:
            yield text
            shown, text = shown + 1, ""
            if shown >= n:
                return
