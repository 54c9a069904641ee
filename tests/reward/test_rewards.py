"""The rewards alone (workbench/reward, torch-free): each built-in on hand-computed cases, a user's reward file (its
digest, its record), every way a reward fails as one line naming the prompt and the completion, the prompts file's
readers, which pairs a prompt's samples make, the pairs file continued and refused, and pass@k against its closed
form."""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import subprocess
import sys
import time
from math import comb
from pathlib import Path

import pytest

from workbench.reward import (
    Prompt,
    RewardError,
    meta_path,
    open_pairs,
    parse_reward,
    pass_at_k,
    prompt_pairs,
    read_prompts,
    summarize,
)

REC = {"prompt": "Capital of France?", "answer": "Paris"}


def score(spec: str, completion: str, record: dict | None = None, prompt: str = "p") -> float:
    return parse_reward(spec).score(prompt, completion, record if record is not None else REC)


# ----------------------------------------------------------------------------- built-ins, by hand

@pytest.mark.parametrize("spec,completion,record,want", [
    ("exact", " Paris\nand more text", REC, 1.0),                   # the first line, stripped
    ("exact", "Paris is the capital", REC, 0.0),
    ("exact:answer", "\n  Paris  \n", REC, 1.0),                    # leading blank lines are not the answer line
    ("exact:city", "Lyon", {"prompt": "x", "city": ["Paris", "Lyon"]}, 1.0),   # a list: any of them
    ("exact:n", "42", {"prompt": "x", "n": 42}, 1.0),                # a number compared as its text
    ("exact", "", REC, 0.0),
    ("regex:^\\d+$", "123", REC, 1.0),
    ("regex:^\\d+$", "12a", REC, 0.0),
    ("regex:P.r", "in Paris", REC, 1.0),                             # search, not a whole match
    ("contains:Paris", "it is Paris.", REC, 1.0),
    ("contains:Paris", "it is paris.", REC, 0.0),                    # case-sensitive
    ("contains:a:b", "x a:b y", REC, 1.0),                           # the text may hold a colon
    ("length:10", "x" * 10, REC, 1.0),
    ("length:10", "x" * 7, REC, 0.7),                                # 1 - 3/10
    ("length:10", "x" * 14, REC, 0.6),                               # 1 - 4/10
    ("length:10", "x" * 25, REC, 0.0),                               # clipped at 0
    ("length:10", "", REC, 0.0),
])
def test_builtin_scores(spec, completion, record, want):
    assert score(spec, completion, record) == pytest.approx(want)


def test_lexicon_is_positive_minus_negative_words_over_words(tmp_path):
    pos = tmp_path / "pos.txt"
    neg = tmp_path / "neg.txt"
    pos.write_text("# good words\ngood\nGreat\n\nlove\n")
    neg.write_text("bad\nawful\n")
    both = f"lexicon:{pos},{neg}"
    # 7 words (a, good, day, great, food, bad, weather): 2 positive, 1 negative -> (2 - 1) / 7
    assert score(both, "A good day, GREAT food; bad weather.") == pytest.approx(1 / 7)
    assert score(both, "awful awful") == pytest.approx(-1.0)
    assert score(both, "...") == 0.0                                  # no words
    assert score(f"lexicon:{pos}", "bad love") == pytest.approx(0.5)  # no negative list: 1 of 2
    r = parse_reward(both)
    want = hashlib.sha256(hashlib.sha256(pos.read_bytes()).digest() + hashlib.sha256(neg.read_bytes()).digest())
    assert r.sha256 == want.hexdigest() and r.describe()["name"] == both
    neg.write_text("bad\n")
    assert parse_reward(both).sha256 != r.sha256                      # another list, another digest


@pytest.mark.parametrize("spec,message", [
    ("nope", "'nope' is neither a built-in (exact, regex, contains, length, lexicon) nor FILE.py:FUNCTION"),
    ("check.py", "name the function too: check.py:FUNCTION"),
    ("regex:(", "--reward regex:(: not a regular expression"),
    ("regex:", "needs a pattern"),
    ("contains:", "needs the text"),
    ("length:0", "at least 1"),
    ("length:ten", "a whole number of characters"),
    ("lexicon:", "takes one or two word lists"),
    ("lexicon:/nonexistent/pos.txt", "cannot read the positive word list /nonexistent/pos.txt"),
])
def test_a_bad_spec_is_one_line(spec, message):
    with pytest.raises(RewardError) as e:
        parse_reward(spec)
    assert message in str(e.value) and "\n" not in str(e.value)


