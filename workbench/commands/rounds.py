"""`workbench rounds RUN --prompts F --reward R --rounds N`: iterated on-policy tuning (Iterative RPO, Pang et al.
2024): each round samples the last round's model on the prompts, pairs its better and worse answers by the reward
(``workbench pairs``) and trains DPO + NLL on them (``train.objective = dpo`` with ``train.pref_sft_weight``, the
SFT term on the chosen answers), starting from the last round's final checkpoint.

The rounds are queue items (``CHAIN-r1``, ``CHAIN-r2``, ...), one queued at a time by the runner as the previous
one finishes; the chain's spec, pairs and records are in ``runs/CHAIN.rounds/`` (:mod:`workbench.queue.rounds`).
Everything is checked before anything is written. Then the first round is queued and, unless a runner already
works on the queue (or ``--queue-only``), a runner is run here, in the foreground, as ``workbench queue run`` runs
one (it starts whatever else is queued too). The same command again continues a chain that was stopped or killed,
and shows where it stands; ``--show`` only shows it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from workbench import rundir
from workbench.commands.common import add_sampling_options, add_set_option, sampling_of, time_budget_arg
from workbench.commands.pairs import PROMPTS_HELP, REWARD_HELP, SAMPLES, check_sampling, preset_name
from workbench.data.chat.chat_templates import model_template
from workbench.errors import WorkbenchError
from workbench.plan.sampling import TEXT
from workbench.queue import rounds as chains
from workbench.queue.runner import Runner, runner_pid
from workbench.queue.store import QueueStore
from workbench.reward import TIMEOUT_S, parse_reward, read_prompts
from workbench.reward.spec import is_file_spec

SFT_WEIGHT = 1.0   # Iterative RPO's: the NLL term (length-normalised, as train.pref_sft_weight's) at weight 1

EPILOG = """\
each round I (CHAIN-rI, queued when round I-1 has finished):
  1. samples K completions of each prompt from round I-1's latest checkpoint (round 1: RUN's
     --checkpoint; fresh samples each round: --seed + (I-1) x the prompts) and writes every
     two with different rewards as a pair: CHAIN.rounds/round-I-pairs.jsonl
  2. trains --init-from that very checkpoint on them: train.objective=dpo with
     train.pref_sft_weight=--sft-weight (DPO + NLL), your --set values after those
  its record (CHAIN.rounds/round-I.json, and round.json in its run directory once it has ended):
  the checkpoint sampled, the pairs' count and the mean reward of its samples.
A round whose samples all score the same has no pair: it fails, saying so, and the chain stops.
Stopped or killed anywhere: run the same command again (or `workbench queue run`); finished rounds
are kept, a cut pairs file is continued, a round's trainer resumes from its checkpoint.
"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("rounds", help="iterated on-policy tuning: rounds of sample -> pair -> DPO + NLL, queued",
                       description="Rounds of on-policy preference tuning (Iterative RPO): each round samples the "
                                   "last round's model, pairs its answers by a reward and trains DPO + NLL on them "
                                   "from that checkpoint, as a queued run whose source is the last round.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", metavar="RUN", help="the run the first round samples and starts from")
    p.add_argument("--checkpoint", default="latest", help="RUN's checkpoint round 1 starts from: latest (default), "
                                                           "best or a step")
    p.add_argument("--prompts", default=None, metavar="FILE", help=PROMPTS_HELP)
    p.add_argument("--reward", default=None, metavar="R", help=REWARD_HELP)
    p.add_argument("--reward-timeout", type=float, default=TIMEOUT_S, metavar="S",
                   help=f"the longest one reward call may take, in seconds (default {TIMEOUT_S:g})")
    p.add_argument("--rounds", type=int, default=None, metavar="N", help="how many rounds")
    p.add_argument("--samples", type=int, default=SAMPLES, metavar="K",
                   help=f"completions sampled a prompt each round (default {SAMPLES})")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--steps", type=int, default=None, metavar="S",
                        help="optimizer steps a round (train.max_iters; default: the preset's)")
    length.add_argument("--time-budget", default=None, metavar="DURATION", help="train each round for this long "
                                                                                  "(45m, 2h, 90s)")
    p.add_argument("--sft-weight", type=float, default=SFT_WEIGHT, metavar="W",
                   help=f"weight of the NLL term on the chosen answers (train.pref_sft_weight; default {SFT_WEIGHT:g}; "
                        "0: plain DPO)")
    p.add_argument("--preset", default=None, help="the preset each round trains with (default: RUN's preset's "
                                                  "name); the model always comes from the round's source")
    add_set_option(p)
    p.add_argument("--name", default=None, metavar="CHAIN",
                   help="the chain's name (default RUN-rpo): its rounds are CHAIN-r1, CHAIN-r2, ...")
    add_sampling_options(p, TEXT)
    p.add_argument("--device", default="auto", help="where the samples are drawn: auto (default), cpu, cuda or mps")
    p.add_argument("--yes", action="store_true", help="queue the rounds even when the estimate says they will not fit")
    p.add_argument("--queue-only", action="store_true",
                   help="queue the first round and return (a runner, `workbench queue run`, takes it from there)")
    p.add_argument("--show", action="store_true", help="only show where the chain stands")
    p.set_defaults(func=run)


