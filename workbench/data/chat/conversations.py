"""Chat data: conversations read from a user's files, and each one as token ids with the loss mask beside
them, built from the model's own template (:mod:`workbench.data.chat.chat_templates`). No torch.

A chat file is JSONL (plain, ``.gz``, ``.zst`` or ``.xz``) or parquet, one conversation a record, its shape
detected from its first record (:func:`detect_format`):

- OpenAI ``{"messages": [{"role": "system"|"user"|"assistant", "content": str}, ...]}``
- ShareGPT ``{"conversations": [{"from": "system"|"human"|"gpt", "value": str}, ...]}``
- alpaca ``{"instruction": str, "input": str (optional), "output": str}``: the user asks the instruction, then a
  newline and the input if there is one (as LLaMA-Factory joins them); the output is the answer
- ``{"prompt": str, "completion": str}``, or each a list of messages (TRL's conversational form)

Any of them may carry a top-level ``"system"`` string, put first when the conversation has no system message
of its own. :class:`ChatOptions` names another field holding the list of messages (``data.messages_field``)
and more role names (``data.chat_roles``: ``{"bot": "assistant"}``). A bad record (no assistant message, an
unknown role, empty content, a field of the wrong type) is one :class:`BadRecord` line naming the file and the
line or row, or is counted and skipped with ``data.skip_bad_records``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Iterator, Mapping

from workbench.data.chat.chat_templates import (
    CHATML_PIECES,
    LOSS_ON,
    ChatTemplate,
    ChatTemplateError,
    end_of_turn,
    trained_spans,
)
from workbench.data.corpus.record_reader import RecordReader, Stats, json_type
from workbench.data.corpus.sources import CorpusError, Source
from workbench.data.text.tokenizer import AnyTokenizer, HFTokenizer

ROLES = ("system", "user", "assistant")
ROLE_NAMES = {"system": "system", "user": "user", "assistant": "assistant", "human": "user", "gpt": "assistant"}
FORMATS = ('OpenAI {"messages": [{"role", "content"}, ...]}', 'ShareGPT {"conversations": [{"from", "value"}, ...]}',
           'alpaca {"instruction", "input", "output"}', '{"prompt", "completion"}')


class BadRecord(CorpusError):
    """One record that cannot be a conversation (skipped with data.skip_bad_records)."""


@dataclass(frozen=True)
class Message:
    role: str       # system | user | assistant
    content: str


@dataclass(frozen=True)
class Conversation:
    messages: tuple[Message, ...]
    where: str = ""     # "corpus file F, line N": where a message about it points
    tag: int = 0        # preference data: a pair's chosen (1) or rejected (0) answer; KTO's label (1 good, 0 bad)

    def as_dicts(self) -> list[dict]:
        """The messages as a chat template reads them."""
        return [{"role": m.role, "content": m.content} for m in self.messages]


@dataclass(frozen=True)
class ChatOptions:
    """How chat records are read."""
    messages_field: str = ""    # data.messages_field: the field holding the list of messages ("" = detected)
    roles: Mapping[str, str] = field(default_factory=dict)  # data.chat_roles: more role names -> system|user|assistant
    skip_bad: bool = False      # data.skip_bad_records

    def role_names(self) -> dict[str, str]:
        for name, role in self.roles.items():
            if role not in ROLES:
                raise CorpusError(f"data.chat_roles maps {name!r} to {role!r}; map each name to one of "
                                  f"{', '.join(ROLES)}")
        return {**ROLE_NAMES, **self.roles}


# ----------------------------------------------------------------------------- records -> conversations

@dataclass(frozen=True)
class ChatFormat:
    """The shape of one file's records, and how a record becomes a conversation."""
    name: str           # messages | sharegpt | alpaca | prompt/completion
    field: str = ""     # the field with the list of messages (messages, sharegpt)

    @property
    def columns(self) -> tuple[str, ...]:
        """The fields a record of this shape is read from."""
        if self.name == "alpaca":
            return ("instruction", "input", "output", "system")
        if self.name == "prompt/completion":
            return ("prompt", "completion", "system")
        return (self.field, "system")

    def conversation(self, rec: dict, roles: dict[str, str], where: str) -> Conversation:
        """``rec`` as a checked conversation; :class:`BadRecord` (without ``where``) if it cannot be one."""
        if self.name == "alpaca":
            instruction, output = _need_str(rec, "instruction"), _need_str(rec, "output")
            extra = rec.get("input")
            if extra is not None and not isinstance(extra, str):
                raise BadRecord(f"'input' is {json_type(extra)}, not a string")
            msgs = [Message("user", instruction + ("\n" + extra if extra else "")), Message("assistant", output)]
        elif self.name == "prompt/completion":
            msgs = []
            for key, role in (("prompt", "user"), ("completion", "assistant")):
                value = rec.get(key)
                msgs += [Message(role, value)] if isinstance(value, str) else _messages(rec, key, roles)
        else:
            msgs = _messages(rec, self.field, roles)
        system = rec.get("system")
        if isinstance(system, str) and system and msgs[0].role != "system":
            msgs.insert(0, Message("system", system))
        _check(msgs)
        return Conversation(tuple(msgs), where)


