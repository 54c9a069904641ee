"""Past the SFT plateau on the chat bench's exact-match task: from one chat-tuned checkpoint where more SFT has
stopped helping, the same wall-clock W of (a) more SFT on the correct answers, (b) GRPO with the `exact` reward,
(c) two rounds of on-policy DPO + NLL (`workbench rounds`), each scored by held-out greedy exact match per task.

    python bench/chat_rl.py --out DIR --seeds 1,2,3 --held 500 --budget 5m   # from the 400-step chat-tune
    python bench/chat_rl.py --out DIR --extend 1000 --seeds 1,2,3 --budget 4m # from past the plateau (the issue's)
    python bench/chat_rl.py --out DIR --quick                                 # toy size: the pipeline, minutes

1. The start (kept in --out; a rerun reuses it): bench/chat_sft.py's pretraining of cpu-small on the built-in
   corpus (its run "pre", --pretrain steps, model.seq_len 128), then the chat-tune of bench/finetune_lr.py's best
   row: full fine-tune, AdamW lr 1e-3 (min_lr at the preset's ratio, wsd), --sft-steps steps (default 400: ~48 %
   held out there, the plateau: 2e-3 scored no better, docs/reference/fine-tuning.md) on chat_sft's 2,000 training
   conversations (tests/support/chat.py, seed 0). Run "start".
   With --extend N: the start's chat-tune continued N steps by the same recipe (run "extend": lr 1e-3, wsd, a
   40-step warmup, seed 1337; a checkpoint every --extend-every steps, all kept), each checkpoint scored on
   --extend-held held-out conversations; the plateau is the first checkpoint no later one beats by more than two
   standard errors (with at least two after it), and the arms start from extend's last checkpoint once there is
   one (or from --start-step S). The first run of this bench started from the 400-step chat-tune, where more SFT
   still had most to gain (docs/performance/chat-rl.md).
2. Per seed (`train.seed`: the order of the data, the sampling), three arms from "start", each given W seconds:
   - **sft**: `train --init-from start --time-budget W` on the same training conversations (their correct
     answers), lr 1e-3 again (the fine-tune rule's rate), wsd over the budget;
   - **grpo**: `train --init-from start --time-budget W --set train.objective=grpo train.reward=exact:answer` on
     the prompts file (below), G --group, completions of at most --max-new 24 tokens, lr --grpo-lr (default the
     shipped cap of a GRPO fine-tune's rate, workbench/plan/finetune.py's GRPO_MAX_LR, 3e-4);
   - **rounds**: `workbench rounds start --rounds R --reward exact --samples 4 --time-budget T` on the first
     --round-prompts prompts of the file (default 512), T = (W - R x --round-overhead) / R so that sampling,
     pairing and training of all R (--rounds, default 2) rounds fit W (their real wall time is reported).
     DPO + NLL (sft weight 1), the preference fine-tune's capped lr (3e-5, flat).
   With --fresh, the three arms get 2,000 conversations the start has not seen (tests/support/chat.py, seed 2)
   instead of its own 2,000: SFT on their answers, GRPO and the rounds on their prompts (with the answer as the
   reward's reference).
3. Held-out exact match of each arm's last checkpoint and of the start on --held conversations (chat_sft's held-out
   set, seed 1), overall and per task (chat_sft.score: greedy, stripped, equal), with each arm's optimizer steps,
   tokens and wall time.

The prompts file: one record a training conversation, {"prompt": the user message, "system": the system message
(the colour table) or absent, "answer": the assistant message}; `exact:answer` scores the completion's first line,
stripped, against "answer" (workbench/reward/builtin.py).

Tokens, per arm: sft, the assistant targets trained (its sampler replayed, chat_sft.trained_per_step); grpo, the
completion tokens sampled and trained on (steps x batch x G x the mean completion length, from its reward records);
rounds, the tokens of the pairs trained (chosen + rejected answers, each pair as often as its steps drew it) and the
tokens sampled to make them.

Every run goes through the real CLI in a subprocess (the commands are printed at the end), one thread each, one at
a time (the arms never share the machine with each other).
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
sys.path.insert(0, str(ROOT / "bench"))

import chat_sft  # noqa: E402
import finetune_lr  # noqa: E402

from tests.support.chat import conversations, write_jsonl  # noqa: E402
from workbench.plan.recipe.finetune import GRPO_MAX_LR  # noqa: E402

SFT_LR = 1e-3          # bench/finetune_lr.py's best full rate at 400 steps (47.8 %, three seeds)
GRPO_LR = GRPO_MAX_LR  # the shipped cap of a GRPO fine-tune's rate (3e-4); the first run of this bench used 1e-4
EXTEND_WARMUP = 40     # the start's own warmup (build_start: 400 // 10)
COMMANDS: list[str] = []


def duration(text: str) -> float:
    """--budget's seconds: 90, 90s, 5m, 1h."""
    t = text.strip().lower()
    mult = {"s": 1, "m": 60, "h": 3600}.get(t[-1:], 1)
    return float(t[:-1] if t[-1:] in "smh" else t) * mult


