"""Eval tasks: what ``workbench eval --task`` and ``train.eval_tasks`` name, read into items (no torch).

A task is a built-in name (:mod:`workbench.data.tasks.builtin_tasks`) or a JSONL file (plain, ``.gz``, ``.zst``
or ``.xz``), one record a line, its shape detected from the first record's fields:

- multiple choice, ``{"query"|"context"|"question": str, "choices": [str, ...], "gold"|"label"|"answer": i}``
- HellaSwag's ``{"ctx", "endings", "label"}``: with its real fields (``activity_label``, ``ctx_a``, ``ctx_b``)
  preprocessed as lm-evaluation-harness's ``hellaswag`` task does (the activity label before the context, ``ctx_b``
  capitalised, WikiHow's ``[title]``/``[step]`` markers taken out); without them, ``ctx`` and the endings as given
- ARC's ``{"question", "choices": {"text": [...], "label": [...]}, "answerKey"}``, asked as lm-evaluation-
  harness asks it: ``"Question: {question}\\nAnswer:"``, each choice after a space
- exact match, ``{"prompt": str, "answer": str | [str, ...]}`` (greedy decoding to a stop sequence)

Anything else is mapped by a TOML sidecar beside the file (``qa.jsonl`` -> ``qa.toml``) or by ``--set``
(:data:`OPTIONS`: ``context_field``, ``choices_field``, ``gold_field``, ``prompt_field``, ``answer_field``,
``kind``, ``metric``, ``delimiter``, ``until``, ``max_new_tokens``, ``name``). A multiple-choice item is
scored by the log-likelihood of ``delimiter + choice`` after the context (lm-evaluation-harness's rule,
delimiter " " by default), never generated. Every bad input is one :class:`TaskError` line naming the file
and the line.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from workbench.config.overrides import parse_value
from workbench.data.corpus.record_reader import RecordReader
from workbench.data.corpus.sources import Source, kind_of
from workbench.errors import WorkbenchError


class TaskError(WorkbenchError):
    pass


@dataclass(frozen=True)
class ChoiceItem:
    """One multiple-choice record: the context, the choices, the index of the right one."""
    context: str
    choices: tuple[str, ...]
    gold: int
    line: int = 0


@dataclass(frozen=True)
class GenItem:
    """One exact-match record: a prompt, and the answer(s) counted right. A chat record has ``messages``
    instead, ((role, content), ...) ending with the user's: the answer is the model's next reply through its
    chat template."""
    prompt: str
    answers: tuple[str, ...]
    line: int = 0
    messages: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Task:
    name: str
    kind: str                          # "mc" (multiple choice) | "gen" (exact match)
    source: str                        # the file, or "builtin"
    items: tuple
    metric: str = "acc_norm"           # mc: which accuracy the task reports as its score (acc | acc_norm)
    delimiter: str = " "               # mc: between the context and each choice
    until: tuple[str, ...] = ("\n",)   # gen: where an answer ends
    max_new_tokens: int = 32           # gen
    shape: str = ""                    # how the records were read (for messages)
    description: str = ""
    note: str = ""                     # how its scores differ from the reference's (said when it is scored)

    @property
    def metrics(self) -> tuple[str, ...]:
        """The metrics scoring reports for this task; the first is its score."""
        return ("centered", "acc", "acc_norm") if self.kind == "mc" else ("exact", "contains")

    @property
    def digest(self) -> str:
        """What identifies the items scored (their text, choices, golds and the scoring options): scores are
        compared only between equal digests, so an edited task file or a changed built-in task is never
        compared with its old self."""
        opts = (self.kind, self.metric, self.delimiter, self.until, self.max_new_tokens)
        return hashlib.sha256(repr((opts, self.items)).encode()).hexdigest()[:12]

    @property
    def chance(self) -> float:
        """The accuracy of guessing: the mean of 1/n over the items (0 for exact match)."""
        if self.kind != "mc" or not self.items:
            return 0.0
        return sum(1 / len(it.choices) for it in self.items) / len(self.items)


# Options a sidecar or --set may give, with their types.
OPTIONS: dict[str, type] = {"name": str, "kind": str, "metric": str, "delimiter": str, "until": list,
                            "max_new_tokens": int, "context_field": str, "choices_field": str, "gold_field": str,
                            "prompt_field": str, "answer_field": str}
SHAPES = ('{"query"|"context"|"question", "choices": [...], "gold"|"label"|"answer": i}',
          'HellaSwag {"ctx", "endings", "label"} (or its "activity_label", "ctx_a", "ctx_b")',
          'ARC {"question", "choices": {"text", "label"}, "answerKey"}',
          '{"prompt", "answer"}', 'chat {"messages": [..., assistant answer]}')


def task_options(items: list[str] | None) -> dict[str, Any]:
    """``--set key=value`` items as task options (checked against :data:`OPTIONS`)."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise TaskError(f"--set {item!r}: expected key=value, e.g. --set gold_field=answer_idx")
        out[key.strip()] = parse_value(value)
    return _checked(out, "--set")