def _fields(obj: dict) -> str:
    return ", ".join(map(repr, list(obj)[:12])) + (", ..." if len(obj) > 12 else "") or "no fields"


def _need_str(rec: dict, key: str) -> str:
    if key not in rec:
        raise BadRecord(f"no {key!r} field (the record has {_fields(rec)})")
    if not isinstance(rec[key], str):
        raise BadRecord(f"{key!r} is {json_type(rec[key])}, not a string")
    return rec[key]


def _messages(rec: dict, key: str, roles: dict[str, str]) -> list[Message]:
    if key not in rec:
        raise BadRecord(f"no {key!r} field (the record has {_fields(rec)})")
    items = rec[key]
    if not isinstance(items, list) or not items:
        what = "an empty list" if isinstance(items, list) else json_type(items)
        raise BadRecord(f"{key!r} is {what}, not a list of messages")
    out = []
    for k, m in enumerate(items, 1):
        if not isinstance(m, dict):
            raise BadRecord(f"message {k} of {key!r} is {json_type(m)}, not an object")
        role_key = next((x for x in ("role", "from") if x in m), None)
        text_key = next((x for x in ("content", "value") if x in m), None)
        if role_key is None or text_key is None:
            raise BadRecord(f"message {k} of {key!r} needs \"role\" and \"content\" (or ShareGPT's \"from\" and "
                            f"\"value\"); it has {_fields(m)}")
        name, content = m[role_key], m[text_key]
        role = roles.get(name) if isinstance(name, str) else None
        if role is None:
            known = ", ".join(sorted(roles))
            raise BadRecord(f"message {k} has an unknown role {name!r} (known: {known}); map it with "
                            f"data.chat_roles, e.g. {{{json.dumps(str(name))} = \"assistant\"}}")
        if not isinstance(content, str):
            raise BadRecord(f"message {k} ({name}): its content is {json_type(content)}, not a string")
        out.append(Message(role, content))
    return out


def _check(msgs: list[Message]) -> None:
    for k, m in enumerate(msgs, 1):
        if m.role != "system" and not m.content.strip():
            raise BadRecord(f"message {k} ({m.role}) has empty content")
    if not any(m.role == "assistant" for m in msgs):
        raise BadRecord(f"the conversation has no assistant message, so there is nothing to train on (its roles: "
                        f"{', '.join(m.role for m in msgs)})")


def detect_format(rec: dict, options: ChatOptions = ChatOptions()) -> ChatFormat | None:
    """The chat shape of a file, from its first record (and ``messages_field``); None if it is not chat."""
    if options.messages_field:
        return ChatFormat("messages", options.messages_field)
    if isinstance(rec.get("messages"), list):
        return ChatFormat("messages", "messages")
    if isinstance(rec.get("conversations"), list):
        return ChatFormat("sharegpt", "conversations")
    if "instruction" in rec and "output" in rec:
        return ChatFormat("alpaca")
    if "prompt" in rec and "completion" in rec:
        return ChatFormat("prompt/completion")
    return None


def _no_format(src: Source, rec: dict) -> CorpusError:
    return CorpusError(f"corpus file {src.path}: the first record is no chat shape (its fields: "
                       f"{_fields(rec)}); accepted: {'; '.join(FORMATS)}; or name the field "
                       "holding the messages with data.messages_field")


# ----------------------------------------------------------------------------- reading files

