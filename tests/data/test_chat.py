"""Chat data: every record shape read into conversations, bad records one line each, templates rendered in the
sandbox, and tokens and loss masks equal to transformers' ``apply_chat_template`` on real models' templates
(tests/fixtures/chat_templates), with the masks checked token by token: no prompt token trained, every
assistant turn's end-of-turn token trained, ``last_assistant`` training the last turn alone."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from tests.support.files import zst_open
from workbench.data.chat.chat_data import sniff_kind
from workbench.data.chat.chat_templates import (
    CHATML_END,
    CHATML_PIECES,
    CHATML_START,
    ChatTemplate,
    ChatTemplateError,
    chatml_template,
    end_of_turn,
    load_chat_template,
    model_template,
    trained_spans,
)
from workbench.data.chat.conversations import (
    BadRecord,
    ChatEncoder,
    ChatOptions,
    ChatReader,
    Conversation,
    Message,
    detect_format,
    offsets_mask,
    special_pieces,
)
from workbench.data.corpus.documents import Stats
from workbench.data.corpus.sources import CorpusError, expand
from workbench.data.text.tokenizer import HFTokenizer

FIXTURES = Path(__file__).parent.parent / "fixtures" / "chat_templates"


def _write(path: Path, rows: list, opener=open) -> Path:
    with opener(path, "wt", encoding="utf-8") as f:
        f.write("".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in rows))
    return path


def _read(path: Path, **options) -> list[Conversation]:
    return list(ChatReader(ChatOptions(**options)).conversations(expand(str(path))))


def _roles(conv: Conversation) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in conv.messages]


# ----------------------------------------------------------------------------- records

WANT = [("system", "Be brief."), ("user", "Capital of France?"), ("assistant", "Paris.")]
SHAPES = {
    "messages": {"messages": [{"role": r, "content": c} for r, c in WANT]},
    "sharegpt": {"conversations": [{"from": {"user": "human", "assistant": "gpt"}.get(r, r), "value": c}
                                   for r, c in WANT]},
    "sharegpt_top_system": {"system": "Be brief.", "conversations": [{"from": "human", "value": "Capital of France?"},
                                                                     {"from": "gpt", "value": "Paris."}]},
    "alpaca": {"system": "Be brief.", "instruction": "Capital of France?", "input": "", "output": "Paris."},
    "prompt_completion": {"system": "Be brief.", "prompt": "Capital of France?", "completion": "Paris."},
    "prompt_completion_lists": {"prompt": [{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": "Capital of France?"}],
                                "completion": [{"role": "assistant", "content": "Paris."}]},
}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("compression", ["", ".gz", ".zst"])
def test_every_shape_reads_the_same_conversation(tmp_path, shape, compression):
    opener = {"": open, ".gz": gzip.open, ".zst": zst_open}[compression]
    path = _write(tmp_path / f"chat.jsonl{compression}", [SHAPES[shape]] * 2, opener)
    convs = _read(path)
    assert [_roles(c) for c in convs] == [WANT, WANT]
    assert convs[1].where == f"corpus file {path}, line 2"


def test_alpaca_input_follows_the_instruction_on_a_new_line(tmp_path):
    path = _write(tmp_path / "a.jsonl", [{"instruction": "Translate.", "input": "chat", "output": "Katze"}])
    assert _roles(_read(path)[0]) == [("user", "Translate.\nchat"), ("assistant", "Katze")]


def test_parquet_reads_as_jsonl_does(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    hey = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hey"}]}
    rows = [SHAPES["messages"], hey]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "chat.parquet")
    convs = _read(tmp_path / "chat.parquet")
    assert [_roles(c) for c in convs] == [WANT, [("user", "Hi"), ("assistant", "Hey")]]
    assert convs[1].where.endswith("chat.parquet, row 2")
    assert sniff_kind(expand(str(tmp_path / "chat.parquet"))[0], ChatOptions()) == "chat"
    alpaca = [{"instruction": "Capital of France?", "input": None, "output": "Paris.", "system": "Be brief."}]
    pq.write_table(pa.Table.from_pylist(alpaca), tmp_path / "alpaca.parquet")
    assert [_roles(c) for c in _read(tmp_path / "alpaca.parquet")] == [WANT]


def test_messages_field_and_role_names_map_other_shapes(tmp_path):
    rec = {"dialog": [{"role": "persona", "content": "Be brief."},
                      {"role": "customer", "content": "Capital of France?"}, {"role": "bot", "content": "Paris."}]}
    path = _write(tmp_path / "d.jsonl", [rec])
    roles = {"persona": "system", "customer": "user", "bot": "assistant"}
    assert _roles(_read(path, messages_field="dialog", roles=roles)[0]) == WANT
    with pytest.raises(CorpusError, match=r"data.chat_roles maps 'bot' to 'robot'; map each name to one of "):
        _read(path, messages_field="dialog", roles={"bot": "robot"})


def test_detect_format_says_which_shape_or_none():
    assert detect_format(SHAPES["messages"]).name == "messages"
    assert detect_format(SHAPES["sharegpt"]).name == "sharegpt"
    assert detect_format(SHAPES["alpaca"]).name == "alpaca"
    assert detect_format(SHAPES["prompt_completion"]).name == "prompt/completion"
    assert detect_format({"text": "plain"}) is None
    assert detect_format({"text": "x"}, ChatOptions(messages_field="turns")).field == "turns"


def test_sniff_kind_reads_one_record_and_tells_text_from_chat(tmp_path):
    chat = _write(tmp_path / "c.jsonl", [SHAPES["sharegpt"], "not json"])
    text = _write(tmp_path / "t.jsonl", [{"text": "a document"}])
    pairs = _write(tmp_path / "p.jsonl", [{"prompt": "Q?", "chosen": "yes", "rejected": "no"}])
    assert sniff_kind(expand(str(chat))[0], ChatOptions()) == "chat"
    assert sniff_kind(expand(str(text))[0], ChatOptions()) == "text"
    assert sniff_kind(expand(str(pairs))[0], ChatOptions()) == "pairs"


BAD = {
    "no assistant": ({"messages": [{"role": "user", "content": "Hi"}]},
                     r"line 2: the conversation has no assistant message, so there is nothing to train on "
                     r"\(its roles: user\)"),
    "unknown role": ({"messages": [{"role": "user", "content": "Hi"}, {"role": "robot", "content": "Hey"}]},
                     r"line 2: message 2 has an unknown role 'robot' \(known: .*\); map it with data.chat_roles"),
    "empty content": ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "  "}]},
                      r"line 2: message 2 \(assistant\) has empty content"),
    "content not a string": ({"messages": [{"role": "user", "content": ["Hi"]}, {"role": "assistant", "content": "x"}]},
                             r"line 2: message 1 \(user\): its content is a list, not a string"),
    "no messages": ({"messages": []}, r"line 2: 'messages' is an empty list, not a list of messages"),
    "not json": ("{oops", r"line 2: not valid JSON \(Expecting property name enclosed in double quotes"),
    "message keys": ({"messages": [{"speaker": "user", "text": "Hi"}]},
                     r"line 2: message 1 of 'messages' needs \"role\" and \"content\""),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_record_is_one_line_naming_the_file_and_line_or_is_skipped(tmp_path, case):
    rec, pattern = BAD[case]
    path = _write(tmp_path / "c.jsonl", [SHAPES["messages"], rec, SHAPES["messages"]])
    with pytest.raises(BadRecord) as e:
        _read(path)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"corpus file {path}, line 2: ")
    assert msg.endswith("set data.skip_bad_records = true to skip bad records")
    assert re.search(pattern, msg), msg
    stats = Stats()
    convs = list(ChatReader(ChatOptions(skip_bad=True), stats).conversations(expand(str(path))))
    assert len(convs) == 2 and stats.skipped_records == 1 and stats.first_bad_record.startswith(f"corpus file {path}")


def test_files_that_are_not_chat_are_refused_with_the_accepted_shapes(tmp_path):
    text = _write(tmp_path / "t.jsonl", [{"text": "a document"}])
    with pytest.raises(CorpusError, match=r"the first record is no chat shape \(its fields: 'text'\); accepted: "
                                          r"OpenAI .*data.messages_field"):
        _read(text)
    (tmp_path / "notes.txt").write_text("plain\n")
    with pytest.raises(CorpusError, match=r"notes.txt is text, not chat records"):
        _read(tmp_path / "notes.txt")
    array = tmp_path / "a.jsonl"
    array.write_text(json.dumps([SHAPES["messages"]]))
    with pytest.raises(CorpusError, match=r"is one JSON array, not JSON lines"):
        _read(array)
    only_bad = _write(tmp_path / "b.jsonl", [BAD["no assistant"][0]])
    with pytest.raises(CorpusError, match=r"no conversations in .*b.jsonl \(1 bad record\(s\) skipped\)"):
        _read(only_bad, skip_bad=True)


def test_a_truncated_compressed_file_is_named(tmp_path):
    path = _write(tmp_path / "c.jsonl.gz", [SHAPES["messages"]] * 200, gzip.open)
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(CorpusError, match=r"c.jsonl.gz is truncated or corrupt \(gz"):
        _read(path)


# ----------------------------------------------------------------------------- templates

TWO_TURNS = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
             {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]


def test_builtin_chatml_renders_chatml_and_names_its_pieces():
    t = chatml_template()
    assert CHATML_PIECES == ("<|im_start|>", "<|im_end|>") == (CHATML_START, CHATML_END)
    prompt = t.render(TWO_TURNS[:1], add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    text, spans = trained_spans(t, TWO_TURNS)
    assert text == ("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
                    "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n")
    assert [text[a:b] for a, b in spans] == ["Hello!<|im_end|>", "4<|im_end|>"]
    assert [text[a:b] for a, b in trained_spans(t, TWO_TURNS, "last_assistant")[1]] == ["4<|im_end|>"]
    assert trained_spans(t, TWO_TURNS, "all")[1] == [(0, len(text))]
    assert end_of_turn(t, CHATML_PIECES) == CHATML_END


def test_templates_run_in_the_sandbox_with_transformers_helpers():
    def render(text, **kw):
        return ChatTemplate(text, "t.jinja", tuple(kw.items())).render(TWO_TURNS)

    assert render("{{ {'a': '<b>', 'é': 1} | tojson }}") == '{"a": "<b>", "é": 1}'
    assert render("{{ bos_token }}{{ messages | length }}", bos_token="<s>") == "<s>4"
    assert len(render("{{ strftime_now('%Y') }}")) == 4
    loop = "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}{% endfor %}"
    assert render(loop) == "Hi"
    assert render("{% generation %}kept{% endgeneration %}") == "kept"
    with pytest.raises(ChatTemplateError, match=r"chat template t.jinja fails: Only user and assistant roles"):
        render("{{ raise_exception('Only user and assistant roles are supported!') }}")
    with pytest.raises(ChatTemplateError, match=r"fails: .*unsafe|fails: .*not safely"):
        render("{{ ''.__class__.__mro__ }}")
    with pytest.raises(ChatTemplateError, match=r"fails: .*may not set '_x'"):
        render("{% set ns = namespace(_x=1) %}")
    with pytest.raises(ChatTemplateError, match=r"t.jinja does not compile \(line 1: "):
        render("{% for m in messages %}")


def test_llama_3_2_dates_itself_today_unless_a_date_is_pinned():
    import datetime
    t = load_chat_template(str(FIXTURES / "llama3_2.jinja"))
    assert f"Today Date: {datetime.datetime.now().strftime('%d %b %Y')}\n" in t.render(TWO_TURNS)
    assert "Today Date: 01 Jan 2030\n" in t.with_variables(date_string="01 Jan 2030").render(TWO_TURNS)


def test_templates_that_cannot_be_masked_are_refused_in_one_line():
    cases = {
        "no generation prompt": ("{% for m in messages %}{{ m.role }}: {{ m.content }}<|im_end|>\n{% endfor %}",
                                 "it renders nothing for add_generation_prompt"),
        "no end token": ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant: {% endif %}",
                         "it does not end an assistant turn with a token"),
        "text end": ("{% for m in messages %}{{ m.role }}: {{ m.content }} ### END\n{% endfor %}"
                     "{% if add_generation_prompt %}assistant: {% endif %}",
                     "it ends an assistant turn with '### END', which is not one special token"),
        "not a prefix": ("{{ messages | length }}{% for m in messages %}{{ m.role }}: {{ m.content }}<|im_end|>"
                         "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}",
                         "does not begin with what the template renders for its prompt"),
    }
    for name, (text, why) in cases.items():
        with pytest.raises(ChatTemplateError) as e:
            end_of_turn(ChatTemplate(text, f"{name}.jinja"), ["<|im_end|>"])
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(f"chat template {name}.jinja cannot be masked: ") and why in msg, msg
        assert msg.endswith('the loss would fall on the wrong tokens, so choose another with data.chat_template '
                            '(e.g. "chatml")')


def test_a_template_that_rewrites_history_can_train_the_last_turn_alone():
    """Like Qwen3's: the last assistant message gets a thinking block that an earlier one loses, so the earlier
    turns' tokens are not what their prompts led to; last_assistant needs no earlier turn and works."""
    t = ChatTemplate("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' and loop.last %}"
                     "<think></think>{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
                     "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}", "qwen3ish.jinja")
    with pytest.raises(ChatTemplateError, match=r"cannot be masked: rendering a later message changes how assistant "
                                                r"message 3 was rendered .* train.loss_on = \"last_assistant\""):
        end_of_turn(t, CHATML_PIECES)
    assert end_of_turn(t, CHATML_PIECES, "last_assistant") == CHATML_END
    text, spans = trained_spans(t, TWO_TURNS, "last_assistant")
    assert [text[a:b] for a, b in spans] == ["<think></think>4<|im_end|>"]