def cli(out: Path, name: str, args: list[str], tolerate: str | None = None) -> float:
    """`python -m workbench ARGS` in a subprocess (one thread, nice 10 if the bench is), unless the run ``name`` in
    --out already finished; its process's wall time (the stored one for a kept run)."""
    env = dict(os.environ, WORKBENCH_CACHE_DIR=str(out / "cache"), OMP_NUM_THREADS="1")
    COMMANDS.append(f"OMP_NUM_THREADS=1 WORKBENCH_CACHE_DIR={shlex.quote(str(out / 'cache'))} python -m workbench "
                    + shlex.join(args))
    kept = out / "walls.json"
    walls = json.loads(kept.read_text()) if kept.is_file() else {}
    if name in walls:
        return float(walls[name])
    status = out / "runs" / name / "status.json"
    if status.is_file() and json.loads(status.read_text()).get("state") == "finished":  # a bench stopped after it
        st = json.loads(status.read_text())
        return float(st["finished"] - st["pid_start"])
    shutil.rmtree(out / "runs" / name, ignore_errors=True)  # a train arm a killed bench left unfinished
    log = out / "logs" / f"{name}.log"  # a file, not a pipe: a stopped bench does not take its child with it
    log.parent.mkdir(exist_ok=True)
    t0, load = time.time(), os.getloadavg()[0]
    with log.open("w") as f:
        rc = subprocess.run([sys.executable, "-m", "workbench", *args], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env).returncode
    wall = time.time() - t0
    if rc != 0 and not (tolerate and tolerate in log.read_text()):  # a failure the caller reads from the runs
        raise SystemExit(f"chat_rl: {name} failed ({rc}):\n{log.read_text()[-3000:]}")
    walls = json.loads(kept.read_text()) if kept.is_file() else {}
    walls[name] = wall
    kept.write_text(json.dumps(walls, indent=1))
    loads = out / "loads.json"  # the machine's 1-minute load at the run's start and end (a kept run keeps its own)
    seen = json.loads(loads.read_text()) if loads.is_file() else {}
    seen[name] = [load, os.getloadavg()[0]]
    loads.write_text(json.dumps(seen, indent=1))
    return wall


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]


def last_step(run_dir: Path) -> int:
    steps = [r["step"] for r in metrics(run_dir) if r.get("kind") == "train"]
    return max(steps) if steps else 0


def build_start(out: Path, corpus: str, pre_steps: int, sft_steps: int) -> tuple[float, float]:
    """chat_sft's pretraining ("pre") and the chat-tune to the plateau ("start"): their wall times."""
    pre_s = finetune_lr.pretrain(out, pre_steps)
    ratio = finetune_lr.preset_rates()[1] / finetune_lr.preset_rates()[0]
    sets = [*chat_sft.COMMON, "train.finetune=full", f"train.lr={SFT_LR:g}", f"train.min_lr={SFT_LR * ratio:.3g}",
            f"train.max_iters={sft_steps}", f"train.warmup_iters={max(1, sft_steps // 10)}",
            f"train.eval_interval={sft_steps}", f"train.ckpt_interval={sft_steps}", "train.log_interval=50"]
    start_s = chat_sft.train(out, "start", corpus, sets, init_from="pre")
    return pre_s, start_s


def copy_start(out: Path, src: Path) -> tuple[None, float]:
    """--start-run: a finished chat-tune made with build_start's recipe elsewhere (bench/finetune_lr.py's full 1e-3
    run at --steps 400 is one), copied into --out as "start"; its chat-tune's wall time."""
    status = json.loads((src / "status.json").read_text()) if (src / "status.json").is_file() else {}
    if status.get("state") != "finished":
        raise SystemExit(f"chat_rl: --start-run {src} is not a finished run; give a finished chat-tune's folder")
    dst = out / "runs" / "start"
    if not (dst / "status.json").is_file():
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("lock", "finetune_lr.json"))
    return None, status["finished"] - status["pid_start"]


