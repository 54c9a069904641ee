"""Mixtures end to end: --corpus NAME=PATH:WEIGHT and [[data.mixture]], the refusals (one line, exit 2, nothing
written), the realized mixture's table, a run killed with SIGKILL and resumed drawing the same stream, each source's
val loss in the records and `workbench runs --json`, a changed mixture on resume refused unless --remix."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest

from tests.support.cli import tiny, wb
from tests.support.mixtures import write_two_corpora
from tests.support.runs import losses, read_jsonl
from workbench.config import resolve_preset
from workbench.data.mixture.mixture_plan import apportion
from workbench.data.preset_data import prepare_data

RUN = ["train.max_iters=8", "train.eval_interval=8", "train.ckpt_interval=5", "train.lr_decay_iters=8"]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> Path:
    """Two small text corpora of different look (made-up words; number words), and a preference file."""
    d = tmp_path_factory.mktemp("mix")
    r = write_two_corpora(d)
    (d / "pairs.jsonl").write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n' * 3)
    for topic, answer_words, n in [("cats", "meow purr whiskers tail nap", 300), ("math", "two plus three sum", 120)]:
        with open(d / f"{topic}.jsonl", "w") as f:   # conversations: the topic in the prompt, its words answering
            for i in range(n):
                q = f"tell me about {topic} number {i} " + " ".join(r.choice(["please", "now", "again"])
                                                                     for _ in range(r.randint(1, 5)))
                a = " ".join(r.choice(answer_words.split()) for _ in range(r.randint(3, 25)))
                f.write(json.dumps({"messages": [{"role": "user", "content": q},
                                                 {"role": "assistant", "content": a}]}) + "\n")
    (d / "mix.toml").write_text(f"""name = "mixtest"
[[data.mixture]]
name = "words"
corpus = "{d / 'words.txt'}"
weight = 0.5
[[data.mixture]]
name = "nums"
corpus = "{d / 'nums.txt'}"
weight = 0.5
max_repeat = 2
""")
    return d


def _mix(d: Path, w1: str = "0.7", w2: str = "0.3") -> list[str]:
    return ["--corpus", f"words={d / 'words.txt'}:{w1}", f"nums={d / 'nums.txt'}:{w2}"]


@pytest.mark.parametrize("case", ["missing", "negative", "zero", "not a number", "unnamed", "pairs", "max_repeat",
                                  "chat and text"])
def test_bad_mixtures_are_one_line_exit_2_nothing_written(corpora, tmp_path, case):
    d = corpora
    args = {
        "missing": ("cpu-small", "--corpus", f"words={d / 'words.txt'}:1", f"gone={d / 'gone.txt'}:1"),
        "negative": ("cpu-small", *_mix(d, "1", "-0.5")),
        "zero": ("cpu-small", *_mix(d, "0", "0")),
        "not a number": ("cpu-small", "--corpus", f"words={d / 'words.txt'}:lots"),
        "unnamed": ("cpu-small", "--corpus", f"words={d / 'words.txt'}:1", str(d / "nums.txt")),
        "pairs": ("cpu-small", "--corpus", f"words={d / 'words.txt'}:1", f"prefs={d / 'pairs.jsonl'}:1"),
        "max_repeat": (str(d / "mix.toml"),),
        "chat and text": ("cpu-small", "--corpus", f"cats={d / 'cats.jsonl'}:1", f"words={d / 'words.txt'}:1"),
    }[case]
    want = {
        "missing": "data.mixture source 'gone': corpus", "negative": "the weight -0.5 must be a number >= 0",
        "zero": "every source's weight is 0", "not a number": "the weight 'lots' is not a number",
        "unnamed": "has no name and weight while others do",
        "pairs": "text and conversations may not be mixed with preference pairs (source 'prefs')",
        # 100 steps x 4 rows: 200 sequences of nums, which holds 97 windows of 32 tokens
        "max_repeat": "source 'nums' would be repeated 2.06 times (200 sequences of 32 tokens planned, it holds 97) "
                      "but its max_repeat is 2",
        "chat and text": "source 'cats' holds conversations and 'words' text: a mixture is of text or of "
                         "conversations, not both",
    }[case]
    runs = tmp_path / "runs"
    cp = wb("train", *args, "--runs-dir", str(runs), "--detach", *tiny("train.max_iters=100"))
    assert cp.returncode == 2, cp.stdout + cp.stderr
    err = cp.stderr.strip().splitlines()
    assert len(err) == 1 and want in err[0], cp.stderr
    assert not runs.exists() or not any(runs.iterdir())


def test_one_source_is_that_corpus_as_data_corpus(corpora):
    """A mixture of one source (the other weighs 0 and is not even read) is today's data, draw for draw."""
    d = corpora
    sets = ["model.seq_len=32", "model.vocab_size=512", "train.batch_size=4"]
    plain = resolve_preset("cpu-small", sets + [f"data.corpus='{d / 'words.txt'}'"])
    mixed = resolve_preset("cpu-small", sets, {"data": {"mixture": [
        {"name": "w", "corpus": str(d / "words.txt"), "weight": 1},
        {"name": "off", "corpus": str(d / "no-such-file.txt"), "weight": 0}]}})
    a, b = (prepare_data(p.data, 512, 32, log=lambda m: None) for p in (plain, mixed))
    sa, sb = a.sampler("train", plain, 7), b.sampler("train", mixed, 7)
    for _ in range(5):
        x, y = sa.next_batch(), sb.next_batch()
        assert np.array_equal(x.inputs, y.inputs) and np.array_equal(x.targets, y.targets)