def test_offsets_mask_counts_every_character_a_token_holds():
    spans = [(5, 9)]
    assert offsets_mask([(0, 3), (3, 5), (5, 7), (7, 9), (9, 12)], spans) == [0, 0, 1, 1, 0]
    # offsets trimmed of a leading space (" word" as (6, 10)): the token still holds character 5
    assert offsets_mask([(0, 5), (6, 10), (10, 12)], [(5, 6)]) == [0, 1, 0]
    # a character split into byte-level tokens: each has it
    assert offsets_mask([(0, 5), (5, 6), (5, 6), (6, 8)], [(5, 6)]) == [0, 1, 1, 0]
    assert offsets_mask([(0, 4), (4, 8)], [(0, 1), (7, 8)]) == [1, 1]
    assert offsets_mask([(0, 4), (4, 8)], []) == [0, 0]


def test_a_model_directory_gives_its_template_and_special_tokens(tmp_path):
    config = {"bos_token": {"content": "<s>"}, "eos_token": "</s>", "pad_token": None,
              "chat_template": [{"name": "tool_use", "template": "T"},
                                {"name": "default", "template": "{{ bos_token }}D"}]}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    t = load_chat_template("model", tmp_path)
    assert t.render(TWO_TURNS) == "<s>D" and dict(t.variables) == {"bos_token": "<s>", "eos_token": "</s>"}
    (tmp_path / "chat_template.jinja").write_text("J{{ eos_token }}")
    assert model_template(tmp_path).render(TWO_TURNS) == "J</s>"
    assert load_chat_template(str(FIXTURES / "smollm2.jinja"), tmp_path).variables == t.variables
    assert load_chat_template("chatml", tmp_path).text == chatml_template().text
    assert load_chat_template(str(tmp_path / "tokenizer_config.json")).render(TWO_TURNS) == "<s>D"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ChatTemplateError, match=r"model .*empty has no chat template \(no chat_template.jinja, no "
                                                r"chat_template in tokenizer_config.json\); set data.chat_template = "
                                                r"\"chatml\""):
        load_chat_template("model", empty)
    with pytest.raises(ChatTemplateError, match=r"data.chat_template = 'nope.jinja': no such file"):
        load_chat_template("nope.jinja", empty)


