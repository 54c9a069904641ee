"""Chat templates: a model's Jinja ``chat_template`` rendered as transformers renders it, workbench's built-in
ChatML, and the characters each assistant turn contributes (what the loss is computed on). No torch.

A template is data, never code: it runs in Jinja's ``ImmutableSandboxedEnvironment`` with the options and
helpers transformers gives it (``_compile_jinja_template`` in ``transformers/utils/chat_template_utils.py``):
``trim_blocks``, ``lstrip_blocks``, the ``loopcontrols`` extension, ``raise_exception``, ``strftime_now``, a
``tojson`` filter that does not escape HTML, and ``{% generation %}`` blocks (rendered; TRL's training
templates carry them). It is given ``messages``, ``add_generation_prompt``, ``tools=None``,
``documents=None`` and the tokenizer's named special tokens (``bos_token``, ``eos_token``, ...), as
``apply_chat_template`` gives them, so a conversation renders to the same text, character for character.

The trained characters come from rendering, not from marker strings: an assistant message at index ``i``
contributes ``render(messages[:i+1])`` minus ``render(messages[:i], add_generation_prompt=True)``, its content
and its end-of-turn token (whitespace after the token is left out: the model stops at the token and never
generates it). A template for which that is not a prefix, that adds nothing for ``add_generation_prompt`` (its
assistant header would be trained), or that does not end an assistant turn with a special token, cannot be
masked: :func:`end_of_turn` says so in one line before any record is read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, NoReturn

from workbench.data.corpus.record_reader import parse_json
from workbench.errors import WorkbenchError
from workbench.rundir import CHAT_TEMPLATE_FILE
from workbench.rundir import TEMPLATES_DIR as ADDITIONAL_TEMPLATES_DIR

if TYPE_CHECKING:  # jinja2 is imported where a template is compiled
    import jinja2

# workbench's own template, for a model trained from scratch with workbench's tokenizer: ChatML, no default
# system prompt, no BOS. The tokenizer must reserve CHATML_PIECES (each one id, never produced by text).
CHATML_START = "<|im_start|>"
CHATML_END = "<|im_end|>"
CHATML_PIECES = (CHATML_START, CHATML_END)
CHATML_TEMPLATE = (
    "{%- for message in messages %}\n"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "{{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)
PROCESSOR_TEMPLATE_FILE = "chat_template.json"          # older processors' {"chat_template": ...}
TOKENIZER_CONFIG = "tokenizer_config.json"
# The named special tokens apply_chat_template passes to a template (transformers' SPECIAL_TOKENS_ATTRIBUTES).
TOKEN_VARIABLES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
LOSS_ON = ("assistant", "last_assistant", "all")

# A conversation rendered to check a template can be masked and find how it ends an assistant turn (tried
# without the system message too: some templates refuse one).
_PROBE = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "Say a word."},
          {"role": "assistant", "content": "Word."}, {"role": "user", "content": "Say the word."},
          {"role": "assistant", "content": "Workbench probe answer."}]


class ChatTemplateError(WorkbenchError):
    pass


@lru_cache(maxsize=32)
def compile_template(text: str) -> jinja2.Template:
    """A chat template compiled in the sandbox, with transformers' options and helpers (cached by its text)."""
    # lazily: jinja2 (~60 ms) loads when a template is first compiled, not with the TUI or the CLI
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: rendered as its body (the spans come from rendering)."""
        tags = {"generation"}

        def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Callable[[], str]) -> str:
            return caller()

    class Namespace(jinja2.utils.Namespace):
        # as transformers': no underscore attributes on a namespace (a way towards CPython internals)
        def __init__(*args: Any, **kwargs: Any) -> None:
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a template may not set {name!r} on a namespace")

    def raise_exception(message: str) -> NoReturn:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | str | None = None,
               separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, namespace=Namespace)
    return env.from_string(text)


def _token_text(tok: Any) -> str | None:
    """A special token of tokenizer_config.json: a string or {"content": ...}."""
    if isinstance(tok, dict):
        tok = tok.get("content")
    return tok if isinstance(tok, str) and tok else None


@dataclass(frozen=True)
class ChatTemplate:
    """A Jinja chat template, where it came from, and the variables it is rendered with."""
    text: str
    source: str                                   # for messages: "chatml (built-in)", a file
    variables: tuple[tuple[str, str], ...] = ()   # bos_token, eos_token, ... (and e.g. date_string, to pin one)

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        """The conversation as the model reads it (``apply_chat_template(..., tokenize=False)``)."""
        import jinja2  # lazily, as in compile_template: for its syntax error
        try:
            template = compile_template(self.text)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"chat template {self.source} does not compile (line {e.lineno}: {e.message}); "
                                    "fix it or choose another with data.chat_template") from None
        try:
            return template.render(messages=[dict(m) for m in messages], tools=None, documents=None,
                                   add_generation_prompt=add_generation_prompt, **dict(self.variables))
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
            detail = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            raise ChatTemplateError(f"chat template {self.source} fails: {detail}") from None

    def with_variables(self, **values: str) -> "ChatTemplate":
        return ChatTemplate(self.text, self.source, tuple({**dict(self.variables), **values}.items()))


def chatml_template() -> ChatTemplate:
    return ChatTemplate(CHATML_TEMPLATE, "chatml (built-in)")


def token_variables(config: dict) -> dict[str, str]:
    """The named special tokens of a tokenizer_config.json, as apply_chat_template passes them."""
    return {k: t for k in TOKEN_VARIABLES if (t := _token_text(config.get(k))) is not None}


def _config(model_dir: Path) -> dict:
    path = model_dir / TOKENIZER_CONFIG
    if not path.is_file():
        return {}
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ChatTemplateError(f"{path} cannot be read ({e.strerror}); fix or remove it") from None
    config = parse_json(raw, str(path), ChatTemplateError, "fix or remove it")
    return config if isinstance(config, dict) else {}


def _named(value: Any, where: str) -> dict[str, str]:
    """A ``chat_template`` value as {name: template}: a string is the default; a list is transformers' named
    templates (``[{"name", "template"}]``)."""
    if value is None:
        return {}
    if isinstance(value, str):
        return {"default": value} if value else {}
    if isinstance(value, list):
        named = {}
        for x in value:
            if not (isinstance(x, dict) and isinstance(x.get("name"), str) and isinstance(x.get("template"), str)):
                raise ChatTemplateError(f"{where}: chat_template holds {str(x)[:60]!r}, not a "
                                        "{\"name\": ..., \"template\": ...} pair")
            named[x["name"]] = x["template"]
        return named
    raise ChatTemplateError(f"{where}: chat_template is {type(value).__name__}, not a string")


def _from_config(config: dict, where: str) -> str | None:
    """tokenizer_config.json's chat_template: a string, or a list of named ones (the one named "default")."""
    named = _named(config.get("chat_template"), where)
    if named and "default" not in named:
        raise ChatTemplateError(f"{where} has named chat templates ({', '.join(map(str, named))}) but none "
                                "named 'default'; give one as a .jinja file with data.chat_template = PATH")
    return named.get("default")


