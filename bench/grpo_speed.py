"""A GRPO step of workbench against TRL's GRPOTrainer on this CPU, side by side in one process (issue 56, "Speed
against the peer"): the same tiny Llama, prompts, group size, completion length and batch, beta 0, one inner
iteration, fp32.

    python bench/grpo_speed.py [--steps 5] [--warmup 1] [--prompts 8] [--group 8] [--new 32] [--dim 128]
        [--layers 4] [--threads 2] [--out DIR]
    python bench/grpo_speed.py --quick      # the smoke test's: dim 64, 2 layers, 2 prompts x 4, 8 tokens, 2 steps

1. Pretrains cpu-small (dim --dim, --layers layers, no QK-norm so it exports as a plain Llama, vocab 512,
   seq 128) for 20 steps on the built-in corpus through the real CLI, and exports it with
   ``workbench export --format hf``: TRL loads those weights and that tokenizer, workbench its own checkpoint.
2. workbench's step: ``workbench.train.grpo_step.rollout`` (every prompt's G completions as rows of one KV cache,
   the prompts left-padded to one length: ``sample_prompts``), then ``rollout_loss`` (one forward with log-probs,
   the dapo loss), backward, the gradient clipped to 1 and an AdamW step: what ``GRPORun.forward_backward`` and the
   loop do, without the run directory.
   Its generation is ``rollout`` (sampling and scoring).
3. TRL's step: ``GRPOTrainer.train()`` with per_device_train_batch_size = prompts x G, num_generations G,
   max_completion_length --new, beta 0, num_iterations 1, loss_type dapo (both defaults), AdamW, max_grad_norm 1,
   on the CPU in fp32; a step is timed from the trainer's ``on_step_begin`` to its ``on_step_end`` (prompt
   tokenising, ``generate``, scoring, the loss forward and backward, clipping, the optimizer); its generation is
   ``_generate_single_turn`` (the padded batch through ``transformers``' ``generate``).
4. Interleaved: TRL's trainer calls workbench's step from its ``on_step_end`` callback, so the steps run A, B, A,
   B... and a noisy neighbour hits both alike; --warmup pairs are dropped, then the medians of --steps pairs and
   the ratio of the paired step times. After each workbench step, outside its timing, the rollout's sampling as it
   was before batching across prompts: ``sample_rows``, a batch of G rows a prompt, the prompts one after another
   (the same completions but for rounding: each prompt keeps its own generator).

Equal lengths: the exported tokenizer has no EOS (workbench's sentencepiece model has none), so neither side can
stop early; workbench rolls out with no stop ids and TRL is given ``min_new_tokens = max_completion_length``
besides (a no-op without an EOS, a guard if one appears). Every completion of both sides is checked to be exactly
--new tokens. The reward (the same function on both sides, on decoded text): the share of the characters of a
completion that are letters, cheap so that the step is the engines' work.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench import cli_client  # noqa: E402

PROMPTS = ["def f1(", "def main(", "import os\n", "class A:", "for i in", "return x", "x = 1\n", "if x =="]
LR = 1e-5


def letters(text: str) -> float:
    """The reward of both sides: the share of a completion's characters that are letters."""
    return sum(c.isalpha() for c in text) / max(1, len(text))


def cli(*args: str) -> None:
    cp = cli_client.run([sys.executable, "-m", "workbench", *args], cwd=ROOT)
    if cp.returncode != 0:
        raise SystemExit(f"workbench {' '.join(args)} failed ({cp.returncode}):\n{cp.stdout}\n{cp.stderr}")


