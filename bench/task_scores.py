"""The built-in tasks separate models: a random-init model of a run's preset, then each of the run's
checkpoints, scored on every built-in task (all items), one after the other in one process.

    python -m workbench train cpu-small --name tasks-600 --set train.max_iters=600 train.ckpt_interval=200
    python bench/task_scores.py tasks-600            # prints the README's table
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench import rundir  # noqa: E402
from workbench.data.tasks.builtin_tasks import BUILTIN_TASKS, builtin_task  # noqa: E402
from workbench.data.text.tokenizer import load_tokenizer  # noqa: E402
from workbench.train.checkpoint import load_run_model  # noqa: E402
from workbench.train.model import GPT  # noqa: E402
from workbench.train.task_eval import score_task  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run")
    ap.add_argument("--runs-dir", default="runs")
    ap.add_argument("--seed", type=int, default=0, help="the random-init model's seed")
    a = ap.parse_args()
    run_dir = rundir.resolve_run(Path(a.runs_dir), a.run)
    tok = load_tokenizer(run_dir)
    tasks = [builtin_task(n) for n in BUILTIN_TASKS]
    loaded = load_run_model(run_dir, "latest")
    torch.manual_seed(a.seed)
    models = [("random init", GPT(loaded.preset.model))]
    models += [(f"step {c['step']}", load_run_model(run_dir, c["step"]).model)
               for c in rundir.list_checkpoints(run_dir)]
    print(f"run {run_dir.name}: preset {loaded.preset.name}, {models[0][1].num_params() / 1e6:.2f} M params; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    head = ["model"] + [f"{t.name} ({t.metric}, centered)" for t in tasks] + ["mean centered", "items/s"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for label, model in models:
        t0, n = time.time(), 0
        cells = []
        cent = []
        for t in tasks:
            sc = score_task(model, tok, t, torch.device("cpu"))
            cells.append(f"{sc.values[t.metric]:.3f} ({sc.values['centered']:+.3f})")
            cent.append(sc.values["centered"])
            n += sc.n
        print(f"| {label} | " + " | ".join(cells) + f" | {sum(cent) / len(cent):+.3f} | {n / (time.time() - t0):.1f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