@pytest.fixture(scope="module")
def mixed_runs(corpora, tmp_path_factory) -> Path:
    """The same mixture trained straight, and killed with SIGKILL at step 7 then resumed."""
    root = tmp_path_factory.mktemp("mixruns")
    base = ("train", "cpu-small", *_mix(corpora), "--runs-dir", str(root))
    logs = {name: _rows(root, name) for name in ("straight", "killed")}  # the rows each trained
    for d in logs.values():
        d.mkdir()
    wb(*base, "--name", "straight", *tiny(*RUN), env={"WORKBENCH_TEST_BATCH_LOG": str(logs["straight"])},
       check=True)
    cp = wb(*base, "--name", "killed", *tiny(*RUN), env={"WORKBENCH_TEST_KILL_AT_STEP": "7",
                                                         "WORKBENCH_TEST_BATCH_LOG": str(logs["killed"])})
    assert cp.returncode == -signal.SIGKILL, cp.stderr
    res = wb("resume", "killed", "--runs-dir", str(root), env={"WORKBENCH_TEST_BATCH_LOG": str(logs["killed"])},
             check=True)
    assert "resumed from checkpoint step_0000005" in res.stdout
    return root


def _rows(root: Path, name: str) -> Path:
    """Where run ``name`` of the runs under ``root`` records the rows it trains (beside the runs, not among them)."""
    return root.parent / f"{root.name}-rows-{name}"


def test_killed_and_resumed_mixture_trains_the_same_stream(mixed_runs):
    """The token stream (each step's rows, over the two pieces: steps 6 and 7 trained again after the resume from
    step 5, the same rows) equals the uninterrupted run's, and so do the losses, bitwise."""
    rows = {}
    for name in ("straight", "killed"):
        rows[name] = {}
        for r in read_jsonl(_rows(mixed_runs, name) / "rank0.jsonl"):
            assert rows[name].setdefault(r["step"], r["rows"]) == r["rows"], (name, r["step"])
    assert sorted(rows["straight"]) == list(range(1, 9)) and rows["killed"] == rows["straight"]
    straight, killed = losses(mixed_runs / "straight"), losses(mixed_runs / "killed")
    assert sorted(straight) == list(range(1, 9)) and killed == straight


