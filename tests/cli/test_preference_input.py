"""Bad preference input through the real CLI: one line naming the file and line (or what is wrong), exit 2, and
no run directory made (nothing the user had touched)."""

from __future__ import annotations

import pytest

from tests.support.chat import write_jsonl
from tests.support.cli import tiny, wb
from tests.support.runs import tree

GOOD = {"prompt": "Sort: 3 1 2", "chosen": "1 2 3", "rejected": "3 2 1"}
CASES = {
    "no rejected": ([GOOD, GOOD, {"prompt": "Sort: 2 1", "chosen": "1 2"}], "dpo", "line 3: no 'rejected' field"),
    "the same answer": ([GOOD, GOOD, {"prompt": "Sort: 2 1", "chosen": "1 2", "rejected": "1 2"}], "dpo",
                        "line 3: chosen and rejected are the same answer"),
    "prompts differ": ([GOOD, {"chosen": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
                               "rejected": [{"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]}],
                       "dpo", "line 2: the chosen and rejected conversations differ before their answers"),
    "label not a boolean": ([{"prompt": "Sort: 2 1", "completion": "1 2", "label": True},
                             {"prompt": "Sort: 2 1", "completion": "2 1", "label": 0}], "kto",
                            "line 2: 'label' is a number (0), not true or false"),
    "pairs with sft": ([GOOD, GOOD], "sft", "which train.objective = sft cannot train on; set train.objective = dpo"),
    "labels with dpo": ([{"prompt": "Sort: 2 1", "completion": "1 2", "label": True}] * 2, "dpo",
                        "train.objective = dpo trains on preference pairs (prompt, chosen, rejected), but"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_preference_input_is_one_line_and_leaves_nothing(trained_run, tmp_path, case):
    records, objective, message = CASES[case]
    corpus = write_jsonl(tmp_path / "prefs.jsonl", records)
    root = trained_run.parent
    before = tree(root)
    cp = wb("train", "cpu-small", "--init-from", trained_run.name, "--name", "bad", "--corpus", str(corpus),
            "--runs-dir", str(root), *tiny(f"train.objective={objective}", "train.max_iters=4"))
    err = cp.stderr.strip()
    assert cp.returncode == 2, (cp.stdout, cp.stderr)
    assert "\n" not in err and message in err, err
    if "line" in message:
        assert str(corpus) in err
    assert tree(root) == before  # no run directory, nothing changed


@pytest.mark.parametrize("detach", [False, True])
def test_an_objective_that_wants_pairs_refuses_text_and_a_model_from_scratch(trained_run, tmp_path, detach):
    root = trained_run.parent
    text = tmp_path / "notes.txt"
    text.write_text("plain text, no preferences here\n" * 50)
    before = tree(root)
    cp = wb("train", "cpu-small", "--init-from", trained_run.name, "--corpus", str(text), "--runs-dir", str(root),
            *(["--detach"] if detach else []), *tiny("train.objective=dpo"))
    assert cp.returncode == 2 and "train.objective = dpo trains on preference pairs" in cp.stderr
    assert "holds text" in cp.stderr
    cp = wb("train", "cpu-small", "--corpus", str(text), "--runs-dir", str(root), *tiny("train.objective=dpo"))
    assert cp.returncode == 2 and "start from a trained model with --init-from RUN" in cp.stderr
    assert tree(root) == before
