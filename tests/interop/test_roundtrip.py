"""Round trip: import -> LoRA fine-tune -> export hf (adapters merged) -> transformers gives workbench's logits;
-> export gguf -> a real GGUF reader (transformers' GGUF loader; llama.cpp too where llama-cpp-python is
installed) gives the same next-token argmax on several prompts, with the tokenizer embedded."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support.hf import FT, VOCAB, cli, transformers
from tests.support.runs import tree
from workbench import rundir
from workbench.cli import main
from workbench.config import load_preset_file
from workbench.data.text.tokenizer import load_tokenizer
from workbench.train.checkpoint import load_init_weights, load_model_state, load_run_model
from workbench.train.lora import apply_lora
from workbench.train.model import GPT

PROMPTS = ["def add(a, b):\n    return", "import json\nimport ", "class Decoder(object):\n    ",
           "# café — 日本語 🙂\n", "    if not s:\n        raise"]


def lora_model(run_dir: Path) -> GPT:
    """The LoRA run's model as the trainer holds it: frozen weights with the adapters beside them (not merged)."""
    p = load_preset_file(run_dir / "preset.toml")
    model = GPT(p.model)
    model.load_state_dict(load_init_weights(run_dir))
    apply_lora(model, p.train)
    model.load_state_dict(load_model_state(rundir.list_checkpoints(run_dir)[-1]["path"]), strict=False)
    return model.eval()


def last_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        x = torch.tensor([ids])
        return model(x, targets=x)[0][0, -1]


def quiet_cli(*args: str) -> tuple[int, str, str]:
    """The CLI in this process, for module fixtures (no capsys there)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(args))
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def qwen2_lora(imported, ft_corpus) -> Path:
    """A short LoRA run on the Qwen2-style model (biases, untied head), adapters on q/v and the MLP."""
    rc, _out, err = quiet_cli("train", "cpu-small", "--init-from", "qwen2-bias", "--corpus", str(ft_corpus),
                                  "--name", "q2lora", "--runs-dir", str(imported), "--set", *FT,
                                  "train.finetune=lora", "train.max_iters=6", "train.eval_interval=6",
                                  "train.lr=1e-2", "train.lora_targets=q_proj,v_proj,mlp")
    assert rc == 0, err
    return imported / "q2lora"


@pytest.mark.parametrize("which", ["llama lora", "qwen2 lora"])
def test_export_hf_merges_adapters(which, lora_run, qwen2_lora, tmp_path, capsys):
    run_dir = lora_run.run_dir if which == "llama lora" else qwen2_lora
    out = tmp_path / "hf"
    rc, stdout, err = cli(capsys, "export", str(run_dir), str(out))
    assert rc == 0, err
    arch = "LlamaForCausalLM" if which == "llama lora" else "Qwen2ForCausalLM"
    assert f"as a Hugging Face {arch} directory" in stdout
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == [arch] and cfg["eos_token_id"] == 0 and cfg["max_position_embeddings"] == 128
    assert (out / "tokenizer.json").read_bytes() == (run_dir / "tokenizer.json").read_bytes()
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (2, 32))
    with torch.no_grad():
        ours, theirs = lora_model(run_dir)(ids, targets=ids)[0], hf(ids).logits
    assert (ours - theirs).abs().max().item() <= 1e-4
    assert bool((ours.argmax(-1) == theirs.argmax(-1)).all())


def gguf_export(capsys, run_dir: Path, out: Path, *extra: str) -> Path:
    rc, stdout, err = cli(capsys, "export", str(run_dir), str(out), "--format", "gguf", *extra)
    assert rc == 0, err
    assert "as a GGUF file (f16)" in stdout or "f32" in extra
    return out / "model.gguf"


def gguf_field(path: Path, key: str):
    """One scalar of a GGUF file's metadata, as the gguf package reads it."""
    from gguf import GGUFReader
    field = GGUFReader(path).fields[key]
    return field.contents()


