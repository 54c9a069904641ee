"""The doctor and `workbench runs` on fine-tunes (issue 53, walk bug 3), real tiny runs: a fine-tune (--init-from)
inherits its tokenizer, so it is never told to change model.vocab_size (a run from scratch on the same text is); a
run shorter than its eval interval is told what it really evaluates, not "an eval every 200 steps"; a preference
run's val loss is not a text loss, so `workbench runs` shows no bits per byte for it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.chat import conversations, pair_records, write_jsonl
from tests.support.cli import REPO, TINY, tiny, wb


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """``base`` (the built-in corpus, a vocabulary of 1024), then on a small text (~8k tokens: 7 per vocabulary id):
    ``ft``, a 17-step full fine-tune of base whose eval interval (200) is longer than the run, and ``scratch``, a new
    model of the same size."""
    root = tmp_path_factory.mktemp("doctor-ft")
    small = root.parent / "small.txt"
    # ~14,000 characters of prose and code (the README's start, before the README moved into docs/)
    text = (REPO / "docs" / "reference" / "training.md").read_text(encoding="utf-8")
    small.write_text(text[:14_000], encoding="utf-8")
    wb("train", "cpu-small", "--name", "base", "--runs-dir", str(root),
       *tiny("model.vocab_size=1024", "train.max_iters=10", "train.eval_interval=10", "train.ckpt_interval=10"),
       check=True)
    # many eval batches: the two evals outweigh 17 tiny steps and pass the eval-share check's floor of 2 s of evals
    # on a fast machine too (300 fell under it once)
    ft_sets = ["--set", *(x for x in TINY if not x.startswith("model.")), "model.seq_len=32",  # the rest is base's
               "train.max_iters=17", "train.eval_interval=200", "train.ckpt_interval=200", "train.eval_iters=1000"]
    wb("train", "cpu-small", "--init-from", "base", "--corpus", str(small), "--name", "ft", "--runs-dir", str(root),
       *ft_sets, check=True)
    wb("train", "cpu-small", "--corpus", str(small), "--name", "scratch", "--runs-dir", str(root),
       *tiny("model.vocab_size=1024", "train.max_iters=4", "train.eval_interval=4"), check=True)
    return root


def doctor(root: Path, run: str) -> dict:
    return json.loads(wb("doctor", run, "--json", "--runs-dir", str(root), check=True).stdout)


def test_a_fine_tune_is_not_told_to_change_its_inherited_vocabulary(root):
    scratch = {f["code"]: f for f in doctor(root, "scratch")["findings"]}
    assert "model.vocab_size" in scratch["data.vocab"]["set"]  # the check itself still speaks to a new model
    report = doctor(root, "ft")
    text = json.dumps(report)
    assert "data.vocab" not in {f["code"] for f in report["findings"]}, text
    assert "vocab_size" not in text, text
    assert any("tokenizer" in n and "base" in n for n in report["notes"]), report["notes"]


def test_a_run_shorter_than_its_eval_interval_is_told_what_it_evaluates(root):
    findings = {f["code"]: f for f in doctor(root, "ft")["findings"]}
    share = findings["slow.eval_share"]
    text = " ".join(share["evidence"])
    assert "every 200 steps" not in text, text
    assert "2 evals in 17 steps (at steps 0 and 17: the eval interval, 200, is longer than the run)" in text, text


@pytest.fixture(scope="module")
def pref_root(tmp_path_factory) -> Path:
    """``sft``: a chat-tuned tiny run; ``dpo``: 4 DPO steps from it on preference pairs."""
    root = tmp_path_factory.mktemp("doctor-dpo")
    chats = write_jsonl(root.parent / "chats.jsonl", conversations(120, seed=2))
    pairs = write_jsonl(root.parent / "pairs.jsonl", pair_records(60))
    steps = ["model.seq_len=64", "train.eval_iters=1"]
    wb("train", "cpu-small", "--name", "sft", "--corpus", str(chats), "--runs-dir", str(root),
       *tiny(*steps, "train.max_iters=6", "train.eval_interval=6", "train.ckpt_interval=6"), check=True)
    wb("train", "cpu-small", "--init-from", "sft", "--name", "dpo", "--corpus", str(pairs), "--runs-dir", str(root),
       *tiny(*steps, "train.objective=dpo", "train.max_iters=4", "train.eval_interval=4", "train.ckpt_interval=4"),
       check=True)
    return root


def test_runs_shows_no_bits_per_byte_for_a_preference_runs_val_loss(pref_root):
    runs = {r["id"]: r for r in json.loads(wb("runs", "--json", "--runs-dir", str(pref_root), check=True).stdout)}
    assert runs["sft"]["val_bpb"] is not None and runs["sft"]["objective"] == "sft"
    assert runs["dpo"]["val_loss"] is not None and runs["dpo"]["val_bpb"] is None and runs["dpo"]["objective"] == "dpo"
    lines = wb("runs", "--runs-dir", str(pref_root), check=True).stdout.splitlines()
    row = next(line for line in lines if line.startswith("dpo "))
    bpb_col = lines[0].index("VAL BPB")  # (the columns are padded to their widest cell: the header's column)
    assert row[bpb_col:].split()[0] == "-", row
    assert any("preference run" in line and "not a text loss" in line for line in lines), lines
