"""Preference data: records saying which answer is better, read into conversations the chat machinery renders
and encodes (:mod:`workbench.data.chat.chat_prepare`). No torch.

Two kinds, detected per file from its first record, JSONL (plain or compressed) or parquet:

- **pairs** (DPO, SimPO, ORPO): ``{"prompt", "chosen", "rejected"}``. Each of them a string (the prompt a user
  message, the answers assistant messages) or a list of messages (OpenAI ``role``/``content`` or ShareGPT
  ``from``/``value``): the prompt's turns shared by both, then the chosen and the rejected assistant turn. Without
  a ``prompt``, ``chosen`` and ``rejected`` are whole conversations that must agree up to their last answer.
- **kto** (KTO, unpaired): ``{"prompt", "completion", "label"}`` with ``label`` true (a good answer) or false.

A top-level ``"system"`` string is put first, as for chat records. Each pair becomes two conversations (the
prompt and the chosen answer, the prompt and the rejected one), one after the other, so the pair is rendered
through the model's own template twice and only its last assistant turn is trained. Bad records (no
``rejected``, a chosen answer equal to the rejected one, prompts that differ between the two conversations, a
label that is not true or false) are one line naming the file and line, or counted and skipped with
``data.skip_bad_records``.
"""

from __future__ import annotations

from typing import Iterator

from workbench.config.objectives import objective_spec, objectives_on
from workbench.data.chat.conversations import (
    BadRecord,
    ChatOptions,
    ChatReader,
    Conversation,
    Message,
    _check,
    _messages,
)
from workbench.data.corpus.kinds import DESCRIBE, KINDS, KTO, OBJECTIVE_FOR, PAIRS
from workbench.data.corpus.record_reader import Stats, json_type
from workbench.data.corpus.sources import CorpusError, Source

PAIR_FIELDS = ("prompt", "chosen", "rejected", "system")
KTO_FIELDS = ("prompt", "completion", "label", "system")
CHOSEN, REJECTED = 1, 0     # a pair's conversations' tags; KTO's: 1 desirable, 0 undesirable


class PreferenceError(CorpusError):
    pass


def detect_kind(rec: dict) -> str | None:
    """The preference kind of a file from its first record; None if it holds none."""
    if "chosen" in rec or "rejected" in rec:
        return PAIRS
    if "label" in rec and "completion" in rec:
        return KTO
    return None


def _turns(rec: dict, key: str, role: str, roles: dict[str, str]) -> list[Message]:
    """A field as messages: a string is one message of ``role``, a list is messages."""
    if key not in rec:
        raise BadRecord(f"no {key!r} field (the record has {', '.join(map(repr, rec)) or 'no fields'})")
    value = rec[key]
    if isinstance(value, str):
        return [Message(role, value)]
    if isinstance(value, list):
        return _messages(rec, key, roles)
    raise BadRecord(f"{key!r} is {json_type(value)}, not a string or a list of messages")


def _with_system(rec: dict, msgs: list[Message]) -> list[Message]:
    system = rec.get("system")
    if isinstance(system, str) and system and msgs[0].role != "system":
        return [Message("system", system), *msgs]
    return msgs


def _answer(msgs: list[Message], what: str) -> None:
    if msgs[-1].role != "assistant":
        raise BadRecord(f"the {what} conversation ends with a {msgs[-1].role} message, not the assistant's answer")
    _check(msgs)


def pair_conversations(rec: dict, roles: dict[str, str], where: str) -> tuple[Conversation, Conversation]:
    """A pair record as its chosen and rejected conversations; :class:`BadRecord` if it cannot be one."""
    for key in ("chosen", "rejected"):
        if key not in rec:
            raise BadRecord(f"no {key!r} field: a preference pair needs prompt, chosen and rejected (the record has "
                            f"{', '.join(map(repr, rec)) or 'no fields'})")
    prompt = _turns(rec, "prompt", "user", roles) if "prompt" in rec else []
    chosen = _with_system(rec, prompt + _turns(rec, "chosen", "assistant", roles))
    rejected = _with_system(rec, prompt + _turns(rec, "rejected", "assistant", roles))
    _answer(chosen, "chosen")
    _answer(rejected, "rejected")
    if chosen[:-1] != rejected[:-1]:
        k = next((i for i, (a, b) in enumerate(zip(chosen, rejected)) if a != b), min(len(chosen), len(rejected)) - 1)
        raise BadRecord(f"the chosen and rejected conversations differ before their answers (at message {k + 1}): "
                        "a pair shares its prompt; give the shared turns as 'prompt' and one answer each")
    if chosen[-1].content == rejected[-1].content:
        raise BadRecord("chosen and rejected are the same answer, so there is nothing to prefer; drop the record")
    return Conversation(tuple(chosen), where, CHOSEN), Conversation(tuple(rejected), where, REJECTED)