def make_model(out: Path, dim: int, layers: int) -> tuple[Path, Path]:
    """A tiny pretrained workbench run and its Hugging Face export (a Llama)."""
    heads = max(2, dim // 32)
    cli("train", "cpu-small", "--runs-dir", str(out), "--name", "base", "--set", f"model.dim={dim}",
        f"model.n_layers={layers}", f"model.n_heads={heads}", f"model.n_kv_heads={heads // 2}", "model.seq_len=128",
        "model.vocab_size=512", "model.qk_norm=false", "train.batch_size=4", "train.max_iters=20",
        "train.warmup_iters=2", "train.eval_iters=2", "train.eval_interval=20", "train.log_interval=10",
        "train.optimizer=adamw", "train.schedule=cosine", "data.builtin_mb=0.3", "data.tokenizer_sample_mb=0.3",
        "hardware.nproc=1", "hardware.compile=false")
    cli("export", str(out / "base"), str(out / "hf"), "--format", "hf")
    return out / "base", out / "hf"


class WorkbenchSide:
    """workbench's GRPO step on its own checkpoint."""

    def __init__(self, run: Path, args):
        import torch

        from workbench.data.text.tokenizer import load_tokenizer
        from workbench.train.checkpoint import load_run_model
        from workbench.train.grpo_step import GRPOSettings

        self.torch = torch
        self.model = load_run_model(run, "latest").model.float()
        self.tok = load_tokenizer(run)
        self.prompts = [self.tok.encode(p) for p in PROMPTS[:args.prompts]]
        self.settings = GRPOSettings(group=args.group, max_new_tokens=args.new, beta=0.0)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=LR, weight_decay=0.0)
        self.new = args.new
        self.times: list[tuple[float, float]] = []   # (step, generation) seconds
        self.per_prompt: list[float] = []             # the sampler's seconds with a batch of G rows a prompt

    def score(self, i: int, ids: list[int]) -> float:
        return letters(self.tok.decode(ids))

    def step(self, k: int) -> None:
        from workbench.train.grpo_step import rollout, rollout_loss

        t0 = time.perf_counter()
        r = rollout(self.model, self.prompts, self.score, self.settings, seed=0, step=k, stops=frozenset())
        self.model.train()
        t1 = time.perf_counter()
        loss, _ = rollout_loss(self.model, r, self.settings)
        loss.backward()
        self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        lens = {len(c) for c in r.completions}
        if lens != {self.new} or len(r.completions) != len(self.prompts) * self.settings.group:
            raise SystemExit(f"workbench: completions of {sorted(lens)} tokens, not all {self.new}")
        self.times.append((t2 - t0, t1 - t0))
        # before batching across prompts: rollout's sampling a batch of G rows a prompt (sample_rows, the prompts one
        # after another, each from its own seed as rollout seeds it); not part of the step above
        from workbench.train.generate import sample_rows
        from workbench.train.grpo_step import rollout_seed
        sampling = self.settings.sampling.replace(max_new_tokens=self.new)
        t3 = time.perf_counter()
        for i, p in enumerate(self.prompts):
            sample_rows(self.model, p, self.settings.group, sampling, rollout_seed(0, k, i), frozenset())
        self.per_prompt.append(time.perf_counter() - t3)