# ----------------------------------------------------------------------------- the user's own function

USER = '''
import math, time
def score(prompt, completion, record):
    return len(completion) / 10 + (1.0 if completion.strip() == record.get("answer") else 0.0)
def right(prompt, completion, record):
    return completion == "yes"
def boom(prompt, completion, record):
    return 1 / 0
def nan(prompt, completion, record):
    return math.nan
def inf(prompt, completion, record):
    return -math.inf
def word(prompt, completion, record):
    return "great"
def none(prompt, completion, record):
    return None
def slow(prompt, completion, record):
    try:
        time.sleep(30)
    except Exception:   # a broad except does not swallow the time limit
        return 1.0
'''


@pytest.fixture()
def user_file(tmp_path) -> Path:
    f = tmp_path / "my_reward.py"
    f.write_text(USER)
    return f


def test_a_user_function_gets_prompt_completion_and_record_and_its_digest_is_kept(user_file):
    r = parse_reward(f"{user_file}:score")
    assert r.score("q", "Paris", REC) == pytest.approx(1.5)
    assert r.score("q", "Lyon", REC) == pytest.approx(0.4)
    assert r.sha256 == hashlib.sha256(user_file.read_bytes()).hexdigest()
    assert r.describe() == {"name": f"{user_file}:score", "kind": "file", "sha256": r.sha256, "timeout_s": 5.0}
    assert r.short == "my_reward.py:score"
    assert parse_reward(f"{user_file}:right").score("q", "yes", REC) == 1.0   # a bool counts as 1 / 0


@pytest.mark.parametrize("name,what", [
    ("boom", "raised ZeroDivisionError: division by zero"),
    ("nan", "returned nan, not a finite number"),
    ("inf", "returned -inf, not a finite number"),
    ("word", "returned \"'great'\" (str), not a number"),
    ("none", "returned 'None' (NoneType), not a number"),
])
def test_a_failing_reward_is_one_line_naming_prompt_and_completion(user_file, name, what):
    r = parse_reward(f"{user_file}:{name}")
    long_completion = "A very long completion " * 10
    with pytest.raises(RewardError) as e:
        r.score("Capital of France?", long_completion, REC)
    msg = str(e.value)
    assert msg.startswith(f"reward my_reward.py:{name} {what} on prompt 'Capital of France?' and completion "
                          "'A very long completion A very long compl…'"), msg
    assert "\n" not in msg


def test_a_slow_reward_is_stopped_at_its_time_limit(user_file):
    r = parse_reward(f"{user_file}:slow", timeout_s=0.2)
    t0 = time.monotonic()
    with pytest.raises(RewardError, match=r"reward my_reward.py:slow took longer than 0.2 s \(--reward-timeout\) on "
                                          r"prompt 'q' and completion 'c'"):
        r.score("q", "c", REC)
    assert time.monotonic() - t0 < 5
    assert parse_reward(f"{user_file}:score", timeout_s=0.2).score("q", "abc", REC) == pytest.approx(0.3)  # timer off


@pytest.mark.parametrize("spec,message", [
    ("{dir}/missing.py:score", "reward file {dir}/missing.py does not exist"),
    ("{file}:absent", "reward file {file} has no 'absent' (it defines boom, inf, nan, none, right, score, slow, word)"),
    ("{file}:not-a-name", "'not-a-name' is not a Python function name"),
    ("{bad}:f", "loading {bad} raised ZeroDivisionError: division by zero; fix the file"),
])
def test_a_reward_file_that_cannot_be_used_is_one_line(user_file, spec, message):
    bad = user_file.with_name("bad.py")
    bad.write_text("x = 1 / 0\n")
    fmt = {"dir": user_file.parent, "file": user_file, "bad": bad}
    with pytest.raises(RewardError) as e:
        parse_reward(spec.format(**fmt))
    assert message.format(**fmt) in str(e.value) and "\n" not in str(e.value)


def test_a_non_positive_time_limit_is_refused():
    with pytest.raises(RewardError, match="--reward-timeout must be a positive number"):
        parse_reward("exact", timeout_s=0)