def test_the_realized_mixture_is_said_before_training(mixed_runs):
    log = (mixed_runs / "straight" / "train.log").read_text()
    n = 8 * 4
    words, nums = apportion([0.7, 0.3], n)
    assert f"mixture over {n} sequences of 32 tokens ({n * 32:,} tokens" in log
    row = next(line for line in log.splitlines() if line.split()[1:3] == ["nums", "0.3"])
    assert row.split()[3:6] == ["30.0%", str(nums), f"{nums * 32:,}"]
    start = next(r for r in read_jsonl(mixed_runs / "straight" / "metrics.jsonl") if r.get("event") == "start")
    facts = start["mixture"]
    assert [s["sequences"] for s in facts["sources"]] == [words, nums] and facts["exact"]


def test_each_source_has_its_val_loss(mixed_runs):
    evals = [r for r in read_jsonl(mixed_runs / "straight" / "metrics.jsonl") if r["kind"] == "eval"]
    assert [e["step"] for e in evals] == [0, 8]
    for e in evals:
        assert set(e["val_sources"]) == {"words", "nums"}
        assert all(np.isfinite(v) and v > 0 for v in e["val_sources"].values())
    assert evals[-1]["val_sources"]["nums"] < evals[0]["val_sources"]["nums"]   # it learns each
    assert "; val by source: words " in (mixed_runs / "straight" / "train.log").read_text()
    out = json.loads(wb("runs", "--json", "--runs-dir", str(mixed_runs), check=True).stdout)
    got = {r["id"]: r["val_sources"] for r in out}
    assert got["straight"] == evals[-1]["val_sources"] and got["killed"] == got["straight"]


def test_a_changed_mixture_on_resume_is_refused_unless_remix(mixed_runs):
    run = mixed_runs / "killed"
    preset = run / "preset.toml"
    preset.write_text(preset.read_text().replace("weight = 0.7", "weight = 0.5"))
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != "lock"}
    cp = wb("resume", "killed", "--more", "2", "--runs-dir", str(mixed_runs))
    assert cp.returncode == 2
    (line,) = cp.stderr.strip().splitlines()
    assert ("was trained on words 0.7, nums 0.3, but the preset now says words 0.5, nums 0.3" in line
            and "--remix" in line)
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != "lock"} == before
    wb("resume", "killed", "--more", "2", "--remix", "--runs-dir", str(mixed_runs), check=True)
    (ev,) = [r for r in read_jsonl(run / "metrics.jsonl") if r.get("event") == "mixture_changed"]
    assert ev["step"] == 8 and ev["before"] == [["words", 0.7], ["nums", 0.3]]
    assert ev["after"] == [["words", 0.5], ["nums", 0.3]]
    assert max(losses(run)) == 10


def test_more_steps_that_would_repeat_a_source_past_its_max_repeat_are_refused_on_resume(mixed_runs, tmp_path):
    """`resume --more` moves the horizon: a source's max_repeat is checked over the steps it goes on to, as `train`
    checks it from the start (one line with the numbers, exit 2, nothing in the run changed)."""
    run = tmp_path / "straight"
    shutil.copytree(mixed_runs / "straight", run)
    preset = run / "preset.toml"   # nums may be read a quarter of a time: 24 of its 97 sequences
    head, nums = preset.read_text().split('name = "nums"')
    preset.write_text(head + 'name = "nums"' + nums.replace("max_repeat = 0.0", "max_repeat = 0.25", 1))
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != "lock"}
    cp = wb("resume", "straight", "--more", "100", "--runs-dir", str(tmp_path))
    assert cp.returncode == 2, (cp.stdout, cp.stderr)
    (line,) = cp.stderr.strip().splitlines()
    assert re.search(r"source 'nums' would be repeated [\d.]+ times \(\d+ sequences of 32 tokens planned, it holds "
                     r"97\) but its max_repeat is 0.25: .*train fewer steps \(train.max_iters\)", line), line
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != "lock"} == before
    wb("resume", "straight", "--more", "2", "--runs-dir", str(tmp_path), check=True)  # within it: goes on
    assert max(losses(run)) == 10