def _checked(opts: dict[str, Any], where: str) -> dict[str, Any]:
    for key, value in opts.items():
        want = OPTIONS.get(key)
        if want is None:
            raise TaskError(f"{where}: unknown task option {key!r}; the options are {', '.join(OPTIONS)}")
        if want is list:
            value = [value] if isinstance(value, str) else value
            if not (isinstance(value, list) and value and all(isinstance(v, str) and v for v in value)):
                raise TaskError(f"{where}: {key} must be a string or a list of non-empty strings")
            opts[key] = value
        elif want is int and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise TaskError(f"{where}: {key} must be a whole number of at least 1, not {value!r}")
        elif want is str and not isinstance(value, str):
            opts[key] = str(value)
    if opts.get("kind", "mc") not in ("mc", "gen"):
        raise TaskError(f"{where}: kind must be mc (multiple choice) or gen (exact match), not {opts['kind']!r}")
    if opts.get("metric", "acc") not in ("acc", "acc_norm"):
        raise TaskError(f"{where}: metric must be acc (summed log-likelihood) or acc_norm (per character), "
                        f"not {opts['metric']!r}")
    return opts


def sidecar_path(path: Path) -> Path:
    """``qa.jsonl``, ``qa.jsonl.gz`` -> ``qa.toml``."""
    name = path.name
    for suffix in (".gz", ".zst", ".xz", ".jsonl", ".json"):
        name = name.removesuffix(suffix)
    return path.with_name(name + ".toml")


