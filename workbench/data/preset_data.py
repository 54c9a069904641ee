"""A preset's data, prepared as the kind it is: :func:`prepare_data` gives a preset's ``[data]`` (a corpus or a
mixture) as the :class:`~workbench.data.train_data.TrainData` a run trains on (text, conversations, preference records),
refused first when the objective cannot train on its kind; and what a start checks before it prepares anything (the
corpus it names, the tokenizer it gives, a chat template). The data package's entry point: the trainer, ``train``,
``data``, ``estimate``, the queue and the TUI ask it; each kind's preparation is its wing's."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from workbench.config import DataConfig
from workbench.config.objectives import SFT
from workbench.data.chat.chat_data import corpus_kind, load_chat, template_for
from workbench.data.chat.chat_prepare import prepare_chat
from workbench.data.chat.chat_templates import ChatTemplateError
from workbench.data.chat.conversations import ChatEncoder
from workbench.data.corpus.documents import Corpus, open_corpus
from workbench.data.preference.preference_data import load_preference
from workbench.data.preference.preference_records import KINDS, check_corpus_kind
from workbench.data.text.prepare import SHARD_CHARS, DataError, Progress, prepare
from workbench.data.text.tokenizer import AnyTokenizer, load_tokenizer, tokenizer_file
from workbench.data.text.tokens import load_tokens
from workbench.data.train_data import TrainData
from workbench.faults import NO_FAULTS, Faults

__all__ = ["DataError", "check_chat_template", "given_tokenizer", "open_data_corpus", "prepare_data", "tokenizer_dir"]


def open_data_corpus(cfg: DataConfig) -> Corpus:
    """The corpus a preset's [data] names (listed, nothing read): a mixture's sources together."""
    if cfg.mixture:
        from workbench.data.mixture.mixture_data import mixture_corpus
        return mixture_corpus(cfg)
    return open_corpus(cfg.corpus, text_field=cfg.text_field, skip_bad=cfg.skip_bad_records,
                       builtin_mb=cfg.builtin_mb)


def given_tokenizer(cfg: DataConfig, vocab_size: int, own: Path | None = None) -> AnyTokenizer | None:
    """The tokenizer ``data.tokenizer`` names (None: one is trained on the corpus), checked against the
    embedding's ``vocab_size`` rows. ``own``: a run directory whose own copy of it comes first (a run keeps
    its tokenizer even if the run it came from is deleted)."""
    if not cfg.tokenizer:
        return None
    where = own if own is not None and tokenizer_file(own) is not None else Path(cfg.tokenizer).expanduser()
    tok = load_tokenizer(where)
    if tok.vocab_size > vocab_size:
        raise DataError(f"the tokenizer {where} has {tok.vocab_size:,} ids but the model's embedding has "
                        f"{vocab_size:,} rows (model.vocab_size): it is not this model's tokenizer")
    if tok.eod_id is None:
        raise DataError(f"the tokenizer {where} has no end-of-sequence token to put between documents; name it "
                        "as eos_token in the tokenizer_config.json beside it")
    return tok


def tokenizer_dir(cfg: DataConfig, own: Path | None = None) -> Path | None:
    """The directory of the tokenizer data.tokenizer names (the run's own copy first): where an imported
    model's tokenizer_config.json and chat template are."""
    if own is not None and tokenizer_file(own) is not None:
        return own
    if not cfg.tokenizer:
        return None
    path = Path(cfg.tokenizer).expanduser()
    return path if path.is_dir() else path.parent


def check_chat_template(cfg: DataConfig, vocab_size: int, loss_on: str = "assistant") -> None:
    """The template a chat corpus will be rendered through can be found and masked with the tokenizer given: the
    check a detached start makes before its run directory exists (the trainer encodes the conversations)."""
    given = given_tokenizer(cfg, vocab_size)
    try:
        template = template_for(cfg, given, tokenizer_dir(cfg))
        if given is not None:
            ChatEncoder(template, given, loss_on)  # finds the end-of-turn token, or says why it cannot
    except ChatTemplateError as e:
        raise DataError(str(e)) from None


def prepare_data(cfg: DataConfig, vocab_size: int, seq_len: int, log: Callable[[str], None] = print,
                 progress: Progress | None = None, workers: int | None = None, shard_chars: int = SHARD_CHARS,
                 faults: Faults = NO_FAULTS, run_dir: Path | None = None, loss_on: str = "assistant",
                 objective: str = SFT) -> TrainData:
    """The tokenizer and tokens of a preset's corpus, ready to train on (prepared now unless cached): a
    :class:`TokenData` of documents, a :class:`~workbench.data.chat.chat_data.ChatData` of conversations (data.format),
    or a :class:`~workbench.data.preference.preference_data.PreferenceData` of preference records, refused first when
    ``objective`` (train.objective) cannot train on its kind. ``run_dir``: the run's own copy of a given tokenizer
    (data.tokenizer) comes first."""
    if cfg.mixture:  # several sources: each prepared as below, one tokenizer (data/mixture/mixture_data.py)
        from workbench.data.mixture.mixture_data import prepare_mixture

        def one(c: DataConfig) -> TrainData:
            return prepare_data(c, vocab_size, seq_len, log, progress, workers, shard_chars, faults, run_dir, loss_on,
                                objective)
        data = prepare_mixture(cfg, vocab_size, seq_len, log, one, given_tokenizer(cfg, vocab_size, run_dir),
                               progress=progress, workers=workers, shard_chars=shard_chars, faults=faults,
                               loss_on=loss_on, model_dir=tokenizer_dir(cfg, run_dir))
        if getattr(data, "names", None):  # several sources (one alone was checked as data.corpus)
            check_corpus_kind(objective, data.format, data.source)
        return data
    corpus = open_data_corpus(cfg)
    kind = corpus_kind(cfg, corpus)
    check_corpus_kind(objective, kind, corpus.description)
    given = given_tokenizer(cfg, vocab_size, run_dir)
    if kind in KINDS:
        try:
            prefs = prepare_chat(cfg, corpus, vocab_size, "assistant", given, tokenizer_dir(cfg, run_dir), log=log,
                                 workers=workers, shard_chars=shard_chars, faults=faults, kind=kind)
        except ChatTemplateError as e:
            raise DataError(str(e)) from None
        return load_preference(prefs, cfg.val_fraction)
    if kind == "chat":
        try:
            chat = prepare_chat(cfg, corpus, vocab_size, loss_on, given, tokenizer_dir(cfg, run_dir), log=log,
                                workers=workers, shard_chars=shard_chars, faults=faults)
        except ChatTemplateError as e:
            raise DataError(str(e)) from None
        return load_chat(chat, cfg.val_fraction)
    prep = prepare(corpus, vocab_size, cfg.tokenizer_sample_mb, log=log, progress=progress, workers=workers,
                   shard_chars=shard_chars, faults=faults, tokenizer=given)
    data = load_tokens(prep, cfg.val_fraction, seq_len)
    data.source = corpus.description  # the same text may have been prepared under other names
    return data