def test_exact_refuses_a_record_without_its_field_before_anything_runs():
    r = parse_reward("exact")
    with pytest.raises(RewardError, match="prompts file p.txt, line 2: --reward exact compares with the record's "
                                          "'answer' field, which this record lacks"):
        r.check_record({"prompt": "x"}, "prompts file p.txt, line 2")
    parse_reward("contains:x").check_record({"prompt": "x"}, "w")   # the others need no field


def test_the_reward_package_imports_no_torch():
    code = "import sys, workbench.reward; assert 'torch' not in sys.modules and 'textual' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ----------------------------------------------------------------------------- prompts files

def test_prompts_from_jsonl_text_and_compressed_text(tmp_path):
    j = tmp_path / "p.jsonl"
    j.write_text(json.dumps({"prompt": "a", "answer": "1", "system": "be brief"}) + "\n\n" +
                 json.dumps({"prompt": "b", "answer": "2"}) + "\n")
    got = read_prompts(j)
    assert [(p.text, p.record.get("answer"), p.system) for p in got.items] == [("a", "1", "be brief"), ("b", "2", None)]
    assert got.items[1].where == f"prompts file {j}, line 3"
    assert got.sha256 == hashlib.sha256(j.read_bytes()).hexdigest()
    t = tmp_path / "p.txt.gz"
    with gzip.open(t, "wt") as f:
        f.write("first prompt\n\n   \nsecond prompt  \n")
    assert [(p.text, p.record) for p in read_prompts(t).items] == [
        ("first prompt", {"prompt": "first prompt"}), ("second prompt  ", {"prompt": "second prompt  "})]
    assert [p.text for p in read_prompts(j, limit=1).items] == ["a"]


@pytest.mark.parametrize("content,name,message", [
    (None, "gone.jsonl", "prompts file {path} does not exist"),
    ("", "empty.jsonl", "prompts file {path} has no prompts"),
    ("\n   \n", "blank.txt", "prompts file {path} has no prompts"),
    ('{"prompt": "a"}\n{"prompt": "b"\n', "bad.jsonl", "prompts file {path}, line 2: not valid JSON"),
    ('{"prompt": "a"}\n{"text": "b"}\n', "noprompt.jsonl", "prompts file {path}, line 2: no 'prompt' field (the "
                                                           "record has 'text')"),
    ('{"prompt": 3}\n', "num.jsonl", "prompts file {path}, line 1: 'prompt' is a number, not a string"),
    ('[{"prompt": "a"}]\n', "array.jsonl", "prompts file {path} is one JSON array, not JSON lines"),
])
def test_a_bad_prompts_file_is_one_line(tmp_path, content, name, message):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(RewardError) as e:
        read_prompts(path)
    assert message.format(path=path) in str(e.value) and "\n" not in str(e.value)


# ----------------------------------------------------------------------------- pairs

def test_every_two_samples_with_different_rewards_make_a_pair_the_higher_chosen():
    p = Prompt("Q", {"prompt": "Q", "system": "S"}, "w")
    got = prompt_pairs(p, ["a", "b", "c", "d"], [1.0, 0.0, 1.0, 0.5])
    # C(4, 2) = 6 pairs of samples, one of them (a, c) tied: 5
    assert [(r["chosen"], r["rejected"], r["chosen_reward"], r["rejected_reward"]) for r in got.records] == [
        ("a", "b", 1.0, 0.0), ("a", "d", 1.0, 0.5), ("c", "b", 1.0, 0.0), ("d", "b", 0.5, 0.0), ("c", "d", 1.0, 0.5)]
    assert all(r["prompt"] == "Q" and r["system"] == "S" for r in got.records) and got.skipped == 0
    assert len(prompt_pairs(p, list("abcd"), [0.1, 0.2, 0.3, 0.4]).records) == 6   # all different: all 6 pairs
    assert prompt_pairs(p, list("abcd"), [1.0] * 4).records == []                   # no signal, no pair
    # the preference reader refuses an empty answer and two equal ones: left out, counted (a reward that is not a
    # function of the text scored "same" 1 and 0: (0, 1) left out, (0, 2) and (1, 2) have an empty answer)
    odd = prompt_pairs(p, ["same", "same", "  ", "x"], [1.0, 0.0, 0.5, 0.5])
    assert [(r["chosen"], r["rejected"]) for r in odd.records] == [("same", "x"), ("x", "same")]
    assert odd.skipped == 3


