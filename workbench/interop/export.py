"""Getting a model out of workbench: a Hugging Face Llama directory, a GGUF file, or the raw state dict.

``--format hf`` writes what ``LlamaForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained`` load:

    config.json              LlamaConfig (architectures LlamaForCausalLM, fp32)
    generation_config.json   no BOS/EOS: the workbench tokenizer has none
    model.safetensors        transformers' tensor names (see ``hf_state_dict``)
    tokenizer.model          the run's sentencepiece model, byte for byte
    tokenizer.json           the same tokenizer for Hugging Face `tokenizers` (fast)
    tokenizer_config.json    no BOS added, no prefix space, non-legacy handling,
    special_tokens_map.json  so the ids equal workbench's own
    chat_template.jinja      a chat model's template (additional_chat_templates/NAME.jinja: its named
                             others), as transformers 5 saves them; tokenizer_config.json holds the same

A model whose run has its own Hugging Face tokenizer (``workbench import``) is written with that
tokenizer's files unchanged and its BOS/EOS ids in config.json; one with Qwen2's attention biases or
Qwen3's QK-norm as Qwen2ForCausalLM / Qwen3ForCausalLM. A LoRA run's adapters are merged into the
weights (``W + (alpha / r) B A``): the export is a plain model.

``--format gguf`` writes ``model.gguf`` for llama.cpp-family runtimes (``workbench.interop.gguf_export``); to a
path ending in ``.gguf`` it writes that file itself (beside it first, then renamed: no half file under its name).

``--format safetensors`` writes the workbench state dict unchanged as
``model.safetensors`` with the run's ``preset.toml`` and tokenizer files.

Both are written into a temporary directory beside OUT_DIR and renamed into
place, so an interrupted export leaves no half directory under the name asked for.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

from safetensors.torch import save_file

from workbench import rundir
from workbench.data.chat.chat_templates import (
    ADDITIONAL_TEMPLATES_DIR,
    CHAT_TEMPLATE_FILE,
    ChatTemplateError,
    end_of_turn,
    model_template,
    model_templates,
)
from workbench.data.chat.conversations import special_pieces
from workbench.data.text.tokenizer import AnyTokenizer, HFTokenizer, Tokenizer, TokenizerError, load_tokenizer
from workbench.data.text.tokenizer_formats import tokenizer_files, tokenizer_json
from workbench.errors import WorkbenchError
from workbench.fs import atomic_dir, fsync_dir, fsync_file
from workbench.interop.gguf_export import ChatExport, check_gguf, write_gguf
from workbench.interop.hf_layout import LayoutError, hf_config, hf_state_dict, rope_permute
from workbench.plan.sampling import TEXT
from workbench.train.checkpoint import load_run_model

FORMATS = ("hf", "safetensors", "gguf")
__all__ = ["FORMATS", "ExportError", "export_run", "export_state_dict", "hf_config", "hf_state_dict", "is_gguf_file",
           "rope_permute", "tokenizer_json"]


class ExportError(WorkbenchError):
    pass


# rope_permute, hf_config and hf_state_dict live in workbench.interop.hf_layout (import uses the same table);
# the sentencepiece model's tokenizer.json in workbench.data.text.tokenizer_formats.

# ----------------------------------------------------------------------------- writers

def _contiguous(sd: dict) -> dict:
    # safetensors wants contiguous tensors that share no storage.
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in sd.items()}


def _save_safetensors(tensors: dict, path: Path, metadata: dict | None = None) -> None:
    # transformers refuses a file whose metadata lacks format=pt.
    save_file(_contiguous(tensors), str(path), metadata={"format": "pt", **(metadata or {})})


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_hf(dest: Path, sd: dict, cfg, tokenizer: AnyTokenizer | None, max_positions: int | None = None,
             chat: ChatExport | None = None) -> None:
    """Fill the (existing, empty) directory ``dest`` with a Hugging Face model (Llama, or Qwen2 / Qwen3
    where the model has their biases or QK-norm). ``chat``: a chat-tuned model's template goes into
    tokenizer_config.json and its end-of-turn id is the end of generation (generation_config.json)."""
    hf_tok = tokenizer if isinstance(tokenizer, HFTokenizer) else None
    eos = hf_tok.eod_id if hf_tok else None
    if chat is not None and chat.end_id is not None:
        eos = chat.end_id if eos is None or eos == chat.end_id else [chat.end_id, eos]
    try:
        config = hf_config(cfg, bos_id=hf_tok.bos_id if hf_tok else None, eos_id=eos, max_positions=max_positions)
    except LayoutError as e:
        raise ExportError(str(e)) from None
    _write_json(dest / "config.json", config)
    # every front's sampling defaults (plan.sampling); no max_length (it would clash with a caller's max_new_tokens)
    gen = {"do_sample": True, "temperature": TEXT.temperature, "top_k": TEXT.top_k, "top_p": TEXT.top_p}
    if hf_tok:
        gen.update(bos_token_id=hf_tok.bos_id)
    if eos is not None:
        gen.update(eos_token_id=eos)
    _write_json(dest / "generation_config.json", gen)
    _save_safetensors(hf_state_dict(sd, cfg), dest / "model.safetensors")
    if isinstance(tokenizer, Tokenizer):
        (dest / "tokenizer.model").write_bytes(tokenizer.proto)
        _write_json(dest / "tokenizer.json", tokenizer_json(tokenizer.proto))
        for name, obj in tokenizer_files(cfg.seq_len).items():
            if chat is not None and name == "tokenizer_config.json":
                obj = {**obj, "eos_token": chat.end_piece or obj.get("eos_token"), "chat_template": _config_value(chat)}
            _write_json(dest / name, obj)
    elif hf_tok:
        hf_tok.save(dest)  # the imported model's own files
        if chat is not None:  # with the template it was tuned with
            config_path = dest / HFTokenizer.CONFIG
            tc = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
            _write_json(config_path, {**tc, "chat_template": _config_value(chat)})
    if chat is not None:
        write_hf_templates(dest, chat)


def _config_value(chat: ChatExport) -> str | list[dict[str, str]]:
    """tokenizer_config.json's chat_template as transformers 4 reads it: the template, or named ones as a list."""
    if not chat.named:
        return chat.template
    return [{"name": "default", "template": chat.template}] + [{"name": n, "template": t} for n, t in chat.named]


