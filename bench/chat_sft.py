"""Chat fine-tuning teaches, and packing pays: exact match on held-out instruction conversations before and
after chat-tuning a pretrained model, loss on the answers against loss on every token, and trained tokens per
second with conversations packed into rows against one conversation a row.

    python bench/chat_sft.py [--out DIR]   # ~10 minutes on a quiet 2-core CPU; runs finished in DIR are kept
    python bench/chat_sft.py --quick       # a smaller version (~3 minutes)

1. Pretrains cpu-small from scratch on the built-in corpus (model.seq_len 128, --pretrain steps): it never
   sees the chat template.
2. Writes 2,000 training conversations (tests/support/chat.py, seed 0: reverse words, sort numbers, look up a
   colour in the system prompt's table; 45 tokens on average, at most 60) and --held held-out ones (seed 1).
3. Exact match: the greedy reply to each held-out conversation without its last assistant message, stripped,
   equal to that message.
4. Three fine-tunes of --steps steps with `--init-from` the pretrained run, the same seed (so the same
   weights): train.loss_on = assistant, packed (the default); loss_on = all, packed; loss_on = assistant,
   data.packing = false. Every --every steps a checkpoint is kept and scored; "s to X %" is the training time
   (the run's elapsed_s, interpolated between checkpoints) until the run first reaches X, the lowest final
   score of the three. A fourth, one conversation a row for as many steps as it takes to train on as many
   answer tokens as the packed run did; a fifth, packed with fewer rows a step for those same steps and about
   the same answer tokens: the same data in the same number of optimizer steps, packing the only difference
   (it should cost no score: no conversation sees another).
5. Trained tokens/s: the assistant targets the run's batches held after its first logged step (its sampler
   replayed from the run's preset), over the training time from then to its last step.

Every run goes through the real CLI in a subprocess (the commands are printed at the end); runs and the
data cache (WORKBENCH_CACHE_DIR) are in --out (default: a new temporary directory).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from tests.support.chat import conversations, write_jsonl  # noqa: E402
from workbench import cli_client  # noqa: E402

COMMON = ["model.seq_len=128", "hardware.compile=false", "train.eval_iters=5", "train.patience=0",
          "train.sample_prompt="]
VARIANTS = (("assistant, packed", ["train.loss_on=assistant"]),
            ("all, packed", ["train.loss_on=all"]),
            ("assistant, unpacked", ["train.loss_on=assistant", "data.packing=false"]))
COMMANDS: list[str] = []


def train(out: Path, name: str, corpus: str, sets: list[str], init_from: str | None = None) -> float:
    """`workbench train cpu-small` in a subprocess (a run finished in an earlier call with the same --out is
    kept); its process's wall time in seconds."""
    args = ["train", "cpu-small", "--corpus", corpus, "--runs-dir", str(out / "runs"), "--name", name, "--yes",
            *(["--init-from", init_from] if init_from else []), "--set", *sets]
    COMMANDS.append(f"WORKBENCH_CACHE_DIR={shlex.quote(str(out / 'cache'))} python -m workbench {shlex.join(args)}")
    run_dir = out / "runs" / name
    status = json.loads((run_dir / "status.json").read_text()) if (run_dir / "status.json").is_file() else {}
    if status.get("state") != "finished":
        shutil.rmtree(run_dir, ignore_errors=True)
        cp = cli_client.run([sys.executable, "-m", "workbench", *args], cwd=ROOT,
                            env=dict(os.environ, WORKBENCH_CACHE_DIR=str(out / "cache")))
        if cp.returncode != 0:
            raise SystemExit(f"chat_sft: {name} failed ({cp.returncode}):\n{cp.stdout[-2000:]}\n{cp.stderr[-2000:]}")
        status = json.loads((run_dir / "status.json").read_text())
    chat = [line for line in (run_dir / "train.log").read_text().splitlines() if "chat: " in line]
    wall = status["finished"] - status["pid_start"]
    print(f"  {name}: {wall:.0f} s" + (f"; {chat[0].split('chat: ', 1)[1]}" if chat else ""), flush=True)
    return wall