class ChatReader:
    """Conversations out of chat files, streamed, bad records raised or counted into ``stats``."""

    group = 1  # conversations that belong together (a preference pair's two): shards never split them

    def __init__(self, options: ChatOptions = ChatOptions(), stats: Stats | None = None):
        self.options, self.roles = options, options.role_names()
        self.stats = stats if stats is not None else Stats()
        self.records = RecordReader(bad_error=BadRecord, skip_bad=options.skip_bad, stats=self.stats)

    def conversations(self, sources: list[Source]) -> Iterator[Conversation]:
        """Every conversation of ``sources`` in order; CorpusError (:meth:`none_found`) if there is none."""
        for src in sources:
            yield from self.read(src)
        if self.stats.documents == 0:
            raise self.none_found(f"{', '.join(s.path for s in sources)} "
                                  f"({self.stats.skipped_records} bad record(s) skipped)")

    def none_found(self, where: str) -> CorpusError:
        return CorpusError(f"no conversations in {where}")

    def read(self, src: Source) -> Iterator[Conversation]:
        """One file's conversations."""
        if src.kind not in ("jsonl", "parquet"):
            raise CorpusError(f"corpus file {src.path} is {src.kind}, not chat records; chat data is JSON lines "
                              "(.jsonl, optionally .gz/.zst/.xz) or parquet, one conversation a record")
        fmt, columns = None, None
        if src.kind == "parquet":  # only the columns its shape reads, known from its first row
            first = self.records.first(src)
            if first is None:
                return
            fmt = self._format(src, first)
            columns = fmt.columns
        for where, rec in self.records.records(src, columns):
            if src.kind == "parquet":  # a column a row leaves empty is a field the record does not have
                rec = {k: v for k, v in rec.items() if v is not None}
            fmt = fmt or self._format(src, rec)
            try:
                conv = fmt.conversation(rec, self.roles, where)
            except BadRecord as e:
                self.records.bad(f"{where}: {e}")
                continue
            self.stats.documents += 1
            self.stats.chars += sum(len(m.content) for m in conv.messages)
            yield conv

    def _format(self, src: Source, first: dict) -> ChatFormat:
        fmt = detect_format(first, self.options)
        if fmt is None:
            raise _no_format(src, first)
        return fmt


# ----------------------------------------------------------------------------- conversations -> tokens

@dataclass(frozen=True)
class ChatTokens:
    """One conversation as the model trains on it."""
    ids: list[int]
    mask: list[int]                    # 1 where the token is a target of the loss (prompt tokens 0)
    text: str                          # the rendered conversation
    spans: tuple[tuple[int, int], ...]  # the trained characters of ``text``, [start, end)

    @property
    def trained(self) -> int:
        return sum(self.mask)


def special_pieces(tok: AnyTokenizer) -> dict[str, int]:
    """The special pieces of ``tok``, each one id wherever a template writes it: a Hugging Face tokenizer's
    added tokens marked special (not whitespace ones: those are text); workbench's control pieces, and the
    ChatML pieces if it has them."""
    if isinstance(tok, HFTokenizer):
        return {t.content: i for i, t in tok.tk.get_added_tokens_decoder().items() if t.special and t.content.strip()}
    sp = tok.sp
    out = {sp.id_to_piece(i): i for i in range(sp.get_piece_size()) if sp.is_control(i)}
    return {**out, **{p: i for p in CHATML_PIECES if sp.id_to_piece(i := sp.piece_to_id(p)) == p}}