def test_presets_show_and_the_toml_round_trip_keep_a_mixture(corpora):
    from workbench.config import preset_to_toml
    from workbench.config.overrides import parse_toml
    from workbench.config.validate import preset_from_dict
    p = resolve_preset(str(corpora / "mix.toml"))
    again = preset_from_dict(parse_toml(preset_to_toml(p), "x"), "x")
    assert dataclasses.asdict(again.data) == dataclasses.asdict(p.data)
    assert again.data.mixture[1] == {"name": "nums", "corpus": str(corpora / "nums.txt"), "weight": 0.5,
                                     "max_repeat": 2.0}


def test_loss_curves_draw_each_sources_val_loss(mixed_runs):
    """The Loss curves pane's lines (tui.plot.loss_series): a line per source at the evals, dropped with the
    timeline a resume abandons."""
    from workbench.tui.plot import loss_series
    from workbench.tui.rundata import RunData
    recs = read_jsonl(mixed_runs / "straight" / "metrics.jsonl")
    d = RunData("straight")
    d.feed(recs)
    lines = {s.label: s for s in loss_series([d], 80)}
    assert set(lines) == {"train", "val", "val words", "val nums"}
    evals = [r for r in recs if r["kind"] == "eval"]
    assert lines["val nums"].xs == [0.0, 8.0] and lines["val nums"].ys == [e["val_sources"]["nums"] for e in evals]
    assert len({s.marker for s in lines.values()}) == 4
    assert not any("val words" in s.label for s in loss_series([d], 80, show="train"))
    d.feed([{"kind": "event", "event": "resume", "step": 4, "time": 0.0}])
    assert [s for s, _ in d.eval_sources["words"]] == [0]


def test_data_inspect_and_estimate_show_the_realized_mixture(corpora, mixed_runs):
    sets = ["--set", "model.vocab_size=512", "model.seq_len=32", "train.batch_size=4", "train.max_iters=50"]
    words, nums = apportion([0.7, 0.3], 200)
    cp = wb("data", "inspect", f"words={corpora / 'words.txt'}:0.7", f"nums={corpora / 'nums.txt'}:0.3", "-n", "1",
            *sets, check=True)
    assert "for a run of cpu-small (50 steps x 4 x 1 sequences):" in cp.stdout
    assert "--- nums: document 1 " in cp.stdout and "--- words: document 1 " in cp.stdout
    # nums holds 97 windows of 32 tokens: 60 sequences are 0.62 of an epoch
    assert f"  nums       0.3  30.0%         {nums}   1,920          1,920     0.62" in cp.stdout
    est = json.loads(wb("estimate", "cpu-small", *_mix(corpora), *sets, "--no-calibrate", "--json",
                        check=True).stdout)
    assert [(s["name"], s["sequences"]) for s in est["mixture"]["sources"]] == [("words", words), ("nums", nums)]
    assert est["mixture"]["refused"] == []