def chain_name(args: argparse.Namespace) -> str:
    name = args.name or f"{Path(args.run).name}-rpo"
    if rundir.sanitize_run_name(name) != name:
        raise WorkbenchError(f"--name {name!r} is not a run name; use letters, digits, '-', '_' and '.'")
    return name


def show(store: QueueStore | None, chain: chains.Chain) -> None:
    head = ("round", "run", "state", "from", "pairs", "mean reward")
    table = [(str(r.round), r.run, r.state, f"{r.source}:{r.step}" if r.step is not None else r.source,
              f"{r.pairs:,}" if r.pairs is not None else "-",
              f"{r.mean_reward:.3f}" if r.mean_reward is not None else "-") for r in chains.rows(store, chain)]
    widths = [max(len(h), *(len(t[k]) for t in table)) for k, h in enumerate(head)]
    print(f"chain {chain.name}: {chain.rounds} round(s) of DPO + NLL on {chain.spec['reward']} "
          f"({chain.spec['samples']} samples a prompt of {chain.spec['prompts']}); mean reward: of the round's "
          "samples, that is of the model it starts from")
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip())
    for r, t in zip(chains.rows(store, chain), table):
        print("  ".join(c.ljust(w) for c, w in zip(t, widths)).rstrip())
        if r.note and r.state not in ("queued", "running", "finished"):
            print(f"    {r.note}")


def run(args: argparse.Namespace) -> int:
    root: Path = args.runs_dir
    name = chain_name(args)
    d = chains.chain_dir(root, name)
    if args.show:
        chain = chains.load_chain(d)
        if chain is None:
            raise WorkbenchError(f"no chain {name!r} in {root} (no {d.name}/{chains.SPEC_FILE}); `workbench rounds "
                                 "RUN --prompts F --reward R --rounds N` starts one")
        show(QueueStore.open_existing(root), chain)
        return 0
    spec = checked_spec(args, root, name)
    old = chains.load_chain(d)
    if old is None and d.exists():
        raise WorkbenchError(f"{d} exists and is not a chain of rounds (no readable {chains.SPEC_FILE}); move it "
                             "aside or give another --name")
    if old is not None:
        differ = [k for k in chains.SETTINGS if old.spec.get(k) != spec.get(k)]
        if differ:
            was = "; ".join(f"{k}: {old.spec.get(k)!r} then, {spec.get(k)!r} now" for k in differ)
            raise WorkbenchError(f"chain {name} was made with other settings ({was}; runs/{d.name}/"
                                 f"{chains.SPEC_FILE}); the same command continues it; give another --name for a new "
                                 "chain")
        spec["rounds"] = max(spec["rounds"], old.spec["rounds"])
        spec["step"] = old.spec["step"]
    if name in {p.name for p in rundir.iter_run_dirs(root)} and old is None:
        raise WorkbenchError(f"a run named {name} exists; give the chain another --name")
    for i in range(1, spec["rounds"] + 1):   # a round's name held by something that is not this chain's round
        taken = root / f"{name}-r{i}"
        if old is None and taken.exists():
            raise WorkbenchError(f"{taken} exists: the chain's round {i} would be named so; give another --name")
    store = QueueStore(root)
    if old is None:
        clash = [f"{name}-r{i}" for i in range(1, spec["rounds"] + 1) if store.find(f"{name}-r{i}")]
        if clash:
            raise WorkbenchError(f"the queue has a run named {clash[0]}: the chain's round would be named so; give "
                                 "another --name")
    chain = chains.write_spec(d, spec) if old is None or old.spec != spec else old
    chains.catch_up(store, lambda m: print(m, flush=True), only=chain)
    alive = runner_pid(root)
    if args.queue_only or alive:
        show(store, chain)
        who = f"the queue runner (pid {alive}) takes it from here" if alive else "`workbench queue run` starts it"
        print(f"{who}; `workbench rounds {args.run} --name {name} --show` shows the rounds")
        return 0
    Runner(root, log=lambda m: print(m, flush=True)).run()
    show(store, chain)
    failed = [r for r in chains.rows(store, chain) if r.state in ("failed", "stopped", "pruned")]
    if failed:
        r = failed[0]
        raise WorkbenchError(f"round {r.round} ({r.run}) {r.state}" + (f": {r.note}" if r.note else ""))
    return 0


