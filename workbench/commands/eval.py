"""`workbench eval RUN`: a run's checkpoints scored on tasks (multiple choice, exact match) and held-out text, and
with ``--reward R --prompts FILE --samples N`` on a reward: N completions of each prompt sampled (as ``workbench
pairs`` samples them, prompt i with seed + i) and scored, reported as the mean reward, pass@1 and pass@k
(:mod:`workbench.reward.scoring`; a sample passes at a reward >= --pass-threshold, default 1.0).

Everything is read and checked before torch loads (tasks, checkpoints, the corpus, the reward and its prompts);
scores are written to the run's ``tasks.jsonl`` only when every checkpoint was scored, so a bad input leaves the
run as it was.
``--json`` prints one object (see :func:`json_result`; ``version`` says its layout).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterator

from workbench import rundir
from workbench.analysis.report_card import card_lines, report_card
from workbench.commands.common import (
    add_corpus_option,
    add_json_option,
    add_progress_option,
    add_run_argument,
    add_sampling_options,
    print_progress,
    sampling_of,
)
from workbench.commands.pairs import REWARDS, Sampler, add_reward_options, batches, check_sampling, sampler_for
from workbench.data.chat.chat_templates import ChatTemplate, ChatTemplateError, run_template
from workbench.data.corpus.documents import Corpus, open_corpus
from workbench.data.tasks.builtin_tasks import BUILTIN_TASKS, builtin_task
from workbench.data.tasks.task_files import Task, TaskError, expand_task_specs, load_task, task_options
from workbench.data.text.tokenizer import load_tokenizer
from workbench.fmt import duration
from workbench.machine.detect import Machine
from workbench.plan.sampling import TEXT
from workbench.plan.settings import resolve_device
from workbench.reward import THRESHOLD, Prompts, Reward, RewardError, parse_reward, read_prompts, summarize

JSON_VERSION = 1


TASK_FORMATS = """\
task files (JSONL, plain, .gz, .zst or .xz; one record a line; the shape from the first):
  multiple choice  {"query"|"context"|"question", "choices": [...], "gold"|"label"|"answer": i}
                   HellaSwag's {"ctx", "endings", "label"}; ARC's {"question",
                   "choices": {"text", "label"}, "answerKey"}; each choice scored by its
                   log-likelihood after the context (acc, acc_norm; centered on chance)
  exact match      {"prompt", "answer"} (answer: a string or a list): greedy to a newline
                   (until) or max_new_tokens
  chat             {"messages": [..., {"role": "assistant", "content": ANSWER}]}, or
                   {"messages": [... ending with the user's], "answer"}: the reply through the
                   run's chat template
  other fields     a TOML sidecar beside the file (qa.jsonl -> qa.toml) or --set, e.g.
                   --set context_field=q choices_field=opts gold_field=idx
"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("eval", help="score a run's checkpoints on tasks and on held-out text",
                       description="Score a run's checkpoints on tasks (multiple choice, exact match, chat) and on "
                                   "held-out text (bits per byte), or on a reward over prompts (--reward: mean "
                                   "reward, pass@1, pass@k); the scores go to the run's tasks.jsonl.",
                       epilog=TASK_FORMATS + "\n" + REWARDS,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_argument(p, nargs="?", checkpoint="latest (default), best, a step number, or all")
    p.add_argument("--task", dest="tasks", action="extend", nargs="+", default=[], metavar="TASK",
                   help="a JSONL task file (plain, .gz, .zst) or a built-in task (builtin = all of them; "
                        "--list-tasks)")
    add_corpus_option(p, ": score the model's bits per byte on this text")
    p.add_argument("--limit", type=int, default=None, metavar="N",
                   help="score the first N items of each task (with --corpus: N windows of the context; "
                        "default 200)")
    p.add_argument("--set", dest="options", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                   help="task options for every task file, over its TOML sidecar: context_field, choices_field, "
                        "gold_field, prompt_field, answer_field, kind (mc|gen), metric (acc|acc_norm), delimiter, "
                        "until, max_new_tokens, name")
    add_json_option(p, "machine-readable output (stable: see docs/reference/evaluating.md)")
    p.add_argument("--dump", default=None, metavar="FILE",
                   help="write each exact-match record (prompt, answers, the model's output, right or not) to "
                        "FILE as JSON lines")
    p.add_argument("--no-save", action="store_true", help="do not add the scores to the run's tasks.jsonl")
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda or mps")
    p.add_argument("--list-tasks", action="store_true", help="list the built-in tasks and exit")
    add_progress_option(p, "TASK DONE/TOTAL (CHECKPOINT)", "as items are scored")
    g = p.add_argument_group("a reward over prompts", "N completions of each prompt sampled and scored by a reward: "
                             "the mean reward, pass@1 and pass@k (Chen et al. 2021's unbiased estimator)")
    add_reward_options(g, prompts_required=False)
    g.add_argument("--samples", type=int, default=1, metavar="N", help="completions sampled a prompt (default 1)")
    g.add_argument("--pass-k", type=int, default=None, metavar="K",
                   help="the k of pass@k, at most --samples (default: --samples)")
    g.add_argument("--pass-threshold", type=float, default=THRESHOLD, metavar="T",
                   help=f"a sample passes when its reward is at least T (default {THRESHOLD:g}: exact's right answer)")
    add_sampling_options(g, TEXT)
    p.set_defaults(func=run)


def list_tasks() -> int:
    for name in BUILTIN_TASKS:
        t = builtin_task(name)
        print(f"{name:18s} {len(t.items)} items, {t.metric}: {t.description}")
    print("builtin            all of the above")
    return 0


def checkpoints(run_dir: Path, selector: str) -> list[dict]:
    if selector == "all":
        found = rundir.list_checkpoints(run_dir)
        if not found:
            rundir.select_checkpoint(run_dir, "latest")  # raises the one-line "no checkpoint" error
        return found
    return [rundir.select_checkpoint(run_dir, selector)]


def documents(corpus: Corpus) -> Iterator[str]:
    """Whole documents of a corpus (its pieces joined)."""
    parts: list[str] = []
    for text, ends in corpus.pieces():
        parts.append(text)
        if ends:
            yield "".join(parts)
            parts = []
    if parts:
        yield "".join(parts)


def load_tasks(args: argparse.Namespace, run_dir: Path) -> tuple[list[Task], ChatTemplate | None]:
    """The tasks --task names (their notes on stderr; two of one name refused), and the run's chat template when
    one of them is a chat task (None otherwise)."""
    opts = task_options(args.options)
    tasks = [load_task(s, opts if s not in BUILTIN_TASKS else None, args.limit) for s in expand_task_specs(args.tasks)]
    names = [t.name for t in tasks]
    if len(set(names)) < len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise TaskError(f"two tasks are named {dup!r}; give one a name in its sidecar (name = \"...\")")
    for t in tasks:
        if t.note:
            print(f"note: {t.name}: {t.note}", file=sys.stderr)
    template = None
    if any(t.shape == "chat" for t in tasks):
        try:
            template = run_template(run_dir)
        except ChatTemplateError as e:
            raise TaskError(f"{next(t.name for t in tasks if t.shape == 'chat')} is a chat task, but {e}") from None
    return tasks, template


def run(args: argparse.Namespace) -> int:
    if args.list_tasks:
        return list_tasks()
    if not args.run:
        raise rundir.RunError("name the run to score: workbench eval RUN --task builtin (`workbench runs` lists them)")
    if not args.tasks and not args.corpus and not args.reward and not args.prompts:
        raise TaskError("give --task (a JSONL file or a built-in task: builtin, " + ", ".join(BUILTIN_TASKS)
                        + "), --corpus PATH or --reward R --prompts FILE")
    if args.limit is not None and args.limit < 1:
        raise TaskError("--limit must be at least 1")
    run_dir = rundir.resolve_run(args.runs_dir, args.run)
    ckpts = checkpoints(run_dir, args.checkpoint)
    tasks, template = load_tasks(args, run_dir)
    corpus = open_corpus(list(args.corpus)) if args.corpus else None
    scoring = reward_scoring(args)

    # lazily: torch and the engine load only once the inputs are known to be good
    import torch

    from workbench.machine.probe import this_machine
    from workbench.train.checkpoint import load_run_model
    from workbench.train.task_eval import score_task, text_bpb

    tok = load_tokenizer(run_dir)
    device = resolve_device(args.device, Machine() if args.device == "cpu" else this_machine())
    results, records, dumps = [], [], []
    for ck in ckpts:
        t0 = time.time()
        loaded = load_run_model(run_dir, ck["step"], device)
        model = loaded.model
        if not args.json:
            print(f"[{run_dir.name} {ck['name']}: {model.num_params() / 1e6:.2f} M params on {device}, loaded in "
                  f"{time.time() - t0:.2f} s]", file=sys.stderr, flush=True)
        scored = []
        for task in tasks:
            on_progress = progress_printer(task.name, len(task.items), ck["name"]) if args.progress else None
            sc = score_task(model, tok, task, torch.device(device), template=template, on_progress=on_progress)
            scored.append(sc)
            dumps += [dict(r, task=task.name, checkpoint=ck["name"]) for r in sc.per_item]
        text = None
        if corpus is not None:
            t1 = time.time()
            bpb, loss, n = text_bpb(model, tok, documents(corpus), torch.device(device),
                                    max_windows=args.limit or 200)
            text = {"corpus": corpus.description, "bpb": bpb, "loss": loss, "tokens": n,
                    "seconds": time.time() - t1}
        rewarded = None
        if scoring is not None:
            rewarded = score_reward(scoring, sampler_for(run_dir, model, tok, scoring.sampling, str(device)), ck,
                                    args.progress)
            dumps += rewarded.pop("per_prompt")
        results.append(dict(json_result_checkpoint(ck, scored, text), reward=rewarded))
        records += task_records(ck, scored, text, corpus) + reward_records(ck, rewarded)
        del model, loaded
    if args.dump:
        with open(args.dump, "w", encoding="utf-8") as f:
            for d in dumps:
                f.write(json.dumps(d, ensure_ascii=False) + "\n")
    if not args.no_save:
        rundir.append_records(run_dir / rundir.TASKS_FILE, records)
    if args.json:
        print(json.dumps({"version": JSON_VERSION, "run": run_dir.name, "device": str(device),
                          "checkpoints": results}, indent=1))
        return 0
    for res in results:
        print_checkpoint(run_dir, res, not args.no_save)
    if args.dump:
        print(f"wrote {len(dumps)} exact-match records to {args.dump}", file=sys.stderr)
    return 0


class RewardScoring:
    """What ``--reward`` asks for, read and checked before torch loads."""

    def __init__(self, reward: Reward, prompts: Prompts, args: argparse.Namespace) -> None:
        self.reward, self.prompts = reward, prompts
        self.samples, self.threshold = args.samples, args.pass_threshold
        self.k = args.pass_k if args.pass_k is not None else args.samples
        self.sampling = sampling_of(args)


def reward_scoring(args: argparse.Namespace) -> RewardScoring | None:
    """``--reward`` and ``--prompts`` read and checked (None without them); one line for anything wrong."""
    if not args.reward and not args.prompts:
        return None
    if not args.reward or not args.prompts:
        raise RewardError("--reward and --prompts go together: the reward scores completions of the prompts")
    if args.pass_k is not None and not 1 <= args.pass_k <= args.samples:
        raise RewardError(f"--pass-k {args.pass_k} must be between 1 and --samples ({args.samples}): pass@k is "
                          "estimated from at least k samples a prompt")
    check_sampling(sampling_of(args), args.samples, "pass@k would be pass@1")
    reward = parse_reward(args.reward, args.reward_timeout)
    prompts = read_prompts(args.prompts, args.limit)
    for p in prompts.items:
        reward.check_record(p.record, p.where)
    return RewardScoring(reward, prompts, args)


def score_reward(s: RewardScoring, sampler: Sampler, ck: dict, progress: bool) -> dict:
    """The reward's summary over the prompts at one checkpoint, as ``--json`` gives it (with ``per_prompt``: the
    completions and rewards, for --dump)."""
    t0 = time.time()
    name = f"reward:{s.reward.short}"
    show = progress_printer(name, len(s.prompts.items), ck["name"]) if progress else None
    rewards, per_prompt = [], []
    items = s.prompts.items
    for batch in batches(0, len(items), s.samples):    # prompt i from its own seed + i, as workbench pairs
        sampled = sampler.complete_many([items[i] for i in batch], s.samples, [s.sampling.seed + i for i in batch])
        for i, completions in zip(batch, sampled):
            p = items[i]
            got = [s.reward.score(p.text, c, p.record) for c in completions]
            rewards.append(got)
            per_prompt.append({"task": name, "checkpoint": ck["name"], "prompt": p.text, "completions": completions,
                               "rewards": got})
            if show:
                show(i + 1)
    summary = summarize(rewards, s.k, s.threshold)
    return {"task": name, "reward": s.reward.describe(), "prompts_file": s.prompts.path,
            "prompts_sha256": s.prompts.sha256, "chat": sampler.chat, "sampling": asdict(s.sampling),
            **summary.to_dict(), "seconds": round(time.time() - t0, 3), "per_prompt": per_prompt}


def reward_records(ck: dict, r: dict | None) -> list:
    """The reward's scores for tasks.jsonl: mean_reward, pass@1 and pass@k (once when k is 1), each with what made
    it (the reward's name and digest, the prompts' digest, the samples, the sampling) and a digest of those, so a
    report card compares only like with like."""
    if r is None:
        return []
    made = {"reward": r["reward"], "prompts_sha256": r["prompts_sha256"], "samples": r["samples"],
            "threshold": r["threshold"], "sampling": r["sampling"]}
    digest = hashlib.sha256(json.dumps(made, sort_keys=True).encode()).hexdigest()[:16]
    now = time.time()
    metrics = ["mean_reward", "pass@1"] + ([f"pass@{r['k']}"] if r["k"] != 1 else [])
    return [rundir.TaskRecord(step=ck["step"], task=r["task"], metric=m, value=r[m], n=r["prompts"], time=now,
                              extra={"source": r["prompts_file"], "checkpoint": ck["name"], "digest": digest, **made})
            for m in metrics]


def progress_printer(task: str, total: int, checkpoint: str, every_s: float = 0.5) -> Callable[[int], None]:
    """``on_progress`` for score_task: a 'progress: TASK DONE/TOTAL (CHECKPOINT)' line on stderr at the start, at
    most every ``every_s`` seconds, and at the end."""
    last = [0.0]

    def show(done: int) -> None:
        now = time.monotonic()
        if done >= total or now - last[0] >= every_s:
            last[0] = now
            print_progress(f"{task} {done}/{total} ({checkpoint})")

    show(0)
    return show


def json_result_checkpoint(ck: dict, scored: list, text: dict | None) -> dict:
    """One checkpoint's scores as ``--json`` gives them."""
    tasks = []
    for sc in scored:
        t: Task = sc.task
        tasks.append({"task": t.name, "kind": t.kind, "source": t.source, "shape": t.shape, "n": sc.n,
                      "metric": t.metrics[0], "score": sc.score,
                      **({"chosen": t.metric, "chance": t.chance} if t.kind == "mc" else {}),
                      **sc.values, "seconds": round(sc.seconds, 3), "items_per_s": sc.n / max(sc.seconds, 1e-9)})
    mc = [x["centered"] for x in tasks if x["kind"] == "mc"]
    return {"step": ck["step"], "checkpoint": ck["name"], "tasks": tasks,
            "mean_centered": sum(mc) / len(mc) if mc else None, "text": text}


def task_records(ck: dict, scored: list, text: dict | None, corpus: Corpus | None) -> list:
    now = time.time()
    out = [r for sc in scored for r in sc.records(ck["step"], checkpoint=ck["name"])]
    if text is not None:
        assert corpus is not None  # the text is scored only on --corpus
        name = f"text:{Path(corpus.spec[0]).name}" + (f"+{len(corpus.spec) - 1}" if len(corpus.spec) > 1 else "")
        for metric in ("bpb", "loss"):
            out.append(rundir.TaskRecord(step=ck["step"], task=name, metric=metric, value=text[metric],
                                         n=text["tokens"], time=now,
                                         extra={"source": corpus.spec, "checkpoint": ck["name"]}))
    return out


def print_checkpoint(run_dir: Path, res: dict, saved: bool) -> None:
    print(f"{run_dir.name} {res['checkpoint']} (step {res['step']})")
    rows = [("task", "items", "acc", "acc_norm", "centered", "exact", "contains", "items/s", "time")]
    for t in res["tasks"]:
        def v(k: str) -> str:
            if k not in t:
                return ""
            mark = "*" if k == t.get("chosen") else ""
            return f"{t[k]:.3f}{mark}"
        rows.append((t["task"], f"{t['n']:,}", v("acc"), v("acc_norm"), v("centered"), v("exact"), v("contains"),
                     f"{t['items_per_s']:.1f}", duration(t["seconds"])))
    if res["tasks"]:
        keep = [i for i in range(len(rows[0])) if any(r[i] for r in rows[1:])]
        widths = [max(len(r[i]) for r in rows) for i in keep]
        for r in rows:
            print("  " + "  ".join(r[i].ljust(w) if i == 0 else r[i].rjust(w) for i, w in zip(keep, widths)).rstrip())
    if res["mean_centered"] is not None:
        n = sum(1 for t in res["tasks"] if t["kind"] == "mc")
        print(f"  mean centered accuracy over {n} multiple-choice task{'s' if n != 1 else ''}: "
              f"{res['mean_centered']:.3f}  (* the metric each task reports; centered: 0 = chance, 1 = all right)")
    if res["reward"]:
        x = res["reward"]
        print(f"  {x['task']} on {x['prompts']:,} prompts x {x['samples']}: mean reward {x['mean_reward']:.3f} "
              f"(sd {x['reward_sd']:.3f}), pass@1 {x['pass@1']:.3f}" + (f", pass@{x['k']} {x['pass@k']:.3f}"
                                                                       if x['k'] != 1 else "")
              + f"  (a pass: reward >= {x['threshold']:g}; {duration(x['seconds'])})")
    if res["text"]:
        x = res["text"]
        print(f"  text {x['corpus']}: {x['bpb']:.4f} bits/byte, loss {x['loss']:.4f} over {x['tokens']:,} tokens "
              f"({duration(x['seconds'])})")
    if saved and res["tasks"]:
        card = report_card(run_dir.parent, run_dir.name, res["step"])
        if card.prev_step is not None or card.base_label:
            print("  report card:")
            for line in card_lines(card):
                print("    " + line)
