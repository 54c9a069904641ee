"""What evals cost a run: the share of its wall-clock spent in evals, and one eval's seconds by how it is done.

    python bench/eval_overhead.py share RUN_DIR [RUN_DIR ...]
    python bench/eval_overhead.py time RUN_DIR [--rounds 5] [--batches 20]

``share``: each run's evals, their seconds and their share of the run's wall-clock (from its start event to its
end), read from metrics.jsonl alike for every run: an eval's seconds are its record's time less the time of the
record before it (the train record of its step, or the start event for step 0), which also reads runs of a
trainer that did not record them; the ``seconds`` the trainer now records, and its totals, are printed beside.

``time``: one eval of the run's latest checkpoint, in one process, the ways alternating round by round (so a
busy machine slows each alike), median seconds:
  - before: ``--batches`` batches of train and of val drawn anew at every eval, and the fused loss computing the
    output weights' gradient for nothing (it did under no_grad: the weight requires grad),
  - cached: the same batches drawn once and kept, the same loss,
  - after: cached, and the fused loss without the gradient (the trainer's eval now), ``--batches`` batches,
  - auto: as after, with the batches train.eval_iters = 0 picks for the run's val split.
Each way's val loss is printed: the first three are the same to the bit. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def read(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def share(runs: list[Path]) -> None:
    for run in runs:
        recs = read(run)
        start = next(r for r in recs if r.get("event") == "start")
        end = next((r for r in reversed(recs) if r.get("event") in ("finish", "stopped", "early_stopped")), recs[-1])
        wall = end["time"] - start["time"]
        inferred, recorded = [], []
        for i, r in enumerate(recs):
            if r["kind"] == "eval":
                inferred.append(r["time"] - recs[i - 1]["time"])
                if "seconds" in r:
                    recorded.append(r["seconds"])
        ckpt = sum(r.get("seconds", 0.0) for r in recs if r.get("event") == "checkpoint")
        train = [r for r in recs if r["kind"] == "train"]
        print(f"{run.name}: {len(inferred)} evals, {sum(inferred):.1f} s of {wall:.1f} s = {sum(inferred) / wall:.1%} "
              f"(each {', '.join(f'{x:.2f}' for x in inferred)} s); saves {ckpt:.2f} s = {ckpt / wall:.1%}; "
              f"median {statistics.median(r['tokens_per_s'] for r in train if r.get('tokens_per_s')):,.0f} tok/s")
        if recorded:
            print(f"  recorded: evals {', '.join(f'{x:.2f}' for x in recorded)} s; totals at the end: "
                  + ", ".join(f"{k} {end.get(k)}" for k in ("elapsed_s", "eval_s", "ckpt_s"))
                  + (f" = {end['eval_s'] / end['elapsed_s']:.1%} in evals" if end.get("elapsed_s") else ""))


def time_evals(run: Path, rounds: int, batches: int) -> None:
    import math

    import torch

    from workbench.data.preset_data import prepare_data
    from workbench.data.train_data import IGNORE
    from workbench.plan.schedule.evals import eval_batches
    from workbench.rundir import EventRecord
    from workbench.train import runtime
    from workbench.train.checkpoint import load_run_model
    from workbench.train.dist import Dist
    from workbench.train.evaluation import EvalBatches, evaluate
    from workbench.train.model import FusedLinearCrossEntropy

    lm = load_run_model(run, "latest")
    p, model = lm.preset, lm.model
    data = prepare_data(p.data, p.model.vocab_size, p.model.seq_len, log=lambda m: None, loss_on=p.train.loss_on)
    dev = torch.device("cpu")
    token_bytes = torch.from_numpy(data.tokenizer.byte_lengths())
    chunk = next((e.get("loss_chunk_tokens") for e in map(EventRecord.from_dict, read(run))
                  if e.event == "start"), 0) or 0
    model.loss_chunk_tokens = chunk
    dist, null = Dist(), contextlib.nullcontext()

    def to_dev(s):
        return runtime.batch_to_device(s.next_batch(), dev)

    @torch.no_grad()
    def before() -> float:
        """The evaluation of before: batches drawn every time, the loss through the fused Function with the
        output weight as it is (requires grad), so it also computed that weight's gradient."""
        model.eval()
        out = []
        for part in ("train", "val"):
            s = data.sampler(part, p, seed=p.train.seed + 1)
            nats, count, nbytes = (torch.zeros(()) for _ in range(3))
            for _ in range(batches):
                b = to_dev(s)
                x, y, pos, seg = b.inputs, b.targets, b.positions, b.segments
                trained = y != IGNORE
                h = model.hidden(x, None, pos, seg)
                n = h.shape[0] * h.shape[1]
                nats += FusedLinearCrossEntropy.apply(h.reshape(n, -1), model.output_weight(), y.reshape(-1),
                                                      chunk, 1.0).float()
                count += trained.sum()
                nbytes += token_bytes[y.clamp_min(0)][trained].sum()
            vec = torch.stack([nats, count.float(), nbytes.float()])
            out.append(vec[0].item() / max(1.0, vec[1].item()))
        model.train()
        return out[1]

    cached = EvalBatches.draw(p, data, batches, token_bytes, dev, to_dev)

    @torch.no_grad()
    def cached_old_loss() -> float:
        model.eval()
        out = []
        for part in ("train", "val"):
            ep = cached.parts[part]
            nats = torch.zeros(())
            for b in ep.batches:
                h = model.hidden(b.inputs, None, b.positions, b.segments)
                n = h.shape[0] * h.shape[1]
                nats += FusedLinearCrossEntropy.apply(h.reshape(n, -1), model.output_weight(), b.targets.reshape(-1),
                                                      chunk, 1.0).float()
            out.append(nats.item() / max(1.0, ep.count.item()))
        model.train()
        return out[1]

    auto_p = dataclasses.replace(p, train=dataclasses.replace(p.train, eval_iters=0))
    n_auto, why = eval_batches(auto_p, data.split_tokens()[1])
    auto = EvalBatches.draw(p, data, n_auto, token_bytes, dev, to_dev)
    ways = {"before": before, "cached": cached_old_loss,
            "after": lambda: evaluate(model, cached, dist, null, 0).val_loss,
            "auto": lambda: evaluate(model, auto, dist, null, 0).val_loss}
    secs: dict[str, list[float]] = {k: [] for k in ways}
    loss: dict[str, float] = {}
    for _ in range(rounds):
        for k, fn in ways.items():
            t0 = time.perf_counter()
            loss[k] = fn()
            secs[k].append(time.perf_counter() - t0)
    print(f"{run.name} ({lm.meta['name']}), {torch.get_num_threads()} threads, {rounds} rounds; {batches} batches "
          f"of train and of val ({why})")
    for k in ways:
        print(f"  {k:7s} {statistics.median(secs[k]):6.2f} s  (min {min(secs[k]):.2f})  val loss {loss[k]!r}")
    same = loss["before"] == loss["cached"] == loss["after"]
    print(f"  the same val loss before, cached and after: {same}")
    assert math.isfinite(loss["auto"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("share")
    s.add_argument("runs", nargs="+", type=Path)
    t = sub.add_parser("time")
    t.add_argument("run", type=Path)
    t.add_argument("--rounds", type=int, default=5)
    t.add_argument("--batches", type=int, default=20)
    a = ap.parse_args()
    if a.cmd == "share":
        share(a.runs)
    else:
        time_evals(a.run, a.rounds, a.batches)


if __name__ == "__main__":
    main()
