"""The new-run form starts a mixture: the corpus field takes `name=PATH:WEIGHT` items (split into sources as the CLI
splits --corpus), the estimate shows each source's share and sequences, ctrl+d the realized mixture's table, and
the run it starts trains on the mixture."""

from __future__ import annotations

import random
import time

from textual.widgets import Input

from tests.support.cli import TINY
from tests.support.runs import read_jsonl
from tests.support.tui import make_app, run, text_of, wait_for
from workbench import rundir
from workbench.data.mixture.mixture_plan import apportion
from workbench.tui.launcher import RunRequest


def _corpora(d):
    r = random.Random(0)
    words = ["".join(r.choice("abcdefghij") for _ in range(r.randint(2, 7))) for _ in range(300)]
    (d / "a b.txt").write_text("\n\n".join(" ".join(r.choice(words) for _ in range(40)) for _ in range(200)))
    (d / "n.txt").write_text("\n\n".join(" ".join(r.choice(["one", "two", "three"]) for _ in range(30))
                                         for _ in range(60)))


def test_the_corpus_field_splits_named_sources_and_keeps_a_plain_path_whole():
    assert RunRequest("p", corpus="web=/d/web.jsonl:0.7 code='/my src/':0.3").corpus_items() == (
        "web=/d/web.jsonl:0.7", "code=/my src/:0.3")
    assert RunRequest("p", corpus="/data/my docs.txt").corpus_items() == ("/data/my docs.txt",)   # spaces kept
    assert RunRequest("p", corpus="C:\\it's.txt").corpus_items() == ("C:\\it's.txt",)           # a lone quote too
    assert RunRequest("p", corpus="").corpus_items() == ()


def test_the_form_starts_a_mixture_and_shows_its_shares_and_table(runs_dir, tmp_path):
    _corpora(tmp_path)
    field = f"big='{tmp_path / 'a b.txt'}':0.75 nums={tmp_path / 'n.txt'}:0.25"
    sets = " ".join([*TINY, "train.max_iters=4", "train.eval_interval=4", "train.lr_decay_iters=4"])
    n = 4 * 4
    big, nums = apportion([0.75, 0.25], n)

    async def go():
        app = make_app(runs_dir)
        async with app.run_test(size=(160, 60)) as pilot:
            app.action_new_run("cpu-small")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "NewRunScreen", what="the form")
            screen = app.screen
            await wait_for(pilot, lambda: screen.query_one("#nr-estimate"), what="the form's fields")
            screen.query_one("#nr-corpus", Input).value = field
            screen.query_one("#nr-overrides", Input).value = sets
            screen.query_one("#nr-name", Input).value = "mixed"
            est = screen.query_one("#nr-estimate")
            await wait_for(pilot, lambda: "mixture (over" in text_of(est), what=lambda: text_of(est))
            assert (f"mixture (over {n} sequences of 32 tokens): big 75.0% ({big}), nums 25.0% ({nums})"
                    in text_of(est)), text_of(est)
            await pilot.press("ctrl+d")   # the preview: the sources prepared, the realized mixture's table
            preview = screen.query_one("#nr-preview")
            await wait_for(pilot, lambda: "repeats" in text_of(preview), timeout=60, what=lambda: text_of(preview))
            table = text_of(preview)
            assert f"mixture over {n} sequences of 32 tokens" in table, table
            row = next(line.split() for line in table.splitlines() if line.startswith("nums"))
            assert row[:3] == ["nums", "25.0%", str(nums)], table
            assert "--- big: document 1 ---" in table
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ != "NewRunScreen", what="the start")
    run(go())
    d = runs_dir / "mixed"
    deadline = time.time() + 120   # the detached trainer, to its end (nothing left running past the test)
    while time.time() < deadline and not (d.exists() and rundir.read_status(d).state in ("finished", "failed")):
        time.sleep(0.1)
    assert rundir.read_status(d).state == "finished", (d / "train.log").read_text()
    recs = read_jsonl(d / "metrics.jsonl")
    # the mixture as two sources: its table in the first lines, a val loss of each
    start = next(r for r in recs if r.get("event") == "start")
    assert [s["sequences"] for s in start["mixture"]["sources"]] == [big, nums]
    last = next(r for r in recs if r.get("kind") == "eval" and r["step"] == 4)
    assert set(last["val_sources"]) == {"big", "nums"}
