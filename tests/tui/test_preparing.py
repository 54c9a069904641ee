"""A run that is still preparing its corpus shows that, with a progress bar, in the Train pane."""

from __future__ import annotations

import json

from textual.widgets import ProgressBar

from tests.support.tui import make_app, run, text_of, wait_for


def test_train_pane_shows_corpus_preparation_then_training(live_runs_dir):
    status_path = live_runs_dir / "delta" / "status.json"
    st = json.loads(status_path.read_text())
    st.update(state="starting", preparing={"phase": "encoding", "fraction": 0.42, "done_bytes": 420 * 2**20,
                                           "total_bytes": 1000 * 2**20, "mb_per_s": 5.1, "eta_s": 114.0})
    status_path.write_text(json.dumps(st))

    async def go():
        app = make_app(live_runs_dir)
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_for(pilot, lambda: app.monitored == "delta", what="the live run")
            await wait_for(pilot, lambda: "preparing the corpus" in text_of(app.query_one("#mon-progress-text")),
                           what="the preparation")
            text = text_of(app.query_one("#mon-progress-text"))
            assert "encoding 420 MiB of 1000 MiB (42%), 5.1 MB/s, ETA 1m 54s" in text, text
            assert app.query_one("#mon-progress", ProgressBar).percentage == 0.42
            # the trainer finishes preparing and trains: the bar follows the steps again
            status_path.write_text(json.dumps(dict(st, state="running", preparing=None)))
            await wait_for(pilot, lambda: "step 120 / 400" in text_of(app.query_one("#mon-progress-text")),
                           what="training progress")
            assert app.query_one("#mon-progress", ProgressBar).percentage == 0.3
    run(go())