def write_hf_templates(dest: Path, chat: ChatExport) -> None:
    """The templates as transformers 5's save_pretrained lays them out (and reads them first): the default in
    chat_template.jinja, each named one in additional_chat_templates/NAME.jinja. tokenizer_config.json holds
    the same (``_config_value``) for transformers 4 and converters that read only that file."""
    (dest / CHAT_TEMPLATE_FILE).write_text(chat.template, encoding="utf-8")
    if chat.named:
        (dest / ADDITIONAL_TEMPLATES_DIR).mkdir()
        for name, text in chat.named:
            (dest / ADDITIONAL_TEMPLATES_DIR / f"{name}.jinja").write_text(text, encoding="utf-8")


def write_raw(dest: Path, sd: dict, preset_toml: str | None, tokenizer: AnyTokenizer | None,
              metadata: dict | None = None) -> None:
    """The workbench state dict as model.safetensors, plus preset.toml and the tokenizer's files."""
    _save_safetensors(sd, dest / "model.safetensors", {k: str(v) for k, v in (metadata or {}).items()})
    if preset_toml is not None:
        (dest / rundir.PRESET_FILE).write_text(preset_toml, encoding="utf-8")
    if tokenizer is not None:
        tokenizer.save(dest)


def is_gguf_file(out: str | os.PathLike, fmt: str) -> bool:
    """A GGUF export to a path ending in ``.gguf`` is that file; any other path is a directory with model.gguf."""
    return fmt == "gguf" and Path(out).suffix.lower() == ".gguf"


def check_out_dir(out: str | os.PathLike, fmt: str = "hf") -> Path:
    """``out`` as the export will write it (a new or empty directory; a new file for :func:`is_gguf_file`), or an
    ExportError saying why not."""
    as_file = is_gguf_file(out, fmt)
    out = Path(out).expanduser()
    if as_file and (out.exists() or out.is_symlink()):
        raise ExportError(f"{out} exists; export never writes over a file: give a new path ending in .gguf "
                          "(or a new or empty directory)")
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


def _write_gguf_file(final: Path, write: Callable[[Path], None], log: Callable[[str], None]) -> None:
    """``write(path)`` into a temporary file beside ``final``, made durable, then renamed to ``final``: an
    interrupted export leaves no half file under the name asked for."""
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    try:
        log(f"writing {tmp.name}")
        write(tmp)
        fsync_file(tmp)
        log(f"renaming it to {final}")
        os.rename(tmp, final)
        fsync_dir(final.parent)
    finally:
        tmp.unlink(missing_ok=True)


