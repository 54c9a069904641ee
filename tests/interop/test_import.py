"""`workbench import`: Hugging Face Llama-family models become runs whose logits and token ids are the
model's own; a model directory is data, never code; bad input gets one line and nothing written."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from tests.support.cli import wb
from tests.support.hf import (
    CHAT_TEMPLATE,
    KINDS,
    TEMPLATE_FORMS,
    TOOL_TEMPLATE,
    VOCAB,
    build_chat_model,
    build_hf_model,
    chat_tokenizer,
    cli,
    transformers,
)
from tests.support.runs import tree
from workbench import rundir
from workbench.config import load_preset_file
from workbench.data.chat.chat_templates import ChatTemplateError, run_template
from workbench.data.text.tokenizer import HFTokenizer, load_tokenizer
from workbench.train.checkpoint import load_run_model

# Code, Unicode, whitespace of every kind, a special token's text, and the empty string.
TEXTS = ["def add(a, b):\n    return a + b  # two  spaces\n\n\tif x:\n\t\tpass\n",
         "café naïve Zürich — ½ ≠ ∞, 日本語のテキスト, emoji 🙂🚀", "   leading and trailing   \n\n\n",
         "\r\nWindows line\r\nends", "x" * 300, "numbers 1234567 3.14159 0xFF", "<|endoftext|> in the text", ""]


@pytest.mark.parametrize("kind", list(KINDS))
def test_imported_logits_equal_transformers(imported, hf_models, kind):
    """fp32, every position of two sequences longer than llama3-scaled's original context (32)."""
    loaded = load_run_model(imported / kind)
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_models[kind], dtype=torch.float32).eval()
    torch.manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, 100))
    model = loaded.model.eval()
    with torch.no_grad():
        ours, theirs = model(ids, targets=ids)[0], hf(ids).logits
    assert (ours - theirs).abs().max().item() <= 1e-4
    m = loaded.preset.model
    assert (m.attn_bias, m.qk_norm, m.tie_embeddings) == (kind == "qwen2-bias", kind == "qwen3-qknorm",
                                                          KINDS[kind][2]["tie_word_embeddings"])
    assert m.rope_scaling == ("llama3" if kind == "llama3-scaled" else "none")
    assert m.head_dim == (32 if kind == "qwen3-qknorm" else 16) and m.n_kv_heads == (4 if "mha" in kind else 2)


def test_token_ids_equal_the_hugging_face_tokenizer(imported, hf_models):
    """AutoTokenizer on a Llama directory uses tokenizer.json as it is. (On a Qwen2 directory transformers 5
    builds Qwen2's own pre-tokenizer instead, which the test tokenizer, GPT-2 style, does not have.)"""
    ours = load_tokenizer(imported / "llama-gqa-tied")
    theirs = transformers.AutoTokenizer.from_pretrained(hf_models["llama-gqa-tied"])
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == theirs(text, add_special_tokens=False)["input_ids"], text
        if "<|endoftext|>" not in text:
            assert ours.decode(ids) == text
            # bits per byte: the ids' byte lengths add up to the text's UTF-8 bytes
            assert int(ours.byte_lengths()[ids].sum()) == len(text.encode("utf-8")), text
    assert ours.eod_id == theirs.eos_token_id == 0 and ours.vocab_size == 400


