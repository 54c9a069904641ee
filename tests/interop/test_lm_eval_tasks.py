"""Task files in HellaSwag's and ARC's real field layouts read as lm-evaluation-harness's own task configs read them
(its shipped hellaswag.yaml and arc_easy.yaml, with their preprocessing, pointed at the same file): the same
context, the same continuations (the target delimiter and each choice) and the same gold, so the log-likelihoods,
whose rule is checked against lm-eval's CLI in test_eval_reference.py, are of the same strings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.data.tasks.task_files import read_task_file

lm_eval = pytest.importorskip("lm_eval")
TASKS = Path(lm_eval.__file__).parent / "tasks"

# Records as the Hugging Face datasets hold them (Rowan/hellaswag's validation split, allenai/ai2_arc): ActivityNet
# and WikiHow contexts (bracketed markers, double spaces, a lower-case ctx_b, an empty one), labels as strings.
HELLASWAG = [
    {"ind": 24, "activity_label": "Roof shingle removal", "ctx_a": "A man is sitting on a roof.", "ctx_b": "he",
     "ctx": "A man is sitting on a roof. he",
     "endings": ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
                 "is holding a rubik's cube.", "starts pulling up roofing on a roof."],
     "source_id": "activitynet~v_-JhWjGDPHMY", "split": "val", "split_type": "indomain", "label": "3"},
    {"ind": 4115, "activity_label": "Home and Garden",
     "ctx_a": "[header] How to make a mason jar lantern [title] Gather your materials. [step] You will need a jar.",
     "ctx_b": "then you", "ctx": "[header] How to make a mason jar lantern [title] Gather your materials. [step] "
     "You will need a jar. then you",
     "endings": ["[substeps] Add  a candle to the jar.", "[title] Light the wick. [step] Close the lid.",
                 "add some wire to the rim of the jar.", "paint the jar [title] Let it dry."],
     "source_id": "wikihow~6797", "split": "val", "split_type": "zeroshot", "label": "2"},
    {"ind": 77, "activity_label": "Playing guitar", "ctx_a": "A Woman Holds A Guitar And Sits On A Chair.",
     "ctx_b": "", "ctx": "A Woman Holds A Guitar And Sits On A Chair. ",
     "endings": [" She tunes the strings.", "She  plays a song.", "she eats.", "[step] She stands up."],
     "source_id": "activitynet~v_x", "split": "val", "split_type": "indomain", "label": "1"},
]
ARC = [
    {"id": "Mercury_7175875", "question": "An astronomer observes that a planet rotates faster after a meteorite "
     "impact. Which is the most likely effect of this increase in rotation?",
     "choices": {"text": ["Planetary density will decrease.", "Planetary years will become longer.",
                          "Planetary days will become shorter.", "Planetary gravity will become stronger."],
                 "label": ["A", "B", "C", "D"]}, "answerKey": "C"},
    {"id": "NYSEDREGENTS_2015_4_7", "question": "Which tool is best for measuring the mass of a rock?",
     "choices": {"text": ["balance", "ruler", "thermometer"], "label": ["1", "2", "3"]}, "answerKey": "1"},
    {"id": "MCAS_2004_9_15", "question": "Which of these is a source of light?",
     "choices": {"text": ["the Moon", "a mirror", "the Sun", "a window", "a lens"],
                 "label": ["A", "B", "C", "D", "E"]}, "answerKey": "C"},
]

# lm-eval's shipped task, its dataset replaced by the local file (its processing, prompt and target kept)
YAML = """\
include: {base}
task: {name}
dataset_path: json
dataset_name: null
dataset_kwargs:
  data_files:
    {split}: {data}
  cache_dir: {cache}
training_split: null
validation_split: {validation}
test_split: {test}
"""

LM_EVAL_REQUESTS = """
import json, sys
from lm_eval.tasks import TaskManager
name = sys.argv[2]
task = TaskManager(include_path=sys.argv[1], include_defaults=False).load([name])["tasks"][name]
out = []
for doc in task.eval_docs:
    reqs = task.construct_requests(doc, task.doc_to_text(doc), metadata=(name, 0, 1))
    out.append({"requests": [list(r.arguments) for r in reqs], "gold": task.doc_to_target(doc)})
print(json.dumps(out))
"""


def lm_eval_requests(tmp_path: Path, base: str, name: str, records: list[dict], split: str) -> list[dict]:
    data = tmp_path / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "tasks").mkdir(exist_ok=True)
    (tmp_path / "tasks" / f"{name}.yaml").write_text(YAML.format(
        base=TASKS / base, name=name, split=split, data=data, cache=tmp_path / "hf-cache",
        validation="validation" if split == "validation" else "null", test="test" if split == "test" else "null"))
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf_home"))
    cp = subprocess.run([sys.executable, "-c", LM_EVAL_REQUESTS, str(tmp_path / "tasks"), name], capture_output=True,
                        text=True, env=env, timeout=300, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, cp.stderr[-3000:]
    return json.loads(cp.stdout.strip().splitlines()[-1])


def ours(path: Path) -> list[dict]:
    task = read_task_file(path)
    return [{"requests": [[it.context, task.delimiter + c] for c in it.choices], "gold": it.gold}
            for it in task.items]


def test_hellaswag_is_read_as_lm_evals_hellaswag_task(tmp_path):
    theirs = lm_eval_requests(tmp_path, "hellaswag/hellaswag.yaml", "wb_hellaswag", HELLASWAG, "validation")
    mine = ours(tmp_path / "wb_hellaswag.jsonl")
    assert mine == theirs
    # what the preprocessing did: the activity label first, ctx_b capitalised, WikiHow's markers out
    assert mine[0]["requests"][0][0] == "Roof shingle removal: A man is sitting on a roof. He"
    assert mine[1]["requests"][0] == ["Home and Garden: How to make a mason jar lantern. Gather your materials. "
                                      "You will need a jar. Then you", "  Add a candle to the jar."]
    task = read_task_file(tmp_path / "wb_hellaswag.jsonl")
    assert (task.shape, task.metric, task.note) == ("HellaSwag", "acc_norm", "")


def test_arc_is_read_as_lm_evals_arc_easy_task(tmp_path):
    theirs = lm_eval_requests(tmp_path, "arc/arc_easy.yaml", "wb_arc", ARC, "test")
    assert ours(tmp_path / "wb_arc.jsonl") == theirs
    assert [t["gold"] for t in theirs] == [2, 0, 2]


def test_a_hellaswag_file_without_its_real_fields_says_how_it_is_scored(tmp_path):
    """Records with ctx alone (lm-eval's task cannot read them): scored on ctx as given, and the output says so."""
    f = tmp_path / "hs.jsonl"
    f.write_text("".join(json.dumps({k: r[k] for k in ("ctx", "endings", "label")}) + "\n" for r in HELLASWAG))
    task = read_task_file(f)
    assert task.shape == "HellaSwag (ctx as given)" and task.items[1].context == HELLASWAG[1]["ctx"]
    assert "scored as given, not as lm-evaluation-harness's hellaswag task preprocesses them" in task.note
