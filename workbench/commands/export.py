"""`workbench export`: a run's checkpoint as a Hugging Face Llama directory or raw safetensors."""

from __future__ import annotations

import sys

from workbench import rundir


def register(sub) -> None:
    p = sub.add_parser("export", help="export a checkpoint (Hugging Face Llama directory or safetensors)",
                       description="Write a run's checkpoint into a new or empty directory. --format hf: "
                                   "config.json, model.safetensors and the tokenizer, loadable with "
                                   "transformers' LlamaForCausalLM / AutoTokenizer. --format safetensors: the "
                                   "workbench state dict with preset.toml and tokenizer.model.")
    p.add_argument("run", help="run id or run directory")
    p.add_argument("out_dir", metavar="OUT_DIR", help="a new or empty directory to write")
    p.add_argument("--checkpoint", default="latest", help="latest (default), best, or a step number")
    p.add_argument("--format", dest="fmt", default="hf", metavar="{hf,safetensors}",
                   help="hf (default): Hugging Face Llama; safetensors: the raw workbench state dict")
    p.set_defaults(func=run)


def run(args) -> int:
    from workbench.train.export import FORMATS, ExportError, check_out_dir, export_run  # imports torch

    # Cheap checks first, before loading torch.
    if args.fmt not in FORMATS:
        raise ExportError(f"unknown export format {args.fmt!r}; choose one of: {', '.join(FORMATS)}")
    check_out_dir(args.out_dir)
    root = rundir.runs_root(getattr(args, "runs_dir", None))
    run_dir = rundir.resolve_run(root, args.run)
    rundir.select_checkpoint(run_dir, args.checkpoint)
    dest, ckpt = export_run(run_dir, args.out_dir, args.fmt, args.checkpoint)
    what = "Hugging Face Llama directory" if args.fmt == "hf" else "safetensors state dict"
    vl = ckpt.get("val_loss")
    print(f"exported {run_dir.name} {ckpt['name']}" + (f" (val loss {vl:.4f})" if vl is not None else "")
          + f" as a {what} to {dest}")
    if args.fmt == "hf":
        print(f"load it with: AutoModelForCausalLM.from_pretrained({str(dest)!r}) and "
              f"AutoTokenizer.from_pretrained({str(dest)!r})", file=sys.stderr)
    return 0