@dataclass(frozen=True)
class ModelTemplates:
    """Every chat template a model directory holds, in whichever form it was saved."""
    default: str | None                  # the one apply_chat_template uses (None: there is none)
    source: str                          # the file it came from (a name in the directory)
    others: tuple[tuple[str, str], ...]  # (name, template) of the other named ones (tool use, RAG, ...)


def model_templates(model_dir: Path) -> ModelTemplates:
    """A model directory's chat templates, as transformers reads them: ``chat_template.jinja`` (transformers 5)
    and named ones in ``additional_chat_templates/NAME.jinja``, else ``tokenizer_config.json``'s
    ``chat_template`` (a string, or a list of named templates whose ``default`` is the one), else an older
    processor's ``chat_template.json``. A name found in several forms takes the first of that order."""
    model_dir = Path(model_dir)
    found: dict[str, tuple[str, str]] = {}   # name -> (template, where), the lowest precedence first
    legacy = model_dir / PROCESSOR_TEMPLATE_FILE
    if legacy.is_file():
        for name, text in _named(_json_file(legacy).get("chat_template"), str(legacy)).items():
            found[name] = (text, PROCESSOR_TEMPLATE_FILE)
    for name, text in _named(_config(model_dir).get("chat_template"), str(model_dir / TOKENIZER_CONFIG)).items():
        found[name] = (text, TOKENIZER_CONFIG)
    extra = model_dir / ADDITIONAL_TEMPLATES_DIR
    if extra.is_dir():
        for f in sorted(extra.glob("*.jinja")):
            found[f.name[:-len(".jinja")]] = (_read_text(f), f"{ADDITIONAL_TEMPLATES_DIR}/{f.name}")
    if (model_dir / CHAT_TEMPLATE_FILE).is_file():
        found["default"] = (_read_text(model_dir / CHAT_TEMPLATE_FILE), CHAT_TEMPLATE_FILE)
    default, source = found.pop("default", (None, ""))
    return ModelTemplates(default or None, source, tuple(sorted((n, t) for n, (t, _w) in found.items())))