def kind(rec: dict) -> str:
    text = rec["messages"][-2]["content"]
    return "reverse" if text.startswith("Reverse") else "sort" if text.startswith("Sort") else "colour"


def replies(run_dir: Path, step: str | int, recs: list[dict], batch: int = 64, device: str = "cpu") -> list[str]:
    """The greedy reply of ``run_dir``'s checkpoint ``step`` to each conversation without its last message.

    Prompts of the same token length go through together (a KV cache of ``batch`` rows, no padding, so each row
    computes what workbench.train.chat_reply.reply computes for it alone; the prompts too long for the context
    go through reply itself; tests/bench/test_chat_sft_replies.py checks the two agree), which makes scoring a few
    hundred conversations take seconds, not minutes."""
    import torch

    from workbench.data.chat.chat_templates import load_chat_template
    from workbench.data.chat.conversations import ChatEncoder
    from workbench.data.text.tokenizer import load_tokenizer
    from workbench.train.chat_reply import reply
    from workbench.train.checkpoint import load_run_model

    model, tok = load_run_model(run_dir, step, device=device).model, load_tokenizer(run_dir)
    model.eval()
    enc = ChatEncoder(load_chat_template("chatml"), tok)  # the pretrained run has none; the fine-tunes use it
    stops = {enc.end_id, *([tok.eod_id] if tok.eod_id is not None else [])}
    max_tokens = 4 + max(len(tok.encode(r["messages"][-1]["content"])) for r in recs)  # the longest answer + 4
    prompts = [enc.prompt_ids(r["messages"][:-1]) for r in recs]
    by_len: dict[int, list[int]] = {}
    out: list[list[int]] = [[] for _ in recs]
    for i, p in enumerate(prompts):
        if len(p) + max_tokens > model.cfg.seq_len:  # generate's context roll: the one-at-a-time reply
            out[i] = reply(model, tok, enc.template, recs[i]["messages"][:-1], max_tokens=max_tokens).ids
        else:
            by_len.setdefault(len(p), []).append(i)
    dtype = next(model.parameters()).dtype
    with torch.no_grad():
        for idx in by_len.values():
            for lo in range(0, len(idx), batch):
                rows = idx[lo:lo + batch]
                cache = model.new_cache(len(rows), device, dtype)
                logits, _ = model(torch.tensor([prompts[i] for i in rows], device=device), cache=cache)
                live = set(rows)                       # the rows not yet at their end-of-turn token
                for t in range(max_tokens):
                    nxt = logits[:, -1].argmax(-1).tolist()
                    for i, tid in zip(rows, nxt):
                        if i in live and tid in stops:
                            live.discard(i)
                        elif i in live:
                            out[i].append(tid)
                    if not live or t + 1 == max_tokens:
                        break
                    logits, _ = model(torch.tensor(nxt, device=device)[:, None], cache=cache)
    return [tok.decode(ids) for ids in out]


def score(run_dir: Path, step: str | int, held: list[dict], device: str = "cpu") -> dict[str, float]:
    """Exact match (%) of the greedy replies of ``run_dir``'s checkpoint ``step``, overall and by kind."""
    hits: dict[str, list[bool]] = {"all": [], "reverse": [], "sort": [], "colour": []}
    for rec, got in zip(held, replies(run_dir, step, held, device=device)):
        ok = got.strip() == rec["messages"][-1]["content"].strip()
        hits["all"].append(ok)
        hits[kind(rec)].append(ok)
    return {k: 100.0 * sum(v) / max(1, len(v)) for k, v in hits.items()}


def score_in_process(run_dir: Path, n_held: int, device: str = "cpu") -> dict[str, float]:
    """:func:`score` of the run's latest checkpoint on the first ``n_held`` held-out conversations (seed 1), in
    a process of its own with one thread (benches that train several runs at once score them side by side)."""
    cp = subprocess.run([sys.executable, __file__, "--score", str(run_dir), "--held", str(n_held), "--device",
                         device], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                        env=dict(os.environ, OMP_NUM_THREADS="1"))
    if cp.returncode != 0:
        raise SystemExit(f"chat_sft: scoring {run_dir} failed ({cp.returncode}):\n{cp.stderr[-2000:]}")
    return json.loads(cp.stdout.splitlines()[-1])