def kto_conversation(rec: dict, roles: dict[str, str], where: str) -> Conversation:
    """A labelled answer as a conversation tagged 1 (good) or 0 (bad)."""
    if "label" not in rec:
        raise BadRecord("no 'label' field: a labelled answer needs prompt, completion and label (true or false)")
    label = rec["label"]
    if not isinstance(label, bool):
        raise BadRecord(f"'label' is {json_type(label)} ({label!r}), not true or false")
    msgs = _with_system(rec, _turns(rec, "prompt", "user", roles) + _turns(rec, "completion", "assistant", roles))
    _answer(msgs, "labelled")
    return Conversation(tuple(msgs), where, int(label))


class PreferenceReader(ChatReader):
    """The conversations of preference files, streamed: a pair's two one after the other (chosen, then
    rejected), or one per labelled answer; bad records raised or counted."""

    def __init__(self, kind: str, options: ChatOptions = ChatOptions(), stats: Stats | None = None):
        super().__init__(options, stats)
        self.kind = kind
        self.group = 2 if kind == PAIRS else 1   # a pair's two conversations: shards and skips never split them


    def read(self, src: Source) -> Iterator[Conversation]:
        if src.kind not in ("jsonl", "parquet"):
            raise PreferenceError(f"corpus file {src.path} is {src.kind}, not preference records; preference data is "
                                  "JSON lines (.jsonl, optionally .gz/.zst/.xz) or parquet, one record a line")
        columns = PAIR_FIELDS if self.kind == PAIRS else KTO_FIELDS
        first = True
        for where, rec in self.records.records(src, columns if src.kind == "parquet" else None):
            if src.kind == "parquet":
                rec = {k: v for k, v in rec.items() if v is not None}
            if first:
                first = False
                found = detect_kind(rec)
                if found != self.kind:
                    raise PreferenceError(f"corpus file {src.path} holds {DESCRIBE.get(found or 'chat')}, not "
                                          f"{DESCRIBE[self.kind]} as the corpus's first file does; train on one "
                                          "kind at a time")
            try:
                convs = pair_conversations(rec, self.roles, where) if self.kind == PAIRS else \
                    (kto_conversation(rec, self.roles, where),)
            except BadRecord as e:
                self.records.bad(f"{where}: {e}")
                continue
            self.stats.documents += 1
            for conv in convs:
                self.stats.chars += sum(len(m.content) for m in conv.messages)
                yield conv

    def none_found(self, where: str) -> CorpusError:
        return PreferenceError(f"no {DESCRIBE[self.kind]} in {where}")


def check_corpus_kind(objective: str, kind: str, where: str) -> None:
    """Refuse, in one line, a corpus of ``kind`` (text, chat, pairs, kto) that ``train.objective`` cannot train
    on: preference records with sft, pairs with kto or labelled answers with a paired objective, text or
    conversations with a preference objective."""
    spec = objective_spec(objective)
    if kind in spec.data:
        return
    if not spec.preference and kind in KINDS:
        first, *others = objectives_on(kind)
        also = f" (or {', '.join(others)})" if others else ""
        raise PreferenceError(f"{where} holds {DESCRIBE[kind]}, which train.objective = {objective} cannot train on; "
                              f"set train.objective = {first}{also} (--set train.objective={first})")
    if spec.preference:
        hint = f"; set train.objective = {OBJECTIVE_FOR[kind]}" if kind in OBJECTIVE_FOR else \
            "; give a file of such records (docs/reference/preference.md)"
        raise PreferenceError(f"train.objective = {objective} trains on {DESCRIBE[spec.data[0]]}, but "
                              f"{where} holds {DESCRIBE[kind]}{hint}")


__all__ = ["CHOSEN", "DESCRIBE", "KINDS", "KTO", "OBJECTIVE_FOR", "PAIRS", "REJECTED",
           "PreferenceError", "PreferenceReader", "check_corpus_kind", "detect_kind", "kto_conversation",
           "pair_conversations"]