def model_template(model_dir: Path) -> ChatTemplate | None:
    """A model directory's own template (:func:`model_templates`' default), rendered with its
    tokenizer_config.json's special tokens. None if it has none."""
    model_dir = Path(model_dir)
    found = model_templates(model_dir)
    if found.default is None:
        if found.others:
            raise ChatTemplateError(f"{model_dir} has named chat templates ({', '.join(n for n, _t in found.others)})"
                                    " but none named 'default'; give one as a .jinja file with "
                                    "data.chat_template = PATH")
        return None
    source = str(model_dir / found.source) + (" (chat_template)" if found.source.endswith(".json") else "")
    return ChatTemplate(found.default, source, tuple(token_variables(_config(model_dir)).items()))


def run_template(run_dir: Path) -> ChatTemplate:
    """The chat template a chat-tuned run trained with (its chat_template.jinja, written at its start), with
    the special tokens of its tokenizer_config.json if it has one."""
    found = model_template(run_dir)
    if found is None:
        raise ChatTemplateError(f"run {Path(run_dir).name} was not trained on conversations (it has no "
                                f"{CHAT_TEMPLATE_FILE}); use a run trained with data.format = chat")
    return found


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ChatTemplateError(f"cannot read chat template {path}: {getattr(e, 'strerror', None) or e}") from None


def load_chat_template(spec: str, model_dir: Path | None = None) -> ChatTemplate:
    """``data.chat_template``: ``model`` (the model directory's own), ``chatml`` (built-in), or a path to a
    ``.jinja`` file or a ``tokenizer_config.json``. A file's template is rendered with the model's special
    tokens (``model_dir``'s tokenizer_config.json) if there is a model, else a tokenizer_config.json's own."""
    if spec == "chatml":
        return chatml_template()
    if spec == "model":
        found = model_template(model_dir) if model_dir is not None else None
        if found is None:
            what = f"model {model_dir}" if model_dir is not None else "a model trained from scratch"
            raise ChatTemplateError(f"{what} has no chat template (no {CHAT_TEMPLATE_FILE}, no chat_template in "
                                    f"{TOKENIZER_CONFIG}); set data.chat_template = \"chatml\" (its "
                                    f"{' and '.join(CHATML_PIECES)} pieces are added to the tokenizer) or to a "
                                    ".jinja file")
        return found
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ChatTemplateError(f"data.chat_template = {spec!r}: no such file; give \"model\", \"chatml\" or the "
                                "path of a .jinja file or a tokenizer_config.json")
    variables = tuple(token_variables(_config(Path(model_dir))).items()) if model_dir is not None else ()
    if path.suffix == ".json":
        config = _json_file(path)
        text = _from_config(config, str(path))
        if text is None:
            raise ChatTemplateError(f"{path} has no chat_template; give a .jinja file or a tokenizer_config.json "
                                    "that has one")
        return ChatTemplate(text, str(path), variables if model_dir is not None else
                            tuple(token_variables(config).items()))
    return ChatTemplate(_read_text(path), str(path), variables)


def _json_file(path: Path) -> dict:
    obj = parse_json(_read_text(path), str(path), ChatTemplateError)
    return obj if isinstance(obj, dict) else {}