def trained_per_step(run_dir: Path, steps: int) -> list[int]:
    """The trained targets of each of the run's ``steps`` steps: its train sampler replayed from its preset."""
    from workbench.config import load_preset_file
    from workbench.data.preset_data import prepare_data

    p = load_preset_file(run_dir / "preset.toml")
    data = prepare_data(p.data, p.model.vocab_size, p.model.seq_len, log=lambda m: None, loss_on=p.train.loss_on)
    sampler = data.sampler("train", p, p.train.seed)
    out = []
    for _ in range(steps):
        out.append(sum(sampler.next_batch().trained() for _ in range(p.train.grad_accum)))
    return out


def fine_tune(out: Path, name: str, label: str, corpus: str, sets: list[str], steps: int, every: int,
              held: list[dict]) -> dict:
    """A chat fine-tune from the pretrained run (or the one finished in --out), its checkpoints scored."""
    run_dir = out / "runs" / name
    log = 10 if every % 10 == 0 else every
    wall = train(out, name, corpus, [*COMMON, *sets, f"train.max_iters={steps}",
                                     f"train.warmup_iters={max(1, steps // 10)}", f"train.eval_interval={steps}",
                                     f"train.ckpt_interval={every}", f"train.milestone_interval={every}",
                                     f"train.log_interval={log}"], init_from="pre")
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    elapsed = {r["step"]: r["elapsed_s"] for r in recs if r.get("kind") == "train"}
    tps = [r["tokens_per_s"] for r in recs if r.get("kind") == "train" and r.get("tokens_per_s")]
    points, scores = [], {}
    for step in sorted(set(range(every, steps + 1, every)) | {steps}):
        scores[step] = score(run_dir, step, held)
        points.append((elapsed[step], scores[step]["all"]))
    first = min(elapsed)
    per_step = trained_per_step(run_dir, steps)
    trained_tps = sum(per_step[first:]) / (elapsed[steps] - elapsed[first])
    return dict(label=label, steps=steps, wall=wall, scores=scores, points=points, trained_tps=trained_tps,
                positions_tps=float(np.median(tps)) if tps else 0.0, trained=sum(per_step))


