"""`workbench eval` from the command line: checkpoints and a branch scored, the stable --json layout, the
scores kept in tasks.jsonl and shown by `workbench runs` and `workbench metrics`; every bad input one line,
exit 2, and nothing written into the run."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from tests.support.cli import FACTS, wb
from tests.support.runs import read_jsonl, tree
from workbench.data.text.tokenizer import load_tokenizer


@pytest.fixture
def run(trained_run, tmp_path) -> Path:
    """A copy of the shared tiny run (checkpoints at steps 20, 40, 60) to write scores into."""
    dst = tmp_path / "runs" / "r"
    shutil.copytree(trained_run, dst)
    return dst


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((json.dumps(r) if not isinstance(r, str) else r) + "\n" for r in rows))
    return path


def test_every_checkpoint_scored_as_json_kept_and_shown(run):
    root = str(run.parent)
    cp = wb("eval", "r", "--runs-dir", root, "--checkpoint", "all", "--task", "builtin", "--limit", "12", "--json",
            check=True)
    out = json.loads(cp.stdout)
    assert out["version"] == 1 and out["run"] == "r"
    assert [c["step"] for c in out["checkpoints"]] == [20, 40, 60]
    for c in out["checkpoints"]:
        assert [t["task"] for t in c["tasks"]] == ["stdlib-next-line", "docs-cloze"]
        # each built-in task's headline metric, as the README gives it
        assert [t["chosen"] for t in c["tasks"]] == ["acc_norm", "acc"]
        for t in c["tasks"]:
            assert t["n"] == 12 and t["kind"] == "mc" and t["chance"] == 0.25 and t["metric"] == "centered"
            assert t["centered"] == pytest.approx((t[t["chosen"]] - 0.25) / 0.75) and t["score"] == t["centered"]
            assert round(t["acc"] * 12) == pytest.approx(t["acc"] * 12)  # a count of right answers
        assert c["mean_centered"] == pytest.approx(sum(t["centered"] for t in c["tasks"]) / 2)
    recs = read_jsonl(run / "tasks.jsonl")
    assert len(recs) == 3 * 2 * 3 and {r["kind"] for r in recs} == {"task"}
    assert {(r["step"], r["task"], r["metric"]) for r in recs} == {
        (s, t, m) for s in (20, 40, 60) for t in ("stdlib-next-line", "docs-cloze")
        for m in ("centered", "acc", "acc_norm")}
    last = {t["task"]: t["centered"] for t in out["checkpoints"][-1]["tasks"]}

    runs = wb("runs", "--runs-dir", root, check=True).stdout
    assert (f"r tasks at step 60: stdlib-next-line {last['stdlib-next-line']:.3f}, docs-cloze "
            f"{last['docs-cloze']:.3f} (centered)") in runs
    csv = wb("metrics", "r", "--runs-dir", root, "--csv", "--tasks", check=True).stdout.splitlines()
    assert csv[0] == "step,task,metric,value,n,source,checkpoint" and len(csv) == 1 + 18
    assert f"60,docs-cloze,centered,{last['docs-cloze']!r},12,builtin,step_0000060" in csv


def test_a_branch_is_compared_with_its_parent(run):
    root = str(run.parent)
    wb("eval", "r", "--runs-dir", root, "--checkpoint", "40", "--task", "docs-cloze", "--limit", "16", check=True)
    wb("resume", "r", "--runs-dir", root, "--checkpoint", "40", "--set", "train.lr=1e-3", check=True)
    cp = wb("eval", "r-from-40", "--runs-dir", root, "--task", "docs-cloze", "--limit", "16", check=True)
    mine = next(r for r in read_jsonl(run.parent / "r-from-40" / "tasks.jsonl") if r["metric"] == "centered")
    parent = next(r for r in read_jsonl(run / "tasks.jsonl") if r["metric"] == "centered")
    assert (mine["step"], parent["step"]) == (60, 40)
    lines = cp.stdout.splitlines()
    head = next(line for line in lines if "Δ parent r@40" in line)
    assert "Δ step 40" in head  # a branch's first scored checkpoint: the parent's before it
    row = next(line for line in lines[lines.index(head):] if line.strip().startswith("docs-cloze"))
    d = f"{mine['value'] - parent['value']:+.3f}"
    assert row.split()[-2:] == [d, d]


def test_exact_match_answers_dumped_for_inspection(facts_run, tmp_path):
    task = _jsonl(tmp_path / "facts.jsonl", [{"prompt": q, "answer": f"{a}."} for q, a in FACTS[:6]]
                  + [{"prompt": q, "answer": "wrong."} for q, _ in FACTS[6:8]])
    dump = tmp_path / "dump.jsonl"
    cp = wb("eval", str(facts_run), "--task", str(task), "--dump", str(dump), "--json", "--no-save", check=True)
    t = json.loads(cp.stdout)["checkpoints"][0]["tasks"][0]
    assert (t["kind"], t["n"], t["exact"], t["contains"]) == ("gen", 8, 0.75, 0.75)
    rows = read_jsonl(dump)
    assert [r["output"] for r in rows] == [f" {a}." for _, a in FACTS[:8]]
    assert [r["exact"] for r in rows] == [True] * 6 + [False] * 2
    assert not (facts_run / "tasks.jsonl").exists()  # --no-save


def test_held_out_text_in_bits_per_byte(run, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("def add(a, b):\n    return a + b\n" * 40)
    cp = wb("eval", "r", "--runs-dir", str(run.parent), "--corpus", str(text), "--limit", "4", "--json", check=True)
    x = json.loads(cp.stdout)["checkpoints"][0]["text"]
    assert x["tokens"] == 4 * 32 and 0 < x["bpb"] < x["loss"]
    # the loss in bits over the UTF-8 bytes of the 128 tokens scored (windows of 33 overlapping by one: the text's
    # first 129 tokens, less the first)
    tok = load_tokenizer(run)
    ids = tok.encode(text.read_text())[:129]
    nbytes = len(tok.decode(ids).encode()) - len(tok.decode(ids[:1]).encode())
    assert x["bpb"] == pytest.approx(x["loss"] * x["tokens"] / math.log(2) / nbytes, rel=1e-9)
    recs = {r["metric"]: r for r in read_jsonl(run / "tasks.jsonl")}
    assert recs["bpb"]["task"] == "text:notes.txt" and recs["bpb"]["value"] == x["bpb"]


def test_a_hellaswag_file_scored_on_ctx_as_given_says_so(run, tmp_path):
    """Records without HellaSwag's activity_label, ctx_a and ctx_b cannot be preprocessed as lm-eval does: the
    output says they are scored as given (tests/interop/test_lm_eval_tasks.py: with them, lm-eval's strings)."""
    f = _jsonl(tmp_path / "hs.jsonl", [{"ctx": "The sky is", "endings": ["blue.", "loud."], "label": 0}])
    cp = wb("eval", "r", "--runs-dir", str(run.parent), "--task", str(f), "--no-save", check=True)
    assert ("note: hs: its records have no activity_label, ctx_a and ctx_b: ctx and the endings are scored as given, "
            "not as lm-evaluation-harness's hellaswag task preprocesses them") in cp.stderr.splitlines()
    js = json.loads(wb("eval", "r", "--runs-dir", str(run.parent), "--task", str(f), "--no-save", "--json",
                       check=True).stdout)
    assert js["checkpoints"][0]["tasks"][0]["shape"] == "HellaSwag (ctx as given)"


def _no_byte_fallback(ws: Path, run: Path) -> None:
    import sentencepiece as spm
    text = ws / "ascii.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 200)
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(ws / "sp"), vocab_size=60, model_type="bpe",
                                   byte_fallback=False, character_coverage=1.0, minloglevel=2)
    (run / "tokenizer.model").write_bytes((ws / "sp.model").read_bytes())
    for f in (ws / "sp.model", ws / "sp.vocab", text):
        f.unlink()