def export_state_dict(sd: dict, cfg, fmt: str, out: Path, *, tokenizer_model: bytes | None = None,
                      tokenizer: AnyTokenizer | None = None, preset_toml: str | None = None,
                      metadata: dict | None = None, max_positions: int | None = None,
                      gguf_type: str = "f16", chat: ChatExport | None = None,
                      log: Callable[[str], None] | None = None) -> Path:
    """Export a state dict (no run needed) into the new or empty directory ``out`` (GGUF: the new file ``out`` where
    it ends in .gguf); returns the directory (or file) written. ``tokenizer`` (or the bytes of a sentencepiece
    ``tokenizer_model``) goes with it.

    Written into ``.<name>.tmp-<pid>`` beside ``out``, then renamed over it. ``log``: told each step.
    """
    log = log or (lambda _msg: None)
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    if tokenizer is None and tokenizer_model is not None:
        tokenizer = Tokenizer(tokenizer_model)
    if fmt == "gguf":  # what GGUF cannot hold is refused before anything is written
        check_gguf(sd, cfg, tokenizer, gguf_type)
        if chat is not None:
            chat.gguf_templates()  # two template names that GGUF would write as one key
    out = check_out_dir(out, fmt)
    try:
        if is_gguf_file(out, fmt):
            _write_gguf_file(out.resolve(), lambda path: write_gguf(path, sd, cfg, tokenizer, gguf_type, metadata or {},
                                                                    max_positions, chat), log)
            return out.resolve()
        with atomic_dir(out.resolve()) as tmp:  # an existing ``out`` is empty (checked above)
            what = {"hf": "config.json, model.safetensors and the tokenizer", "gguf": f"model.gguf ({gguf_type})",
                    "safetensors": "model.safetensors, preset.toml and the tokenizer"}[fmt]
            log(f"writing {what} into {tmp.name}")
            if fmt == "hf":
                write_hf(tmp, sd, cfg, tokenizer, max_positions, chat)
            elif fmt == "gguf":
                write_gguf(tmp / "model.gguf", sd, cfg, tokenizer, gguf_type, metadata or {}, max_positions, chat)
            else:
                write_raw(tmp, sd, preset_toml, tokenizer, metadata)
            log(f"renaming it to {out.resolve()}")
    except OSError as e:
        raise ExportError(f"cannot write {out}: {e.strerror or e}") from None
    return out.resolve()


def export_run(run_dir: Path, out: Path, fmt: str = "hf", checkpoint: str | int | None = "latest",
               gguf_type: str = "f16", log: Callable[[str], None] | None = None) -> tuple[Path, dict]:
    """Export a run's checkpoint (a LoRA run's adapters merged into its weights); returns (the output
    directory, or the GGUF file, and the checkpoint's sidecar). ``log``: told each step (the CLI's --progress)."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    check_out_dir(out, fmt)
    run_dir = Path(run_dir)
    rundir.select_checkpoint(run_dir, checkpoint)  # no checkpoint: say so before the tokenizer
    try:
        tokenizer = load_tokenizer(run_dir)
    except TokenizerError:
        raise ExportError(f"run {run_dir.name} has no tokenizer.model or tokenizer.json; it cannot be exported "
                          "with its tokenizer") from None
    # Shapes only (no memory, no init time for a large model): a state dict that does not fit the
    # preset is refused, naming the keys.
    if log:
        log(f"reading the weights of {run_dir.name} checkpoint {checkpoint}")
    loaded = load_run_model(run_dir, checkpoint, shapes_only=True)
    ckpt = loaded.meta
    meta = {"run": run_dir.name, "checkpoint": ckpt["name"], "step": ckpt.get("step"),
            "val_loss": ckpt.get("val_loss")}
    source = loaded.preset.source or {}
    if source.get("model"):
        meta["source"] = source["model"]
    max_pos = source.get("max_position_embeddings")
    dest = export_state_dict(loaded.state_dict, loaded.preset.model, fmt, out, tokenizer=tokenizer,
                             preset_toml=(run_dir / rundir.PRESET_FILE).read_text(encoding="utf-8"), metadata=meta,
                             max_positions=max_pos if isinstance(max_pos, int) else None, gguf_type=gguf_type,
                             chat=chat_export(run_dir, tokenizer), log=log)
    return dest, ckpt


def chat_export(run_dir: Path, tokenizer: AnyTokenizer) -> ChatExport | None:
    """A run's chat template (chat-tuned, or an imported model's own) and its end-of-turn token (None for a run
    with no template). An imported template workbench cannot mask travels as it came, with no end-of-turn
    token (a chat-tuned run's can always be masked: it was checked before training)."""
    if not (Path(run_dir) / CHAT_TEMPLATE_FILE).is_file():
        return None
    try:
        template = model_template(run_dir)
        named = model_templates(run_dir).others  # an imported model's tool-use, RAG, ... templates go with it
    except ChatTemplateError as e:
        raise ExportError(str(e)) from None
    assert template is not None  # (the run has its chat_template.jinja)
    try:
        end = end_of_turn(template, special_pieces(tokenizer))
    except ChatTemplateError:
        return ChatExport(template.text, None, None, named)
    return ChatExport(template.text, end, special_pieces(tokenizer)[end], named)