# ----------------------------------------------------------------------------- against transformers

# Templates (tests/fixtures/chat_templates) -> the special tokens they need and the tokenizer's bos/eos.
CHATML_TOKENS = dict(specials=["<|im_end|>"], bos=None, eos="<|im_end|>")
LLAMA_TOKENS = dict(specials=["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
                    bos="<|begin_of_text|>", eos="<|eot_id|>")
TEMPLATES = {"smollm2": CHATML_TOKENS, "smollm2_generation": CHATML_TOKENS, "qwen2_5": CHATML_TOKENS,
             "llama3_1": LLAMA_TOKENS, "llama3_2": LLAMA_TOKENS, "llama3_training": LLAMA_TOKENS}
GENERATION_TAGGED = ("smollm2_generation", "llama3_training")
END = {"smollm2": "<|im_end|>", "smollm2_generation": "<|im_end|>", "qwen2_5": "<|im_end|>",
       "llama3_1": "<|eot_id|>", "llama3_2": "<|eot_id|>", "llama3_training": "<|eot_id|>"}


def _m(*pairs: str) -> list[dict]:
    roles = {"s": "system", "u": "user", "a": "assistant"}
    return [{"role": roles[p[0]], "content": p[2:]} for p in pairs]


CONVERSATIONS = [
    _m("u:Hi", "a:Hello!"),
    _m("s:You are terse.", "u:Capital of France?", "a:Paris."),
    _m("u:Name a prime.", "a:7", "u:Another?", "a:11", "u:And one more?", "a:13"),
    _m("s:", "u:Empty system prompt above.", "a:Noted."),
    _m("u:Grüße aus Köln! Ça va? 你好，世界 🚀", "a:Très bien, merci — 谢谢! 🙂 ñ ü ß"),
    _m("s:Réponds en français.", "u:Quelle heure est-il ?", "a:Il est midi. ✓"),
    _m("u:  leading and trailing spaces  ", "a:  padded answer  \n"),
    _m("u:Write code.", "a:```python\ndef f(x):\n\treturn x * 2\n```\nDone."),
    _m("u:First question", "a:First answer", "u:A question left unanswered"),
    _m("s:System one.", "u:Hi", "a:Hey", "s:System again, mid-conversation.", "u:Still there?", "a:Yes."),
    _m("u:Count.", "a:" + " ".join(str(i) for i in range(60))),
    _m("u:Math: 12345 + 678?", "a:12345 + 678 = 13023"),
    _m("u:Line endings\r\nwith CRLF\ttabs", "a:ok\r\nfine"),
    _m("u:Two answers follow.", "a:One.", "a:Two."),
    _m("s:Greet first.", "a:Hello, how can I help?", "u:Tell me a joke.", "a:Why did the chicken cross the road?"),
    _m("u:ok", "a:k"),
    _m("u:مرحبا بالعالم", "a:नमस्ते दुनिया"),
    _m("u:JSON please", "a:{\"a\": [1, 2, {\"b\": \"c\"}], \"d\": null}"),
    _m("u:Angle brackets <| not a token |> here", "a:<b>bold</b> & <|partial"),
    _m("s:" + "Long system prompt. " * 5, "u:q1", "a:a1", "u:q2", "a:a2", "u:q3", "a:a3", "u:q4", "a:a4"),
    _m("u:Leading space answer", "a: yes"),
]


@pytest.fixture(scope="module")
def chat_dirs(tmp_path_factory, hf_tokenizer_dir) -> dict[str, Path]:
    """For each template, a copy of the tests' byte-level tokenizer with the template's special tokens added and
    the template set, saved by transformers (tokenizer.json, tokenizer_config.json, chat_template.jinja)."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer
    root = tmp_path_factory.mktemp("chat-tok")
    out = {}
    for name, spec in TEMPLATES.items():
        tok = AutoTokenizer.from_pretrained(hf_tokenizer_dir)
        tok.add_tokens([AddedToken(s, special=True, normalized=False) for s in spec["specials"]], special_tokens=True)
        if spec["bos"]:
            tok.bos_token = spec["bos"]
        tok.eos_token = spec["eos"]
        tok.chat_template = (FIXTURES / f"{name}.jinja").read_text(encoding="utf-8")
        tok.save_pretrained(root / name)
        out[name] = root / name
    return out


def _ours(d: Path, loss_on: str = "assistant") -> tuple[ChatEncoder, HFTokenizer]:
    tok = HFTokenizer.load(d / "tokenizer.json")
    return ChatEncoder(load_chat_template("model", d), tok, loss_on), tok


def _conv(messages: list[dict], where: str = "test") -> Conversation:
    return Conversation(tuple(Message(m["role"], m["content"]) for m in messages), where)


def _runs(ids: list[int], mask: list[int]) -> list[list[int]]:
    """The trained tokens, one list per run of consecutive 1s."""
    runs: list[list[int]] = []
    for j, (i, m) in enumerate(zip(ids, mask)):
        if m:
            if j == 0 or not mask[j - 1]:
                runs.append([])
            runs[-1].append(i)
    return runs


def assert_mask_trains_the_answers(ids, mask, messages, tok: HFTokenizer, end: str, loss_on: str, trim: bool):
    """The trained tokens are exactly each trained assistant message's content and its end-of-turn token: a prompt
    token trained, an end-of-turn token left out, or an earlier turn trained under last_assistant all fail."""
    answers = [m["content"] for m in messages if m["role"] == "assistant"]
    if loss_on == "last_assistant":
        answers = answers[-1:]
    runs = _runs(ids, mask)
    assert len(ids) == len(mask) and len(runs) == len(answers)
    for run, answer in zip(runs, answers):
        want = (answer.strip() if trim else answer) + end
        text = tok.tk.decode(run, skip_special_tokens=False)
        assert text.endswith(want) and run[-1] == tok.token_id(end), (text, want)
        extra = text[: len(text) - len(want)]
        if extra:  # only a token holding both the header's last characters and the answer's first, trained as
            # transformers trains it: byte-level BPE merges "\n" + "  answer" into "\n " + " answer"
            first = tok.tk.decode(run[:1], skip_special_tokens=False)
            assert first.startswith(extra) and want.startswith(first[len(extra):]) and len(first) > len(extra), text


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_tokens_equal_transformers_apply_chat_template(chat_dirs, name):
    from transformers import AutoTokenizer
    ref = AutoTokenizer.from_pretrained(chat_dirs[name])
    enc, tok = _ours(chat_dirs[name])
    assert enc.end == END[name]
    for messages in CONVERSATIONS:
        theirs = ref.apply_chat_template(messages, tokenize=True)
        theirs = theirs["input_ids"] if not isinstance(theirs, list) else theirs
        got = enc.encode(_conv(messages))
        assert got.text == ref.apply_chat_template(messages, tokenize=False)
        assert got.ids == list(theirs), messages
        assert_mask_trains_the_answers(got.ids, got.mask, messages, tok, END[name], "assistant",
                                       trim=name.startswith("llama"))


@pytest.mark.parametrize("name", GENERATION_TAGGED)
def test_assistant_mask_equals_transformers_generation_mask(chat_dirs, name):
    from transformers import AutoTokenizer
    ref = AutoTokenizer.from_pretrained(chat_dirs[name])
    enc, _ = _ours(chat_dirs[name])
    for messages in CONVERSATIONS:
        out = ref.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        got = enc.encode(_conv(messages))
        assert got.ids == list(out["input_ids"])
        assert got.mask == list(out["assistant_masks"]), messages


@pytest.mark.parametrize("name", ["smollm2", "qwen2_5", "llama3_2"])
def test_two_turn_mask_is_exactly_the_answers_and_their_end_tokens(chat_dirs, name):
    """Hand-checked: the trained ids are the answers' own encodings, each followed by the end-of-turn id."""
    enc, tok = _ours(chat_dirs[name])
    end_id = tok.token_id(END[name])
    got = enc.encode(_conv(TWO_TURNS))
    assert _runs(got.ids, got.mask) == [tok.encode("Hello!") + [end_id], tok.encode("4") + [end_id]]
    assert got.trained == len(tok.encode("Hello!")) + len(tok.encode("4")) + 2
    untrained = tok.tk.decode([i for i, m in zip(got.ids, got.mask) if not m], skip_special_tokens=False)
    assert "Hello!" not in untrained and "Hi" in untrained and "2+2?" in untrained
    last = ChatEncoder(enc.template, tok, "last_assistant").encode(_conv(TWO_TURNS))
    assert last.ids == got.ids and _runs(last.ids, last.mask) == [tok.encode("4") + [end_id]]
    every = ChatEncoder(enc.template, tok, "all").encode(_conv(TWO_TURNS))
    assert every.ids == got.ids and every.mask == [1] * len(got.ids)


@pytest.mark.parametrize("name", ["qwen2_5", "llama3_1"])
def test_last_assistant_trains_the_last_turn_alone(chat_dirs, name):
    enc, tok = _ours(chat_dirs[name], "last_assistant")
    for messages in CONVERSATIONS:
        got = enc.encode(_conv(messages))
        assert_mask_trains_the_answers(got.ids, got.mask, messages, tok, END[name], "last_assistant",
                                       trim=name.startswith("llama"))


def test_the_mask_checks_fail_on_a_broken_mask(chat_dirs):
    """The assertion the tests above rest on catches each way a mask goes wrong."""
    enc, tok = _ours(chat_dirs["smollm2"])
    messages = CONVERSATIONS[2]
    good = enc.encode(_conv(messages))
    assert_mask_trains_the_answers(good.ids, good.mask, messages, tok, "<|im_end|>", "assistant", trim=False)
    first = good.mask.index(1)
    end_id = tok.token_id("<|im_end|>")
    last_end = max(j for j, (i, m) in enumerate(zip(good.ids, good.mask)) if m and i == end_id)
    prompt_in = good.mask[: first - 1] + [1] + good.mask[first:]            # the header's last token trained
    end_out = good.mask[:last_end] + [0] + good.mask[last_end + 1:]         # the last <|im_end|> not trained
    for broken, loss_on in ((prompt_in, "assistant"), (end_out, "assistant"), (good.mask, "last_assistant")):
        with pytest.raises(AssertionError):
            assert_mask_trains_the_answers(good.ids, broken, messages, tok, "<|im_end|>", loss_on, trim=False)


def test_bad_conversations_for_a_template_name_the_record(chat_dirs):
    enc, _ = _ours(chat_dirs["smollm2"])
    templated = _m("u:<|im_start|>user\nHi<|im_end|>", "a:Hey")
    with pytest.raises(BadRecord, match=r"^corpus file c.jsonl, line 3: message 1 \(user\) contains the special "
                                        r"token <\|im_start\|> \(is the text templated already\?\)"):
        enc.encode(_conv(templated, "corpus file c.jsonl, line 3"))
    strict = ChatTemplate("{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system') }}"
                          "{% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}", "strict.jinja")
    enc = ChatEncoder(strict, enc.tok)
    assert enc.end == "<|im_end|>"
    with pytest.raises(BadRecord, match=r"^corpus file c.jsonl, line 4: chat template strict.jinja fails: no system$"):
        enc.encode(_conv(_m("s:x", "u:Hi", "a:Hey"), "corpus file c.jsonl, line 4"))


def test_a_tokenizer_without_the_templates_tokens_is_refused(hf_tokenizer_dir):
    tok = HFTokenizer.load(hf_tokenizer_dir / "tokenizer.json")
    assert "<|im_end|>" not in special_pieces(tok)
    with pytest.raises(ChatTemplateError, match=r"cannot be masked: it ends an assistant turn with '<\|im_end\|>', "
                                                r"which is not one special token of the tokenizer"):
        ChatEncoder(chatml_template(), tok)


# ----------------------------------------------------------------------------- workbench's own tokenizer

@pytest.fixture(scope="module")
def sp_tok():
    """workbench's own tokenizer as `workbench train` trains it: the ChatML pieces reserved as control pieces."""
    from tests.support.hf import corpus_text
    from workbench.data.text.tokenizer import train_tokenizer
    return train_tokenizer(corpus_text(), 600, num_threads=1)


def test_builtin_chatml_with_workbench_tokenizer(sp_tok):
    enc = ChatEncoder(chatml_template(), sp_tok)
    start, end = (sp_tok.sp.piece_to_id(p) for p in CHATML_PIECES)
    assert enc.end == CHATML_END and enc.end_id == end
    for messages in CONVERSATIONS:
        got = enc.encode(_conv(messages))
        assert got.ids.count(start) == len(messages) and got.ids.count(end) == len(messages)
        answers = [m["content"] for m in messages if m["role"] == "assistant"]
        runs = _runs(got.ids, got.mask)
        assert [r[-1] for r in runs] == [end] * len(answers)
        assert [sp_tok.decode(r) for r in runs] == answers  # the control piece decodes to nothing
        assert sp_tok.decode(got.ids) == got.text.replace(CHATML_START, "").replace(CHATML_END, "")
    got = enc.encode(_conv(TWO_TURNS))
    assert _runs(got.ids, got.mask) == [sp_tok.encode("Hello!") + [end], sp_tok.encode("4") + [end]]
    assert enc.prompt_ids(TWO_TURNS[:3]) == got.ids[: _last_run_start(got.mask)]


def _last_run_start(mask: list[int]) -> int:
    return max(j for j, m in enumerate(mask) if m and (j == 0 or not mask[j - 1]))


@pytest.mark.parametrize("name", ["smollm2", "qwen2_5", "llama3_2"])
def test_the_prompt_a_reply_is_generated_from_is_the_training_prefix(chat_dirs, name):
    """What the chat mode sends the model is exactly the tokens training put before the answer."""
    enc, _ = _ours(chat_dirs[name])
    for messages in CONVERSATIONS:
        last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
        if messages[last]["content"][:2].isspace():
            continue  # "\n  answer": the header's "\n" and a space are one token (the straddle above)
        got = ChatEncoder(enc.template, enc.tok, "last_assistant").encode(_conv(messages[: last + 1]))
        assert enc.prompt_ids(messages[:last]) == got.ids[: _last_run_start(got.mask)], messages
