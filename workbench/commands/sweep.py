"""`workbench sweep`: make a sweep (a spec file, or a preset with --set-grid) whose trials are queued runs,
and show its results. The sweep is ``workbench.queue.sweep``; this parses and prints."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

from workbench.commands.common import (
    add_corpus_option,
    add_json_option,
    add_set_option,
    calibrated,
    time_budget_arg,
)
from workbench.machine.detect import Machine, detect
from workbench.machine.gpus import find_gpu
from workbench.plan.compare import machine_with
from workbench.queue.best import save_best
from workbench.queue.outcome import others_text, parse_metric
from workbench.queue.runner import runner_pid
from workbench.queue.store import QueueError, QueueStore, trial_name
from workbench.queue.sweep import create_sweep, print_commands
from workbench.queue.sweep_results import best, caveats, compute_saved, gpu_memory_line, load, results
from workbench.queue.sweep_spec import (
    METHODS,
    PRUNERS,
    SpecError,
    SweepSpec,
    build_spec,
    load_spec,
    parse_set_grid,
    point_sets,
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("sweep", help="search settings: trials queued as runs, ranked by what they reach",
                       description="`sweep SPEC.toml`, or `sweep PRESET --set-grid train.lr=1e-3,3e-3 "
                                   "train.warmup_iters=10,50 --time-budget 60s`: every trial is estimated, then "
                                   "queued as its own run (NAME-t0001, ...) for `workbench queue run`. "
                                   "`sweep show NAME` (or `sweep NAME --status`) ranks the trials; `sweep ls` lists "
                                   "the sweeps; `sweep save-best NAME [--as PRESET]` keeps the best trial's "
                                   "settings as a user preset.")
    p.add_argument("target", metavar="SPEC.toml|PRESET|show|ls|save-best",
                   help="a spec file, a preset (with --set-grid), `show NAME`, `ls`, `save-best NAME`, or a sweep's "
                        "name with --status")
    p.add_argument("sweep", nargs="?", default=None, metavar="NAME", help="the sweep, after `show` or `save-best`")
    p.add_argument("--set-grid", nargs="+", action="extend", default=[], metavar="SECTION.KEY=V1,V2",
                   help="a searched key and its values (several may follow one --set-grid)")
    add_set_option(p)
    add_corpus_option(p, " (default: the preset's)")
    p.add_argument("--time-budget", metavar="DURATION", default=None,
                   help="each trial trains this long (60s, 5m): trials compare by what they reach in the same time")
    p.add_argument("--name", default=None, help="the sweep's name (default: the spec file's, or <preset>-sweep)")
    p.add_argument("--method", choices=METHODS, default=None, help="grid (default), random or tpe (Optuna)")
    p.add_argument("--trials", type=int, default=None, help="random and tpe: how many trials")
    p.add_argument("--metric", default=None,
                   help="val_loss (default), val_bpb, task:NAME[:METRIC], or val_reward (GRPO trials' held-out "
                        "reward, higher is better: their default)")
    p.add_argument("--pruner", choices=PRUNERS, default=None,
                   help="median: stop a trial whose eval is worse than the median of earlier ones at the same "
                        "share of the budget; halving: successive halving, keep the best half at each rung")
    p.add_argument("--seed", type=int, default=0, help="the sampler's seed (random, tpe)")
    p.add_argument("--force", action="store_true",
                   help="queue trials whose time budget is too short to buy a complete run (evals within their "
                        "share, a warmup, ten steps), as `train --yes` starts one; they are marked in `sweep show`")
    p.add_argument("--print-commands", action="store_true",
                   help="queue nothing: print one `workbench train` line per trial (for Slurm, GNU parallel, ...)")
    p.add_argument("--gpu", metavar="NAME", default=None,
                   help="with --print-commands: estimate and auto-fit the trials as if on this GPU of the table "
                        "(`workbench hw --gpus`), the one the machines that run them have")
    p.add_argument("--storage", default=None, metavar="URL",
                   help="make (or show) the sweep in a shared study database, postgresql://USER:PASSWORD@HOST/DB "
                        "(or mysql://...), for workers on several machines (`workbench queue run --storage URL` on "
                        "each); default: $WORKBENCH_STORAGE, else this runs directory's SQLite")
    p.add_argument("--status", action="store_true", help="with a sweep's name: its results (as `sweep show`)")
    add_json_option(p, "show: the results as JSON")
    p.add_argument("--tsv", action="store_true", help="show: one tab-separated line per trial")
    p.add_argument("--as", dest="as_preset", metavar="PRESET", default=None,
                   help="save-best: the new user preset's name (default: NAME-best); an existing one is never "
                        "overwritten")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    root = args.runs_dir
    args.storage = args.storage or os.environ.get("WORKBENCH_STORAGE") or None
    if args.storage is not None:
        return run_shared(args)
    if args.as_preset and args.target != "save-best":
        raise QueueError("--as names the preset `sweep save-best NAME --as PRESET` writes; it goes with save-best")
    if args.target == "ls":
        return show_list(root)
    if args.target == "show" or args.status:
        name = args.sweep if args.target == "show" else args.target
        if not name:
            raise QueueError("name the sweep: `workbench sweep show NAME` (`workbench sweep ls` lists them)")
        return show(root, name, args.json, args.tsv)
    if args.target == "save-best":
        if not args.sweep:
            raise QueueError("name the sweep: `workbench sweep save-best NAME [--as PRESET]` (`workbench sweep ls` "
                             "lists them)")
        saved = save_best(root, args.sweep, args.as_preset)
        top = saved.trial
        print(f"sweep {args.sweep}: best trial {top.name} ({' '.join(point_sets(top.params))}), {saved.metric} "
              f"{top.metric:.4f}")
        print(f"saved as preset {saved.preset}: {saved.path}; `workbench train {saved.preset}` trains it")
        return 0
    if args.sweep:
        raise QueueError(f"unexpected {args.sweep!r} after {args.target}; --set-grid KEY=V1,V2 names what to search")
    time_budget_arg(args.time_budget)  # a bad one is the flag's, not the spec's or the preset's
    spec = dataclasses.replace(_spec(args), force=args.force)
    info = detect()
    if spec.time_budget and not args.gpu:  # the steps a budget buys need this machine's speed, as `train` asks it
        info = calibrated(info, spec.preset)
    machine = Machine.from_info(info)
    if args.gpu:
        if not args.print_commands:
            raise QueueError("--gpu plans the trials for machines with that GPU: it goes with --print-commands "
                             "(queued trials run on this machine, and are estimated for it)")
        machine = machine_with(find_gpu(args.gpu))
    if args.print_commands:
        for line in print_commands(root, spec, machine, info):
            print(line)
        return 0
    trials = create_sweep(root, spec, machine, info)
    queued = [t for t in trials if t.item is not None]
    size = " x ".join(str(len(p.values)) for p in spec.params) if spec.method == "grid" else str(spec.trials)
    print(f"sweep {spec.name}: {spec.method}, {size} trial(s) of {spec.preset}"
          + (f", {spec.time_budget} each" if spec.time_budget else "")
          + f", ranked by {spec.metric.name} ({spec.metric.goal})"
          + (f", {spec.pruner} pruner" if spec.pruner != "none" else ""))
    for t in trials:
        what = ("queued" + (f" ({t.note})" if t.note else "")) if t.item is not None else f"refused: {t.note}"
        print(f"  {trial_name(spec.name, t.number)}  {' '.join(point_sets(t.params))}  {what}")
    more = " (tpe: each next trial is drawn when one ends)" if spec.method == "tpe" else ""
    runner = "" if runner_pid(root) else "; `workbench queue run` runs them"
    print(f"{len(queued)} trial(s) queued{more}{runner}; `workbench sweep show {spec.name}` ranks them")
    return 0


def run_shared(args: argparse.Namespace) -> int:
    """`sweep ... --storage URL`: the sweep made in (or shown from) a shared study database."""
    from workbench.queue import distributed
    url = args.storage
    if args.target == "show" or args.status:
        name = args.sweep if args.target == "show" else args.target
        if not name:
            raise QueueError("name the sweep: `workbench sweep show NAME --storage URL`")
        return show_shared(url, name, args.json)
    if args.target == "ls":
        return list_shared(url)
    if args.target == "save-best":
        raise QueueError("`sweep save-best` reads this runs directory's sweeps; with --storage, `sweep show NAME "
                         "--storage URL` shows a shared one's best, and its run directory is on the machine it ran on")
    if args.print_commands or args.gpu:
        raise QueueError("--print-commands writes the trials out for another scheduler; it does not go with --storage")
    time_budget_arg(args.time_budget)
    spec = dataclasses.replace(_spec(args), force=args.force)
    storage = distributed.open_storage(url)  # an unreachable database, or wrong credentials: said first
    info = detect()
    if spec.time_budget:
        info = calibrated(info, spec.preset)
    _, made = distributed.create(url, spec, args.runs_dir, Machine.from_info(info), info, storage)
    where = distributed.masked(url)
    if made:
        count = "every point enqueued" if spec.method != "tpe" else f"{spec.trials} trials, drawn as workers ask"
        print(f"sweep {spec.name} made in {where}: {spec.method} over "
              f"{', '.join(p.describe() for p in spec.params)} of {spec.preset} ({count})")
    else:
        print(f"sweep {spec.name} is already in {where} with this spec: nothing added")
    print(f"run `workbench queue run --storage URL` on each machine (the URL in $WORKBENCH_STORAGE keeps the "
          f"password off the command line); `workbench sweep show {spec.name} --storage URL` ranks the trials")
    return 0


def list_shared(url: str) -> int:
    from workbench.queue import distributed, shared_study
    sweeps = shared_study.summaries(url)
    if not sweeps:
        print(f"no sweeps in {distributed.masked(url)}; `workbench sweep PRESET --set-grid KEY=V1,V2 --storage URL` "
              "makes one")
        return 0
    for d in sweeps:
        line = f"{d['name']}  {d['method']}  {d['ended']}/{d['target'] or d['counted']} ended"
        if d["best"] is not None:
            line += (f"  best {d['best_run']} {d['metric']} {d['best']:.4f} "
                     f"({' '.join(point_sets(d['best_params']))})")
        print(line)
    return 0


def show_shared(url: str, name: str, as_json: bool) -> int:
    from workbench.queue import distributed, shared_study
    spec, rows = shared_study.results(url, name)
    if as_json:
        print(json.dumps({"sweep": spec.to_dict(), "trials": rows}, indent=1))
        return 0
    keys = [p.key for p in spec.params]
    head = ["trial", "run", *keys, "state", spec.metric.name, "rank", "host", "note"]
    table = [[str(r["trial"]), r["run"], *(_fmt(r["params"].get(k, "")) for k in keys), r["state"],
              "" if r["value"] is None else f"{r['value']:.4f}", str(r.get("rank", "")), r["host"],
              "; ".join(n for n in (f"retry of trial {r['retry_of']}" if r["retry_of"] else "",
                                    f"resumed {r['resumed_from']}" if r["resumed_from"] else "", r["note"]) if n)]
             for r in rows]
    widths = [max(len(h), *(len(t[k]) for t in table)) if table else len(h) for k, h in enumerate(head)]
    print(f"sweep {name} in {distributed.masked(url)}: {spec.method}; ranked by {spec.metric.name} "
          f"({spec.metric.goal})")
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip())
    for t in table:
        print("  ".join(c.ljust(w) for c, w in zip(t, widths)).rstrip())
    return 0


def _spec(args: argparse.Namespace) -> SweepSpec:
    target = args.target
    if target.endswith(".toml") or Path(target).is_file():
        if args.set_grid:
            raise SpecError("give the searched keys in the spec's [parameters], or use a preset with --set-grid, "
                            "not both")
        spec = load_spec(Path(target), args.name)
        over = {}
        if args.time_budget:
            over["time_budget"] = args.time_budget
        if args.overrides or args.corpus or over or args.method or args.trials or args.metric or args.pruner:
            d = spec.to_dict()
            return build_spec(name=spec.name, preset=spec.preset, method=args.method or spec.method,
                              params=list(spec.params), trials=args.trials or (None if (args.method or spec.method)
                                                                                == "grid" else spec.trials),
                              time_budget=over.get("time_budget", spec.time_budget),
                              sets=spec.sets + tuple(args.overrides), corpus=tuple(args.corpus or d["corpus"]),
                              metric=parse_metric(args.metric) if args.metric else spec.metric,
                              pruner=args.pruner or spec.pruner, prune_startup=spec.prune_startup,
                              prune_shares=spec.prune_shares, seed=args.seed or spec.seed)
        return spec
    if not args.set_grid:
        raise SpecError(f"{target!r} is not a spec file; to sweep preset {target}, name what to search: "
                        f"--set-grid train.lr=1e-3,3e-3,1e-2")
    return build_spec(name=args.name or f"{Path(target).stem}-sweep", preset=target, method=args.method or "grid",
                      params=parse_set_grid(args.set_grid), trials=args.trials, time_budget=args.time_budget,
                      sets=tuple(args.overrides), corpus=tuple(args.corpus or ()),
                      metric=parse_metric(args.metric) if args.metric else None, pruner=args.pruner or "none",
                      seed=args.seed)


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def show(root: Path, name: str, as_json: bool, as_tsv: bool) -> int:
    store = QueueStore.open_existing(root, readonly=True)
    if store is None:
        raise QueueError(f"no sweep {name!r} in {root}: nothing was ever queued there")
    spec = load(store, name)
    rows = results(store, name)
    top = best(rows)
    keys = [p.key for p in spec.params]
    beside = [r for r in rows if r.beside]
    if as_json:
        print(json.dumps({"sweep": spec.to_dict(), "trials": [r.to_dict() for r in rows],
                          "best": top.to_dict() if top else None, "compute": compute_saved(rows),
                          "beside_others": len(beside), "caveats": caveats(rows)}, indent=1))
        return 0
    if as_tsv:
        print("\t".join(["run", *keys, spec.metric.name, "rank", "state", "seconds", "others_cpu", "gpu_free_mib",
                         "note"]))
        for r in rows:
            print("\t".join([r.name, *(_fmt(r.params.get(k, "")) for k in keys),
                             "" if r.metric is None else f"{r.metric:.6f}", str(r.rank or ""), r.state,
                             "" if r.seconds is None else f"{r.seconds:.1f}",
                             "" if r.others_cpu is None else f"{r.others_cpu:.3f}",
                             "" if r.gpu_free[1] is None else f"{r.gpu_free[1]:.0f}",
                             "; ".join(n for n in (r.fit, r.note, r.short, r.beside) if n).replace("\t", " ")]))
        return 0
    print(f"sweep {name}: {spec.method} over {', '.join(p.describe() for p in spec.params)}; {spec.preset}"
          + (f", {spec.time_budget} a trial" if spec.time_budget else "")
          + f"; ranked by {spec.metric.name} ({spec.metric.goal})"
          + (f"; {spec.pruner} pruner" if spec.pruner != "none" else ""))
    head = ["trial", *keys, "state", spec.metric.name, "rank", "seconds", "others"]
    table = [[r.name, *(_fmt(r.params.get(k, "")) for k in keys), r.state,
              "" if r.metric is None else f"{r.metric:.4f}", str(r.rank or ""),
              "" if r.seconds is None else f"{r.seconds:.0f}", others_text(r.others_cpu)] for r in rows]
    widths = [max(len(h), *(len(t[k]) for t in table)) if table else len(h) for k, h in enumerate(head)]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip())
    for r, t in zip(rows, table):
        print("  ".join(c.ljust(w) for c, w in zip(t, widths)).rstrip())
        for note in (r.fit, r.note if r.state in ("refused", "failed", "pruned") else "", r.short, r.beside):
            if note:
                print(f"    {note}")
    counts = {s: sum(r.state == s for r in rows) for s in dict.fromkeys(r.state for r in rows)}
    c = compute_saved(rows)
    saved = (f"; pruning saved {c['saved_share']:.0%}: {c['saved_s']:,.0f} of the {c['full_s']:,.0f} the trials "
             "would have taken, each to its end" if c["saved_s"] else "")
    print(", ".join(f"{n} {s}" for s, n in counts.items()) + f"; {c['spent_s']:,.0f} trial-seconds" + saved)
    if (gpu := gpu_memory_line(rows)):
        print(gpu)
    for line in caveats(rows):
        print(line)
    if top:
        print(f"best: {top.name} ({' '.join(point_sets(top.params))}): {spec.metric.name} {top.metric:.4f}")
    else:
        print("best: none yet (no trial has finished with the metric)")
    return 0


def show_list(root: Path) -> int:
    store = QueueStore.open_existing(root, readonly=True)
    names = store.sweep_names() if store else []
    if store is None or not names:
        print(f"no sweeps in {root}; `workbench sweep PRESET --set-grid KEY=V1,V2` makes one")
        return 0
    for name in names:
        rows = results(store, name)
        spec = load(store, name)
        top = best(rows)
        done = sum(r.state in ("finished", "failed", "stopped", "pruned", "refused") for r in rows)
        line = f"{name}  {spec.method}  {done}/{len(rows)} ended"
        if top:
            line += f"  best {top.name} {spec.metric.name} {top.metric:.4f} ({' '.join(point_sets(top.params))})"
        print(line)
    return 0