# ----------------------------------------------------------------------------- the trained characters

def _unmaskable(template: ChatTemplate, why: str) -> ChatTemplateError:
    return ChatTemplateError(f"chat template {template.source} cannot be masked: {why}; the loss would fall on the "
                             "wrong tokens, so choose another with data.chat_template (e.g. \"chatml\")")


def trained_spans(template: ChatTemplate, messages: list[dict], loss_on: str = "assistant"
                  ) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans ``[start, end)`` the loss is computed on:
    ``assistant`` each assistant message, ``last_assistant`` the last one, ``all`` the whole text. An
    assistant span is its content and its end-of-turn token, never a header, system or user text."""
    if loss_on not in LOSS_ON:
        raise ValueError(f"loss_on must be one of {', '.join(LOSS_ON)}, not {loss_on!r}")
    text = template.render(messages)
    if loss_on == "all":
        return text, [(0, len(text))]
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if loss_on == "last_assistant":
        turns = turns[-1:]
    spans = []
    for i in turns:
        prompt = template.render(messages[:i], add_generation_prompt=True)
        upto = text if i == len(messages) - 1 else template.render(messages[: i + 1])
        if not upto.startswith(prompt):
            raise _unmaskable(template, f"the conversation up to assistant message {i + 1} does not begin with what "
                                        "the template renders for its prompt (add_generation_prompt)")
        if not text.startswith(upto):
            raise _unmaskable(template, f"rendering a later message changes how assistant message {i + 1} was "
                                        "rendered (as Qwen3's drops an earlier turn's thinking block); "
                                        "train.loss_on = \"last_assistant\" trains the last turn alone, which works")
        answer = upto[len(prompt):].rstrip()
        if not answer:
            raise _unmaskable(template, f"assistant message {i + 1} renders to nothing")
        spans.append((len(prompt), len(prompt) + len(answer)))
    return text, spans


def end_of_turn(template: ChatTemplate, special_tokens: Iterable[str], loss_on: str = "assistant") -> str:
    """The special token that ends an assistant turn in ``template`` (``<|im_end|>``, ``<|eot_id|>``), found
    by rendering a two-turn probe conversation; the check, before any record, that the template can be masked
    under ``loss_on`` (its generation prompt is the assistant's header, its rendering keeps prefixes, a token
    of ``special_tokens`` ends the turn)."""
    specials = sorted({s for s in special_tokens if s}, key=len, reverse=True)
    probe = _PROBE
    try:
        template.render(probe)
    except ChatTemplateError:
        probe = _PROBE[1:]
    if template.render(probe[:-1], add_generation_prompt=True) == template.render(probe[:-1]):
        raise _unmaskable(template, "it renders nothing for add_generation_prompt, so an assistant's header cannot "
                                    "be told from its answer")
    text, spans = trained_spans(template, probe, "last_assistant" if loss_on == "all" else loss_on)
    start, end = spans[-1]
    answer = text[start:end]
    content = probe[-1]["content"]
    cut = answer.rfind(content)
    if cut < 0:
        raise _unmaskable(template, "an assistant message's content does not appear where the template renders it")
    tail = answer[cut + len(content):].strip()
    if not tail:
        raise _unmaskable(template, "it does not end an assistant turn with a token, so the model could not learn "
                                    "to stop")
    found = next((s for s in specials if tail.endswith(s)), None)
    if found is None or tail != found:
        raise _unmaskable(template, f"it ends an assistant turn with {tail!r}, which is not one special token of "
                                    "the tokenizer (add it to the tokenizer as a special token)")
    return found


__all__ = ["ADDITIONAL_TEMPLATES_DIR", "CHATML_END", "CHATML_PIECES", "CHATML_START", "CHATML_TEMPLATE",
           "CHAT_TEMPLATE_FILE", "ChatTemplate", "ChatTemplateError", "LOSS_ON", "ModelTemplates",
           "PROCESSOR_TEMPLATE_FILE", "chatml_template", "compile_template", "end_of_turn", "load_chat_template",
           "model_template", "model_templates", "run_template", "token_variables", "trained_spans"]