SETTINGS = {"run": "r", "samples": 4, "sampling": {"seed": 1}}


def _prompt(i: int) -> Prompt:
    return Prompt(f"q{i}", {"prompt": f"q{i}"}, f"line {i}")


def test_a_pairs_file_is_continued_where_its_sidecar_says_and_refused_otherwise(tmp_path):
    out = tmp_path / "pairs.jsonl"
    pf = open_pairs(out, SETTINGS, total=3)
    assert (pf.done, out.exists(), meta_path(out).exists()) == (0, False, False)   # nothing made before a prompt
    pf.add(prompt_pairs(_prompt(0), ["a", "b"], [1.0, 0.0]), [1.0, 0.0])
    pf.add(prompt_pairs(_prompt(1), ["c", "d"], [0.5, 0.5]), [0.5, 0.5])
    good = out.read_bytes()
    meta = json.loads(meta_path(out).read_text())
    assert (meta["done"], meta["pairs"], meta["no_signal"], meta["bytes"], meta["complete"]) == (2, 1, 1, len(good),
                                                                                                 False)
    assert meta["mean_reward"] == pytest.approx(0.5)
    with out.open("ab") as f:      # the third prompt's pairs half written when the run was killed
        f.write(b'{"prompt": "q2", "cho')
    again = open_pairs(out, SETTINGS, total=3)
    assert (again.done, again.pairs, out.read_bytes()) == (2, 1, good)
    again.add(prompt_pairs(_prompt(2), ["e", "f"], [0.0, 1.0]), [0.0, 1.0])
    assert again.complete and [json.loads(x)["chosen"] for x in out.read_text().splitlines()] == ["a", "f"]

    with pytest.raises(RewardError) as e:
        open_pairs(out, dict(SETTINGS, samples=8), total=3)
    assert str(e.value) == (f"{out} was made with other settings (samples: 4 then, 8 now); run the same command to "
                            f"continue it, or delete {out} and pairs.jsonl.meta.json (or give another --out) to "
                            "start over")
    with pytest.raises(RewardError, match=r"sampling.seed: 1 then, 2 now"):
        open_pairs(out, dict(SETTINGS, sampling={"seed": 2}), total=3)
    theirs = tmp_path / "theirs.jsonl"
    theirs.write_text("mine\n")
    with pytest.raises(RewardError, match="theirs.jsonl exists and was not written by `workbench pairs`"):
        open_pairs(theirs, SETTINGS, total=3)
    assert theirs.read_text() == "mine\n"
    out.write_bytes(good[:10])
    with pytest.raises(RewardError, match="is shorter than pairs.jsonl.meta.json says"):
        open_pairs(out, SETTINGS, total=3)


# ----------------------------------------------------------------------------- pass@k

def test_pass_at_k_is_the_unbiased_estimator_of_chen_et_al():
    for n, c, k in [(5, 2, 2), (10, 3, 1), (10, 3, 5), (10, 0, 3), (4, 4, 4), (20, 7, 10)]:
        closed = 1 - comb(n - c, k) / comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(closed, abs=1e-12), (n, c, k)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)            # by hand: 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)           # pass@1 is the share that passes
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_a_summary_of_rewards_by_hand():
    rewards = [[1.0, 0.0, 0.0, 1.0, 0.0], [0.0] * 5, [1.0, 1.0, 0.5, 1.0, 1.0]]
    s = summarize(rewards, k=2)
    flat = [x for r in rewards for x in r]
    mean = sum(flat) / 15
    assert s.mean == pytest.approx(mean) and s.sd == pytest.approx(math.sqrt(sum((x - mean) ** 2 for x in flat) / 15))
    # passes (reward >= 1): 2, 0 and 4 of 5
    assert s.pass_at_1 == pytest.approx((2 / 5 + 0 + 4 / 5) / 3)
    assert s.pass_at_k == pytest.approx(((1 - 3 / 10) + 0 + 1) / 3)
    assert s.no_signal == 1 and s.to_dict()["pass@2"] == s.pass_at_k
    assert summarize(rewards, k=1, threshold=0.5).pass_at_1 == pytest.approx((2 / 5 + 0 + 1) / 3)
    with pytest.raises(RewardError, match="--pass-k 6 needs at least as many samples"):
        summarize(rewards, k=6)
