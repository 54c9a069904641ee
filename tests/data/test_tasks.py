"""Task files read into items (every accepted shape, compressed, mapped), and the built-in tasks: fixed, and
made only of documents no built-in corpus trains on."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import wb
from tests.support.files import zst_open
from workbench.data.corpus.documents import Stats, builtin_documents, builtin_pieces
from workbench.data.corpus.sources import builtin_source
from workbench.data.tasks.builtin_tasks import BUILTIN_TASKS, builtin_task
from workbench.data.tasks.task_files import ChoiceItem, GenItem, load_task, read_task_file, task_options

ITEMS = [("The sky is", ["blue", "green", "loud"], 0), ("Two and two make", ["three", "four"], 1)]


def _write(path: Path, rows: list[dict], opener=open) -> Path:
    with opener(path, "wt", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    return path


SHAPES = {
    "plain": ([{"query": c, "choices": ch, "gold": g} for c, ch, g in ITEMS], "multiple choice", "acc"),
    "context_label": ([{"context": c, "choices": ch, "label": str(g)} for c, ch, g in ITEMS], "multiple choice", "acc"),
    "hellaswag": ([{"ctx": c, "endings": ch, "label": g, "activity_label": "x"} for c, ch, g in ITEMS],
                  "HellaSwag (ctx as given)", "acc_norm"),
}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("compression", ["", ".gz", ".zst"])
def test_every_multiple_choice_shape_reads_the_same_items(tmp_path, shape, compression):
    rows, name, metric = SHAPES[shape]
    opener = {"": open, ".gz": gzip.open, ".zst": zst_open}[compression]
    task = read_task_file(_write(tmp_path / f"t.jsonl{compression}", rows, opener))
    assert task.kind == "mc" and task.shape == name and task.metric == metric and task.name == "t"
    assert [(it.context, list(it.choices), it.gold) for it in task.items] == ITEMS
    assert task.chance == pytest.approx((1 / 3 + 1 / 2) / 2)


def test_arc_asks_as_lm_eval_does_and_maps_letter_keys(tmp_path):
    rows = [{"question": "Which is a color?", "choices": {"text": ["dog", "red", "run"], "label": ["A", "B", "C"]},
             "answerKey": "B"}]
    task = read_task_file(_write(tmp_path / "arc.jsonl", rows))
    assert task.items == (ChoiceItem("Question: Which is a color?\nAnswer:", ("dog", "red", "run"), 1, 1),)


def test_fields_are_mapped_by_a_sidecar_or_set_with_set_winning(tmp_path):
    rows = [{"q": "Pick one", "opts": ["a", "b"], "idx": 1, "gold": 0}]
    f = _write(tmp_path / "odd.jsonl", rows)
    (tmp_path / "odd.toml").write_text('name = "odd-task"\ncontext_field = "q"\nchoices_field = "opts"\n'
                                       'gold_field = "gold"\nmetric = "acc_norm"\n')
    task = read_task_file(f)
    assert (task.name, task.metric, task.items[0].gold) == ("odd-task", "acc_norm", 0)
    task = load_task(str(f), task_options(["gold_field=idx", "delimiter=''"]))
    assert (task.items[0].gold, task.delimiter, task.name) == (1, "", "odd-task")


def test_prompt_answer_records_are_exact_match(tmp_path):
    rows = [{"prompt": "2+2=", "answer": "4"}, {"prompt": "capital of France:", "answer": ["Paris", "paris"]}]
    (tmp_path / "qa.toml").write_text('until = ["\\n", "."]\nmax_new_tokens = 5\n')
    task = read_task_file(_write(tmp_path / "qa.jsonl", rows))
    assert task.kind == "gen" and task.metrics == ("exact", "contains")
    assert task.items[1] == GenItem("capital of France:", ("Paris", "paris"), 2)
    assert task.until == ("\n", ".") and task.max_new_tokens == 5


def test_limit_reads_only_the_first_items(tmp_path):
    rows = [{"query": f"q{i}", "choices": ["a", "b"], "gold": i % 2} for i in range(50)]
    assert len(read_task_file(_write(tmp_path / "t.jsonl", rows), limit=7).items) == 7


def test_builtin_tasks_are_fixed_and_sized():
    # made again in a fresh interpreter with another hash seed: the same items and options, so scores of two runs
    # (or of one before and after a restart) are comparable (builtin_task is cached: within a process it is one object)
    code = ("import json; from workbench.data.tasks.builtin_tasks import BUILTIN_TASKS, builtin_task; "
            "print(json.dumps({n: builtin_task(n).digest for n in BUILTIN_TASKS}))")
    cp = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONHASHSEED="12345"),
                        capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(cp.stdout) == {n: builtin_task(n).digest for n in BUILTIN_TASKS}
    for name in BUILTIN_TASKS:
        a = builtin_task(name)
        assert len(a.items) == 400 and all(len(it.choices) == 4 for it in a.items)
        assert all(it.choices.count(it.choices[it.gold]) == 1 for it in a.items)
        golds = [it.gold for it in a.items]
        assert min(golds.count(g) for g in range(4)) > 60  # the right answer is not always in one place


def test_each_built_in_task_reports_the_metric_the_readme_gives_and_eval_lists_them():
    """stdlib-next-line by per-character likelihood (its lines differ in length), docs-cloze by the summed one."""
    assert {n: builtin_task(n).metric for n in BUILTIN_TASKS} == {"stdlib-next-line": "acc_norm", "docs-cloze": "acc"}
    cp = wb("eval", "--list-tasks", check=True)
    assert cp.stdout.splitlines() == [
        "stdlib-next-line   400 items, acc_norm: the next line of held-out standard-library code, of 4",
        "docs-cloze         400 items, acc: the next word of held-out Python documentation, of 4",
        "builtin            all of the above"]


def test_no_built_in_corpus_holds_a_held_out_document():
    held = list(builtin_documents(held_out=True))
    assert sum(k == "doc" for k, _, _ in held) >= 5 and sum(k == "code" for k, _, _ in held) >= 10
    corpus = "".join(text for text, _ in builtin_pieces(builtin_source(1000), Stats()))  # the whole corpus
    for kind, name, text in held:
        probe = text[:300] if kind == "doc" else f"# file: {name}\n"
        assert probe not in corpus, name
    # decontaminated: no item's question with its answer occurs in the text a built-in corpus trains on (held-out
    # topics repeat others; some modules share code: 44 of the items came back when that check was off)
    seen = [(t.name, it.line) for t in map(builtin_task, BUILTIN_TASKS) for it in t.items
            if it.context[-100:] + t.delimiter + it.choices[it.gold] in corpus]
    assert seen == []
