"""Getting a model out of workbench: a Hugging Face Llama directory, or the raw state dict.

``--format hf`` writes what ``LlamaForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained`` load:

    config.json              LlamaConfig (architectures LlamaForCausalLM, fp32)
    generation_config.json   no BOS/EOS: the workbench tokenizer has none
    model.safetensors        transformers' tensor names (see ``hf_state_dict``)
    tokenizer.model          the run's sentencepiece model, byte for byte
    tokenizer.json           the same tokenizer for Hugging Face `tokenizers` (fast)
    tokenizer_config.json    no BOS added, no prefix space, non-legacy handling,
    special_tokens_map.json  so the ids equal workbench's own

``--format safetensors`` writes the workbench state dict unchanged as
``model.safetensors`` with the run's ``preset.toml`` and ``tokenizer.model``.

Both are written into a temporary directory beside OUT_DIR and renamed into
place, so an interrupted export leaves no half directory under the name asked for.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

from safetensors.torch import save_file

from workbench import rundir
from workbench.errors import WorkbenchError
from workbench.fs import fsync_dir
from workbench.train.checkpoint import load_run_model

FORMATS = ("hf", "safetensors")


class ExportError(WorkbenchError):
    pass


# ----------------------------------------------------------------------------- HF Llama layout

def rope_permute(w, n_heads: int):
    """Reorder the rows of a q/k projection from interleaved RoPE pairs to transformers' rotate_half.

    workbench rotates pairs (x0, x1), (x2, x3), ... of each head; transformers' Llama
    rotates (x_i, x_{i + hd/2}). Within a head, HF row ``a * hd/2 + i`` is our row
    ``2 i + a`` — the same ``permute`` as transformers' convert_llama_weights_to_hf.
    """
    out_dim, in_dim = w.shape
    hd = out_dim // n_heads
    return w.view(n_heads, hd // 2, 2, in_dim).transpose(1, 2).reshape(out_dim, in_dim)


def hf_config(cfg, torch_dtype: str = "float32") -> dict:
    """config.json for a workbench ``ModelConfig`` (LlamaConfig's keys)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.dim,
        "intermediate_size": cfg.hidden_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": bool(cfg.tie_embeddings),
        "initializer_range": 0.02,
        "use_cache": True,
        "pretraining_tp": 1,
        # The workbench tokenizer has no BOS/EOS/PAD pieces.
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
        "torch_dtype": torch_dtype,
        "dtype": torch_dtype,
    }


def hf_state_dict(sd: dict, cfg) -> dict:
    """workbench tensor names → transformers' Llama names, q/k rows permuted for rotate_half.

    Tied embeddings: only ``model.embed_tokens.weight`` is stored, as transformers does
    (it ties ``lm_head`` to it on load because config.tie_word_embeddings is true).
    """
    out = {"model.embed_tokens.weight": sd["tok_emb.weight"], "model.norm.weight": sd["norm.weight"]}
    for i in range(cfg.n_layers):
        s, d = f"layers.{i}.", f"model.layers.{i}."
        out[d + "self_attn.q_proj.weight"] = rope_permute(sd[s + "attn.wq.weight"], cfg.n_heads)
        out[d + "self_attn.k_proj.weight"] = rope_permute(sd[s + "attn.wk.weight"], cfg.n_kv_heads)
        out[d + "self_attn.v_proj.weight"] = sd[s + "attn.wv.weight"]
        out[d + "self_attn.o_proj.weight"] = sd[s + "attn.wo.weight"]
        out[d + "mlp.gate_proj.weight"] = sd[s + "mlp.w1.weight"]
        out[d + "mlp.up_proj.weight"] = sd[s + "mlp.w3.weight"]
        out[d + "mlp.down_proj.weight"] = sd[s + "mlp.w2.weight"]
        out[d + "input_layernorm.weight"] = sd[s + "attn_norm.weight"]
        out[d + "post_attention_layernorm.weight"] = sd[s + "mlp_norm.weight"]
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = sd["lm_head.weight"]
    # config.json says float32: a checkpoint kept in bf16/fp16 is widened (exactly).
    return {k: v.float() if v.is_floating_point() else v for k, v in out.items()}


