"""Fine-tuning memory, measured beside the estimate: full and LoRA (with and without activation checkpointing).

    python bench/finetune_memory.py [--size tiny|100m] [--steps 4] [--batch 4] [--seq 256]
                                    [--device cpu|cuda] [--methods full,lora,lora+ac] [--json]

Builds a random Llama-family model locally with transformers (nothing is downloaded: tiny is dim 64 x 2
layers, 100m is dim 768 x 12 layers, 12/4 heads, vocab 32000, tied, 98 M parameters) and a small byte-level
BPE tokenizer, brings it in with `workbench import`, then runs `workbench train cpu-small --init-from` for a
few steps per method, each in its own process, on Python's own sources. The measured figure is what
`workbench runs` shows as MEM MB (the trainer's peak RSS on CPU, peak allocated on CUDA) and the estimate is
its EST MB (`workbench estimate` for the same run).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIZES = {
    "tiny": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=416),
    "100m": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                 num_key_value_heads=4, vocab_size=32000),
}
METHODS = {"full": ["train.finetune=full"], "lora": ["train.finetune=lora"],
           "lora+ac": ["train.finetune=lora", "hardware.activation_checkpointing=true"]}


def corpus_text() -> str:
    import json as j
    import string
    import textwrap
    return "\n\n".join(inspect.getsource(m) for m in (j.decoder, textwrap, string, inspect))


def build_model(out: Path, size: str) -> None:
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator([corpus_text()], trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**SIZES[size], max_position_embeddings=2048, tie_word_embeddings=True)
    transformers.LlamaForCausalLM(cfg).save_pretrained(out)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>").save_pretrained(out)


def wb(*args: str) -> str:
    cp = subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True, text=True,
                        env=dict(os.environ, PYTHONUNBUFFERED="1"), cwd=ROOT)
    if cp.returncode:
        raise SystemExit(f"workbench {' '.join(args)} failed:\n{cp.stdout[-2000:]}\n{cp.stderr[-2000:]}")
    return cp.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=SIZES, default="tiny")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--methods", default="full,lora,lora+ac")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        build_model(tmp / "model", args.size)
        (tmp / "corpus.txt").write_text(corpus_text() * 4, encoding="utf-8")
        runs = str(tmp / "runs")
        os.environ.setdefault("WORKBENCH_CACHE_DIR", str(tmp / "cache"))
        wb("import", str(tmp / "model"), "--name", "base", "--runs-dir", runs)
        rows = []
        for method in args.methods.split(","):
            name = method.replace("+", "-")
            wb("train", "cpu-small", "--init-from", "base", "--corpus", str(tmp / "corpus.txt"), "--name", name,
               "--runs-dir", runs, "--yes", "--set", f"model.seq_len={args.seq}", f"train.batch_size={args.batch}",
               f"train.max_iters={args.steps}", "train.warmup_iters=1", "train.eval_iters=1",
               f"train.eval_interval={args.steps}", f"train.ckpt_interval={args.steps}", "train.log_interval=1",
               "hardware.compile=false", "hardware.nproc=1", f"hardware.device={args.device}", *METHODS[method])
            r = next(x for x in json.loads(wb("runs", "--json", "--runs-dir", runs)) if x["id"] == name)
            ck = r["checkpoints"][-1]
            rows.append({"method": method, "measured_mb": r["mem_mb"], "estimate_mb": r["est_mem_mb"],
                         "error_pct": r["mem_err_pct"], "tokens_per_s": r["tokens_per_s"],
                         "checkpoint_bytes": ck["bytes"]})
        if args.json:
            print(json.dumps({"size": args.size, "device": args.device, "batch": args.batch, "seq": args.seq,
                              "rows": rows}, indent=1))
            return
        print(f"{args.size} model, {args.device}, batch {args.batch} x seq {args.seq}, {args.steps} steps "
              "(measured: the trainer's peak RSS on CPU / peak allocated on CUDA)")
        print(f"{'method':<10} {'measured MB':>12} {'estimate MB':>12} {'error':>7} {'tokens/s':>9} {'checkpoint':>11}")
        for x in rows:
            print(f"{x['method']:<10} {x['measured_mb']:>12,.0f} {x['estimate_mb']:>12,.0f} {x['error_pct']:>+6.0f}% "
                  f"{x['tokens_per_s'] or 0:>9,.0f} {x['checkpoint_bytes'] / 2**20:>9,.1f} MiB")


if __name__ == "__main__":
    main()
