"""What a sweep's trials ran with reaches what it reports and keeps (issue 54's breaks 6 and 7): `sweep save-best`
keeps the trial's --corpus in the saved preset, so the preset trains on the trial's data (a sweep without --corpus
cannot tell); `sweep show`'s "pruning saved" share is of the compute the trials would have taken to their ends,
checked against the figures recorded for each trial, not against the command's own JSON.

The queue's record of each trial is the real one (`workbench sweep` made it); the trials' ends are written into it
as the runner writes them (state, start, end, metric) and the pruned trial's run directory holds the status its
trainer wrote when stopped, so the arithmetic has known inputs."""

from __future__ import annotations

import json
import random
import tomllib

import pytest

from tests.support.cli import TINY, wb
from tests.support.rundirs import RunDir
from workbench.config import preset_to_toml, resolve_preset
from workbench.queue.store import QueueStore

SETS = [s for s in TINY if not s.startswith("train.lr=")]


@pytest.fixture
def sweep(tmp_path):
    """runs/ with sweep `sw` over three learning rates on a corpus of its own (a JSONL of text records), 30 s a
    trial: t0001 and t0002 finished after 30 s, t0003 pruned after 10 s with 20 s of its budget left."""
    root, presets = tmp_path / "runs", tmp_path / "presets"
    corpus = tmp_path / "notes.jsonl"
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(900)]
    corpus.write_text("".join(json.dumps({"text": " ".join(rng.choices(words, k=400))}) + "\n" for _ in range(60)))
    env = {"WORKBENCH_PRESETS_DIR": str(presets)}
    wb("sweep", "cpu-small", "--set-grid", "train.lr=1e-3,3e-3,1e-2", "--time-budget", "30s", "--name", "sw",
       "--corpus", str(corpus), "--runs-dir", str(root), "--set", *SETS, env=env, check=True)
    store = QueueStore(root)
    for name, state, metric, seconds in [("sw-t0001", "finished", 3.4, 30.0), ("sw-t0002", "finished", 3.2, 30.0),
                                         ("sw-t0003", "pruned", None, 10.0)]:
        store.update(store.find(name).id, state=state, metric=metric, started=1000.0, ended=1000.0 + seconds)
    store.close()
    with RunDir(root, "sw-t0003", preset_to_toml(resolve_preset("cpu-small", SETS))) as r:
        r.status(state="stopped", step=40, max_iters=400, budget_s=30.0, budget_spent_s=10.0)
    return {"root": root, "presets": presets, "corpus": corpus, "env": env}


def test_pruning_saved_is_a_share_of_the_full_compute(sweep):
    """70 trial-seconds spent; had the pruned trial used its whole budget, 90: pruning saved 20 of 90, 22 % (not
    20 of the 70 spent, 29 %)."""
    root = sweep["root"]
    res = json.loads(wb("sweep", "show", "sw", "--json", "--runs-dir", str(root), check=True).stdout)
    assert [t["unspent_s"] for t in res["trials"]] == [None, None, pytest.approx(20.0)]
    c = res["compute"]
    assert c["spent_s"] == pytest.approx(70.0) and c["full_s"] == pytest.approx(90.0)
    assert c["saved_s"] == pytest.approx(20.0) and c["saved_share"] == pytest.approx(20.0 / 90.0)
    text = wb("sweep", "show", "sw", "--runs-dir", str(root), check=True).stdout
    assert ("2 finished, 1 pruned; 70 trial-seconds; pruning saved 22%: 20 of the 90 the trials would have taken, "
            "each to its end") in text, text


def test_save_best_keeps_the_trials_corpus_and_the_saved_preset_trains_on_it(sweep):
    root, presets, corpus, env = sweep["root"], sweep["presets"], sweep["corpus"], sweep["env"]
    cp = wb("sweep", "save-best", "sw", "--runs-dir", str(root), env=env, check=True)
    assert "best trial sw-t0002 (train.lr=0.003)" in cp.stdout, cp.stdout
    saved = tomllib.loads((presets / "sw-best.toml").read_text())
    assert saved["data"]["corpus"] == str(corpus) and saved["train"]["lr"] == 0.003
    # the saved preset, trained as a user would, reads the trial's corpus (not the built-in one)
    cp = wb("train", "sw-best", "--name", "again", "--runs-dir", str(root), "--set", "train.max_iters=3",
            "train.eval_interval=3", "train.ckpt_interval=3", env=env, check=True)
    assert f"corpus {corpus}" in cp.stdout and "encoded 60 documents" in cp.stdout, cp.stdout
    ran = tomllib.loads((root / "again" / "preset.toml").read_text())
    assert ran["data"]["corpus"] == str(corpus) and ran["train"]["lr"] == 0.003
