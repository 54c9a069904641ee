"""workbench eval's scores against independent implementations, on a real trained run exported with
`workbench export --format hf`: transformers for every choice's log-likelihood, greedy answers and text loss,
and lm-evaluation-harness (run as its own CLI, on a task YAML written here) for accuracy."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.support.cli import FACTS, wb
from workbench.data.tasks.builtin_tasks import cloze_task, next_line_task
from workbench.data.tasks.task_files import ChoiceItem, GenItem, Task, load_task, task_options
from workbench.data.text.tokenizer import load_tokenizer
from workbench.train.checkpoint import load_run_model
from workbench.train.task_eval import choice_requests, continuation_logprobs, score_task, text_bpb


@pytest.fixture(scope="module")
def exported(trained_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "model"
    wb("export", str(trained_run), str(out), "--format", "hf", check=True)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    return out, model, AutoTokenizer.from_pretrained(out)


@pytest.fixture(scope="module")
def ours(trained_run):
    loaded = load_run_model(trained_run, "latest")
    return loaded.model.eval(), load_tokenizer(trained_run)


def mixed_task() -> Task:
    """36 four-way items: contexts cropped to 12, 60 and 400 characters (the model's context is 32 tokens, so
    the long ones are cut from the left), from both built-in tasks (no delimiter, and a space)."""
    items = []
    for k, it in enumerate(next_line_task().items[:12] + cloze_task().items[:24]):
        items.append(ChoiceItem(it.context[-(12, 60, 400)[k % 3]:], it.choices, it.gold, k + 1))
    return Task("mixed", "mc", "test", tuple(items), metric="acc", delimiter=" ")


def reference_ll(model, hf_tok, context: str, continuation: str, max_len: int) -> float:
    """lm-evaluation-harness's rule, written out here on transformers and its tokenizer (a continuation longer
    than the window, which lm-eval refuses, is scored on the tokens that fit, as workbench does)."""
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    whole = hf_tok.encode(context + continuation, add_special_tokens=False)
    ctx = hf_tok.encode(context, add_special_tokens=False)
    cont = whole[len(ctx):]
    full = (ctx + cont)[-(max_len + 1):]
    with torch.no_grad():
        logp = model(torch.tensor([full[:-1]])).logits[0].float().log_softmax(-1)
    cont = cont[-(len(full) - 1):]
    start = len(full) - 1 - len(cont)
    return sum(logp[start + i, t].item() for i, t in enumerate(cont))


def test_every_choice_log_likelihood_equals_transformers(exported, ours):
    _, hf_model, hf_tok = exported
    model, tok = ours
    task = mixed_task()
    L = model.cfg.seq_len
    got, want = [], []
    for it in task.items:
        reqs = choice_requests(it, task, lambda text, line: tok.encode(text), tok.eod_id)
        got += continuation_logprobs(model, reqs, torch.device("cpu"), torch.autocast("cpu", enabled=False))
        want += [reference_ll(hf_model, hf_tok, it.context, " " + c, L) for c in it.choices]
    assert len(got) == len(want) == 144
    assert any(len(it.context) > 100 for it in task.items)  # some contexts were cropped
    f64 = torch.float64
    torch.testing.assert_close(torch.tensor(got, dtype=f64), torch.tensor(want, dtype=f64), atol=1e-4, rtol=0)


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_gold_and_normalisation_read_right_in_every_shape(exported, ours, tmp_path):
    """The gold of each item is set to the reference's own argmax, so a right scorer scores exactly 1.0: a
    gold read from the wrong field, an off-by-one, or length normalisation on the wrong sum scores less."""
    _, hf_model, hf_tok = exported
    model, tok = ours
    L = model.cfg.seq_len
    items = mixed_task().items
    lls = [[reference_ll(hf_model, hf_tok, it.context, " " + c, L) for c in it.choices] for it in items]
    by_sum = [max(range(4), key=lambda j: (ll[j], -j)) for ll in lls]
    by_char = [max(range(4), key=lambda j: (ll[j] / len(it.choices[j]), -j)) for ll, it in zip(lls, items)]
    assert sum(a != b for a, b in zip(by_sum, by_char)) >= 3  # the two metrics pick differently on some items
    for gold, metric in ((by_sum, "acc"), (by_char, "acc_norm")):
        decoy = [(g + 1) % 4 for g in gold]  # a field that is not the gold
        shapes = {
            "plain": [{"query": it.context, "choices": list(it.choices), "gold": g, "label": d}
                      for it, g, d in zip(items, gold, decoy)],
            "hellaswag": [{"ctx": it.context, "endings": list(it.choices), "label": str(g), "gold": d}
                          for it, g, d in zip(items, gold, decoy)],
            "arc": [{"question": "", "choices": {"text": list(it.choices), "label": list("ABCD")},
                     "answerKey": "ABCD"[g], "label": d} for it, g, d in zip(items, gold, decoy)],
            "mapped": [{"q": it.context, "options": list(it.choices), "idx": g, "gold": d}
                       for it, g, d in zip(items, gold, decoy)],
        }
        for shape, rows in shapes.items():
            f = _write(tmp_path / f"{shape}-{metric}.jsonl", rows)
            if shape == "arc":  # ARC's own prompt: a different context, so only the gold reading is checked
                continue
            extra = ["--set", "context_field=q", "choices_field=options", "gold_field=idx"] if shape == "mapped" else []
            task = load_task(str(f), task_options(extra[1:]))
            sc = score_task(model, tok, task, torch.device("cpu"))
            assert sc.values[metric] == 1.0, (shape, metric, sc.values)
        arc = load_task(str(tmp_path / f"arc-{metric}.jsonl"))
        assert [it.gold for it in arc.items] == gold and arc.items[0].context.startswith("Question: ")


def test_greedy_answers_equal_transformers_generate(facts_run, tmp_path):
    """A model that knows twelve facts by heart: its answers, cut at the first newline, are transformers'
    greedy ones token for token; exact match and "contains" follow from them."""
    out = tmp_path / "hf"
    wb("export", str(facts_run), str(out), "--format", "hf", check=True)
    hf_model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    hf_tok = AutoTokenizer.from_pretrained(out)
    model, tok = load_run_model(facts_run, "latest").model.eval(), load_tokenizer(facts_run)
    items, expected, theirs = [], [], []
    for k, (q, word) in enumerate(FACTS):
        ids = hf_tok.encode(q, add_special_tokens=False)
        gen = hf_model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False,
                                attention_mask=torch.ones(1, len(ids), dtype=torch.long), pad_token_id=0)
        theirs.append(hf_tok.decode(gen[0, len(ids):].tolist()).split("\n")[0])
        answer, want = ((f" {word}. ", (1, 1)), (word, (0, 1)), (FACTS[(k + 1) % len(FACTS)][1] + ".", (0, 0)))[k % 3]
        items.append(GenItem(q, (answer,), k + 1))
        expected.append(want)
    task = Task("facts", "gen", "test", tuple(items), until=("\n",), max_new_tokens=8)
    sc = score_task(model, tok, task, torch.device("cpu"))
    assert [r["output"] for r in sc.per_item] == theirs
    assert theirs == [f" {w}." for _, w in FACTS]  # it knows them all
    assert [(int(r["exact"]), int(r["contains"])) for r in sc.per_item] == expected
    assert sc.values == {"exact": 4 / 12, "contains": 8 / 12}


def test_text_loss_and_bits_per_byte_equal_transformers(exported, ours):
    _, hf_model, hf_tok = exported
    model, tok = ours
    docs = [it.context for it in cloze_task().items[:6]]
    bpb, loss, n = text_bpb(model, tok, docs, torch.device("cpu"), max_windows=5, batch_size=2)
    ids = []
    for d in docs:
        ids += tok.encode(d) + [tok.eod_id]
    L = model.cfg.seq_len
    nats = count = 0.0
    for w in range(5):
        window = ids[w * L: w * L + L + 1]
        if len(window) < 2:
            break
        with torch.no_grad():
            logits = hf_model(torch.tensor([window[:-1]])).logits[0].float()
        nats += torch.nn.functional.cross_entropy(logits, torch.tensor(window[1:]), reduction="sum").item()
        count += len(window) - 1
    assert n == count == 5 * L
    assert loss == pytest.approx(nats / count, abs=1e-5)
    # bits per byte: transformers' nats in bits, over the UTF-8 bytes of the text the scored tokens stand for (their
    # text by transformers' tokenizer: what the first 5 L + 1 tokens decode to, less what the first one does)
    text = hf_tok.decode(ids[:5 * L + 1], skip_special_tokens=True)
    first = hf_tok.decode(ids[:1], skip_special_tokens=True)
    assert text.startswith(first) and text in "".join(docs)
    nbytes = len(text.encode("utf-8")) - len(first.encode("utf-8"))
    assert nbytes > count  # more than one byte a token
    assert bpb == pytest.approx(nats / math.log(2) / nbytes, rel=1e-5), (bpb, nats / math.log(2) / nbytes)


# ----------------------------------------------------------------------------- lm-evaluation-harness

TASK_YAML = """\
task: wb_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{query}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{gold}}}}"
target_delimiter: " "
metric_list:
  - metric: acc
  - metric: acc_norm
