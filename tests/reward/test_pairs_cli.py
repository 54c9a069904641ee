"""`workbench pairs` through the real CLI on real tiny runs: the pairs are every two samples with different rewards
(checked against the samples `eval --reward --dump` shows for the same settings), a stopped run continues to the
very file one go writes, other settings are refused, every bad input is one line with exit 2 and nothing written,
the K-row sampler is `generate`'s loop, and the preference trainer trains on what a chat-tuned run's pairs give."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.chat import conversations, write_jsonl
from tests.support.cli import FACTS, tiny, wb
from tests.support.runs import read_jsonl, tree

# hot sampling, so that the facts model gets some answers wrong: pairs need samples that differ
SAMPLING = ["--temperature", "1.5", "--max-new-tokens", "6", "--top-k", "40", "--top-p", "0.95", "--seed", "7",
            "--device", "cpu"]

REWARD = '''
from pathlib import Path
STOP = Path(__file__).with_name("stop-at")

def right(prompt, completion, record):
    if STOP.exists() and STOP.read_text() == prompt:
        raise RuntimeError("asked to stop here")
    return 1.0 if completion.strip().startswith(record["answer"]) else 0.0

def boom(prompt, completion, record):
    raise ValueError("no idea")

def nan(prompt, completion, record):
    return float("nan")

def word(prompt, completion, record):
    return "high"

def slow(prompt, completion, record):
    import time
    time.sleep(20)
    return 0.0
'''


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pairs-inputs")
    # the facts model's line is "code 003 means cloud.": the first line of a right completion is "cloud."
    (d / "prompts.jsonl").write_text("".join(json.dumps({"prompt": q, "answer": f"{a}."}) + "\n" for q, a in FACTS))
    (d / "reward.py").write_text(REWARD)
    return d


def pairs_cli(run: Path, out: Path, *extra: str, cwd: Path | None = None):
    return wb("pairs", run.name, "--runs-dir", str(run.parent), "--out", str(out), *extra, cwd=cwd)


def ok(cp) -> str:
    assert cp.returncode == 0, (cp.stdout, cp.stderr)
    return cp.stdout


def errors(cp) -> list[str]:
    """stderr without its progress lines."""
    return [ln for ln in cp.stderr.splitlines() if not ln.startswith("progress:")]


def test_the_pairs_are_every_two_samples_with_different_rewards(facts_run, inputs, tmp_path):
    out = tmp_path / "pairs.jsonl"
    stdout = ok(pairs_cli(facts_run, out, "--prompts", str(inputs / "prompts.jsonl"), "--reward", "exact:answer",
                      "--samples", "4", *SAMPLING))
    # the same samples, as eval shows them: prompt i sampled with seed + i, K rows together
    dump = tmp_path / "dump.jsonl"
    ok(wb("eval", facts_run.name, "--runs-dir", str(facts_run.parent), "--prompts", str(inputs / "prompts.jsonl"),
          "--reward", "exact:answer", "--samples", "4", "--dump", str(dump), "--no-save", *SAMPLING))
    want = []
    for d in read_jsonl(dump):
        c, r = d["completions"], d["rewards"]
        for i in range(4):
            for j in range(i + 1, 4):
                if r[i] != r[j]:
                    hi, lo = (i, j) if r[i] > r[j] else (j, i)
                    want.append({"prompt": d["prompt"], "chosen": c[hi], "rejected": c[lo], "chosen_reward": r[hi],
                                 "rejected_reward": r[lo]})
    got = read_jsonl(out)
    assert got == want and len(got) >= 6   # not vacuous: the facts model is right and wrong at this temperature
    assert {(g["chosen_reward"], g["rejected_reward"]) for g in got} == {(1.0, 0.0)}
    meta = json.loads((tmp_path / "pairs.jsonl.meta.json").read_text())
    s = meta["settings"]
    assert (s["run"], s["checkpoint"], s["step"], s["samples"]) == ("facts", "step_0000150", 150, 4)
    assert s["reward"] == {"name": "exact:answer", "kind": "exact", "sha256": None}
    assert s["sampling"] == {"temperature": 1.5, "top_k": 40, "top_p": 0.95, "seed": 7, "max_new_tokens": 6}
    assert (meta["done"], meta["pairs"], meta["complete"], meta["chat"]) == (12, len(got), True, False)
    assert f"wrote {len(got)} pairs from 12 prompts x 4 samples to {out}" in stdout
    assert "workbench train cpu-small --init-from facts:150 --corpus" in stdout


def test_no_pair_says_why_instead_of_a_command_that_would_fail(facts_run, inputs, tmp_path):
    """A reward no sample earns scores every sample alike: no pair, said with what would give some, and no `train`
    command for an empty file (a walk ran the suggested one and it failed)."""
    out = tmp_path / "none.jsonl"
    stdout = ok(pairs_cli(facts_run, out, "--prompts", str(inputs / "prompts.jsonl"), "--reward", "contains:zzzqqq",
                          "--samples", "2", *SAMPLING))
    assert "wrote 0 pairs from 12 prompts x 2 samples" in stdout and read_jsonl(out) == []
    assert "no pair: every prompt's 2 samples scored alike" in stdout and "train on them" not in stdout


def test_a_stopped_run_continues_to_the_file_one_go_writes(facts_run, inputs, tmp_path):
    args = ["--prompts", str(inputs / "prompts.jsonl"), "--reward", str(inputs / "reward.py") + ":right",
            "--samples", "3", "--reward-timeout", "3", "--checkpoint", "150", *SAMPLING]
    whole = tmp_path / "whole.jsonl"
    ok(pairs_cli(facts_run, whole, *args))
    part = tmp_path / "part.jsonl"
    (inputs / "stop-at").write_text(FACTS[5][0])
    try:
        cp = pairs_cli(facts_run, part, *args)
    finally:
        (inputs / "stop-at").unlink()
    assert cp.returncode == 2 and len(errors(cp)) == 1, cp.stderr
    assert errors(cp)[0].startswith("workbench: error: reward reward.py:right raised RuntimeError: asked to stop here "
                                    "on prompt 'code 005 means' and completion '"), cp.stderr
    meta = json.loads((tmp_path / "part.jsonl.meta.json").read_text())
    assert meta["done"] == 5 and not meta["complete"]
    assert meta["settings"]["reward"]["sha256"] == json.loads(
        (tmp_path / "whole.jsonl.meta.json").read_text())["settings"]["reward"]["sha256"]
    with part.open("ab") as f:
        f.write(b'{"prompt": "code 005 means", "cho')      # a prompt half written when the process died
    cp = pairs_cli(facts_run, part, *args)
    ok(cp)
    assert "continuing " + str(part) + " after 5 of 12 prompts" in cp.stderr
    assert part.read_bytes() == whole.read_bytes()
    assert "is complete" in ok(pairs_cli(facts_run, part, *args))

    before = tree(tmp_path)
    for changed, said in [(["--samples", "4"], "samples: 3 then, 4 now"),
                          (["--temperature", "1.0"], "sampling.temperature: 1.5 then, 1.0 now"),
                          (["--reward", "contains:apple"], 'reward.name: "' + str(inputs / "reward.py") + ':right" '
                                                          'then, "contains:apple" now')]:
        cp = pairs_cli(facts_run, part, *args, *changed)
        assert cp.returncode == 2 and len(errors(cp)) == 1 and said in cp.stderr, cp.stderr
        assert f"delete {part} and part.jsonl.meta.json (or give another --out) to start over" in cp.stderr
    assert tree(tmp_path) == before


BAD = {
    "reward file missing": (["--reward", "{d}/missing.py:right"], "reward file {d}/missing.py does not exist"),
    "name not in file": (["--reward", "{d}/reward.py:nope"],
                         "reward file {d}/reward.py has no 'nope' (it defines boom, nan, right, slow, word)"),
    "reward raises": (["--reward", "{d}/reward.py:boom"],
                      "reward reward.py:boom raised ValueError: no idea on prompt 'code 000 means' and completion"),
    "reward is NaN": (["--reward", "{d}/reward.py:nan"],
                      "reward reward.py:nan returned nan, not a finite number on prompt 'code 000 means'"),
    "reward is a string": (["--reward", "{d}/reward.py:word"],
                           "reward reward.py:word returned \"'high'\" (str), not a number on prompt 'code 000 means'"),
    "reward too slow": (["--reward", "{d}/reward.py:slow", "--reward-timeout", "0.5"],
                        "reward reward.py:slow took longer than 0.5 s (--reward-timeout) on prompt 'code 000 means'"),
    "prompts missing": (["--prompts", "{d}/none.jsonl"], "prompts file {d}/none.jsonl does not exist"),
    "no prompts": (["--prompts", "{d}/blank.txt"], "prompts file {d}/blank.txt has no prompts"),
    "bad JSON line": (["--prompts", "{d}/broken.jsonl"], "prompts file {d}/broken.jsonl, line 2: not valid JSON"),
    "exact without answers": (["--prompts", "{d}/plain.txt", "--reward", "exact"],
                              "prompts file {d}/plain.txt, line 1: --reward exact compares with the record's "
                              "'answer' field"),
    "one sample": (["--samples", "1"], "--samples must be at least 2: a pair needs two samples of a prompt"),
    "greedy": (["--temperature", "0"], "--temperature 0 is greedy: the 4 samples of a prompt would be the same"),
    "not our file": (["--out", "{d}/notes.jsonl"], "notes.jsonl exists and was not written by `workbench pairs`"),
    "no such directory": (["--out", "{d}/new/p.jsonl"], "--out {d}/new/p.jsonl: there is no directory {d}/new"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_exit_2_and_nothing_written(facts_run, inputs, tmp_path, case):
    d = tmp_path / "in"
    d.mkdir()
    (d / "reward.py").write_text(REWARD)
    (d / "blank.txt").write_text("\n   \n")
    (d / "broken.jsonl").write_text('{"prompt": "code 001 means", "answer": "river"}\n{"prompt": \n')
    (d / "plain.txt").write_text("code 001 means\n")
    (d / "notes.jsonl").write_text("my own notes\n")
    flags, message = BAD[case]
    flags = [f.format(d=d) for f in flags]
    given = dict(zip(flags[::2], flags[1::2]))
    args = ["--prompts", given.pop("--prompts", str(inputs / "prompts.jsonl")),
            "--reward", given.pop("--reward", "exact"), *[x for kv in given.items() for x in kv]]
    work = tmp_path / "work"
    work.mkdir()
    before, runs_before = tree(tmp_path), tree(facts_run)
    cp = wb("pairs", str(facts_run), *args, "--max-new-tokens", "3", *(["--out", "p.jsonl"] if "--out" not in given
                                                                       else []), cwd=work)
    assert cp.returncode == 2, (cp.stdout, cp.stderr)
    assert len(errors(cp)) == 1 and message.format(d=d) in cp.stderr, cp.stderr
    assert tree(tmp_path) == before and tree(facts_run) == runs_before   # no pairs, no sidecar, nothing changed


def test_the_k_row_sampler_is_generates_loop(facts_run):
    """One row of the batched sampler gives `generate`'s tokens for the same seed, through a full KV cache rebuilt
    (40 tokens past a 32-token context); K rows sample K different completions, the same again for the same seed,
    each cut at its own stop."""
    from workbench.plan.sampling import TEXT
    from workbench.train.checkpoint import load_run_model
    from workbench.train.generate import generate, sample_rows

    model = load_run_model(facts_run, "latest", "cpu").model
    prompt = [5, 9, 12]
    s = TEXT.replace(max_new_tokens=40, temperature=1.2)
    one = sample_rows(model, prompt, 1, s, 11, frozenset())
    assert one[0] == list(generate(model, prompt, 40, **s.replace(seed=11).generate_args()))
    rows = sample_rows(model, prompt, 4, s, 11, frozenset())
    assert len({tuple(r) for r in rows}) == 4 and all(len(r) == 40 for r in rows)
    assert rows == sample_rows(model, prompt, 4, s, 11, frozenset())   # the seed fixes all K
    stop = rows[2][5]
    cut = sample_rows(model, prompt, 4, s, 11, frozenset({stop}))
    assert cut == [r[:r.index(stop)] if stop in r else r for r in rows]   # each row cut before its first stop id
    kept = sample_rows(model, prompt, 4, s, 11, frozenset({stop}), keep_stop=True)
    assert kept == [r[:r.index(stop) + 1] if stop in r else r for r in rows]   # ... or just after it


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory) -> Path:
    """A tiny chat-tuned run (its chat template is ChatML) and prompts of its task."""
    root = tmp_path_factory.mktemp("pairs-chat") / "runs"
    chats = write_jsonl(root.parent / "chats.jsonl", conversations(200, seed=2))
    wb("train", "cpu-small", "--name", "chat", "--corpus", str(chats), "--runs-dir", str(root),
       *tiny("model.seq_len=64", "train.max_iters=24", "train.eval_interval=24", "train.ckpt_interval=24",
             "train.eval_iters=1", "train.lr=3e-3"), check=True)
    return root / "chat"


def test_a_chat_runs_pairs_are_its_replies_and_the_preference_trainer_takes_them(chat_run, tmp_path):
    prompts = [{"prompt": c["messages"][-2]["content"], "answer": c["messages"][-1]["content"]}
               for c in conversations(12, seed=5) if c["messages"][0]["role"] == "user"]
    write_jsonl(tmp_path / "prompts.jsonl", prompts)
    out = tmp_path / "chat-pairs.jsonl"
    ok(wb("pairs", "chat", "--runs-dir", str(chat_run.parent), "--prompts", str(tmp_path / "prompts.jsonl"),
          "--reward", "length:12", "--samples", "4", "--max-new-tokens", "12", "--device", "cpu", "--out", str(out)))
    got = read_jsonl(out)
    meta = json.loads((tmp_path / "chat-pairs.jsonl.meta.json").read_text())
    assert meta["chat"] is True and len(got) == meta["pairs"] >= len(prompts)
    for g in got:   # replies through the template: the end-of-turn token never shows
        assert "<|im_end|>" not in g["chosen"] + g["rejected"] and g["chosen_reward"] > g["rejected_reward"]
        assert g["chosen_reward"] == pytest.approx(max(0.0, 1 - abs(len(g["chosen"]) - 12) / 12))
    cp = wb("train", "cpu-small", "--init-from", "chat", "--name", "dpo", "--corpus", str(out), "--runs-dir",
            str(chat_run.parent), *tiny("model.seq_len=64", "train.objective=dpo", "train.max_iters=2",
                                        "train.warmup_iters=0", "train.eval_interval=2", "train.ckpt_interval=2",
                                        "train.eval_iters=1"))
    assert cp.returncode == 0, cp.stderr
    start = next(r for r in read_jsonl(chat_run.parent / "dpo" / "metrics.jsonl") if r.get("event") == "start")
    assert start["preference"]["items"] == len(got)
    assert [r["step"] for r in read_jsonl(chat_run.parent / "dpo" / "metrics.jsonl") if r.get("kind") == "pref"
            and r["split"] == "train"] == [1, 2]