def _sidecar(path: Path) -> dict[str, Any]:
    side = sidecar_path(path)
    if not side.is_file():
        return {}
    try:
        opts = tomllib.loads(side.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise TaskError(f"task sidecar {side}: {e}; fix the TOML or remove the file") from None
    return _checked(opts, f"task sidecar {side}")


def _records(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, record) of a task file; every bad line is a TaskError."""
    kind, compression = kind_of(path)
    if kind != "jsonl":
        raise TaskError(f"task {path}: a task file is JSON lines (.jsonl, optionally .gz/.zst/.xz), one record a "
                        "line; or name a built-in task (workbench eval --list-tasks)")
    try:
        src = Source(str(path), kind, compression, path.stat().st_size, 0)
    except OSError as e:
        raise TaskError(f"cannot read task {path}: {e.strerror}") from None
    reader = RecordReader(label="task", error=TaskError, fix="fix the line")
    for where, rec in reader.records(src):
        yield where.number, rec


@dataclass
class _Shape:
    """How one file's records become items."""
    name: str
    kind: str
    context: str = ""
    choices: str = ""
    gold: str = ""
    arc: bool = False
    hellaswag: bool = False            # the real HellaSwag fields: lm-eval's preprocessing

    def item(self, rec: dict, n: int, where: str) -> ChoiceItem | GenItem:
        def need(key: str, kinds: tuple[type, ...], what: str) -> Any:
            if key not in rec:
                raise TaskError(f"{where}, line {n}: no {key!r} field (this file's records are {self.name}; "
                                f"the record has {', '.join(map(repr, rec)) or 'no fields'})")
            v = rec[key]
            if not isinstance(v, kinds) or isinstance(v, bool):
                raise TaskError(f"{where}, line {n}: {key!r} must be {what}, not {type(v).__name__}")
            return v

        if self.name == "chat":
            return _chat_item(rec, n, where)
        if self.kind == "gen":
            prompt = need(self.context, (str,), "a string")
            ans = need(self.gold, (str, list), "a string or a list of strings")
            answers = (ans,) if isinstance(ans, str) else tuple(ans)
            if not answers or not all(isinstance(a, str) and a.strip() for a in answers):
                raise TaskError(f"{where}, line {n}: {self.gold!r} must hold a non-empty answer")
            return GenItem(prompt, answers, n)
        if self.arc:
            q = need("question", (str,), "a string")
            ch = need("choices", (dict,), 'an object {"text": [...], "label": [...]}')
            texts, labels = ch.get("text"), ch.get("label")
            if not (isinstance(texts, list) and isinstance(labels, list) and len(texts) == len(labels)):
                raise TaskError(f"{where}, line {n}: choices must have lists 'text' and 'label' of one length")
            key = need("answerKey", (str, int), "a label")
            if str(key) not in [str(x) for x in labels]:
                raise TaskError(f"{where}, line {n}: answerKey {key!r} is not one of the labels "
                                f"{', '.join(map(str, labels))}")
            context, choices, gold = f"Question: {q}\nAnswer:", texts, [str(x) for x in labels].index(str(key))
        elif self.hellaswag:
            label, a, b = (need(k, (str,), "a string") for k in ("activity_label", "ctx_a", "ctx_b"))
            endings = need("endings", (list,), "a list of strings")
            context = hellaswag_preprocess(label + ": " + a + " " + b.capitalize())
            choices = [hellaswag_preprocess(e) if isinstance(e, str) else e for e in endings]
            gold = self._gold(need(self.gold, (int, str), "the index of the right choice"), choices, n, where)
        else:
            context = need(self.context, (str,), "a string")
            choices = need(self.choices, (list,), "a list of strings")
            gold = self._gold(need(self.gold, (int, str), "the index of the right choice"), choices, n, where)
        if len(choices) < 2 or not all(isinstance(c, str) for c in choices):
            raise TaskError(f"{where}, line {n}: a record needs at least two choices, each a string")
        if not 0 <= gold < len(choices):
            raise TaskError(f"{where}, line {n}: gold index {gold} is out of range for {len(choices)} choices "
                            f"(0 to {len(choices) - 1})")
        if len(set(choices)) == 1:
            raise TaskError(f"{where}, line {n}: all {len(choices)} choices are the same text, so no answer can be "
                            "told apart; fix or drop the record")
        return ChoiceItem(context, tuple(choices), gold, n)

    def _gold(self, g: int | str, choices: list, n: int, where: str) -> int:
        if isinstance(g, str):
            if not g.strip().isdigit():
                raise TaskError(f"{where}, line {n}: {self.gold!r} is {g!r}; it must be the index of the right "
                                f"choice (0 to {len(choices) - 1})")
            g = int(g)
        return g


def hellaswag_preprocess(text: str) -> str:
    """lm-evaluation-harness's ``preprocess`` for HellaSwag (lm_eval/tasks/hellaswag/utils.py, 0.4.x): WikiHow's
    bracketed markers out, `` [title]`` as the end of a sentence."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    text = text.replace("  ", " ")
    return text


HELLASWAG_FIELDS = {"activity_label", "ctx_a", "ctx_b"}


def _first(rec: dict, names: tuple[str, ...]) -> str | None:
    return next((k for k in names if k in rec), None)


def detect_shape(rec: dict, opts: dict[str, Any], path: Path) -> _Shape:
    """The shape of a file's records, from its first record and the options that map fields."""
    where = f"task {path}"
    mapped = {k: opts[k] for k in ("context_field", "choices_field", "gold_field", "prompt_field", "answer_field")
              if k in opts}
    if opts.get("kind") == "gen" or "prompt_field" in mapped or "answer_field" in mapped:
        return _Shape("prompt/answer", "gen", mapped.get("prompt_field", "prompt"),
                      gold=mapped.get("answer_field", "answer"))
    if mapped:
        context = mapped.get("context_field") or _first(rec, ("query", "context", "question", "ctx")) or "query"
        return _Shape("mapped", "mc", context, mapped.get("choices_field", "choices"),
                      mapped.get("gold_field") or _first(rec, ("gold", "label", "answer")) or "gold")
    if {"ctx", "endings", "label"} <= rec.keys() or {"endings", "label"} | HELLASWAG_FIELDS <= rec.keys():
        real = HELLASWAG_FIELDS <= rec.keys()
        return _Shape("HellaSwag" if real else "HellaSwag (ctx as given)", "mc", "ctx", "endings", "label",
                      hellaswag=real)
    if {"question", "answerKey"} <= rec.keys() and isinstance(rec.get("choices"), dict):
        return _Shape("ARC", "mc", arc=True)
    ctx, gold = _first(rec, ("query", "context", "question")), _first(rec, ("gold", "label", "answer"))
    if ctx and gold and isinstance(rec.get("choices"), list):
        return _Shape("multiple choice", "mc", ctx, "choices", gold)
    if "prompt" in rec and "answer" in rec:
        return _Shape("prompt/answer", "gen", "prompt", gold="answer")
    if "messages" in rec:
        return _Shape("chat", "gen")
    raise TaskError(f"{where}, line 1: no task shape matches the fields {', '.join(map(repr, rec)) or '(none)'}; "
                    f"accepted: {'; '.join(SHAPES)}; or map fields in {sidecar_path(path).name} "
                    "or with --set (e.g. --set context_field=q choices_field=options gold_field=idx)")


def _chat_item(rec: dict, n: int, where: str) -> GenItem:
    """{"messages": [..., {"role": "assistant", "content": answer}]}, or {"messages": [... user], "answer"}."""
    msgs = rec.get("messages")
    if not (isinstance(msgs, list) and msgs and all(
            isinstance(m, dict) and m.get("role") in ("system", "user", "assistant")
            and isinstance(m.get("content"), str) for m in msgs)):
        raise TaskError(f"{where}, line {n}: 'messages' must be a list of {{\"role\": system|user|assistant, "
                        "\"content\": text}")
    if "answer" in rec:
        ans = rec["answer"]
        answers = (ans,) if isinstance(ans, str) else tuple(ans) if isinstance(ans, list) else ()
    elif msgs[-1]["role"] == "assistant":
        answers, msgs = (msgs[-1]["content"],), msgs[:-1]
    else:
        answers = ()
    if not answers or not all(isinstance(a, str) and a.strip() for a in answers):
        raise TaskError(f"{where}, line {n}: a chat task record ends with the assistant's answer, or has "
                        "\"answer\" beside messages that end with the user's")
    if not msgs or msgs[-1]["role"] != "user":
        raise TaskError(f"{where}, line {n}: the conversation before the answer must end with a user message")
    return GenItem("", answers, n, tuple((m["role"], m["content"]) for m in msgs))


def read_task_file(path: Path, opts: dict[str, Any] | None = None, limit: int | None = None) -> Task:
    """A task from a JSONL file: the sidecar's options, then ``opts`` (``--set``) over them."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise TaskError(f"task {path} does not exist; give a JSONL file or a built-in task "
                        "(workbench eval --list-tasks)")
    opts = {**_sidecar(path), **(opts or {})}
    where = f"task {path}"
    shape, items = None, []
    for n, rec in _records(path):
        if shape is None:
            shape = detect_shape(rec, opts, path)
        items.append(shape.item(rec, n, where))
        if limit and len(items) >= limit:
            break
    if shape is None:
        raise TaskError(f"{where} has no records; a task needs at least one JSON object a line")
    kind = shape.kind
    metric = opts.get("metric", "acc_norm" if shape.name.startswith("HellaSwag") else "acc")
    note = ("its records have no activity_label, ctx_a and ctx_b: ctx and the endings are scored as given, not as "
            "lm-evaluation-harness's hellaswag task preprocesses them" if shape.name == "HellaSwag (ctx as given)"
            else "")
    return Task(name=opts.get("name") or sidecar_path(path).stem, kind=kind, source=str(path), items=tuple(items),
                metric=metric, delimiter=opts.get("delimiter", " "), until=tuple(opts.get("until", ["\n"])),
                max_new_tokens=opts.get("max_new_tokens", 32), shape=shape.name, note=note)


def _builtin_tasks() -> Mapping[str, Callable[[], Task]]:
    """The built-in tasks' builders by name."""
    from workbench.data.tasks.builtin_tasks import BUILTIN_TASKS  # lazily: builtin_tasks builds on this module's Task

    return BUILTIN_TASKS


def load_task(spec: str, opts: dict[str, Any] | None = None, limit: int | None = None) -> Task:
    """A built-in task by name, or a task file."""
    builtin = _builtin_tasks()
    if spec in builtin:
        task = builtin[spec]()
        if opts:
            unknown = set(opts) - {"name", "metric"}
            if unknown:
                raise TaskError(f"built-in task {spec}: only name and metric can be set, not {', '.join(unknown)}")
            task = replace(task, **opts)
        return replace(task, items=task.items[:limit]) if limit else task
    return read_task_file(Path(spec), opts, limit)


def expand_task_specs(specs: list[str]) -> list[str]:
    """``builtin`` stands for every built-in task."""
    out: list[str] = []
    for s in specs:
        for one in (list(_builtin_tasks()) if s == "builtin" else [s]):
            if one not in out:
                out.append(one)
    return out


def absolute_task_spec(spec: str) -> str:
    """A task as a run's preset keeps it: built-in names as they are, files as absolute paths."""
    return spec if spec in _builtin_tasks() or spec == "builtin" else str(Path(spec).expanduser().absolute())


__all__ = ["ChoiceItem", "GenItem", "OPTIONS", "Task", "TaskError", "absolute_task_spec", "expand_task_specs",
           "hellaswag_preprocess", "load_task", "read_task_file", "sidecar_path", "task_options"]