def extend(out: Path, corpus: str, steps: int, every: int) -> float:
    """More of the start's chat-tune ("extend"): ``steps`` steps from "start" by the same recipe (lr 1e-3, min_lr
    at the preset's ratio, wsd, a 40-step warmup, seed 1337), a checkpoint every ``every`` steps, all kept."""
    ratio = finetune_lr.preset_rates()[1] / finetune_lr.preset_rates()[0]
    return cli(out, "extend", ["train", "cpu-small", "--corpus", corpus, "--runs-dir", str(out / "runs"), "--name",
                               "extend", "--yes", "--init-from", "start", "--set", *chat_sft.COMMON,
                               "train.finetune=full", f"train.lr={SFT_LR:g}", f"train.min_lr={SFT_LR * ratio:.3g}",
                               f"train.max_iters={steps}", f"train.warmup_iters={EXTEND_WARMUP}",
                               f"train.eval_interval={every}", f"train.ckpt_interval={every}",
                               f"train.milestone_interval={every}", "train.log_interval=50", "train.seed=1337"])


def plateau(points: list[tuple[int, float]], n_held: int, after: int = 2) -> int | None:
    """The first checkpoint (step) that no later one beats by more than two standard errors of its own score on
    ``n_held`` items, with at least ``after`` checkpoints after it: where more SFT stopped helping. None while the
    score still rises (or too few checkpoints follow)."""
    for i, (step, s) in enumerate(points):
        if len(points) - 1 - i < after:
            return None
        p = min(max(s / 100, 1 / n_held), 1 - 1 / n_held)
        se = 100 * (p * (1 - p) / n_held) ** 0.5
        if all(t <= s + 2 * se for _, t in points[i + 1:]):
            return step
    return None


def prompts_file(path: Path, recs: list[dict]) -> Path:
    """The training conversations as GRPO / rounds prompts: user message, system message, the answer."""
    rows = []
    for r in recs:
        msgs = r["messages"]
        row = {"prompt": msgs[-2]["content"], "answer": msgs[-1]["content"]}
        if msgs[0]["role"] == "system":
            row["system"] = msgs[0]["content"]
        rows.append(row)
    return write_jsonl(path, rows)


def arm_sft(out: Path, corpus: str, seed: int, budget: float, init: str, tag: str = "") -> dict:
    name = f"sft-{tag}s{seed}"
    ratio = finetune_lr.preset_rates()[1] / finetune_lr.preset_rates()[0]
    wall = cli(out, name, ["train", "cpu-small", "--corpus", corpus, "--runs-dir", str(out / "runs"), "--name", name,
                           "--yes", "--init-from", init, "--time-budget", f"{budget:g}s", "--set",
                           *chat_sft.COMMON, "train.finetune=full", f"train.lr={SFT_LR:g}",
                           f"train.min_lr={SFT_LR * ratio:.3g}", f"train.seed={seed}", "train.log_interval=10"])
    run_dir = out / "runs" / name
    steps = last_step(run_dir)
    return dict(arm="more SFT", run=name, wall=wall, steps=steps,
                tokens=f"{sum(chat_sft.trained_per_step(run_dir, steps)):,} answer tokens trained")