def test_import_cli_makes_a_run(tmp_path, hf_models):
    cp = wb("import", str(hf_models["qwen2-bias"]), "--name", "q", "--runs-dir", str(tmp_path))
    assert cp.returncode == 0, cp.stderr
    assert "imported Qwen2ForCausalLM" in cp.stdout and "attention biases" in cp.stdout
    assert cp.stdout.strip().splitlines()[-1] == "q"
    # the estimate decides the method (full where it fits): the next step does not say LoRA before it has
    assert "`workbench train cpu-small --init-from q --corpus YOUR_TEXT` with the --set it recommends" in cp.stdout
    d = tmp_path / "q"
    assert {"preset.toml", "tokenizer.json", "tokenizer_config.json", "status.json", "metrics.jsonl",
            "checkpoints"} <= {p.name for p in d.iterdir()}
    p = load_preset_file(d / "preset.toml")
    assert p.source["architecture"] == "Qwen2ForCausalLM" and p.source["model"] == str(hf_models["qwen2-bias"])
    assert p.data.tokenizer == str(d / "tokenizer.json")
    assert rundir.read_status(d).state == "imported"
    [ck] = rundir.list_checkpoints(d)
    assert ck["step"] == 0 and ck["reason"] == "import"
    runs = json.loads(wb("runs", "--json", "--runs-dir", str(tmp_path), check=True).stdout)
    assert runs[0]["source"] == str(hf_models["qwen2-bias"]) and runs[0]["architecture"] == "Qwen2ForCausalLM"
    table = wb("runs", "--runs-dir", str(tmp_path), check=True).stdout
    assert "SOURCE" in table and "qwen2-bias" in table
    # an imported model is a starting point, not a run to continue
    cp = wb("resume", "q", "--runs-dir", str(tmp_path))
    assert cp.returncode == 2 and "--init-from q" in cp.stderr


def test_bin_weights_load_only_as_tensors(tmp_path, hf_models, imported):
    """pytorch_model.bin through torch.load(weights_only=True); a pickle that would run code is refused."""
    d = tmp_path / "bin"
    shutil.copytree(hf_models["llama-mha-untied"], d)
    from safetensors.torch import load_file
    torch.save(load_file(d / "model.safetensors"), d / "pytorch_model.bin")
    (d / "model.safetensors").unlink()
    from workbench.interop.hf_import import import_model
    r = import_model(d, tmp_path / "runs", "b", log=lambda m: None)
    want = load_run_model(imported / "llama-mha-untied").state_dict
    got = load_run_model(r.run_dir).state_dict
    assert all(torch.equal(got[k], want[k]) for k in want)

    class Boom:
        def __reduce__(self):
            return (Path.touch, (tmp_path / "pwned",))
    (d / "pytorch_model.bin").write_bytes(pickle.dumps({"model.embed_tokens.weight": Boom()}))
    cp = wb("import", str(d), "--runs-dir", str(tmp_path / "runs2"))  # the real command, in its own process
    assert cp.returncode == 2 and "unsafe pickle" in cp.stderr
    assert not (tmp_path / "pwned").exists()


def test_a_workbench_export_imports_back(trained_run, tmp_path, capsys):
    """workbench's own sentencepiece model through export --format hf (a Metaspace, byte-fallback tokenizer.json)
    and import: the same logits, the same token ids."""
    out = tmp_path / "hf"
    assert cli(capsys, "export", str(trained_run), str(out))[0] == 0
    rc, stdout, _err = cli(capsys, "import", str(out), "--name", "back", "--runs-dir", str(tmp_path / "runs"))
    assert rc == 0 and "end of document '<|endoftext|>' (id 1)" in stdout
    a, b = load_run_model(trained_run), load_run_model(tmp_path / "runs" / "back")
    ids = torch.randint(0, a.preset.model.vocab_size, (2, a.preset.model.seq_len))
    with torch.no_grad():
        diff = (a.model.eval()(ids, targets=ids)[0] - b.model.eval()(ids, targets=ids)[0]).abs().max().item()
    assert diff <= 1e-5
    spm, hf = load_tokenizer(trained_run), load_tokenizer(tmp_path / "runs" / "back")
    assert isinstance(hf, HFTokenizer)
    for text in TEXTS[:-2]:
        assert hf.encode(text) == spm.encode(text), text
    assert hf.eod_id == spm.eod_id == 1


# ----------------------------------------------------------------------------- bad input

def _config(d: Path, **change) -> None:
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(change)
    (d / "config.json").write_text(json.dumps(cfg))