def test_a_time_budget_plans_the_mixture_for_its_steps_and_follows_its_end(corpora, tmp_path):
    """With --time-budget the mixture is planned for the budget's first guess at its steps (not max_iters', here 3),
    re-planned as the end moves (what was drawn kept), and the run ends with each source's sequences within one of
    the apportionment of the steps it trained (equal to it when the end was foreseen a step before)."""
    root = tmp_path / "runs"
    wb("train", "cpu-small", *_mix(corpora), "--runs-dir", str(root), "--name", "b", "--time-budget", "3s",
       *tiny("train.max_iters=3", "train.ckpt_interval=100000", "train.eval_interval=200"), check=True)
    d = root / "b"
    recs = read_jsonl(d / "metrics.jsonl")
    start = next(r for r in recs if r.get("event") == "start")
    assert start["mixture"]["horizon"] == start["budget_steps"] * 4 != 3 * 4
    last = sorted((d / "checkpoints").glob("step_*"))[-1]
    st = json.loads((last / "trainer_state.json").read_text())["sampler"]
    steps = max(r["step"] for r in recs if r["kind"] == "train")
    n = st["counter"]
    assert n == steps * 4 and sum(st["drawn"]) == n and steps > 3
    assert all(abs(g - w) <= 1 for g, w in zip(st["drawn"], apportion([0.7, 0.3], n))), (st, n)
    assert st["horizons"][-1] >= n    # the plan followed the end: never ran past it (max_iters' plan: 12 sequences)
    log = (d / "train.log").read_text()
    assert "time budget: the mixture planned for its first guess of" in log
    assert f"mixture realized over {n:,} sequences ({steps:,} steps): words {st['drawn'][0]:,}" in log



def test_a_mixture_of_conversations_draws_each_sources_rows_with_their_loss_masks(corpora):
    """Two conversation files mixed 0.6 / 0.4: each row is one source's packed conversations (the prompt's topic
    says which) with only the assistant's tokens as targets, the rows of each source are the apportionment over the
    horizon, and the run's start says the table in rows."""
    from workbench.data.chat.chat_data import ChatData
    from workbench.data.mixture.mixture_data import MixtureData
    from workbench.data.train_data import IGNORE

    d = corpora
    p = resolve_preset("cpu-small", ["model.seq_len=64", "model.vocab_size=300", "train.batch_size=4",
                                     "train.max_iters=6", "train.warmup_iters=1", "data.tokenizer_sample_mb=0.3"],
                       {"data": {"mixture": [{"name": "cats", "corpus": str(d / "cats.jsonl"), "weight": 0.6},
                                             {"name": "math", "corpus": str(d / "math.jsonl"), "weight": 0.4}]}})
    data = prepare_data(p.data, 300, 64, log=lambda m: None, loss_on="assistant")
    assert isinstance(data, MixtureData) and data.format == "chat" and all(isinstance(x, ChatData) for x in data.parts)
    assert data.template is not None and data.parts[0].tokenizer.digest() == data.parts[1].tokenizer.digest()
    sampler = data.sampler("train", p, p.train.seed)
    tok, seen = data.tokenizer, {"cats": 0, "math": 0}
    for _ in range(6):
        b = sampler.next_batch()
        assert b.masked and b.segments is not None
        for x, y in zip(b.inputs, b.targets):
            text = tok.decode([int(i) for i in x if i >= 0])
            topic = "cats" if "about cats" in text else "math"
            assert ("about math" in text) == (topic == "math"), text       # one source a row
            seen[topic] += 1
            trained = tok.decode([int(t) for t in y if t != IGNORE])
            answer = {"cats": "meow purr whiskers tail nap", "math": "two plus three sum"}[topic].split()
            words = trained.replace("<|im_end|>", " ").split()   # answers only (the last maybe cut at seq_len)
            assert words and all(any(a.startswith(w) for a in answer) for w in words), trained
    assert [seen["cats"], seen["math"]] == apportion([0.6, 0.4], 24) == sampler.plan.counts
    # its state is the counter: a sampler set from it after 2 batches draws the same next ones (a resume)
    again = data.sampler("train", p, p.train.seed)
    again.next_batch(), again.next_batch()
    st = again.state()
    back = data.sampler("train", p, p.train.seed)
    back.set_state(st)
    for _ in range(3):
        x, y = again.next_batch(), back.next_batch()
        assert all(np.array_equal(a, b) for a, b in zip((x.inputs, x.targets, x.positions, x.segments),
                                                        (y.inputs, y.targets, y.positions, y.segments)))
    lines = data.start_lines(sampler, p)
    assert lines[0].startswith("chat: each source's conversations packed into rows of 64")
    assert lines[1].startswith("mixture over 24 rows of 64 positions")