def arm_grpo(out: Path, prompts: Path, seed: int, budget: float, group: int, max_new: int, lr: float,
             init: str, tag: str = "") -> dict:
    name = f"grpo-{tag}s{seed}" if lr == GRPO_LR else f"grpo-{tag}lr{lr:g}-s{seed}"
    wall = cli(out, name, ["train", "cpu-small", "--corpus", str(prompts), "--runs-dir", str(out / "runs"), "--name",
                           name, "--yes", "--init-from", init, "--time-budget", f"{budget:g}s", "--set",
                           *chat_sft.COMMON, "train.objective=grpo", "train.reward=exact:answer",
                           f"train.grpo_group={group}", f"train.grpo_max_new_tokens={max_new}", f"train.lr={lr:g}",
                           f"train.min_lr={lr / 10:g}", f"train.seed={seed}", "train.log_interval=1"])
    run_dir = out / "runs" / name
    recs = metrics(run_dir)
    train = [r for r in recs if r.get("kind") == "reward" and r.get("split") == "train"]
    from workbench.config import load_preset_file
    batch = load_preset_file(run_dir / "preset.toml").train.batch_size
    lengths = [r.get("completion_len", r.get("length", 0)) or 0 for r in train]
    sampled = sum(lengths) * batch * group
    rewards = [r["reward"] for r in train]
    q = max(1, len(rewards) // 4)
    held = [r["reward"] for r in recs if r.get("kind") == "reward" and r.get("split") == "val"]
    return dict(arm="GRPO exact" + ("" if lr == GRPO_LR else f" lr {lr:g}"), run=name, wall=wall,
                steps=last_step(run_dir),
                tokens=f"{sampled:,.0f} completion tokens sampled and trained ({batch} prompts x G {group} a step)",
                reward=(sum(rewards[:q]) / q, sum(rewards[-q:]) / q) if rewards else None,
                held=(held[0], held[-1]) if held else None)


def arm_rounds(out: Path, prompts: Path, seed: int, budget: float, overhead: float, samples: int,
               max_new: int, init: str, n_rounds: int = 2, tag: str = "") -> dict:
    chain = f"rpo-{tag}s{seed}"
    per_round = max(10.0, (budget - n_rounds * overhead) / n_rounds)
    run, _, step = init.partition(":")
    wall = cli(out, chain, ["rounds", run, "--checkpoint", step or "latest", "--runs-dir", str(out / "runs"),
                            "--prompts", str(prompts), "--reward", "exact", "--rounds", str(n_rounds), "--samples",
                            str(samples), "--time-budget", f"{per_round:.0f}s", "--name", chain, "--max-new-tokens",
                            str(max_new), "--seed", str(seed), "--yes", "--set", "hardware.compile=false",
                            "train.patience=0", "train.sample_prompt=", "train.eval_iters=5", f"train.seed={seed}",
                            "train.log_interval=10"], tolerate="no pair to train on")
    steps, pairs, pair_tokens, sampled, means = [], 0, 0, 0, []
    from workbench.data.text.tokenizer import load_tokenizer
    tok = load_tokenizer(out / "runs" / "start")
    done = 0
    for i in range(1, n_rounds + 1):
        run_dir = out / "runs" / f"{chain}-r{i}"
        st = run_dir / "status.json"
        if not st.is_file() or json.loads(st.read_text()).get("state") != "finished":
            break  # `rounds` stops a chain at a round whose samples all scored the same: no pair to train on
        done = i
        steps.append(last_step(run_dir))
        lines = [json.loads(x) for x in (out / "runs" / f"{chain}.rounds" / f"round-{i}-pairs.jsonl").read_text()
                 .splitlines() if x.strip()]
        pairs += len(lines)

        def text(x: object) -> str:
            return x if isinstance(x, str) else " ".join(m["content"] for m in x)  # type: ignore[index, union-attr]
        per_pair = [len(tok.encode(text(p["chosen"]))) + len(tok.encode(text(p["rejected"]))) for p in lines]
        from workbench.config import load_preset_file
        batch = load_preset_file(run_dir / "preset.toml").train.batch_size
        # each step draws batch pairs in epoch order: steps x batch pairs at the pairs' mean length
        pair_tokens += round(steps[-1] * batch * sum(per_pair) / max(1, len(per_pair)))
        meta = json.loads((out / "runs" / f"{chain}.rounds" / f"round-{i}.json").read_text())
        sampled += meta.get("prompts", 0) * samples
        means.append(meta.get("mean_reward") or 0.0)
    last = out / "runs" / f"{chain}.rounds" / f"round-{done + 1}.json"
    if done < n_rounds and last.is_file():  # the round that found no pair still drew its samples
        meta = json.loads(last.read_text())
        sampled += meta.get("prompts", 0) * samples
        means.append(meta.get("mean_reward") or 0.0)
    stopped = "" if done == n_rounds else f"; the chain stopped before round {done + 1}: no pair to train on"
    return dict(arm=f"{n_rounds} rounds DPO + NLL", run=f"{chain}-r{done}" if done else init, key=chain, wall=wall,
                steps=sum(steps),
                tokens=f"{pair_tokens:,} answer tokens of {pairs:,} pairs trained ({' + '.join(map(str, steps)) or 0} "
                       f"steps, {per_round:.0f} s budget a round); {sampled:,} samples drawn, their mean reward "
                       + " then ".join(f"{m:.3f}" for m in means) + " (the start's, then each round's model)" + stopped,
                reward=None)


def extended(out: Path, corpus: str, a: argparse.Namespace, sft_steps: int) -> tuple[str, float]:
    """--extend: the start's chat-tune continued, each checkpoint scored on --extend-held conversations (the
    start's own score first), the table printed; the arms' start as RUN:STEP, past the plateau (or --start-step)."""
    wall = extend(out, corpus, a.extend, a.extend_every)
    run_dir = out / "runs" / "extend"
    n = a.extend_held
    held = conversations(n, seed=1)
    path = out / f"extend-scores-{n}.json"
    got = json.loads(path.read_text()) if path.is_file() else {}
    steps = list(range(a.extend_every, a.extend + 1, a.extend_every))
    for key, step in [("0", None), *((str(x), x) for x in steps)]:
        if key not in got:
            got[key] = chat_sft.score(out / "runs" / "start", "latest", held) if step is None else \
                chat_sft.score(run_dir, step, held)
            path.write_text(json.dumps(got, indent=1))
    lrs = {r["step"]: r["lr"] for r in metrics(run_dir) if r.get("kind") == "train"}
    print(f"\nthe start's chat-tune continued ({a.extend} steps, {wall:.0f} s): held-out exact match on {n}\n\n"
          "| chat-tune steps | lr there | exact match | reverse / sort / colour |\n|---|---|---|---|")
    points = []
    for key in ["0", *map(str, steps)]:
        sc, total = got[key], sft_steps + int(key)
        points.append((int(key), sc["all"]))
        lr = f"{lrs[int(key)]:.2g}" if int(key) in lrs else "-"
        print(f"| {total} | {lr} | {sc['all']:.1f} % | {sc['reverse']:.1f} / {sc['sort']:.1f} / "
              f"{sc['colour']:.1f} |", flush=True)
    onset = plateau(points, n)
    print("plateau (no later checkpoint more than two standard errors above): "
          + (f"from chat-tune step {sft_steps + onset}" if onset is not None else "none yet"), flush=True)
    if a.start_step is not None:
        return f"extend:{a.start_step}", wall
    if onset is None:
        raise SystemExit(f"chat_rl: the chat-tune still improves at step {sft_steps + a.extend}; give --extend "
                         "more steps (or --start-step S to start from one anyway)")
    return f"extend:{a.extend}", wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="runs and cache here (default: a new temp dir); the start "
                                                           "and finished arms in it are kept")
    ap.add_argument("--quick", action="store_true", help="toy size: pretrain 60, chat-tune 60, 40 held out, 60 s")
    ap.add_argument("--seeds", default="1", help="train.seed of the arms, comma-separated (default 1)")
    ap.add_argument("--held", type=int, default=None, help="held-out conversations scored (default 500; quick 40)")
    ap.add_argument("--budget", default=None, help="each arm's wall-clock W: 90s, 5m (default 5m; quick 60s)")
    ap.add_argument("--pretrain", type=int, default=None, help="pretraining steps (default 400; quick 60)")
    ap.add_argument("--sft-steps", type=int, default=None, help="the start's chat-tune steps (default 400; quick 60)")
    ap.add_argument("--group", type=int, default=8, help="GRPO completions a prompt, G (default 8)")
    ap.add_argument("--grpo-lr", type=float, default=GRPO_LR,
                    help=f"GRPO's learning rate (default {GRPO_LR:g}; another rate's runs are named grpo-lrLR-sSEED)")
    ap.add_argument("--max-new", type=int, default=24, help="longest sampled answer, tokens (default 24)")
    ap.add_argument("--samples", type=int, default=4, help="rounds: samples a prompt (default 4)")
    ap.add_argument("--fresh", action="store_true",
                    help="the arms train on 2,000 new conversations (seed 2; runs named ARM-fresh-sSEED), not the "
                         "start's own 2,000, which a long chat-tune has learnt by heart (no GRPO signal left there)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of DPO + NLL (default 2)")
    ap.add_argument("--round-prompts", type=int, default=512, help="rounds: prompts sampled a round (default 512)")
    ap.add_argument("--round-overhead", type=float, default=None,
                    help="rounds: seconds a round spends outside training (sampling, pairing, start-up), taken off "
                         "W before it is split in two (default: W/6)")
    ap.add_argument("--arms", default="sft,grpo,rounds", help="which arms (default sft,grpo,rounds)")
    ap.add_argument("--start-run", type=Path, default=None,
                    help="a finished chat-tune of the same recipe to start from (copied into --out as 'start'), "
                         "instead of pretraining and chat-tuning here")
    ap.add_argument("--start-only", action="store_true", help="build (or reuse) and score the start, then stop")
    ap.add_argument("--extend", type=int, default=0, metavar="N",
                    help="chat-tune the start N more steps by its own recipe (run 'extend'), score every kept "
                         "checkpoint, and start the arms past the plateau that shows (default 0: from the start)")
    ap.add_argument("--extend-every", type=int, default=100, metavar="K",
                    help="--extend: a checkpoint every K steps, each scored (default 100)")
    ap.add_argument("--extend-held", type=int, default=300, metavar="N",
                    help="--extend: held-out conversations each checkpoint is scored on (default 300)")
    ap.add_argument("--start-step", type=int, default=None, metavar="S",
                    help="--extend: the arms start from its checkpoint S (default: its last, once the scores "
                         "show a plateau)")
    a = ap.parse_args()
    if a.start_step is not None and not a.extend:
        ap.error("--start-step picks a checkpoint of --extend's run; give --extend N too")
    if a.extend and (a.extend_every < 1 or a.extend % a.extend_every):
        ap.error(f"--extend {a.extend} is not a multiple of --extend-every {a.extend_every}; make it one")
    if a.start_step is not None and (a.start_step < 1 or a.start_step > a.extend or a.start_step % a.extend_every):
        ap.error(f"--start-step {a.start_step}: not one of --extend's checkpoints (every {a.extend_every} steps to "
                 f"{a.extend}); pick one of them")
    n_held = a.held or (40 if a.quick else 500)
    budget = duration(a.budget or ("60s" if a.quick else "5m"))
    pre_steps = a.pretrain or (60 if a.quick else 400)
    sft_steps = a.sft_steps or (60 if a.quick else 400)
    seeds = [int(x) for x in a.seeds.split(",") if x.strip()]
    arms = [x.strip() for x in a.arms.split(",") if x.strip()]
    if bad := [x for x in arms if x not in ("sft", "grpo", "rounds")]:
        ap.error(f"--arms: unknown {', '.join(bad)}; choose from sft, grpo, rounds")
    out = (a.out or Path(tempfile.mkdtemp(prefix="wb-chat-rl-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ["WORKBENCH_CACHE_DIR"] = str(out / "cache")  # the sampler replay reads the runs' prepared data
    os.environ["OMP_NUM_THREADS"] = "1"                      # chat_sft.train's subprocesses inherit it
    t0 = time.time()
    train_recs = conversations(2000, seed=0)
    corpus = str(write_jsonl(out / "train.jsonl", train_recs))
    tag = "fresh-" if a.fresh else ""
    arm_recs = conversations(2000, seed=2) if a.fresh else train_recs
    arm_corpus = str(write_jsonl(out / "fresh.jsonl", arm_recs)) if a.fresh else corpus
    prompts = prompts_file(out / f"{tag}prompts.jsonl", arm_recs)
    round_prompts = prompts_file(out / f"{tag}prompts-{a.round_prompts}.jsonl", arm_recs[:a.round_prompts])
    print(f"chat_rl in {out}: pretrain {pre_steps}, chat-tune {sft_steps} steps at lr {SFT_LR:g}; seeds "
          f"{seeds}; W {budget:.0f} s an arm; {n_held} held out; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
          flush=True)
    pre_s, start_s = (copy_start(out, a.start_run.resolve()) if a.start_run
                      else build_start(out, corpus, pre_steps, sft_steps))
    scores_path = out / f"scores-{n_held}.json"
    scores = json.loads(scores_path.read_text()) if scores_path.is_file() else {}

    def scored(run: str) -> dict[str, float]:
        if run not in scores:
            name, _, step = run.partition(":")
            scores[run] = (chat_sft.score(out / "runs" / name, int(step), conversations(n_held, seed=1)) if step
                           else chat_sft.score_in_process(out / "runs" / run, n_held))
            scores_path.write_text(json.dumps(scores, indent=1))
        return scores[run]

    s = scored("start")
    print(f"start: exact match {s['all']:.1f} % (reverse {s['reverse']:.1f} / sort {s['sort']:.1f} / colour "
          f"{s['colour']:.1f} %); pretrain {'(copied)' if pre_s is None else f'{pre_s:.0f} s'}, chat-tune "
          f"{start_s:.0f} s", flush=True)
    start_s_label = f"{start_s:.0f}"
    init, start_label, start_steps = "start", f"start (pretrain {pre_steps} + chat-tune {sft_steps})", sft_steps
    if a.extend:
        init, ext_s = extended(out, corpus, a, sft_steps)
        start_s_label = f"{start_s:.0f} + {ext_s:.0f}"
        s = scored(init)
        start_steps = sft_steps + int(init.split(":")[1])
        start_label = f"start (pretrain {pre_steps} + chat-tune {start_steps})"
        print(f"the arms' start: {init} (chat-tune step {start_steps}): exact match {s['all']:.1f} % on {n_held} "
              f"(reverse {s['reverse']:.1f} / sort {s['sort']:.1f} / colour {s['colour']:.1f} %)", flush=True)
    if a.start_only:
        return 0
    overhead = a.round_overhead if a.round_overhead is not None else budget / 6
    rows = []
    for seed in seeds:
        for arm in arms:
            if arm == "sft":
                r = arm_sft(out, arm_corpus, seed, budget, init, tag)
            elif arm == "grpo":
                r = arm_grpo(out, prompts, seed, budget, a.group, a.max_new, a.grpo_lr, init, tag)
            else:
                r = arm_rounds(out, round_prompts, seed, budget, overhead, a.samples, a.max_new, init,
                               a.rounds, tag)
            loads = json.loads((out / "loads.json").read_text()) if (out / "loads.json").is_file() else {}
            r["seed"], r["load"] = seed, loads.get(r.get("key", r["run"]), [float("nan")] * 2)
            r["arm"] += ", new data" if tag else ""
            r["scores"] = scored(r["run"])
            rows.append(r)
            sc = r["scores"]
            print(f"  seed {seed} {r['arm']}: {sc['all']:.1f} % (reverse {sc['reverse']:.1f} / sort "
                  f"{sc['sort']:.1f} / colour {sc['colour']:.1f} %), {r['steps']} steps, {r['wall']:.0f} s (load "
                  f"{r['load'][0]:.1f} -> {r['load'][1]:.1f}); "
                  f"{r['tokens']}" + (f"; train reward (first / last quarter of its steps) {r['reward'][0]:.3f} -> "
                                      f"{r['reward'][-1]:.3f}" if r.get("reward") else "")
                  + (f"; its held-out reward {r['held'][0]:.3f} -> {r['held'][1]:.3f}" if r.get("held") else ""),
                  flush=True)
    print(f"\nW = {budget:.0f} s an arm; held-out exact match on {n_held} conversations (chat_sft's, seed 1)\n")
    print("| arm | seed | exact match | reverse / sort / colour | steps | wall s | load | tokens |\n"
          "|---|---|---|---|---|---|---|---|")
    pre = "-" if pre_s is None else f"{pre_s:.0f}"
    print(f"| {start_label} | - | {s['all']:.1f} % | {s['reverse']:.1f} / "
          f"{s['sort']:.1f} / {s['colour']:.1f} | {start_steps} | {pre} + {start_s_label} | - | - |")
    for r in rows:
        sc = r["scores"]
        print(f"| {r['arm']} | {r['seed']} | {sc['all']:.1f} % | {sc['reverse']:.1f} / {sc['sort']:.1f} / "
              f"{sc['colour']:.1f} | {r['steps']} | {r['wall']:.0f} | {r['load'][0]:.1f} -> {r['load'][1]:.1f} | "
              f"{r['tokens']} |")
    if len(seeds) > 1:
        for arm in dict.fromkeys(r["arm"] for r in rows):
            same = [r["scores"] for r in rows if r["arm"] == arm]
            m = {k: sum(x[k] for x in same) / len(same) for k in ("all", "reverse", "sort", "colour")}
            print(f"| **{arm}, mean of {len(same)}** | - | **{m['all']:.1f} %** ({min(x['all'] for x in same):.1f}-"
                  f"{max(x['all'] for x in same):.1f}) | {m['reverse']:.1f} / {m['sort']:.1f} / {m['colour']:.1f} "
                  "| | | | |")
    print(f"\ntotal {time.time() - t0:.0f} s; commands:")
    for c in [*chat_sft.COMMANDS, *COMMANDS]:
        print("  " + c)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
