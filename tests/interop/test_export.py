"""`workbench export`: the Hugging Face directory loads in transformers with the same logits and token ids.

transformers is a test-only extra; without it the tests that load the export skip
(CI installs it). Everything else here needs only torch and safetensors.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.support.cli import wb
from tests.support.runs import tree
from workbench import rundir
from workbench.config import ModelConfig, load_preset_file
from workbench.data.text.tokenizer import Tokenizer
from workbench.interop.export import export_state_dict, hf_state_dict, rope_permute, tokenizer_json
from workbench.train.checkpoint import load_model_state
from workbench.train.model import GPT, apply_rope, rope_tables

SAMPLE = ("def add(a, b):\n    return a + b  # two  spaces\n\n\tif x:\n\t\tpass\n"
          "café naïve Zürich — ½ ≠ ∞, 日本語のテキスト, emoji 🙂🚀\n   trailing   \n\n\nend")


def transformers_or_skip():
    return pytest.importorskip("transformers", reason="transformers is not installed (test-only extra: "
                                                      "pip install transformers); CI installs it")


def our_logits(model: GPT, ids: torch.Tensor) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(ids, targets=ids)[0]  # with targets: every position's logits


def hf_logits(out: Path, ids: torch.Tensor) -> torch.Tensor:
    tf = transformers_or_skip()
    hf = tf.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)  # Llama or Qwen3, by config.json
    hf.eval()
    with torch.no_grad():
        return hf(ids).logits


@pytest.fixture(scope="module")
def hf_export(trained_run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("exp") / "hf"
    cp = wb("export", str(trained_run), "--format", "hf", str(out))
    assert cp.returncode == 0, cp.stderr
    assert "exported tiny step_0000060" in cp.stdout
    return out


def test_rope_permutation_turns_interleaved_pairs_into_rotate_half():
    """The permuted projection under transformers' rotate_half RoPE = ours under interleaved pairs, reordered."""
    hd, n_heads, dim, T = 8, 2, 16, 5
    w = torch.randn(n_heads * hd, dim)
    x = torch.randn(1, T, dim)
    cos, sin = rope_tables(hd, T, 10000.0)
    ours = apply_rope((x @ w.T).view(1, T, n_heads, hd).transpose(1, 2), cos, sin)

    def rotate_half(t):
        return torch.cat((-t[..., hd // 2:], t[..., :hd // 2]), dim=-1)
    c, s = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
    q = (x @ rope_permute(w, n_heads).T).view(1, T, n_heads, hd).transpose(1, 2)
    theirs = q * c + rotate_half(q) * s
    # Same values, each head's dims reordered: HF dim a*hd/2 + i is our dim 2i + a.
    order = torch.arange(hd).view(hd // 2, 2).T.reshape(-1)
    torch.testing.assert_close(theirs, ours[..., order], atol=1e-5, rtol=0)


def test_hf_directory_layout(hf_export, trained_run):
    names = {p.name for p in hf_export.iterdir()}
    assert names == {"config.json", "generation_config.json", "model.safetensors", "tokenizer.model",
                     "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}
    cfg = json.loads((hf_export / "config.json").read_text())
    m = load_preset_file(trained_run / "preset.toml").model
    assert m.qk_norm  # the shipped presets' recipe: QK-norm, which transformers' Qwen3 layout has and Llama's has not
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["model_type"] == "qwen3"
    assert (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"], cfg["head_dim"], cfg["vocab_size"], cfg["max_position_embeddings"]) == \
        (m.dim, m.hidden_dim, m.n_layers, m.n_heads, m.n_kv_heads, m.head_dim, m.vocab_size, m.seq_len)
    assert cfg["rope_theta"] == m.rope_theta and cfg["rms_norm_eps"] == m.norm_eps
    assert cfg["tie_word_embeddings"] is True and cfg["torch_dtype"] == "float32"
    assert cfg["bos_token_id"] is None and cfg["eos_token_id"] is None
    assert (hf_export / "tokenizer.model").read_bytes() == (trained_run / "tokenizer.model").read_bytes()
    from safetensors import safe_open
    with safe_open(hf_export / "model.safetensors", "pt") as f:
        keys = set(f.keys())
        assert f.metadata()["format"] == "pt"
    assert "lm_head.weight" not in keys  # tied: transformers ties it to the embedding on load
    assert {"model.embed_tokens.weight", "model.norm.weight", "model.layers.1.self_attn.k_proj.weight",
            "model.layers.0.mlp.gate_proj.weight", "model.layers.0.post_attention_layernorm.weight",
            "model.layers.1.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight"} <= keys
    assert not [p for p in hf_export.parent.iterdir() if p.name.startswith(".")]  # no temporary left


def test_hf_logits_match_trained_run(hf_export, trained_run):
    transformers_or_skip()
    p = load_preset_file(trained_run / "preset.toml")
    model = GPT(p.model)
    model.load_state_dict(load_model_state(rundir.select_checkpoint(trained_run, "latest")["path"]))
    tok = Tokenizer.load(trained_run / "tokenizer.model")
    ids = torch.tensor([tok.encode(SAMPLE)[: p.model.seq_len]])
    ids = torch.cat([ids, torch.randint(0, p.model.vocab_size, ids.shape)])
    diff = (our_logits(model, ids) - hf_logits(hf_export, ids)).abs().max().item()
    assert diff <= 1e-4, diff


@pytest.mark.parametrize("cls", ["AutoTokenizer", "LlamaTokenizer", "tokenizer.model only"])
def test_hf_tokenizer_gives_workbench_ids(hf_export, trained_run, tmp_path, cls):
    tf = transformers_or_skip()
    ours = Tokenizer.load(trained_run / "tokenizer.model")
    where = hf_export
    if cls == "tokenizer.model only":
        # No tokenizer.json: transformers converts tokenizer.model itself (needs sentencepiece + protobuf).
        pytest.importorskip("google.protobuf", reason="converting tokenizer.model in transformers needs protobuf")
        where = tmp_path / "spm"
        shutil.copytree(hf_export, where)
        (where / "tokenizer.json").unlink()
    hf = (tf.AutoTokenizer if cls != "LlamaTokenizer" else tf.LlamaTokenizer).from_pretrained(where)
    for text in (SAMPLE, " leading space", "\n\nx", "a" * 200, ""):
        ids = hf(text)["input_ids"]
        assert ids == ours.encode(text), (cls, text)
        assert hf.decode(ids) == text
    assert hf.bos_token_id is None and hf.eos_token_id is None


def test_tokenizer_json_equals_transformers_conversion(hf_export, tmp_path):
    """Our tokenizer.json is exactly what transformers builds from tokenizer.model (when it can)."""
    tf = transformers_or_skip()
    pytest.importorskip("google.protobuf", reason="converting tokenizer.model in transformers needs protobuf")
    where = tmp_path / "spm"
    shutil.copytree(hf_export, where)
    (where / "tokenizer.json").unlink()
    theirs = json.loads(tf.AutoTokenizer.from_pretrained(where).backend_tokenizer.to_str())
    ours = tokenizer_json((hf_export / "tokenizer.model").read_bytes())
    for key in ("added_tokens", "normalizer", "pre_tokenizer", "decoder"):
        assert ours[key] == theirs[key], key
    assert ours["model"]["vocab"] == theirs["model"]["vocab"]
    assert ours["model"]["merges"] == [list(m) for m in theirs["model"]["merges"]]


@pytest.mark.parametrize("n_kv,tied,extra", [
    (2, True, {}),                                                     # GQA, tied
    (1, False, {"rope_theta": 500000.0, "norm_eps": 1e-6}),            # MQA, untied
    (4, False, {"ffn_hidden": 96, "vocab_size": 300}),                 # MHA, untied, odd sizes
])
def test_hf_logits_match_for_configs(tmp_path, n_kv, tied, extra):
    transformers_or_skip()
    torch.manual_seed(n_kv)
    cfg = ModelConfig(**{"vocab_size": 256, "dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": n_kv,
                         "seq_len": 32, "tie_embeddings": tied, **extra})
    model = GPT(cfg)
    with torch.no_grad():  # norms away from 1 so a swapped norm would show
        for name, prm in model.named_parameters():
            if name.endswith("norm.weight"):
                prm.uniform_(0.5, 1.5)
    sd = model.state_dict()
    assert ("lm_head.weight" in sd) == (not tied)
    assert ("lm_head.weight" in hf_state_dict(sd, cfg)) == (not tied)
    out = export_state_dict(sd, cfg, "hf", tmp_path / "out")
    ids = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    diff = (our_logits(model, ids) - hf_logits(out, ids)).abs().max().item()
    assert diff <= 1e-4, diff


def test_safetensors_format_is_the_raw_state_dict(trained_run, tmp_path):
    from safetensors.torch import load_file
    out = tmp_path / "raw"
    out.mkdir()  # an existing empty directory is fine
    cp = wb("export", str(trained_run), "--checkpoint", "20", "--format", "safetensors", str(out))
    assert cp.returncode == 0, cp.stderr
    assert {p.name for p in out.iterdir()} == {"model.safetensors", "preset.toml", "tokenizer.model"}
    got = load_file(out / "model.safetensors")
    want = load_model_state(trained_run / "checkpoints" / "step_0000020")
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k
    assert (out / "preset.toml").read_text() == (trained_run / "preset.toml").read_text()
    assert (out / "tokenizer.model").read_bytes() == (trained_run / "tokenizer.model").read_bytes()


def _nonempty(ws: Path, run: Path) -> None:
    (ws / "out").mkdir()
    (ws / "out" / "keep.txt").write_text("mine")


def _no_ckpt(ws: Path, run: Path) -> None:
    shutil.rmtree(run / "checkpoints")


def _a_file(ws: Path, run: Path) -> None:
    (ws / "out").write_text("a file")


BAD = {
    "nonempty_out_dir": (["hf"], _nonempty, "is not empty; export writes only into a new or empty directory"),
    "out_is_a_file": (["hf"], _a_file, "exists and is not a directory"),
    "unknown_format": (["onnx"], None, "unknown export format 'onnx'; choose one of: hf, safetensors, gguf"),
    "no_checkpoints": (["hf"], _no_ckpt, "run r has no complete checkpoint yet"),
    "no_such_step": (["hf", "--checkpoint", "7"], None, "run r has no checkpoint at step 7; it has: 20, 40, 60"),
    "unknown_run": (["hf", "--runs-dir", "elsewhere"], None, "no run 'r' in"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_export_bad_input(name, trained_run, tmp_path):
    args, setup, message = BAD[name]
    ws = tmp_path / "ws"
    (ws / "runs").mkdir(parents=True)
    run = ws / "runs" / "r"
    shutil.copytree(trained_run, run)
    if setup:
        setup(ws, run)
    before = tree(ws)
    dirs_before = sorted(p.name for p in ws.iterdir())
    extra = args[1:] if "--runs-dir" in args else [*args[1:], "--runs-dir", str(ws / "runs")]
    cp = wb("export", "r", "--format", args[0], str(ws / "out"), *extra, cwd=ws)
    lines = cp.stderr.strip().splitlines()
    assert cp.returncode == 2, cp.stderr
    assert len(lines) == 1 and lines[0].startswith("workbench: error: "), cp.stderr
    assert message in lines[0], lines[0]
    assert tree(ws) == before  # nothing written, changed or removed
    assert sorted(p.name for p in ws.iterdir()) == dirs_before  # no out dir, no temporary