def trl_side(hf: Path, out: Path, args, wb: WorkbenchSide):
    """TRL's GRPOTrainer on the export, calling ``wb.step`` after each of its own steps (the interleaving);
    returns its (step, generation) seconds a step."""
    import warnings

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.utils import logging as hf_logging
    from trl import GRPOConfig, GRPOTrainer

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)

    tok = AutoTokenizer.from_pretrained(hf)
    # workbench's tokenizer has no EOS or pad: TRL needs both, so <unk> (id 0, never seen in training) is each;
    # min_new_tokens keeps generate from ending on it
    tok.pad_token = tok.eos_token = tok.unk_token
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
    times: list[list[float]] = []
    lens: set[int] = set()

    def reward(completions, **kw):
        return [letters(c) for c in completions]

    cfg = GRPOConfig(output_dir=str(out / "trl"), per_device_train_batch_size=args.prompts * args.group,
                     num_generations=args.group, max_completion_length=args.new, beta=0.0, num_iterations=1,
                     learning_rate=LR, weight_decay=0.0, max_grad_norm=1.0, max_steps=args.warmup + args.steps,
                     temperature=1.0, top_p=1.0, generation_kwargs={"min_new_tokens": args.new},
                     logging_steps=10**6, save_strategy="no", report_to=[], use_cpu=True, bf16=False,
                     disable_tqdm=True, seed=0, dataloader_num_workers=0)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, processing_class=tok,
                          train_dataset=Dataset.from_dict({"prompt": PROMPTS[:args.prompts]}))
    generate = trainer._generate_single_turn

    def timed_generate(*a, **kw):
        t = time.perf_counter()
        completion_ids, logprobs = generate(*a, **kw)
        times[-1][1] += time.perf_counter() - t
        lens.update(len(c) for c in completion_ids)
        return completion_ids, logprobs

    trainer._generate_single_turn = timed_generate

    class Interleave(TrainerCallback):
        def on_step_begin(self, *a, **kw):
            times.append([time.perf_counter(), 0.0])

        def on_step_end(self, state, *a, **kw):
            times[-1][0] = time.perf_counter() - times[-1][0]
            wb.step(len(times))

    trainer.add_callback(Interleave())
    trainer.train()
    if lens != {args.new}:
        raise SystemExit(f"TRL: completions of {sorted(lens)} tokens, not all {args.new}")
    return [(s, g) for s, g in times]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="keep the model here (default: a temporary dir)")
    ap.add_argument("--quick", action="store_true", help="the smoke test's size")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.warmup, args.prompts, args.group, args.new, args.dim, args.layers = 2, 1, 2, 4, 8, 64, 2
    if not 1 <= args.prompts <= len(PROMPTS):
        ap.error(f"--prompts: 1 to {len(PROMPTS)}")
    import torch
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        run, hf = make_model(out, args.dim, args.layers)
        print(f"model: dim {args.dim}, {args.layers} layers, vocab 512 (pretrained 20 steps, exported to HF) "
              f"in {time.perf_counter() - t:.0f} s; {args.prompts} prompts x G {args.group} = "
              f"{args.prompts * args.group} completions of {args.new} tokens a step, beta 0, one inner iteration, "
              f"fp32, {args.threads} threads; torch {torch.__version__}", flush=True)
        wb = WorkbenchSide(run, args)
        trl = trl_side(hf, out, args, wb)
    import transformers
    import trl as trl_pkg
    print(f"trl {trl_pkg.__version__}, transformers {transformers.__version__}; {args.warmup} warm-up pair(s) "
          f"dropped, then {args.steps} interleaved pairs (TRL, workbench, TRL, ...)")
    pairs = list(zip(trl, wb.times))
    for k, (t, w) in enumerate(pairs):
        print(f"  pair {k + 1}{' (warm-up)' if k < args.warmup else ''}: TRL {t[0]:.3f} s (generation {t[1]:.3f}), "
              f"workbench {w[0]:.3f} s (generation {w[1]:.3f})")
    pairs = pairs[args.warmup:]
    n = args.prompts * args.group
    rows = []
    for name, side in (("TRL GRPOTrainer", [p[0] for p in pairs]), ("workbench", [p[1] for p in pairs])):
        step = statistics.median(s for s, _ in side)
        gen = statistics.median(g / s for s, g in side)
        rows.append((name, step, n / step, gen))
    print(f"\n| {'side':<16} | s / step | completions / s | generation share |")
    print(f"|{'-' * 18}|---------:|----------------:|-----------------:|")
    for name, step, cps, gen in rows:
        print(f"| {name:<16} | {step:8.3f} | {cps:15.1f} | {gen:16.0%} |")
    ratios = [t[0] / w[0] for t, w in pairs]
    gen_ratios = [t[1] / w[1] for t, w in pairs]
    rest = [(t[0] - t[1]) / (w[0] - w[1]) for t, w in pairs]
    print(f"\nworkbench speed-up (TRL s / workbench s, paired): median {statistics.median(ratios):.2f}x "
          f"(range {min(ratios):.2f}-{max(ratios):.2f}); generation {statistics.median(gen_ratios):.2f}x, "
          f"the rest (loss, backward, optimizer) {statistics.median(rest):.2f}x")
    before = statistics.median(wb.per_prompt[args.warmup:])
    lengths = sorted(len(p) for p in wb.prompts)
    print(f"workbench's rollout (sampling and scoring) with the {n} rows in one left-padded batch (prompts of "
          f"{lengths[0]}-{lengths[-1]} tokens): {statistics.median(w[1] for _, w in pairs):.3f} s; its sampling "
          f"a batch of G rows a prompt, as before: {before:.3f} s; TRL's generation "
          f"{statistics.median(t[1] for t, _ in pairs):.3f} s")


if __name__ == "__main__":
    main()
