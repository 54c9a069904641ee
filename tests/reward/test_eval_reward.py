"""`workbench eval --reward R --prompts FILE --samples N` through the real CLI on the facts run: the mean reward,
pass@1 and pass@k are those of the samples it dumps (pass@k by the closed form), the scores go to tasks.jsonl with
the reward's name and digest, and a bad reward input is one line with nothing written."""

from __future__ import annotations

import hashlib
import json
import shutil
from math import comb
from pathlib import Path

import pytest

from tests.support.cli import FACTS, wb
from tests.support.runs import read_jsonl, tree

SAMPLING = ["--temperature", "1.5", "--max-new-tokens", "6", "--top-k", "40", "--top-p", "0.95", "--seed", "3"]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("eval-reward")
    (d / "prompts.jsonl").write_text("".join(json.dumps({"prompt": q, "answer": f"{a}."}) + "\n" for q, a in FACTS))
    (d / "check.py").write_text("def right(prompt, completion, record):\n"
                                "    return float(completion.strip().startswith(record['answer']))\n")
    return d


def test_mean_reward_pass_at_1_and_pass_at_k_are_those_of_the_samples(facts_run, prompts, tmp_path):
    run = shutil.copytree(facts_run, tmp_path / "runs" / "facts")   # its tasks.jsonl is written: not the shared run's
    dump = tmp_path / "dump.jsonl"
    reward = f"{prompts / 'check.py'}:right"
    cp = wb("eval", "facts", "--runs-dir", str(run.parent), "--prompts", str(prompts / "prompts.jsonl"), "--reward",
            reward, "--samples", "5",
            "--pass-k", "2", "--pass-threshold", "1", "--reward-timeout", "2", "--dump", str(dump), "--json",
            "--device", "cpu", *SAMPLING)
    assert cp.returncode == 0, cp.stderr
    r = json.loads(cp.stdout)["checkpoints"][0]["reward"]
    rows = read_jsonl(dump)
    assert [d["prompt"] for d in rows] == [q for q, _ in FACTS] and all(len(d["completions"]) == 5 for d in rows)
    flat = [x for d in rows for x in d["rewards"]]
    passed = [sum(x >= 1 for x in d["rewards"]) for d in rows]
    assert 0 < sum(passed) < len(flat)     # some right, some wrong: pass@k differs from pass@1
    assert r["mean_reward"] == pytest.approx(sum(flat) / len(flat))
    assert r["pass@1"] == pytest.approx(sum(c / 5 for c in passed) / 12)
    assert r["pass@2"] == r["pass@k"] == pytest.approx(sum(1 - comb(5 - c, 2) / comb(5, 2) for c in passed) / 12)
    assert (r["prompts"], r["samples"], r["k"], r["threshold"], r["task"]) == (12, 5, 2, 1.0, "reward:check.py:right")
    digest = hashlib.sha256((prompts / "check.py").read_bytes()).hexdigest()
    assert r["reward"] == {"name": reward, "kind": "file", "sha256": digest, "timeout_s": 2.0}
    assert r["sampling"] == {"temperature": 1.5, "top_k": 40, "top_p": 0.95, "seed": 3, "max_new_tokens": 6}
    recs = [x for x in read_jsonl(run / "tasks.jsonl") if x["task"] == "reward:check.py:right"]
    assert [(x["metric"], x["value"], x["n"]) for x in recs] == [
        ("mean_reward", r["mean_reward"], 12), ("pass@1", r["pass@1"], 12), ("pass@2", r["pass@2"], 12)]
    assert all(x["reward"]["sha256"] == digest and x["step"] == 150 and x["samples"] == 5 for x in recs)

    # the table: --limit takes the first prompts; --progress says how far it is
    text = wb("eval", str(run), "--prompts", str(prompts / "prompts.jsonl"), "--reward", "contains:e",
              "--samples", "3", "--limit", "4", "--no-save", "--progress", *SAMPLING)
    assert text.returncode == 0, text.stderr
    assert "reward:contains:e on 4 prompts x 3: mean reward " in text.stdout and ", pass@3 " in text.stdout
    assert "progress: reward:contains:e 4/4 (step_0000150)" in text.stderr.splitlines()


@pytest.mark.parametrize("flags,message", [
    (["--reward", "exact"], "--reward and --prompts go together"),
    (["--reward", "exact", "--prompts", "{p}", "--samples", "2", "--pass-k", "3"],
     "--pass-k 3 must be between 1 and --samples (2)"),
    (["--reward", "exact", "--prompts", "{p}", "--samples", "2", "--temperature", "0"],
     "--temperature 0 is greedy: the 2 samples of a prompt would be the same, so pass@k would be pass@1"),
    (["--reward", "{d}/check.py:wrong", "--prompts", "{p}"],
     "reward file {d}/check.py has no 'wrong' (it defines right)"),
    (["--reward", "exact", "--prompts", "{d}/nothing.txt"], "prompts file {d}/nothing.txt does not exist"),
])
def test_bad_reward_input_is_one_line_and_writes_nothing(facts_run, prompts, flags, message):
    fmt = {"p": prompts / "prompts.jsonl", "d": prompts}
    before = tree(facts_run)
    cp = wb("eval", str(facts_run), *[f.format(**fmt) for f in flags])
    assert cp.returncode == 2 and cp.stderr.count("\n") == 1 and message.format(**fmt) in cp.stderr, cp.stderr
    assert tree(facts_run) == before