@pytest.mark.parametrize("which", ["llama lora", "qwen2 lora", "workbench sentencepiece"])
def test_gguf_gives_the_same_next_token(which, lora_run, qwen2_lora, trained_run, tmp_path, capsys):
    """transformers' GGUF loader (the reader CI has): the same argmax on every prompt, logits within f16's error."""
    run_dir = {"llama lora": lora_run.run_dir, "qwen2 lora": qwen2_lora, "workbench sentencepiece": trained_run}[which]
    path = gguf_export(capsys, run_dir, tmp_path / "gguf")
    ours_model = lora_model(run_dir) if "lora" in which else load_run_model(run_dir).model.eval()
    tok = load_tokenizer(run_dir)
    cfg = transformers.AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    if cfg.model_type == "qwen3":  # the presets' QK-norm exports as Qwen3: transformers' GGUF map for qwen3 skips
        cfg.head_dim = gguf_field(path, "qwen3.attention.key_length")  # the head width and assumes 128; the file has it
    hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, config=cfg,
                                                           dtype=torch.float32).eval()
    worst = 0.0
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        ours = last_logits(ours_model, ids)
        with torch.no_grad():
            theirs = hf(torch.tensor([ids])).logits[0, -1]
        assert int(theirs.argmax()) == int(ours.argmax()), prompt
        worst = max(worst, (theirs - ours).abs().max().item())
    assert worst < 0.02  # f16 weights
    if "lora" in which:  # the embedded byte-level BPE, as transformers rebuilds it from the GGUF file
        theirs_tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        for prompt in PROMPTS:
            assert theirs_tok(prompt, add_special_tokens=False)["input_ids"] == tok.encode(prompt), prompt


@pytest.mark.parametrize("run", ["qwen3-qknorm", "llama3-scaled", "lora", "workbench sentencepiece"])
def test_gguf_in_llama_cpp(run, imported, lora_run, trained_run, tmp_path, capsys):
    """llama.cpp itself (llama-cpp-python, a dev dependency: CI builds it). Also the two layouts transformers'
    GGUF loader cannot read back: Qwen3's wider heads, llama3 RoPE scaling."""
    import llama_cpp
    run_dir = trained_run if run == "workbench sentencepiece" else imported / run
    path = gguf_export(capsys, run_dir, tmp_path / "gguf")
    model = lora_model(run_dir) if run == "lora" else load_run_model(run_dir).model.eval()
    tok = load_tokenizer(run_dir)
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, logits_all=True, verbose=False)
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        assert llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=False) == ids, prompt
        llm.reset()
        llm.eval(ids)
        theirs = torch.tensor(np.array(llm.scores[len(ids) - 1]))
        ours = last_logits(model, ids)
        assert int(theirs.argmax()) == int(ours.argmax()), prompt
        assert (theirs - ours).abs().max().item() < 0.02


# ----------------------------------------------------------------------------- what GGUF cannot hold

def _unknown_pre_tokenizer(run_dir: Path) -> None:
    t = json.loads((run_dir / "tokenizer.json").read_text())
    t["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"\s+|\w+"}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    (run_dir / "tokenizer.json").write_text(json.dumps(t))


def _beyond_f16(run_dir: Path) -> None:
    ck = Path(rundir.list_checkpoints(run_dir)[-1]["path"])
    sd = torch.load(ck / "model.pt", weights_only=True)
    sd["layers.0.mlp.w2.weight"][0, 0] = 1e6
    (ck / "model.pt").unlink()  # (never write through a file that may be a hard link)
    torch.save(sd, ck / "model.pt")


GGUF_BAD = {
    "unknown_pre_tokenizer": (_unknown_pre_tokenizer, [], "pre-tokenizer is not one llama.cpp knows by name"),
    "beyond_f16": (_beyond_f16, [], "layers.0.mlp.w2.weight holds values beyond f16's range"),
    "bad_type": (None, ["--gguf-type", "q4"], "--gguf-type 'q4': choose f16 or f32"),
}


@pytest.mark.parametrize("name", list(GGUF_BAD))
def test_gguf_bad_input(name, imported, tmp_path, capsys):
    setup, extra, message = GGUF_BAD[name]
    runs = tmp_path / "runs"
    shutil.copytree(imported / "llama-mha-untied", runs / "m")
    if setup:
        setup(runs / "m")
    before = tree(tmp_path)
    rc, _out, err = cli(capsys, "export", "m", str(tmp_path / "out"), "--format", "gguf", "--runs-dir", str(runs),
                        *extra)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and message in lines[0], err
    assert tree(tmp_path) == before and not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left
