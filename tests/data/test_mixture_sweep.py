"""A mixture's source set by name: `--set data.mixture.NAME.weight=W` (its weight, max_repeat or corpus) on a run, and
a sweep searching a source's weight, each trial training the mixture its weight makes; a name the mixture does not
have is one line, exit 2."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.support.cli import tiny, wb
from tests.support.runs import read_jsonl
from workbench.data.mixture.mixture_plan import apportion


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("mixsweep")
    r = random.Random(1)
    words = ["".join(r.choice("abcdefghij") for _ in range(r.randint(2, 8))) for _ in range(300)]
    (d / "words.txt").write_text("\n\n".join(" ".join(r.choice(words) for _ in range(40)) for _ in range(300)))
    nums = "one two three four five six seven eight nine ten".split()
    (d / "nums.txt").write_text("\n\n".join(" ".join(r.choice(nums) for _ in range(30)) for _ in range(300)))
    return d


def _mix(d: Path) -> list[str]:
    return ["--corpus", f"words={d / 'words.txt'}:0.5", f"nums={d / 'nums.txt'}:0.5"]


def _counts(run: Path) -> dict[str, tuple[float, int]]:
    start = next(r for r in read_jsonl(run / "metrics.jsonl") if r.get("event") == "start")
    return {s["name"]: (s["weight"], s["sequences"]) for s in start["mixture"]["sources"]}


RUN = ["train.max_iters=6", "train.eval_interval=6", "train.lr_decay_iters=6"]


def test_a_source_weight_set_by_name_reaches_the_run_and_a_sweep_searches_it(corpora, tmp_path):
    runs = tmp_path / "runs"
    cp = wb("train", "cpu-small", *_mix(corpora), "--name", "set", "--runs-dir", str(runs),
            *tiny(*RUN, "data.mixture.nums.weight=0.2"), check=True)
    # 6 steps x 4 rows = 24 sequences, apportioned 0.5 : 0.2 (the weights normalised): 17 and 7
    assert _counts(runs / "set") == {"words": (0.5, 17), "nums": (0.2, 7)} == {
        n: (w, c) for n, w, c in zip(("words", "nums"), (0.5, 0.2), apportion([0.5, 0.2], 24))}, cp.stdout
    assert 'weight = 0.2' in (runs / "set" / "preset.toml").read_text()

    # a sweep over the weight: each trial its own mixture, the best saved with its weight
    wb("sweep", "cpu-small", *_mix(corpora), "--set-grid", "data.mixture.nums.weight=0.1,0.9", "--name", "mw",
       "--runs-dir", str(runs), "--set", *tiny(*RUN)[1:], check=True)
    wb("queue", "run", "--runs-dir", str(runs), timeout=300, check=True)
    shown = json.loads(wb("sweep", "show", "mw", "--json", "--runs-dir", str(runs), check=True).stdout)
    assert [(t["params"]["data.mixture.nums.weight"], t["state"]) for t in shown["trials"]] == [
        (0.1, "finished"), (0.9, "finished")]
    assert _counts(runs / "mw-t0001") == {"words": (0.5, apportion([0.5, 0.1], 24)[0]),
                                          "nums": (0.1, apportion([0.5, 0.1], 24)[1])}
    assert _counts(runs / "mw-t0002")["nums"] == (0.9, apportion([0.5, 0.9], 24)[1])


def test_a_source_the_mixture_does_not_have_is_one_line_exit_2(corpora, tmp_path):
    for item, want in (("data.mixture.code.weight=0.3", "the mixture has no source named 'code' (its sources: "
                                                        "'words', 'nums')"),
                       ("data.mixture.nums.share=0.3", "FIELD one of weight, max_repeat, corpus")):
        cp = wb("train", "cpu-small", *_mix(corpora), "--runs-dir", str(tmp_path / "runs"),
                *tiny(*RUN, item))
        assert cp.returncode == 2 and len(cp.stderr.strip().splitlines()) == 1 and want in cp.stderr, cp.stderr
        assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