def _sharded_missing(d: Path) -> None:
    (d / "model.safetensors").rename(d / "model-00001-of-00002.safetensors")
    index = {"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                            "model.norm.weight": "model-00002-of-00002.safetensors"}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))


def _wrong_shape(d: Path) -> None:
    from safetensors.torch import load_file, save_file
    sd = load_file(d / "model.safetensors")
    sd["model.layers.1.mlp.up_proj.weight"] = sd["model.layers.1.mlp.up_proj.weight"][:-1].contiguous()
    save_file(sd, d / "model.safetensors", metadata={"format": "pt"})


def _small_embedding(d: Path) -> None:
    """A model of 300 embedding rows with the 400-id tokenizer."""
    from safetensors.torch import load_file, save_file
    sd = load_file(d / "model.safetensors")
    sd["model.embed_tokens.weight"] = sd["model.embed_tokens.weight"][:300].contiguous()
    save_file(sd, d / "model.safetensors", metadata={"format": "pt"})
    _config(d, vocab_size=300)


BAD = {
    "no_config": (lambda d: (d / "config.json").unlink(), "has no config.json: not a Hugging Face model directory"),
    "not_a_directory": (None, "is not a directory"),
    "unsupported": (lambda d: _config(d, architectures=["GPT2LMHeadModel"]),
                    "architecture GPT2LMHeadModel is not supported; workbench imports LlamaForCausalLM, "
                    "Qwen2ForCausalLM, Qwen3ForCausalLM"),
    "custom_code": (lambda d: _config(d, auto_map={"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}),
                    "asks for custom code (auto_map)"),
    "missing_shard": (_sharded_missing, "shard file(s) listed in model.safetensors.index.json are missing: "
                                        "model-00002-of-00002.safetensors"),
    "no_weights": (lambda d: (d / "model.safetensors").unlink(), "has no weights"),
    "mismatched_tensor": (_wrong_shape, "tensor shapes do not match config.json: model.layers.1.mlp.up_proj.weight"),
    "tokenizer_too_big": (_small_embedding, "the tokenizer has 400 ids but the embedding has 300 rows"),
    "no_tokenizer": (lambda d: (d / "tokenizer.json").unlink(), "has no tokenizer.json"),
    "bad_json": (lambda d: (d / "config.json").write_text("{"), "config.json is not valid JSON"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_import_bad_input(name, tmp_path, hf_models, capsys):
    """In this process (a second each saved); test_import_cli_* runs the real command."""
    setup, message = BAD[name]
    d = tmp_path / "model"
    if setup is None:
        d.write_text("a file")
    else:
        shutil.copytree(hf_models["llama-gqa-tied"], d)
        setup(d)
    runs = tmp_path / "runs"
    runs.mkdir()
    before = tree(tmp_path)
    rc, _out, err = cli(capsys, "import", str(d), "--runs-dir", str(runs))
    lines = err.strip().splitlines()
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith("workbench: error: "), err
    assert message in lines[0], lines[0]
    assert tree(tmp_path) == before and not any(runs.iterdir())  # nothing written


def test_untied_checkpoint_with_unexpected_tensors_is_refused(tmp_path, hf_tokenizer_dir, capsys):
    d = build_hf_model(tmp_path / "m", "qwen2-bias", hf_tokenizer_dir)
    from safetensors.torch import load_file, save_file
    sd = load_file(d / "model.safetensors")
    sd["model.layers.0.self_attn.o_proj.bias"] = torch.zeros(64)
    save_file(sd, d / "model.safetensors", metadata={"format": "pt"})
    rc, _out, err = cli(capsys, "import", str(d), "--runs-dir", str(tmp_path / "runs"))
    assert rc == 2 and "this architecture does not have: model.layers.0.self_attn.o_proj.bias" in err


# ----------------------------------------------------------------------------- the chat template

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And of Italy?"}]


@pytest.mark.parametrize("form", TEMPLATE_FORMS)
def test_import_carries_the_chat_template_in_every_form(form, tmp_path, hf_models, hf_tokenizer_dir, capsys):
    """transformers 5 saves a template only to chat_template.jinja; older files hold it in tokenizer_config.json
    (a string, or named templates) or chat_template.json. The run has it as chat_template.jinja, the other named
    templates beside it, and renders a conversation as transformers does."""
    d = build_chat_model(tmp_path / form, hf_models["llama-gqa-tied"], hf_tokenizer_dir, form)
    rc, out, err = cli(capsys, "import", str(d), "--name", "m", "--runs-dir", str(tmp_path / "runs"))
    assert rc == 0, err
    run = tmp_path / "runs" / "m"
    assert (run / "chat_template.jinja").read_text(encoding="utf-8") == CHAT_TEMPLATE
    named = form.endswith("-named")
    assert sorted(p.name for p in (run / "additional_chat_templates").glob("*")) == (["tool_use.jinja"] if named
                                                                                     else [])
    if named:
        assert (run / "additional_chat_templates" / "tool_use.jinja").read_text(encoding="utf-8") == TOOL_TEMPLATE
    assert "chat template: chat_template.jinja" in out
    ref = chat_tokenizer(hf_tokenizer_dir)
    for prompt in (True, False):
        want = ref.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=prompt)
        assert run_template(run).render(CHAT, add_generation_prompt=prompt) == want
    assert want.startswith("<|endoftext|><|im_start|>system")  # the tokenizer's BOS reached the template


def test_import_of_a_model_without_a_template_has_none(imported):
    assert not (imported / "llama-gqa-tied" / "chat_template.jinja").exists()
    with pytest.raises(ChatTemplateError, match="has no chat_template.jinja"):
        run_template(imported / "llama-gqa-tied")


@pytest.mark.parametrize("template", ["chatml", "unmaskable"])
def test_an_imported_template_goes_out_with_export(template, tmp_path, hf_models, hf_tokenizer_dir, capsys):
    """Import then export --format hf: transformers renders the exported model's conversations as the original's.
    A template workbench could not train through (its generation prompt adds nothing) travels as it came."""
    d = build_chat_model(tmp_path / "m", hf_models["llama-gqa-tied"], hf_tokenizer_dir)
    if template == "unmaskable":
        (d / "chat_template.jinja").write_text(TOOL_TEMPLATE, encoding="utf-8")
    assert cli(capsys, "import", str(d), "--name", "m", "--runs-dir", str(tmp_path / "runs"))[0] == 0
    rc, _out, err = cli(capsys, "export", "m", str(tmp_path / "out"), "--runs-dir", str(tmp_path / "runs"))
    assert rc == 0, err
    theirs = transformers.AutoTokenizer.from_pretrained(d)
    exported = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert exported.apply_chat_template(CHAT, tokenize=False) == theirs.apply_chat_template(CHAT, tokenize=False)


@pytest.mark.parametrize("form", TEMPLATE_FORMS)
def test_every_named_template_goes_out_with_export(form, tmp_path, hf_models, hf_tokenizer_dir, capsys):
    """Import then export: the HF directory holds the templates as transformers 5 saves them (chat_template.jinja,
    additional_chat_templates/NAME.jinja; tokenizer_config.json the same for transformers 4), so AutoTokenizer
    renders each name as the original tokenizer does; the GGUF file has tokenizer.chat_template and
    tokenizer.chat_template.NAME, as llama.cpp reads them."""
    import llama_cpp
    named = form.endswith("-named")
    original = chat_tokenizer(hf_tokenizer_dir, {"default": CHAT_TEMPLATE, "tool_use": TOOL_TEMPLATE} if named
                              else CHAT_TEMPLATE)
    d = build_chat_model(tmp_path / "m", hf_models["llama-gqa-tied"], hf_tokenizer_dir, form)
    runs = str(tmp_path / "runs")
    assert cli(capsys, "import", str(d), "--name", "m", "--runs-dir", runs)[0] == 0
    for fmt in ("hf", "gguf"):
        rc, _out, err = cli(capsys, "export", "m", str(tmp_path / fmt), "--format", fmt, "--runs-dir", runs)
        assert rc == 0, err
    out = tmp_path / "hf"
    assert (out / "chat_template.jinja").read_text(encoding="utf-8") == CHAT_TEMPLATE
    assert sorted(p.name for p in (out / "additional_chat_templates").glob("*")) == (["tool_use.jinja"] if named
                                                                                     else [])
    exported = transformers.AutoTokenizer.from_pretrained(out)
    assert exported.chat_template == original.chat_template
    for name in (["default", "tool_use"] if named else [None]):
        for prompt in (True, False):
            want = original.apply_chat_template(CHAT, chat_template=name, tokenize=False, add_generation_prompt=prompt)
            assert exported.apply_chat_template(CHAT, chat_template=name, tokenize=False,
                                                add_generation_prompt=prompt) == want, (name, prompt)
    config = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))["chat_template"]
    assert config == ([{"name": "default", "template": CHAT_TEMPLATE}, {"name": "tool_use", "template": TOOL_TEMPLATE}]
                      if named else CHAT_TEMPLATE)
    meta = llama_cpp.Llama(model_path=str(tmp_path / "gguf" / "model.gguf"), n_ctx=32, verbose=False).metadata
    assert meta["tokenizer.chat_template"] == CHAT_TEMPLATE
    assert {k: v for k, v in meta.items() if k.startswith("tokenizer.chat_template.")} == (
        {"tokenizer.chat_template.tool_use": TOOL_TEMPLATE} if named else {})


def test_template_names_that_gguf_would_merge_are_refused(tmp_path, hf_models, hf_tokenizer_dir, capsys):
    """GGUF spells a name's characters outside [A-Za-z0-9] as _: tool-use and tool_use would be one key."""
    d = build_chat_model(tmp_path / "m", hf_models["llama-gqa-tied"], hf_tokenizer_dir, "jinja-named")
    runs = str(tmp_path / "runs")
    assert cli(capsys, "import", str(d), "--name", "m", "--runs-dir", runs)[0] == 0
    (tmp_path / "runs" / "m" / "additional_chat_templates" / "tool-use.jinja").write_text(TOOL_TEMPLATE)
    rc, _out, err = cli(capsys, "export", "m", str(tmp_path / "gguf"), "--format", "gguf", "--runs-dir", runs)
    assert rc == 2 and err.strip().splitlines() == [
        "workbench: error: the chat templates named 'tool-use' and 'tool_use' would both be "
        "tokenizer.chat_template.tool_use in GGUF; rename one in the run's additional_chat_templates/"]
    assert not (tmp_path / "gguf").exists() and not list(tmp_path.glob(".gguf*"))


def test_a_named_template_whose_name_is_a_path_is_left_out_and_said(tmp_path, hf_models, hf_tokenizer_dir, capsys):
    """A template is data: a name like ../x never becomes a path outside the run."""
    d = build_chat_model(tmp_path / "m", hf_models["llama-gqa-tied"], hf_tokenizer_dir, "config")
    config = json.loads((d / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "default", "template": CHAT_TEMPLATE},
                               {"name": "../../escaped", "template": TOOL_TEMPLATE}]
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    rc, out, err = cli(capsys, "import", str(d), "--name", "m", "--runs-dir", str(tmp_path / "runs"))
    assert rc == 0, err
    assert "left out the chat template named '../../escaped': its name cannot be a file name" in out
    assert not list(tmp_path.rglob("escaped*")) and not (tmp_path / "runs" / "m" / "additional_chat_templates").exists()
    assert (tmp_path / "runs" / "m" / "chat_template.jinja").read_text(encoding="utf-8") == CHAT_TEMPLATE
