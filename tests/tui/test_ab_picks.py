"""Preferences from the Sample pane's A/B chat, on a REAL tiny chat-tuned run: F5 saves A's reply as the better of
the two (a pair in RUN/preferences.jsonl, with both checkpoints), F7 / F8 rate A's reply (a KTO row in
RUN/ratings.jsonl); the transcript says where it went; and `workbench train --init-from RUN --corpus
RUN/preferences.jsonl --set train.objective=dpo` trains on the picks."""

from __future__ import annotations

import json

from textual.widgets import Input, Select

from tests.support.chat import CHAT_SFT
from tests.support.cli import wb
from tests.support.tui import make_app, open_sample_on, run, wait_for


def test_picks_in_the_ab_chat_become_preference_data_a_dpo_run_trains_on(chat_sft, tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_PRESETS_DIR", str(tmp_path / "user-presets"))
    prefs, ratings = chat_sft / "sft" / "preferences.jsonl", chat_sft / "sft" / "ratings.jsonl"
    shown = {}

    async def go():
        app = make_app(chat_sft)
        async with app.run_test(size=(160, 48)) as pilot:
            pane = await open_sample_on(pilot, app, "sft")
            assert pane.chat_mode
            out_a, out_b = app.query_one("#smp-out-a"), app.query_one("#smp-out-b")
            # before any reply there is nothing to judge: said, nothing written
            await pilot.press("f5")
            assert not prefs.exists()
            app.query_one("#smp-ckpt-a", Select).value = "60"
            app.query_one("#smp-ckpt-b", Select).value = "40"
            app.query_one("#smp-chat-max_new_tokens", Input).value = "12"
            messages = ["Sort: 3 1 2", "Reverse the words: apple river stone", "Sort: 9 4 7", "Colour of Ada?",
                        "Sort: 5 2 8 1"]
            for message in messages:  # a pick of an empty reply, or of two equal ones, is refused: go on
                app.query_one("#smp-message", Input).focus()
                app.query_one("#smp-message", Input).value = message
                await pilot.press("enter")
                await wait_for(pilot, lambda: not pane.chat.replying, timeout=120, what="both replies")
                await pilot.press("f5")   # A's reply is the better one (keys reach the pane from the text box)
                await pilot.pause()
                if prefs.exists() and len(prefs.read_text().splitlines()) == 2:
                    break
            await pilot.press("f7")
            await pilot.press("f8")
            await pilot.pause()
            shown["a"], shown["b"] = out_a.text.plain, out_b.text.plain
    run(go())
    print(shown["a"])  # what the pane shows of a pick being saved
    assert "preferred (step 60 over step 40): " in shown["a"] and "(2 pairs)]" in shown["a"]
    assert "rated good: " in shown["a"] and "rated bad: " in shown["a"] and "(2 ratings)" in shown["a"]
    lines = [json.loads(x) for x in prefs.read_text().splitlines()]
    print(json.dumps(lines[0]))
    first = lines[0]
    assert len(lines) == 2 and first["prompt"][-1]["role"] == "user"
    assert first["chosen"][0]["role"] == "assistant" and first["chosen"] != first["rejected"]
    assert first["chosen_checkpoint"] == "60" and first["rejected_checkpoint"] == "40"
    # the second pick's prompt is the conversation A's reply answered (its first turn included)
    assert [m["role"] for m in lines[1]["prompt"]][-3:] == ["user", "assistant", "user"]
    rates = [json.loads(x) for x in ratings.read_text().splitlines()]
    assert [r["label"] for r in rates] == [True, False] and rates[0]["completion"][0]["role"] == "assistant"
    # the picks train a DPO run
    cp = wb("train", "cpu-small", "--init-from", "sft", "--name", "dpo", "--corpus", str(prefs), "--runs-dir",
            str(chat_sft), "--set", *[x for x in CHAT_SFT if not x.startswith("model.")], "model.seq_len=256",
            "train.objective=dpo", "train.max_iters=3", "train.eval_interval=3",
            "data.val_fraction=0.5", "train.batch_size=1")
    assert cp.returncode == 0, cp.stderr
    assert "preference: 2 pairs (1 train)" in cp.stdout and "step 0: train loss 0.6931" in cp.stdout