BAD = {
    "no_shape": ([{"foo": 1, "bar": "x"}], [], "task {f}, line 1: no task shape matches the fields 'foo', 'bar'; "
                 "accepted: "),
    "gold_out_of_range": ([{"query": "a", "choices": ["x", "y", "z"], "gold": 0},
                           {"query": "b", "choices": ["x", "y", "z"], "gold": 3}], [],
                          "task {f}, line 2: gold index 3 is out of range for 3 choices (0 to 2)"),
    "empty": ([], [], "task {f} has no records"),
    "identical_choices": ([{"query": "a", "choices": ["same", "same"], "label": 1}], [],
                          "task {f}, line 1: all 2 choices are the same text"),
    "not_json": (["{not json"], [], "task {f}, line 1: not valid JSON"),
    "missing_checkpoint": ([{"query": "a", "choices": ["x", "y"], "gold": 0}], ["--checkpoint", "35"],
                           "run r has no checkpoint at step 35; it has: 20, 40, 60"),
    "unknown_option": ([{"query": "a", "choices": ["x", "y"], "gold": 0}], ["--set", "gold=1"],
                       "--set: unknown task option 'gold'"),
    "cannot_encode": ([{"query": "the fox", "choices": ["jumps", "日本"], "gold": 0}], [],
                      "task t, item 1: the run's tokenizer cannot encode '日' (it becomes <unk>)"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_is_one_line_and_writes_nothing(run, tmp_path, name):
    rows, extra, message = BAD[name]
    f = _jsonl(tmp_path / "t.jsonl", rows)
    if name == "cannot_encode":
        _no_byte_fallback(tmp_path, run)
    before = tree(tmp_path)
    cp = wb("eval", "r", "--runs-dir", str(run.parent), "--task", str(f), *extra)
    lines = cp.stderr.strip().splitlines()
    assert cp.returncode == 2, cp.stderr
    assert lines[-1].startswith("workbench: error: ") and message.format(f=f) in lines[-1], lines[-1]
    assert len([x for x in lines if x.startswith("workbench: error")]) == 1
    assert tree(tmp_path) == before


def test_a_missing_task_file_or_run_says_so(run, tmp_path):
    cp = wb("eval", "r", "--runs-dir", str(run.parent), "--task", str(tmp_path / "nope.jsonl"))
    assert cp.returncode == 2 and f"task {tmp_path / 'nope.jsonl'} does not exist" in cp.stderr
    cp = wb("eval", "r", "--runs-dir", str(run.parent))
    assert cp.returncode == 2 and "give --task" in cp.stderr


def test_eval_help_describes_the_task_file_formats():
    """`eval --help` is where a user looks for what a task file holds: each shape the reader detects, the sidecar,
    and the chat records; kept line for line as written (not re-wrapped into one paragraph)."""
    out = wb("eval", "--help", check=True).stdout
    for shape in ('{"query"|"context"|"question", "choices": [...], "gold"|"label"|"answer": i}',
                  '{"ctx", "endings", "label"}', '"answerKey"', '{"prompt", "answer"}',
                  '{"messages": [..., {"role": "assistant", "content": ANSWER}]}', "qa.jsonl -> qa.toml"):
        assert shape in out, shape
    assert "\ntask files (JSONL, plain, .gz, .zst or .xz; one record a line; the shape from the first):\n" in out
