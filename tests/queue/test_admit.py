"""A run is admitted to the queue by the pre-flight `train --detach` runs when the runner starts it
(workbench/plan/preflight.py): a corpus `train` would refuse is refused when the run is added, not hours later."""

from __future__ import annotations

import pytest

from tests.support.cli import tiny, wb

CORPORA = {
    # a JSONL whose records have no data.text_field: refused by its first record (was queued, then failed at start)
    "no_text_field": ('{"body": "hello there"}\n', ()),
    # train.loss_on asked of a text corpus: no turns to mask
    "loss_on_on_text": ("some text to train on\n" * 50, ("train.loss_on=assistant",)),
}


@pytest.mark.parametrize("case", list(CORPORA))
def test_queue_add_refuses_the_corpus_train_would_refuse_with_its_line(case, tmp_path):
    text, sets = CORPORA[case]
    corpus = tmp_path / ("corpus.jsonl" if text.startswith("{") else "corpus.txt")
    corpus.write_text(text)
    runs = tmp_path / "runs"
    args = ["cpu-small", "--runs-dir", str(runs), "--corpus", str(corpus), *tiny("train.max_iters=3", *sets)]
    train = wb("train", *args, "--detach")
    queued = wb("queue", "add", *args)
    forced = wb("queue", "add", *args, "--yes")      # --yes forces the estimate, never a corpus that cannot train
    assert train.returncode == 2 and train.stderr.startswith("workbench: error: "), train.stderr
    for cp in (queued, forced):
        assert cp.returncode == 2, (cp.stdout, cp.stderr)
        assert cp.stderr == train.stderr          # the same one line
    assert not runs.exists() or not any(runs.iterdir())   # nothing queued, no run directory
