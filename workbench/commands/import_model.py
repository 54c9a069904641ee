"""`workbench import MODEL_DIR`: a local Hugging Face Llama-family checkpoint as a run to fine-tune from."""

from __future__ import annotations

import argparse
from pathlib import Path

from workbench import rundir
from workbench.fmt import millions


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("import", help="import a local Hugging Face model (Llama, Qwen2, Qwen3) to fine-tune",
                       description="Read a local Hugging Face model directory (config.json, *.safetensors or "
                                   "sharded ones, tokenizer.json) of LlamaForCausalLM, Qwen2ForCausalLM or "
                                   "Qwen3ForCausalLM and create a run whose step-0 checkpoint holds its weights "
                                   "and whose tokenizer is the model's own. Nothing in the directory is run: "
                                   "custom code (auto_map) is refused, .bin weights load only with "
                                   "torch.load(weights_only=True). Train from it with "
                                   "`workbench train PRESET --init-from RUN`.")
    p.add_argument("model_dir", metavar="MODEL_DIR", help="the model's directory (already on this machine)")
    p.add_argument("--name", default=None, help="run id (default: the directory's name and the time)")
    p.add_argument("--seq-len", type=int, default=None, metavar="N",
                   help="the training context recorded as model.seq_len (default: the model's, at most 2048); "
                        "fine-tuning runs may change it")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.seq_len is not None and args.seq_len < 2:
        raise rundir.RunError(f"--seq-len {args.seq_len} must be at least 2")
    root = args.runs_dir
    from workbench.interop.hf_import import import_model  # imports torch
    r = import_model(Path(args.model_dir), root, args.name, args.seq_len, log=lambda m: print(m, flush=True))
    m, src, tok = r.preset.model, r.preset.source, r.tokenizer
    extras = [x for x, on in (("attention biases", m.attn_bias), ("QK-norm", m.qk_norm),
                              (f"rope scaling {m.rope_scaling} x{m.rope_factor:g}", m.rope_scaling != "none"),
                              ("tied embeddings", m.tie_embeddings)) if on]
    print(f"imported {src['architecture']} from {src['model']}: {millions(r.params, '.1f')} parameters (dim {m.dim}, "
          f"{m.n_layers} layers, {m.n_heads}/{m.n_kv_heads} heads of {m.head_dim}, MLP {m.hidden_dim}, vocab "
          f"{m.vocab_size:,}, context {src['max_position_embeddings']:,}"
          + (", " + ", ".join(extras) if extras else "") + f") in {r.seconds:.1f} s")
    eos = tok.tk.id_to_token(tok.eod_id)
    print(f"tokenizer: {tok.vocab_size:,} ids (tokenizer.json), end of document {eos!r} (id {tok.eod_id})")
    t = r.templates
    others = f"; {len(t.others)} other named: {', '.join(n for n, _t in t.others)} (additional_chat_templates/)" \
        if t.others else ""
    if t.default is not None:
        print(f"chat template: chat_template.jinja (from the model's {t.source}){others}")
    else:
        print("chat template: none (a chat fine-tune takes data.chat_template = \"chatml\" or a .jinja file)"
              + others)
    rid = r.run_dir.name
    print(f"run {rid} in {r.run_dir}")
    print(f"next: `workbench estimate cpu-small --init-from {rid}` (which of full / LoRA fits), then "
          f"`workbench train cpu-small --init-from {rid} --corpus YOUR_TEXT` with the --set it recommends")
    print(rid)
    return 0