def tokenizer_files(seq_len: int) -> dict[str, dict]:
    """tokenizer_config.json and special_tokens_map.json for the workbench sentencepiece model.

    The model has no BOS/EOS/PAD (so none is added), no dummy prefix (so no prefix
    space, non-legacy handling of a leading space), and "<unk>" at id 0.
    """
    cfg = {
        "tokenizer_class": "LlamaTokenizer",
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "legacy": False,
        "bos_token": None,
        "eos_token": None,
        "pad_token": None,
        "unk_token": "<unk>",
        "clean_up_tokenization_spaces": False,
        "spaces_between_special_tokens": False,
        "model_max_length": seq_len,
        "sp_model_kwargs": {},
    }
    special = {"unk_token": "<unk>"}
    return {"tokenizer_config.json": cfg, "special_tokens_map.json": special}


# sentencepiece ModelProto.SentencePiece.Type
_SP_NORMAL, _SP_UNKNOWN, _SP_CONTROL, _SP_USER_DEFINED, _SP_UNUSED, _SP_BYTE = 1, 2, 3, 4, 5, 6


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def _fields(buf: bytes):
    """(field number, wire type, value) of one protobuf message; value is bytes for length-delimited."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            val, i = _varint(buf, i)
        elif wt == 1:
            val, i = struct.unpack_from("<d", buf, i)[0], i + 8
        elif wt == 2:
            n, i = _varint(buf, i)
            val, i = buf[i:i + n], i + n
        elif wt == 5:
            val, i = struct.unpack_from("<f", buf, i)[0], i + 4
        else:
            raise ExportError(f"tokenizer.model is not a sentencepiece model (protobuf wire type {wt})")
        yield num, wt, val


def spm_pieces(model_proto: bytes) -> list[tuple[str, float, int]]:
    """(piece, score, type) of every piece of a sentencepiece model, in id order.

    Read straight from the protobuf wire format: sentencepiece's Python API does not say
    which pieces are user-defined, and its _pb2 module needs the protobuf package.
    """
    pieces = []
    try:
        for num, wt, val in _fields(model_proto):
            if num == 1 and wt == 2:
                piece, score, typ = "", 0.0, _SP_NORMAL
                for n2, w2, v2 in _fields(val):
                    if n2 == 1 and w2 == 2:
                        piece = v2.decode("utf-8")
                    elif n2 == 2 and w2 == 5:
                        score = v2
                    elif n2 == 3 and w2 == 0:
                        typ = v2
                pieces.append((piece, score, typ))
    except (IndexError, UnicodeDecodeError):
        raise ExportError("tokenizer.model is not a valid sentencepiece model") from None
    return pieces


def bpe_merges(vocab: dict[str, int]) -> list[list[str]]:
    """Merges for a sentencepiece BPE vocabulary, ranked by the merged piece's id.

    sentencepiece merges the adjacent pair whose concatenation has the best score
    (BPE scores fall with the id), so a merge's rank is its result's id; ties (one
    result, several splits) by the parts' ids, then lengths — the order transformers'
    SentencePieceExtractor / generate_merges gives.
    """
    merges = []
    for merged, mid in vocab.items():
        local = []
        for k in range(1, len(merged)):
            left, right = merged[:k], merged[k:]
            if left in vocab and right in vocab:
                local.append((left, right, mid))
        local.sort(key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda x: (x[2], len(x[0]), len(x[1])))
    return [[a, b] for a, b, _ in merges]


def tokenizer_json(model_proto: bytes) -> dict:
    """tokenizer.json (Hugging Face `tokenizers`) equivalent to the workbench sentencepiece BPE model.

    No normalizer (identity), spaces become "▁" with no prefix added, BPE with byte
    fallback; control and user-defined pieces ("\n") are added tokens matched before
    BPE, as sentencepiece does. With it, AutoTokenizer needs neither sentencepiece nor
    protobuf, and no conversion heuristics decide the ids.
    """
    pieces = spm_pieces(model_proto)
    vocab = {p: i for i, (p, _s, _t) in enumerate(pieces)}
    unk = next((p for p, _s, t in pieces if t == _SP_UNKNOWN), None)
    added = [{"id": i, "content": p, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": t in (_SP_CONTROL, _SP_UNKNOWN)}
             for i, (p, _s, t) in enumerate(pieces) if t in (_SP_UNKNOWN, _SP_CONTROL, _SP_USER_DEFINED)]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "never", "split": False},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": bpe_merges(vocab)},
    }


# ----------------------------------------------------------------------------- writers

def _contiguous(sd: dict) -> dict:
    # safetensors wants contiguous tensors that share no storage.
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in sd.items()}


def _save_safetensors(tensors: dict, path: Path, metadata: dict | None = None) -> None:
    # transformers refuses a file whose metadata lacks format=pt.
    save_file(_contiguous(tensors), str(path), metadata={"format": "pt", **(metadata or {})})


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_hf(dest: Path, sd: dict, cfg, tokenizer_model: bytes | None) -> None:
    """Fill the (existing, empty) directory ``dest`` with a Hugging Face Llama model."""
    _write_json(dest / "config.json", hf_config(cfg))
    # workbench sample's defaults; no max_length (it would clash with a caller's max_new_tokens).
    _write_json(dest / "generation_config.json", {"do_sample": True, "temperature": 0.8, "top_k": 50})
    _save_safetensors(hf_state_dict(sd, cfg), dest / "model.safetensors")
    if tokenizer_model is not None:
        (dest / "tokenizer.model").write_bytes(tokenizer_model)
        _write_json(dest / "tokenizer.json", tokenizer_json(tokenizer_model))
        for name, obj in tokenizer_files(cfg.seq_len).items():
            _write_json(dest / name, obj)


def write_raw(dest: Path, sd: dict, preset_toml: str | None, tokenizer_model: bytes | None,
              metadata: dict | None = None) -> None:
    """The workbench state dict as model.safetensors, plus preset.toml and tokenizer.model."""
    _save_safetensors(sd, dest / "model.safetensors", {k: str(v) for k, v in (metadata or {}).items()})
    if preset_toml is not None:
        (dest / "preset.toml").write_text(preset_toml, encoding="utf-8")
    if tokenizer_model is not None:
        (dest / "tokenizer.model").write_bytes(tokenizer_model)


def check_out_dir(out: Path) -> Path:
    out = Path(out).expanduser()
    if out.exists():
        if not out.is_dir():
            raise ExportError(f"{out} exists and is not a directory; give a new or empty directory")
        if any(out.iterdir()):
            raise ExportError(f"{out} is not empty; export writes only into a new or empty directory")
    parent = out.resolve().parent
    if not parent.is_dir():
        raise ExportError(f"the parent directory {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK):
        raise ExportError(f"cannot write into {parent}: permission denied")
    return out


def export_state_dict(sd: dict, cfg, fmt: str, out: Path, *, tokenizer_model: bytes | None = None,
                      preset_toml: str | None = None, metadata: dict | None = None) -> Path:
    """Export a state dict (no run needed) into the new or empty directory ``out``.

    Written into ``.<name>.tmp-<pid>`` beside ``out``, then renamed over it.
    """
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    out = check_out_dir(out)
    out_abs = out.resolve()
    tmp = out_abs.parent / f".{out_abs.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        if fmt == "hf":
            write_hf(tmp, sd, cfg, tokenizer_model)
        else:
            write_raw(tmp, sd, preset_toml, tokenizer_model, metadata)
        if out_abs.exists():
            out_abs.rmdir()  # empty (checked above); os.rename cannot replace a directory on every OS
        os.rename(tmp, out_abs)
        fsync_dir(out_abs.parent)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ExportError(f"cannot write {out}: {e.strerror or e}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_abs


def export_run(run_dir: Path, out: Path, fmt: str = "hf", checkpoint: str | int | None = "latest") -> tuple[Path, dict]:
    """Export a run's checkpoint; returns (the output directory, the checkpoint's sidecar)."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    check_out_dir(out)
    run_dir = Path(run_dir)
    tok_path = run_dir / "tokenizer.model"
    rundir.select_checkpoint(run_dir, checkpoint)  # no checkpoint: say so before the tokenizer
    if not tok_path.is_file():
        raise ExportError(f"run {run_dir.name} has no tokenizer.model; it cannot be exported with its tokenizer")
    # Shapes only (no memory, no init time for a large model): a state dict that does not fit the
    # preset is refused, naming the keys.
    loaded = load_run_model(run_dir, checkpoint, shapes_only=True)
    ckpt = loaded.meta
    meta = {"run": run_dir.name, "checkpoint": ckpt["name"], "step": ckpt.get("step"),
            "val_loss": ckpt.get("val_loss")}
    dest = export_state_dict(loaded.state_dict, loaded.preset.model, fmt, out, tokenizer_model=tok_path.read_bytes(),
                             preset_toml=(run_dir / "preset.toml").read_text(encoding="utf-8"), metadata=meta)
    return dest, ckpt