def test_a_budget_whose_first_guess_repeats_a_source_past_its_max_repeat_is_refused_before_training(corpora, tmp_path):
    """With a time budget max_iters is not the run's length: max_repeat is checked over the steps the budget buys
    by the estimate (the trainer's first guess too). A minute buys thousands of tiny steps (nums passes its
    max_repeat after ~97): refused, one line with the numbers and the fix, exit 2, nothing written."""
    runs = tmp_path / "runs"
    cp = wb("train", str(corpora / "mix.toml"), "--runs-dir", str(runs), "--time-budget", "1m",
            *tiny("train.max_iters=10"))
    assert cp.returncode == 2, cp.stdout + cp.stderr
    (line,) = cp.stderr.strip().splitlines()
    m = re.search(r"source 'nums' would be repeated ([\d.]+) times \(([\d,]+) sequences of 32 tokens planned for "
                  r"the time budget's first guess of ([\d,]+) steps, it holds 97\) but its max_repeat is 2: .* or "
                  r"give a shorter time budget \(train.time_budget\)", line)
    assert m, line
    steps = int(m.group(3).replace(",", ""))
    assert steps > 100 and int(m.group(2).replace(",", "")) == apportion([0.5, 0.5], steps * 4)[1]
    assert not runs.exists() or not any(runs.iterdir())


def test_a_budget_that_outruns_a_sources_max_repeat_ends_at_the_last_step_within_it(corpora, mixed_runs, tmp_path):
    """The budget's first guess keeps nums within its max_repeat, but the run is faster than estimated (the estimate
    rests on an earlier run of the preset here that measured 250 tokens/s, as one beside a busy machine would): as
    the budget's end moves out the mixture is re-planned, and the run ends, finished, at the last step that keeps
    nums within its max_repeat (0.25: 24 of its 97 sequences), said in train.log, before the budget is spent."""
    root = tmp_path / "runs"
    slow = root / "measured"
    slow.mkdir(parents=True)
    (slow / "preset.toml").write_bytes((mixed_runs / "straight" / "preset.toml").read_bytes())
    recs = read_jsonl(mixed_runs / "straight" / "metrics.jsonl")
    (slow / "metrics.jsonl").write_text("".join(
        json.dumps(dict(r, tokens_per_s=250.0) if r["kind"] == "train" else r) + "\n" for r in recs))
    cp = wb("train", "cpu-small", *_mix(corpora), "--runs-dir", str(root), "--name", "b", "--time-budget", "8s",
            "--yes", *tiny("train.max_iters=3", "train.ckpt_interval=100000", "train.eval_interval=200",
                           "data.mixture.nums.max_repeat=0.25"), check=True)
    d = root / "b"
    recs = read_jsonl(d / "metrics.jsonl")
    start = next(r for r in recs if r.get("event") == "start")
    guess = start["budget_steps"]
    assert "at 250 tokens/s (measured" in cp.stdout and guess * 4 * 0.3 < 24, (guess, cp.stdout)
    st = json.loads((sorted((d / "checkpoints").glob("step_*"))[-1] / "trainer_state.json").read_text())["sampler"]
    steps = max(r["step"] for r in recs if r["kind"] == "train")
    assert steps > guess and st["counter"] == steps * 4
    assert 23 <= st["drawn"][1] <= 24, st              # a step more (1 or 2 of nums) would pass 24
    log = (d / "train.log").read_text()
    assert (f"time budget: the run ends at step {steps}, before the budget's end" in log
            and "a step more would repeat source 'nums' more than its max_repeat 0.25 (it holds 97 sequences" in log)
    status = json.loads((d / "status.json").read_text())
    assert status["state"] == "finished" and status["step"] == steps