"""


def test_lm_evaluation_harness_scores_the_same(exported, trained_run, tmp_path):
    """lm-eval's own CLI on the exported model and a local task: the same accuracy (summed and per character)
    as `workbench eval` on the same records, and each choice's log-likelihood within 1e-4."""
    out_dir, _, hf_tok = exported
    task = mixed_task()
    L = load_run_model(trained_run, "latest", shapes_only=True).preset.model.seq_len
    fits = [it for it in task.items  # lm-eval refuses a continuation longer than the window
            if all(len(hf_tok.encode(" " + c, add_special_tokens=False)) < L for c in it.choices)]
    task = Task("fits", "mc", "test", tuple(fits[:30]), metric="acc", delimiter=" ")
    data = _write(tmp_path / "wb_mc.jsonl", [{"query": it.context, "choices": list(it.choices), "gold": it.gold}
                                             for it in task.items])
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "wb_mc.yaml").write_text(TASK_YAML.format(data=data))
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf_home"),
               TOKENIZERS_PARALLELISM="false")
    eod = load_tokenizer(trained_run).eod_id  # our export names no BOS; lm-eval's prefix for an empty context
    cp = subprocess.run([sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
                         f"pretrained={out_dir},dtype=float32,prefix_token_id={eod}", "--device", "cpu",
                         "--tasks", "wb_mc", "--include_path", str(tmp_path / "tasks"), "--batch_size", "8",
                         "--output_path", str(tmp_path / "out"), "--log_samples"],
                        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, cp.stderr[-3000:]
    result = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())["results"]["wb_mc"]
    samples = [json.loads(line) for line in next((tmp_path / "out").rglob("samples_wb_mc_*.jsonl")).open()]

    mine = wb("eval", str(trained_run), "--task", str(data), "--json", "--no-save", check=True)
    scored = json.loads(mine.stdout)["checkpoints"][0]["tasks"][0]
    assert scored["n"] == len(samples) == len(task.items) >= 20
    assert scored["acc"] == pytest.approx(result["acc,none"], abs=1e-9)
    assert scored["acc_norm"] == pytest.approx(result["acc_norm,none"], abs=1e-9)
    model, tok = load_run_model(trained_run, "latest").model.eval(), load_tokenizer(trained_run)
    for s in sorted(samples, key=lambda s: s["doc_id"]):
        it = task.items[s["doc_id"]]
        reqs = choice_requests(it, task, lambda text, line: tok.encode(text), tok.eod_id)
        ll = continuation_logprobs(model, reqs, torch.device("cpu"), torch.autocast("cpu", enabled=False))
        theirs = [r[0][0] if isinstance(r[0], list) else r[0] for r in s["filtered_resps"]]
        assert all(math.isclose(a, float(b), abs_tol=1e-4) for a, b in zip(ll, theirs)), (ll, theirs)
