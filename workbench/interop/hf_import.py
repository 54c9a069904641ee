"""``workbench import MODEL_DIR``: a local Hugging Face checkpoint of the Llama family as a workbench run.

A model directory is data, never code: nothing in it is executed or unpickled. ``config.json`` is read as
JSON (one that asks for custom code, ``auto_map``, is refused), weights come from ``*.safetensors``
(sharded ones through ``model.safetensors.index.json``), or ``pytorch_model*.bin`` only through
``torch.load(weights_only=True)``, and the tokenizer from ``tokenizer.json`` (the ``tokenizers`` library).

Everything is checked before anything is written (architecture, every tensor's name and shape, shards,
the tokenizer against the embedding); then the run is made: ``preset.toml`` (the mapped [model], a
[source] table saying where it came from), the tokenizer files, the chat templates (whichever form the
model holds them in: ``chat_template.jinja``, named ones in ``additional_chat_templates/``), a step-0
checkpoint with the weights in fp32, ``status.json`` state ``imported``. An error on the way removes the run
directory again.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from workbench import rundir
from workbench.config import Preset, preset_from_dict, preset_to_toml
from workbench.data.chat.chat_templates import (
    ADDITIONAL_TEMPLATES_DIR,
    CHAT_TEMPLATE_FILE,
    ChatTemplateError,
    ModelTemplates,
    model_templates,
)
from workbench.data.text.tokenizer import HFTokenizer, TokenizerError
from workbench.errors import WorkbenchError
from workbench.fs import write_atomic
from workbench.interop.hf_layout import SUPPORTED, LayoutError, model_config, tensor_names, workbench_state_dict
from workbench.train.checkpoint import save_checkpoint
from workbench.train.model import GPT
from workbench.train.state import TrainerState

# Tensors a checkpoint may carry that the model computes itself.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class ImportModelError(WorkbenchError):
    pass


def read_config(model_dir: Path) -> dict:
    """config.json of a supported architecture, or one line saying why not."""
    d = Path(model_dir).expanduser()
    if not d.is_dir():
        raise ImportModelError(f"{d} is not a directory; give a Hugging Face model directory (config.json, "
                               "*.safetensors, tokenizer.json)")
    path = d / "config.json"
    if not path.is_file():
        raise ImportModelError(f"{d} has no config.json: not a Hugging Face model directory")
    try:
        hf = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ImportModelError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(hf, dict):
        raise ImportModelError(f"{path} is not a JSON object")
    if "auto_map" in hf or hf.get("trust_remote_code"):
        raise ImportModelError(f"{path} asks for custom code (auto_map); a model directory is data, and workbench "
                               f"never runs code from one; it imports {SUPPORTED}")
    archs = hf.get("architectures")
    if not (isinstance(archs, list) and archs and isinstance(archs[0], str)):
        raise ImportModelError(f"{path} names no architecture; workbench imports {SUPPORTED}")
    return hf


# ----------------------------------------------------------------------------- weights

@dataclass
class WeightFiles:
    files: list[Path]
    kind: str                               # safetensors | bin
    shapes: dict[str, tuple[int, ...]]      # tensor name -> shape (read from headers; .bin files are loaded)
    where: dict[str, Path]                  # tensor name -> its file


def _index_files(d: Path, index_name: str) -> list[Path]:
    path = d / index_name
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
        weight_map = index["weight_map"]
        names = sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ImportModelError(f"{path} is not a valid shard index ({type(e).__name__}: {e})") from None
    bad = [n for n in names if not isinstance(n, str) or "/" in n or n.startswith(".")]
    if bad:
        raise ImportModelError(f"{path} names shard files outside the directory: {bad[0]!r}")
    missing = [n for n in names if not (d / n).is_file()]
    if missing:
        raise ImportModelError(f"{len(missing)} shard file(s) listed in {index_name} are missing: "
                               f"{', '.join(missing[:3])}" + (" ..." if len(missing) > 3 else ""))
    return [d / n for n in names]


def weight_files(model_dir: Path) -> WeightFiles:
    """The weight files and the name and shape of every tensor in them (safetensors preferred)."""
    d = Path(model_dir)
    if (d / "model.safetensors.index.json").is_file():
        files, kind = _index_files(d, "model.safetensors.index.json"), "safetensors"
    elif (d / "model.safetensors").is_file():
        files, kind = [d / "model.safetensors"], "safetensors"
    elif (d / "pytorch_model.bin.index.json").is_file():
        files, kind = _index_files(d, "pytorch_model.bin.index.json"), "bin"
    elif (d / "pytorch_model.bin").is_file():
        files, kind = [d / "pytorch_model.bin"], "bin"
    else:
        raise ImportModelError(f"{d} has no weights: expected model.safetensors (or shards with "
                               "model.safetensors.index.json), or pytorch_model.bin")
    shapes, where = {}, {}
    for f in files:
        for name, t in _tensors(f, kind, shapes_only=True):
            if name in where:
                raise ImportModelError(f"tensor {name} is in both {where[name].name} and {f.name}")
            shapes[name], where[name] = t, f
    return WeightFiles(files, kind, shapes, where)


def _tensors(path: Path, kind: str, shapes_only: bool = False):
    """(name, tensor) of one file; (name, shape) with ``shapes_only`` (safetensors reads only the header)."""
    try:
        if kind == "safetensors":
            with safe_open(str(path), "pt") as f:
                for name in f.keys():
                    yield name, (tuple(f.get_slice(name).get_shape()) if shapes_only else f.get_tensor(name))
            return
        sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # noqa: BLE001 - OSError, UnpicklingError, safetensors' own errors
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:120]
        raise ImportModelError(f"cannot read {path.name}: {first} (truncated, corrupt, or an unsafe pickle, "
                               "which is refused)") from None
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise ImportModelError(f"{path.name} is not a state dict of tensors")
    for name, t in sd.items():
        yield name, (tuple(t.shape) if shapes_only else t)


def check_tensors(w: WeightFiles, cfg) -> None:
    """Every tensor the model needs is there with its shape; nothing is there that it would ignore."""
    with torch.device("meta"):
        own = GPT(cfg).state_dict()
    wanted = {theirs: tuple(own[ours].shape) for ours, theirs, _h in tensor_names(cfg)}
    missing = [n for n in wanted if n not in w.shapes]
    wrong = [f"{n} {w.shapes[n]} (expected {s})" for n, s in wanted.items() if n in w.shapes and w.shapes[n] != s]
    extra = [n for n in w.shapes if n not in wanted and not n.endswith(IGNORED_SUFFIXES)
             and not (n == "lm_head.weight" and cfg.tie_embeddings)]
    if missing:
        raise ImportModelError(f"the weights lack {len(missing)} tensor(s) the config needs: "
                               f"{', '.join(missing[:3])}" + (" ..." if len(missing) > 3 else "")
                               + " (missing or mismatched shard files?)")
    if wrong:
        raise ImportModelError(f"tensor shapes do not match config.json: {'; '.join(wrong[:2])}")
    if extra:
        raise ImportModelError(f"the weights hold {len(extra)} tensor(s) this architecture does not have: "
                               f"{', '.join(extra[:3])}" + (" ..." if len(extra) > 3 else ""))


def read_weights(w: WeightFiles, cfg) -> dict[str, torch.Tensor]:
    """The model's tensors in workbench's names and RoPE order, fp32, one file at a time."""
    wanted = {theirs for _o, theirs, _h in tensor_names(cfg)}
    hf_sd = {}
    for f in w.files:
        for name, t in _tensors(f, w.kind):
            if name in wanted:
                hf_sd[name] = t
    return workbench_state_dict(hf_sd, cfg)


# ----------------------------------------------------------------------------- tokenizer

def _first_id(value) -> int | None:
    if isinstance(value, list):
        value = value[0] if value else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_tokenizer(model_dir: Path, hf: dict, vocab_size: int) -> HFTokenizer:
    """tokenizer.json (+ tokenizer_config.json) with its end-of-sequence id made explicit, checked
    against the embedding's ``vocab_size`` rows."""
    d = Path(model_dir)
    if not (d / "tokenizer.json").is_file():
        what = " (it has tokenizer.model: save a fast tokenizer with transformers' " \
               "AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR))" if (d / "tokenizer.model").is_file() else ""
        raise ImportModelError(f"{d} has no tokenizer.json{what}")
    try:
        tok = HFTokenizer.load(d / "tokenizer.json")
    except TokenizerError as e:
        raise ImportModelError(str(e)) from None
    if tok.vocab_size > vocab_size:
        raise ImportModelError(f"the tokenizer has {tok.vocab_size:,} ids but the embedding has {vocab_size:,} rows "
                               "(vocab_size in config.json): the tokenizer is not this model's")
    if tok.eod_id is None:
        gen = {}
        if (d / "generation_config.json").is_file():
            try:
                gen = json.loads((d / "generation_config.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                gen = {}
        eos = _first_id(gen.get("eos_token_id")) if isinstance(gen, dict) else None
        eos = eos if eos is not None else _first_id(hf.get("eos_token_id"))
        if eos is None:
            raise ImportModelError("the model names no end-of-sequence token (eos_token in tokenizer_config.json, "
                                   "eos_token_id in config.json); workbench puts it between documents")
        try:
            tok = tok.with_eos(eos)
        except TokenizerError as e:
            raise ImportModelError(str(e)) from None
    return tok


# A named template's file name in additional_chat_templates/ (as transformers saves them; never a path).
_TEMPLATE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def read_templates(model_dir: Path, log=print) -> ModelTemplates:
    """The model's chat templates in whichever form it holds them (chat_template.jinja, tokenizer_config.json's
    chat_template as a string or named templates, chat_template.json); a named one whose name is not a plain
    file name is left out, and said so."""
    try:
        found = model_templates(model_dir)
    except ChatTemplateError as e:
        raise ImportModelError(str(e)) from None
    for name, _t in found.others:
        if not _TEMPLATE_NAME.fullmatch(name):
            log(f"left out the chat template named {name!r}: its name cannot be a file name")
    return ModelTemplates(found.default, found.source,
                          tuple((n, t) for n, t in found.others if _TEMPLATE_NAME.fullmatch(n)))


def save_templates(run_dir: Path, found: ModelTemplates) -> None:
    """The default template as the run's chat_template.jinja (what chat, eval, export and a chat fine-tune read
    as the model's own), the others as additional_chat_templates/NAME.jinja (transformers 5's layout)."""
    if found.default is not None:
        write_atomic(run_dir / CHAT_TEMPLATE_FILE, found.default.encode("utf-8"))
    if found.others:
        (run_dir / ADDITIONAL_TEMPLATES_DIR).mkdir()
        for name, text in found.others:
            write_atomic(run_dir / ADDITIONAL_TEMPLATES_DIR / f"{name}.jinja", text.encode("utf-8"))


# ----------------------------------------------------------------------------- the run

@dataclass
class Imported:
    run_dir: Path
    preset: Preset
    params: int
    tokenizer: HFTokenizer
    seconds: float
    templates: ModelTemplates


def plan_import(model_dir: Path, seq_len: int | None = None, log=print
                ) -> tuple[Preset, WeightFiles, HFTokenizer, ModelTemplates]:
    """Everything checked, nothing written: the run's preset, its weight files, its tokenizer and chat
    templates."""
    d = Path(model_dir).expanduser().resolve()
    hf = read_config(d)
    try:
        model = model_config(hf, seq_len)
    except LayoutError as e:
        raise ImportModelError(f"{d / 'config.json'}: {e}") from None
    arch = hf["architectures"][0]
    source = {"model": str(d), "architecture": arch, "model_type": str(hf.get("model_type", "")),
              "max_position_embeddings": int(hf.get("max_position_embeddings") or model["seq_len"]),
              "imported": time.strftime("%Y-%m-%d %H:%M:%S")}
    data = {"name": d.name, "description": f"{arch} imported from {d}", "model": model, "source": source}
    try:
        preset = preset_from_dict(data, str(d / "config.json"), name=rundir.sanitize_run_name(d.name))
    except WorkbenchError as e:
        raise ImportModelError(str(e)) from None
    w = weight_files(d)
    check_tensors(w, preset.model)
    tok = read_tokenizer(d, hf, preset.model.vocab_size)
    return preset, w, tok, read_templates(d, log)


def import_model(model_dir: Path, root: Path, name: str | None = None, seq_len: int | None = None,
                 log=print) -> Imported:
    t0 = time.time()
    preset, w, tok, templates = plan_import(model_dir, seq_len, log)
    params = 0

    def fill(run_dir: Path) -> str:
        nonlocal params
        preset.data.tokenizer = str(run_dir / tok.FILE)
        log(f"reading {len(w.files)} weight file(s) ({w.kind}) ...")
        sd = read_weights(w, preset.model)
        params = sum(t.numel() for t in sd.values())
        tok.save(run_dir)
        save_templates(run_dir, templates)
        meta = {"train_loss": None, "val_loss": None, "tokens_seen": 0, "elapsed_s": 0.0, "reason": "import",
                "preset": preset.name, "best_val_loss": None, "model": vars(preset.model), "world_size": 1,
                "finetune": "full", "source": preset.source["model"]}
        save_checkpoint(run_dir, 0, sd, {}, TrainerState().to_dict(), meta)
        rundir.append_records(run_dir / rundir.METRICS_FILE, [rundir.EventRecord(
            event="import", step=0, time=time.time(),
            data={"source": preset.source["model"], "params": params,
                  "architecture": preset.source["architecture"]})])
        rundir.write_status(run_dir, state="imported", step=0, max_iters=0, error=None, pid=None,
                            source=preset.source["model"])
        return preset_to_toml(preset)  # written last by make_run: the preset's file makes it a run
    run_dir = rundir.make_run(root, preset.name, fill, name)
    return Imported(run_dir, preset, params, tok, time.time() - t0, templates)
