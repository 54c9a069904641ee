"""A prepared mixture (data.mixture): each source a corpus prepared as today (streamed, cached, its own train/val split
at a document or conversation boundary), all encoded with one tokenizer (data.tokenizer, or one trained on a sample of
all the sources together), drawn in the plan's order (``workbench.data.mixture.mixture_plan``). Text sources are drawn
as windows of seq_len tokens; conversation sources (all of them: text and conversations are not mixed) as rows of their
packed conversations, each with its loss mask as one chat corpus has it. A mixture of one source (the others weighing 0)
is that corpus as data.corpus: today's sampler, bit for bit. No torch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from workbench.config import DataConfig, Preset
from workbench.data.chat.chat_data import Packing, fill_row, trained_labels
from workbench.data.chat.chat_prepare import SHARD_CHARS as CHAT_SHARD_CHARS
from workbench.data.corpus.documents import Corpus, CorpusError, open_corpus
from workbench.data.mixture.mixture_plan import MixturePlan, MixtureSampler, SourceSpec, plan_mixture
from workbench.data.text.prepare import DataError, prepare, train_corpus_tokenizer
from workbench.data.text.tokenizer import AnyTokenizer
from workbench.data.train_data import IGNORE, Batch
from workbench.faults import NO_FAULTS
from workbench.fmt import human_bytes

VAL_HORIZON_BATCHES = 64   # a val sampler's plan: this many batches (an eval draws fewer; past it the plan repeats)

__all__ = ["MixtureData", "active_sources", "mixture_corpus", "mixture_facts", "mixture_lines", "mixture_sources",
           "mixture_table", "over_limit", "prepare_mixture"]


def active_sources(cfg: DataConfig) -> list[dict]:
    """The sources of data.mixture that weigh above 0 (a weight of 0 leaves a source out: it is not read)."""
    return [s for s in cfg.mixture if s["weight"] > 0]


def mixture_sources(cfg: DataConfig) -> list[list] | None:
    """The [[name, weight], ...] a run of ``cfg`` draws as a mixture (a sampler's state keeps them); None when it
    trains on one corpus (data.corpus, or a mixture of one source)."""
    active = active_sources(cfg)
    return [[s["name"], s["weight"]] for s in active] if len(active) > 1 else None


def check_mixture_repeats(p: Preset, run_dir: Path) -> None:
    """A resume's check of its mixture's max_repeat over the horizon it goes on to (its sources' prepared tokens,
    from the cache): refused in one line with the numbers, as `train` refuses it from the start."""
    if not any(s.get("max_repeat") for s in active_sources(p.data)):
        return
    from workbench.data.preset_data import prepare_data  # the mixture's sources, prepared as the trainer will have them
    data = prepare_data(p.data, p.model.vocab_size, p.model.seq_len, log=lambda _m: None, run_dir=run_dir,
                        loss_on=p.train.loss_on, objective=p.train.objective)
    if isinstance(data, MixtureData):
        data.check(p)


def source_corpus(cfg: DataConfig, src: dict) -> Corpus:
    """One source's corpus (listed, nothing read); a missing one refused naming the source."""
    try:
        return open_corpus(src["corpus"], text_field=cfg.text_field, skip_bad=cfg.skip_bad_records,
                           builtin_mb=cfg.builtin_mb)
    except CorpusError as e:
        raise DataError(f"data.mixture source {src['name']!r}: {e}") from None


def mixture_corpus(cfg: DataConfig) -> Corpus:
    """All the active sources as one corpus (what the tokenizer is trained on, and what checks read first)."""
    specs: list[str] = []
    for src in active_sources(cfg):
        source_corpus(cfg, src)  # each must exist: its own line if not
        specs += [src["corpus"]] if isinstance(src["corpus"], str) else list(src["corpus"])
    return open_corpus(specs, text_field=cfg.text_field, skip_bad=cfg.skip_bad_records, builtin_mb=cfg.builtin_mb)


@dataclass
class MixtureData:
    """Several prepared text corpora drawn as one mixture (a :class:`~workbench.data.train_data.TrainData`)."""
    names: list[str]
    weights: list[float]
    max_repeat: list[float]
    parts: list[Any]               # each source's TokenData (its train and val tokens)
    tokenizer: AnyTokenizer
    tokenizer_path: Path
    cached: bool
    format: str = "text"
    _plans: dict = field(default_factory=dict, repr=False)

    @property
    def source(self) -> str:
        total = sum(self.weights)
        return "mixture of " + ", ".join(f"{n} {w / total:.0%}" for n, w in zip(self.names, self.weights))

    @property
    def n_train(self) -> int:
        return sum(int(d.n_train) for d in self.parts)

    @property
    def template(self) -> Any:
        """The chat template of a mixture of conversations (every source is rendered through it), else None."""
        return self.parts[0].template if self.format == "chat" else None

    def windows(self, s: int, part: str, p: Preset) -> int:
        """The sequences source ``s``'s ``part`` holds: its windows of seq_len tokens (text), or its rows of packed
        conversations (chat)."""
        if self.format == "chat":
            return int(self.parts[s].rows(part, p.model.seq_len, p.data.packing, p.data.overlong).rows)
        return (len(self.tokens_of(s, part)) - 1) // p.model.seq_len

    def horizon(self, part: str, p: Preset, steps: int | None = None) -> int:
        """Sequences a plan covers: the run's (max_iters x batch_size x grad_accum; ``steps`` instead of max_iters:
        a time budget's first guess at its steps), or an eval's."""
        if part == "train":
            return (steps or p.train.max_iters) * p.train.batch_size * p.train.grad_accum
        return p.train.batch_size * VAL_HORIZON_BATCHES

    def plan(self, part: str, p: Preset, seed: int, steps: int | None = None) -> MixturePlan:
        key = (part, self.horizon(part, p, steps), p.model.seq_len, seed)
        if key not in self._plans:
            T = p.model.seq_len
            specs = [SourceSpec(n, w, self.windows(s, part, p), m, _content(d))
                     for s, (n, w, m, d) in enumerate(zip(self.names, self.weights, self.max_repeat, self.parts))]
            self._plans[key] = plan_mixture(specs, T, self.horizon(part, p, steps), seed)
        return self._plans[key]

    def tokens_of(self, s: int, part: str) -> np.ndarray:
        return self.parts[s].train if part == "train" else self.parts[s].val

    def sampler(self, part: str, p: Preset, seed: int) -> MixtureSampler:
        plan = self.plan(part, p, seed)
        if self.format == "chat":
            rows = [d.rows(part, p.model.seq_len, p.data.packing, p.data.overlong) for d in self.parts]
            return ChatMixtureSampler(plan, list(zip(self.parts, rows)), p.train.batch_size,
                                      trained_labels(p.train.loss_on), p.data.packing)
        return MixtureSampler(plan, [self.tokens_of(s, part) for s in range(len(self.parts))], p.train.batch_size)

    def source_samplers(self, part: str, p: Preset, seed: int) -> dict[str, Any]:
        """Each source alone (its own windows of ``part``): what a per-source val loss is measured on."""
        return {n: d.sampler(part, p, seed) for n, d in zip(self.names, self.parts)}

    def split_tokens(self) -> tuple[int, int]:
        tr, va = zip(*(d.split_tokens() for d in self.parts))
        return sum(tr), sum(va)

    def check(self, p: Preset, steps: int | None = None) -> None:
        """A source repeated more than its max_repeat over the run's horizon (``steps``: a time budget's first guess
        at its steps, which max_iters is not then): refused with the numbers."""
        if self.format == "chat":  # a source whose conversations fill no row: refused naming it
            for name, d in zip(self.names, self.parts):
                try:
                    d.check(p)
                except DataError as e:
                    raise DataError(f"data.mixture source {name!r}: {e}") from None
        over = over_limit(self.plan("train", p, p.train.seed, steps), p, steps)
        if over:
            raise DataError(over)

    def start_lines(self, sampler: Any, p: Preset) -> list[str]:
        chat = [f"chat: each source's conversations packed into rows of {p.model.seq_len} as one chat corpus is, "
                f"loss on {p.train.loss_on}, template {self.template.source}; the shares are in rows"] \
            if self.format == "chat" else []
        if p.train.time_budget_s is not None:  # the trainer re-plans it for the budget's steps
            return chat + [f"mixture of {len(self.names)} sources: planned for the time budget's steps once they "
                           "are estimated (below)"]
        return chat + self.table(self.plan("train", p, p.train.seed))

    def table(self, plan: MixturePlan) -> list[str]:
        """:func:`mixture_table` of ``plan`` with this mixture's sources."""
        return mixture_table(plan, [d.split_tokens()[0] for d in self.parts], rows=self.format == "chat")

    def start_facts(self, sampler: Any, p: Preset) -> dict[str, Any]:
        """The plan the run starts with (a time budget's: re-planned for its first guess at its steps)."""
        plan = sampler.plan if isinstance(sampler, MixtureSampler) else self.plan("train", p, p.train.seed)
        return {"mixture": {"digest": plan.digest, "horizon": plan.horizon, "exact": plan.exact,
                            "sources": [{"name": src.name, "weight": src.weight, "sequences": plan.counts[s],
                                         "windows": src.windows, "repeats": round(plan.repeats(s), 4)}
                                        for s, src in enumerate(plan.sources)]}}


def _content(d: Any) -> str:
    """What a prepared source is, for the mixture's digest: its text's SHA-256 (text); its conversations' lengths
    and its counts of tokens and trained tokens (chat: a touched file prepared again gives the same)."""
    if getattr(d, "format", "text") == "chat":
        what = np.diff(d.offsets).astype(np.int64).tobytes() + json.dumps(
            [d.index.get(k) for k in ("conversations", "tokens", "trained", "last_trained", "template")]).encode()
        return hashlib.sha256(what).hexdigest()
    return d.index.get("content", "") if d.index else ""


class ChatMixtureSampler(MixtureSampler):
    """A mixture of conversation sources: each sequence is a row of one source's packed conversations (as its
    :class:`~workbench.data.chat.chat_data.ChatSampler` would draw it: positions and segments per conversation, the
    targets ``train.loss_on`` does not train masked), drawn in the plan's order; the state is the same counter."""

    def __init__(self, plan: MixturePlan, rows: list[tuple[Any, Packing]], batch_size: int, trains: np.ndarray,
                 packed: bool):
        super().__init__(plan, [d for d, _ in rows], batch_size)
        self.rows, self.trains, self.packed = rows, trains, packed

    def next_batch(self) -> Batch[np.ndarray]:
        T, B = self.plan.seq_len, self.batch_size
        x = np.zeros((B, T), dtype=np.int64)
        y = np.full((B, T), IGNORE, dtype=np.int64)
        pos = np.zeros((B, T), dtype=np.int64)
        seg = np.full((B, T), -1, dtype=np.int64)
        for b, c in enumerate(range(self.counter, self.counter + B)):
            s, r = self.plan.at(c - self.base)
            d, packing = self.rows[s]
            fill_row(d, packing, self.trains, r, (x[b], y[b], pos[b], seg[b]))
        self.counter += B
        return Batch(x, y, pos, seg if self.packed else None, masked=True)


def mixture_table(plan: MixturePlan, train_tokens: list[int], rows: bool = False) -> list[str]:
    """The realized mixture over the run's horizon, a row per source: its weight, the sequences and tokens it
    gives, the unique tokens among them, how many times it is repeated, what its train part holds. ``rows``: a
    mixture of conversations, whose unit is a row of packed conversations (its positions padded where no
    conversation fits, its targets masked as train.loss_on says)."""
    T, total = plan.seq_len, sum(s.weight for s in plan.sources)
    seq, tok = ("rows", "positions") if rows else ("sequences", "tokens")
    head = (f"mixture over {plan.horizon:,} {seq} of {T} {tok} ({plan.horizon * T:,} {tok}; each source's "
            f"share within one {seq[:-1]} after every step"
            + ("" if plan.exact else "; counts by the order, not the apportionment: see the mixture's notes") + "):")
    rows_ = [("source", "weight", "share", seq, tok, f"unique {tok}", "repeats", "train tokens")]
    for s, src in enumerate(plan.sources):
        n = plan.counts[s]
        rows_.append((src.name, f"{src.weight:g}", f"{src.weight / total:.1%}", f"{n:,}", f"{n * T:,}",
                     f"{min(n, src.windows) * T:,}", f"{plan.repeats(s):.2f}", f"{train_tokens[s]:,}"))
    widths = [max(len(r[i]) for r in rows_) for i in range(len(rows_[0]))]
    return [head] + ["  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in rows_]


def over_limit(plan: MixturePlan, p: Preset, steps: int | None = None) -> str:
    """The line that refuses a run whose plan repeats a source past its max_repeat, with the numbers and what to
    change ("" when none does); ``steps``: the plan is a time budget's first guess at its steps."""
    budget = p.train.time_budget_s is not None
    over = plan.over_limit(_planned(p, steps))
    if not over:
        return ""
    return "; ".join(over) + (": lower its weight, raise its max_repeat, add text to it, or give a shorter time "
                              "budget (train.time_budget)" if budget else
                              ": lower its weight, raise its max_repeat, add text to it, or train fewer steps "
                              "(train.max_iters)")


def _planned(p: Preset, steps: int | None) -> str:
    """What a plan's horizon is, as over_limit's phrases say it: a time budget's first guess, else nothing."""
    budgeted = steps and p.train.time_budget_s is not None
    return f" for the time budget's first guess of {steps:,} steps" if budgeted else ""


def mixture_facts(data: MixtureData, p: Preset, steps: int | None = None) -> dict:
    """A prepared mixture's sources and the realized mixture over a run of ``p`` (as `train`'s first lines say;
    ``steps``: a time budget's first guess at its steps), for --json."""
    plan = data.plan("train", p, p.train.seed, steps)
    T = plan.seq_len
    return {"format": "mixture", "horizon_sequences": plan.horizon, "seq_len": T, "exact": plan.exact,
            "chat": data.format == "chat", "vocab_size": data.tokenizer.vocab_size, "cached": data.cached,
            "refused": plan.over_limit(_planned(p, steps)),
            "sources": [{"name": src.name, "weight": src.weight, "source": d.source, "sequences": plan.counts[s],
                         "tokens": plan.counts[s] * T, "unique_tokens": min(plan.counts[s], src.windows) * T,
                         "repeats": round(plan.repeats(s), 4), "max_repeat": src.max_repeat,
                         "train_tokens": d.split_tokens()[0], "val_tokens": d.split_tokens()[1]}
                        for s, (src, d) in enumerate(zip(plan.sources, data.parts))]}


def mixture_lines(data: MixtureData, p: Preset, steps: int | None = None) -> list[str]:
    """The realized mixture over a run of ``p`` as `data inspect`, `data prepare` and `estimate` print it
    (``steps``: a time budget's first guess at its steps)."""
    t = p.train
    plan = data.plan("train", p, t.seed, steps)
    guess = " (the time budget's first guess)" if steps else ""
    note = "" if steps or t.time_budget_s is None else (
        " (train.max_iters: with its time budget the run is planned for the steps the budget buys, which "
        "`workbench estimate` shows)")
    return ([f"for a run of {p.name} ({steps or t.max_iters:,} steps{guess} x {t.batch_size} x {t.grad_accum} "
             f"sequences){note}:"]
            + data.table(plan)
            + [f"`train` would refuse it: {why}" for why in plan.over_limit(_planned(p, steps))])


def prepare_mixture(cfg: DataConfig, vocab_size: int, seq_len: int, log: Callable[[str], None], prepare_one: Callable,
                    given: AnyTokenizer | None, **kw: Any) -> Any:
    """The mixture's sources prepared: one source alone is ``prepare_one`` of it as data.corpus (today's data);
    several are text corpora encoded with one tokenizer (``given``, or one trained on all of them)."""
    from workbench.data.chat.chat_data import corpus_kind
    from workbench.data.preference.preference_records import KINDS
    from workbench.data.text.tokens import load_tokens

    active = active_sources(cfg)
    corpora = [source_corpus(cfg, src) for src in active]
    kinds = [corpus_kind(dataclasses.replace(cfg, corpus=src["corpus"], mixture=[]), c)
             for src, c in zip(active, corpora)]
    if any(k in KINDS for k in kinds) and any(k not in KINDS for k in kinds):
        pairs = active[next(i for i, k in enumerate(kinds) if k in KINDS)]["name"]
        raise DataError(f"data.mixture: text and conversations may not be mixed with preference pairs (source "
                        f"{pairs!r}); train on the pairs alone, or leave them out of the mixture")
    if len(active) == 1:
        return prepare_one(dataclasses.replace(cfg, corpus=active[0]["corpus"], mixture=[]))
    loss_on, model_dir = kw.pop("loss_on", "assistant"), kw.pop("model_dir", None)
    if len(set(kinds)) > 1:
        chat, text = (next(src["name"] for src, k in zip(active, kinds) if k == want) for want in ("chat", "text"))
        raise DataError(f"data.mixture: source {chat!r} holds conversations and {text!r} text: a mixture is of text "
                        "or of conversations, not both; set data.format = text to train on the conversations' text, "
                        "or give the text as conversations")
    if kinds[0] == "chat":
        return _prepare_chat_mixture(cfg, active, corpora, vocab_size, log, given, loss_on, model_dir, **kw)
    tok = given
    if tok is None:
        union = mixture_corpus(cfg)
        tok = train_corpus_tokenizer(union, vocab_size, cfg.tokenizer_sample_mb, log=log,
                                     progress=kw.get("progress"))
    parts, cached = [], True
    for src, corpus in zip(active, corpora):
        log(f"mixture source {src['name']}: {corpus.description} ({human_bytes(corpus.total_bytes)})")
        prep = prepare(corpus, vocab_size, cfg.tokenizer_sample_mb, log=log, tokenizer=tok, **kw)
        try:
            d = load_tokens(prep, cfg.val_fraction, seq_len)
        except DataError as e:
            raise DataError(f"data.mixture source {src['name']!r}: {e}") from None
        parts.append(_sourced(d, corpus))
        cached = cached and prep.cached
    return _mixture_of(active, parts, cached)


def _prepare_chat_mixture(cfg: DataConfig, active: list[dict], corpora: list[Corpus], vocab_size: int,
                          log: Callable[[str], None], given: AnyTokenizer | None, loss_on: str,
                          model_dir: Path | None, **kw: Any) -> MixtureData:
    """Several conversation sources: each prepared as one chat corpus is (its own cache, its own train/val split
    by conversations), all with one tokenizer (``given``, or one trained on the messages of all of them)."""
    from workbench.data.chat.chat_data import load_chat
    from workbench.data.chat.chat_prepare import prepare_chat
    from workbench.data.chat.chat_templates import ChatTemplateError

    tok = given if given is not None else chat_mixture_tokenizer(cfg, vocab_size, log)
    parts, cached = [], True
    for src, corpus in zip(active, corpora):
        log(f"mixture source {src['name']}: {corpus.description} ({human_bytes(corpus.total_bytes)}), conversations")
        try:
            prep = prepare_chat(dataclasses.replace(cfg, corpus=src["corpus"], mixture=[]), corpus, vocab_size,
                                loss_on, tok, model_dir, log=log, workers=kw.get("workers"),
                                shard_chars=kw.get("shard_chars") or CHAT_SHARD_CHARS,
                                faults=kw.get("faults") or NO_FAULTS)
            d = load_chat(prep, cfg.val_fraction)
        except ChatTemplateError as e:
            raise DataError(str(e)) from None
        except DataError as e:
            raise DataError(f"data.mixture source {src['name']!r}: {e}") from None
        parts.append(_sourced(d, corpus))
        cached = cached and prep.cached
    return _mixture_of(active, parts, cached, format="chat")


def _sourced(d: Any, corpus: Corpus) -> Any:
    """A source's prepared data, named by its corpus (what messages and the table call it)."""
    d.source = corpus.description
    return d


def _mixture_of(active: list[dict], parts: list, cached: bool, format: str = "text") -> MixtureData:
    """The prepared sources as one MixtureData: their names, weights and repeat caps, the first's tokenizer (all
    share it)."""
    return MixtureData([s["name"] for s in active], [s["weight"] for s in active],
                       [s["max_repeat"] for s in active], parts, parts[0].tokenizer, parts[0].tokenizer_path,
                       cached, format=format)


def chat_mixture_tokenizer(cfg: DataConfig, vocab_size: int, log: Callable[[str], None]) -> AnyTokenizer:
    """A tokenizer trained on the messages of all of a mixture's conversation sources (the first
    data.tokenizer_sample_mb of them together, as one chat corpus's is), cached under the sources' manifest."""
    from workbench.data.chat.chat_prepare import _sample_for_tokenizer, make_reader
    from workbench.data.text.tokenizer import load_tokenizer, tokenizer_file, train_tokenizer
    from workbench.fs import cache_root, write_atomic

    union = mixture_corpus(cfg)
    key = hashlib.sha256(json.dumps([union.manifest(), cfg.messages_field, cfg.chat_roles, vocab_size,
                                     cfg.tokenizer_sample_mb], default=str, sort_keys=True).encode()).hexdigest()[:20]
    d = cache_root() / "data" / f"chatmix-{key}"
    if tokenizer_file(d) is not None:
        return load_tokenizer(d)
    log(f"training a {vocab_size}-piece tokenizer on the messages of all the sources ({union.description}) ...")
    tok = train_tokenizer(_sample_for_tokenizer(make_reader(cfg, "chat"), union, cfg.tokenizer_sample_mb), vocab_size)
    d.mkdir(parents=True, exist_ok=True)
    write_atomic(d / "tokenizer.model", tok.proto)  # sentencepiece's: what train_tokenizer makes
    return tok