def time_to(points: list[tuple[float, float]], target: float) -> float | None:
    """Seconds until the score first reaches ``target``, interpolated between the (seconds, score) around it."""
    prev = (0.0, 0.0)
    for t, s in points:
        if s >= target:
            return t if s == prev[1] else prev[0] + (t - prev[0]) * (target - prev[1]) / (s - prev[1])
        prev = (t, s)
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps and held-out conversations")
    ap.add_argument("--pretrain", type=int, default=None, help="pretraining steps (default 400; quick 100)")
    ap.add_argument("--steps", type=int, default=None, help="fine-tuning steps (default 400; quick 60)")
    ap.add_argument("--every", type=int, default=None, help="score a checkpoint every this many steps")
    ap.add_argument("--held", type=int, default=None, help="held-out conversations (default 200; quick 60)")
    ap.add_argument("--out", type=Path, default=None, help="runs and cache here (default: a new temp dir)")
    ap.add_argument("--score", type=Path, default=None, help=argparse.SUPPRESS)  # score_in_process's entry
    ap.add_argument("--device", default="cpu", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.score:
        print(json.dumps(score(a.score, "latest", conversations(a.held, seed=1), device=a.device)))
        return 0
    pre_steps = a.pretrain or (100 if a.quick else 400)
    steps = a.steps or (60 if a.quick else 400)
    every = a.every or steps // (2 if a.quick else 4)
    n_held = a.held or (60 if a.quick else 200)
    out = (a.out or Path(tempfile.mkdtemp(prefix="wb-chat-sft-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ["WORKBENCH_CACHE_DIR"] = str(out / "cache")  # the sampler replay reads the runs' prepared data
    t_start = time.time()
    corpus = str(write_jsonl(out / "train.jsonl", conversations(2000, seed=0)))
    held = conversations(n_held, seed=1)
    print(f"chat_sft in {out}: pretrain {pre_steps} steps, fine-tunes {steps} steps, {n_held} held out", flush=True)

    pre_s = train(out, "pre", "builtin", [*COMMON, f"train.max_iters={pre_steps}", "train.log_interval=50",
                                          f"train.warmup_iters={min(40, pre_steps // 4)}",
                                          f"train.eval_interval={pre_steps}"])
    before = score(out / "runs" / "pre", "latest", held)
    results = [fine_tune(out, f"ft{i}", label, corpus, sets, steps, every, held)
               for i, (label, sets) in enumerate(VARIANTS)]
    # one conversation a row for as many trained targets as the packed run trained on (its own schedule over
    # them): does packing cost quality at equal data? (packing's cross-talk is what hurts elsewhere)
    matched = round(steps * results[0]["trained"] / results[2]["trained"] / 10) * 10
    equal = fine_tune(out, "ft3", "assistant, unpacked, as many trained targets", corpus, VARIANTS[2][1], matched,
                      matched // 4, held)
    # and packed with rows enough for the same trained targets a step: the same data in the same number of
    # optimizer steps, so packing (and its mask) is the only difference
    from workbench.config import load_preset_file
    batch = load_preset_file(out / "runs" / "ft0" / "preset.toml").train.batch_size
    small = max(1, round(batch * results[2]["trained"] / results[0]["trained"]))
    same = fine_tune(out, "ft4", f"assistant, packed, batch {small}", corpus,
                     [*VARIANTS[0][1], f"train.batch_size={small}"], matched, matched // 4, held)

    target = min(r["points"][-1][1] for r in results)
    steps_shown = sorted(results[0]["scores"])
    print(f"\npretrained cpu-small ({pre_steps} steps of builtin, {pre_s:.0f} s): exact match "
          f"{before['all']:.1f} % on {n_held} held-out conversations (reverse {before['reverse']:.0f} / sort "
          f"{before['sort']:.0f} / colour {before['colour']:.0f} %)")
    head = ["fine-tune (loss on, rows)", *[f"EM @{s}" for s in steps_shown], "final rev/sort/col %", "train s",
            f"s to {target:.1f} %", "trained tok/s", "positions/s", "trained targets"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in results:
        last = r["scores"][steps]
        reach = time_to(r["points"], target) if target > 0 else None
        print(f"| {r['label']} | " + " | ".join(f"{r['scores'][s]['all']:.1f} %" for s in steps_shown)
              + f" | {last['reverse']:.0f} / {last['sort']:.0f} / {last['colour']:.0f} | {r['points'][-1][0]:.0f}"
              + f" | {f'{reach:.0f}' if reach is not None else '-'} | {r['trained_tps']:,.0f}"
              + f" | {r['positions_tps']:,.0f} | {r['trained']:,} |")
    packed, unpacked = results[0], results[2]
    print(f"\npacking pays: {packed['trained_tps']:,.0f} / {unpacked['trained_tps']:,.0f} trained tokens/s = "
          f"{packed['trained_tps'] / unpacked['trained_tps']:.2f}x (packed / one conversation a row, padded to 128)")
    print(f"equal data: one conversation a row for {equal['steps']} steps ({equal['trained']:,} trained targets, "
          f"packed: {packed['trained']:,} in {steps}): exact match "
          + ", ".join(f"{v['all']:.1f} % @{k}" for k, v in equal["scores"].items())
          + f" (packed {packed['scores'][steps]['all']:.1f} % @{steps}); {equal['points'][-1][0]:.0f} s of training "
          f"against {packed['points'][-1][0]:.0f} s; {equal['trained_tps']:,.0f} trained tokens/s")
    print(f"same data, same steps: packed in rows of batch {small} for {same['steps']} steps ({same['trained']:,} "
          "trained targets): exact match " + ", ".join(f"{v['all']:.1f} % @{k}" for k, v in same["scores"].items())
          + f" (one a row: {equal['scores'][equal['steps']]['all']:.1f} %); {same['points'][-1][0]:.0f} s of "
          f"training against {equal['points'][-1][0]:.0f} s; {same['trained_tps']:,.0f} trained tokens/s")
    print(f"total {time.time() - t_start:.0f} s; commands:")
    for c in COMMANDS:
        print("  " + c)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