def absolute_reward(spec: str) -> str:
    """``--reward`` with its files made absolute (a user's FILE.py, a lexicon's word lists): the runner that samples
    the rounds may run elsewhere."""
    if is_file_spec(spec):
        file, fn = spec.rsplit(":", 1)
        return f"{Path(file).expanduser().absolute()}:{fn}"
    if spec.startswith("lexicon:"):
        return "lexicon:" + ",".join(str(Path(f).expanduser().absolute()) for f in spec[len("lexicon:"):].split(","))
    return spec


def checked_spec(args: argparse.Namespace, root: Path, name: str) -> dict:
    """The chain's spec from the arguments, every one checked before anything is written (one line each)."""
    if args.rounds is None or args.rounds < 1:
        given = "" if args.rounds is None else f" {args.rounds}"
        raise WorkbenchError(f"--rounds{given}: give the number of rounds, 1 or more (Iterative RPO: 2 to 4)")
    if args.reward is None:
        raise WorkbenchError("--reward is missing: the rounds pair samples by it, e.g. --reward exact (see "
                             "`workbench rounds --help`)")
    if args.prompts is None:
        raise WorkbenchError("--prompts is missing: give the prompts the rounds sample, e.g. --prompts prompts.jsonl")
    if args.samples < 2:
        raise WorkbenchError("--samples must be at least 2: a pair needs two samples of a prompt")
    if args.steps is not None and args.steps < 1:
        raise WorkbenchError(f"--steps {args.steps}: give 1 or more optimizer steps a round")
    if args.sft_weight < 0:
        raise WorkbenchError(f"--sft-weight {args.sft_weight:g}: give 0 (plain DPO) or more")
    sampling = sampling_of(args)
    check_sampling(sampling, args.samples, "there would be no pairs")
    budget = time_budget_arg(args.time_budget)
    run_dir = rundir.resolve_run(root, args.run)
    if run_dir.parent != root:
        raise WorkbenchError(f"{run_dir} is not in the runs directory {root}: the rounds are runs beside their "
                             "source; give --runs-dir its directory")
    ckpt = rundir.select_checkpoint(run_dir, args.checkpoint)
    if model_template(run_dir) is None:
        raise WorkbenchError(f"{run_dir.name} is not chat-tuned (no chat template): each round trains its pairs, and "
                             "the next round samples, through a chat template, while its own samples would continue "
                             "the prompts' text; chat-tune it first (a chat corpus, or `workbench import` a chat "
                             "model)")
    reward = parse_reward(args.reward, args.reward_timeout)
    prompts = read_prompts(args.prompts)
    for p in prompts.items:
        reward.check_record(p.record, p.where)
    sets = ["train.objective=dpo", f"train.pref_sft_weight={args.sft_weight:g}",
            *([f"train.max_iters={args.steps}"] if args.steps else []), *args.overrides]
    preset = args.preset or preset_name(run_dir)
    if preset == "PRESET":
        raise WorkbenchError(f"{run_dir.name}'s preset has no name to train the rounds with; give one with --preset")
    from workbench.plan.run_plan import NewRun, plan_new_run
    from workbench.queue.admit import preset_argument
    preset = preset_argument(preset)
    d = chains.chain_dir(root, name)
    # round 1 planned as `train` will plan it (its pairs file is written later): a bad --set is refused now
    plan_new_run(NewRun(preset, tuple(sets), (str(d / "round-1-pairs.jsonl"),), f"{run_dir.name}:{ckpt['step']}",
                        time_budget=budget, name=f"{name}-r1"), root)
    return {"version": chains.VERSION, "name": name, "source": run_dir.name, "step": int(ckpt["step"]),
            "prompts": str(Path(args.prompts).resolve()), "prompts_sha256": prompts.sha256,
            "prompt_count": len(prompts.items), "reward": absolute_reward(args.reward),
            "reward_timeout": args.reward_timeout, "samples": args.samples,
            "sampling": {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
                         "seed": sampling.seed, "max_new_tokens": sampling.max_new_tokens},
            "preset": preset, "sets": sets, "time_budget": budget.text if budget else None, "device": args.device,
            "force": bool(args.yes), "rounds": args.rounds}
