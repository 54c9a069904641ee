"""`workbench export`: a run's checkpoint as a Hugging Face Llama directory or raw safetensors."""

from __future__ import annotations

import argparse
import json
import sys

from workbench import rundir
from workbench.commands.common import add_progress_option, add_run_argument, print_progress


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("export", help="export a checkpoint (Hugging Face directory, GGUF or safetensors)",
                       description="Write a run's checkpoint into a new or empty directory (a LoRA run's adapters "
                                   "merged into its weights). --format hf: config.json, model.safetensors and the "
                                   "tokenizer, loadable with transformers' AutoModelForCausalLM / AutoTokenizer "
                                   "(Llama, or Qwen2 / Qwen3 for an imported model of theirs). --format gguf: "
                                   "model.gguf with the tokenizer embedded, for llama.cpp, Ollama, LM Studio (OUT_DIR "
                                   "ending in .gguf: that file). "
                                   "--format safetensors: the workbench state dict with preset.toml and the "
                                   "tokenizer.")
    add_run_argument(p, checkpoint=True)
    p.add_argument("out_dir", metavar="OUT_DIR", help="a new or empty directory to write (--format gguf: a new path "
                                                      "ending in .gguf is the file itself)")
    p.add_argument("--format", dest="fmt", default="hf", metavar="{hf,gguf,safetensors}",
                   help="hf (default): a Hugging Face model directory; gguf: one GGUF file; safetensors: the raw "
                        "workbench state dict")
    p.add_argument("--gguf-type", default="f16", metavar="{f16,f32}",
                   help="GGUF: the matrices' type (default f16; vectors are always f32)")
    add_progress_option(p, "WHAT", "as the export goes")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from workbench.interop.export import FORMATS, ExportError, check_out_dir, export_run, is_gguf_file  # imports torch

    # Cheap checks first, before loading torch.
    if args.fmt not in FORMATS:
        raise ExportError(f"unknown export format {args.fmt!r}; choose one of: {', '.join(FORMATS)}")
    if args.gguf_type not in ("f16", "f32"):
        raise ExportError(f"--gguf-type {args.gguf_type!r}: choose f16 or f32")
    check_out_dir(args.out_dir, args.fmt)
    root = args.runs_dir
    run_dir = rundir.resolve_run(root, args.run)
    rundir.select_checkpoint(run_dir, args.checkpoint)
    dest, ckpt = export_run(run_dir, args.out_dir, args.fmt, args.checkpoint, gguf_type=args.gguf_type,
                            log=print_progress if args.progress else None)
    gguf = dest if is_gguf_file(args.out_dir, args.fmt) else dest / "model.gguf"
    what = {"hf": "Hugging Face " + json.loads((dest / "config.json").read_text())["architectures"][0]
            + " directory" if args.fmt == "hf" else "",
            "gguf": f"GGUF file ({args.gguf_type})" + ("" if gguf == dest else f", {gguf},"),
            "safetensors": "safetensors state dict"}[args.fmt]
    vl = ckpt.get("val_loss")
    print(f"exported {run_dir.name} {ckpt['name']}" + (f" (val loss {vl:.4f})" if vl is not None else "")
          + f" as a {what} to {dest}")
    if args.fmt == "hf":
        print(f"load it with: AutoModelForCausalLM.from_pretrained({str(dest)!r}) and "
              f"AutoTokenizer.from_pretrained({str(dest)!r})", file=sys.stderr)
    elif args.fmt == "gguf":
        print(f"run it with: llama-cli -m {gguf} (or `ollama create` with a Modelfile FROM {gguf})", file=sys.stderr)
    return 0