class ChatEncoder:
    """Conversations as (ids, mask) through one template and one tokenizer. Building one checks the template
    can be masked (:func:`~workbench.data.chat.chat_templates.end_of_turn`), once, before any record.

    A Hugging Face tokenizer encodes the whole rendered text, as ``apply_chat_template(..., tokenize=True)``
    does, and a token is trained if its characters (its offsets) overlap a trained span, as transformers'
    ``return_assistant_tokens_mask`` counts them. workbench's own tokenizer encodes the text between special
    pieces and span boundaries piece by piece, each special piece its one id. A message whose text contains a
    special piece (``<|im_end|>`` typed into the data: text templated already) is a bad record, never a
    turn boundary the data smuggled in."""

    def __init__(self, template: ChatTemplate, tok: AnyTokenizer, loss_on: str = "assistant"):
        if loss_on not in LOSS_ON:
            raise ValueError(f"loss_on must be one of {', '.join(LOSS_ON)}, not {loss_on!r}")
        self.template, self.tok, self.loss_on = template, tok, loss_on
        self.specials = special_pieces(tok)
        self.end = end_of_turn(template, self.specials, loss_on)
        self.end_id = self.specials[self.end]
        if isinstance(tok, HFTokenizer) and tok.tk.encode(self.end, add_special_tokens=False).ids != [self.end_id]:
            raise ChatTemplateError(f"the end-of-turn token {self.end} does not encode to its one id {self.end_id}")
        # the special pieces, longest first, as one group (re.split keeps them)
        self._special_re = re.compile("(" + "|".join(map(re.escape, sorted(self.specials, key=len, reverse=True)))
                                      + ")")

    def encode(self, conv: Conversation) -> ChatTokens:
        """``conv`` as tokens and loss mask; :class:`BadRecord` naming ``conv.where`` if the template fails on it."""
        for k, m in enumerate(conv.messages, 1):
            found = self._special_re.search(m.content)
            if found:
                raise BadRecord(f"{conv.where}: message {k} ({m.role}) contains the special token {found.group()} "
                                "(is the text templated already?); give the plain messages, the template adds them")
        try:
            text, spans = trained_spans(self.template, conv.as_dicts(), self.loss_on)
        except ChatTemplateError as e:
            raise BadRecord(f"{conv.where}: {e}") from None
        if self.loss_on != "all":
            for a, b in spans:
                if not text[a:b].endswith(self.end):
                    raise BadRecord(f"{conv.where}: an assistant turn does not end with {self.end} in this "
                                    f"conversation's rendering by {self.template.source}")
        if isinstance(self.tok, HFTokenizer):
            enc = self.tok.tk.encode(text, add_special_tokens=False)
            ids, mask = list(enc.ids), offsets_mask(enc.offsets, spans)
        else:
            ids, mask = self._pieces(text, spans)
        if self.loss_on != "all":
            self._check_ends(ids, mask, conv)
        return ChatTokens(ids, mask, text, tuple(spans))

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """The ids a reply is generated from: the conversation so far and the assistant's header
        (``add_generation_prompt``), encoded as a conversation is for training."""
        text = self.template.render(messages, add_generation_prompt=True)
        if isinstance(self.tok, HFTokenizer):
            return list(self.tok.tk.encode(text, add_special_tokens=False).ids)
        return self._pieces(text, [])[0]

    def _pieces(self, text: str, spans: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
        cuts = sorted({0, len(text), *(x for s in spans for x in s)})
        ids: list[int] = []
        mask: list[int] = []
        for lo, hi in zip(cuts, cuts[1:]):
            trained = int(any(a <= lo and hi <= b for a, b in spans))
            for part in filter(None, self._special_re.split(text[lo:hi])):
                got = [self.specials[part]] if part in self.specials else self.tok.encode(part)
                ids += got
                mask += [trained] * len(got)
        return ids, mask

    def _check_ends(self, ids: list[int], mask: list[int], conv: Conversation) -> None:
        """Each run of trained tokens ends with the end-of-turn id: the model learns to stop."""
        for j, m in enumerate(mask):
            if m and (j + 1 == len(mask) or not mask[j + 1]) and ids[j] != self.end_id:
                raise BadRecord(f"{conv.where}: a trained turn ends in token {ids[j]}, not the end-of-turn "
                                f"{self.end} ({self.end_id}): the tokenizer merges it with the text around it")


def offsets_mask(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """1 for each token whose characters overlap a span (spans sorted, disjoint). A token's characters run from
    where the tokens before it ended, so offsets trimmed of whitespace leave no character out; the byte-level
    tokens of one character each have that character."""
    mask = [0] * len(offsets)
    prev_end = k = 0
    for j, (start, end) in enumerate(offsets):
        lo = min(start, prev_end)
        hi = max(end, lo + 1)
        prev_end = max(prev_end, end)
        while k < len(spans) and spans[k][1] <= lo:
            k += 1
        if k < len(spans) and spans[k][0] < hi:
            mask[j] = 1
    return mask


__all__ = ["BadRecord", "ChatEncoder", "ChatFormat", "ChatOptions", "ChatReader", "ChatTokens", "Conversation",
           "FORMATS", "Message", "ROLES", "ROLE_NAMES", "detect_format", "offsets_mask",
           "special_pieces"]
