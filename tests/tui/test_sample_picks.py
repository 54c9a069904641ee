"""Which reply a pick in the Sample pane's A/B chat saves as the better one (issue 54's break 1), on a REAL tiny
chat-tuned run with two checkpoints: F6 ("B better") saves column B's reply as chosen and A's as rejected, each
with the checkpoint that gave it; F5 the other way round. A pick saved the wrong way round trains DPO toward the
worse reply, and nothing else would show it. (The transcript's line, F7/F8's ratings and training on the picks:
tests/tui/test_ab_picks.py.)"""

from __future__ import annotations

import json

from textual.widgets import Input, Select

from tests.support.tui import make_app, open_sample_on, run, wait_for

MESSAGES = ["Sort: 3 1 2", "Reverse the words: apple river stone", "Sort: 9 4 7", "Colour of Ada?", "Sort: 5 2 8 1",
            "Reverse the words: stone maple", "Sort: 6 3"]


def last_reply(pane, column: str) -> str:
    history = pane.chat.conversations[f"#smp-out-{column}"]
    assert history[-1]["role"] == "assistant"
    return history[-1]["content"]


def test_f6_saves_bs_reply_as_the_better_one_and_f5_as_the_worse(chat_sft, tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_PRESETS_DIR", str(tmp_path / "user-presets"))
    prefs = chat_sft / "sft" / "preferences.jsonl"
    shown: list[tuple[str, str, str]] = []   # (key, A's reply, B's reply) for each pick saved

    async def go():
        app = make_app(chat_sft)
        async with app.run_test(size=(160, 48)) as pilot:
            pane = await open_sample_on(pilot, app, "sft")
            assert pane.chat_mode
            app.query_one("#smp-ckpt-a", Select).value = "60"
            app.query_one("#smp-ckpt-b", Select).value = "40"
            app.query_one("#smp-chat-max_new_tokens", Input).value = "12"
            messages = iter(MESSAGES)
            for key in ("f6", "f5"):
                # a pick of an empty reply, or of two equal ones, is refused (nothing written): the next message
                while len(shown) < (1 if key == "f6" else 2):
                    box = app.query_one("#smp-message", Input)
                    box.focus()
                    box.value = next(messages)
                    await pilot.press("enter")
                    await wait_for(pilot, lambda: not pane.chat.replying, timeout=120, what="both replies")
                    before = len(prefs.read_text().splitlines()) if prefs.exists() else 0
                    await pilot.press(key)   # the keys reach the pane from the text box
                    await pilot.pause()
                    if prefs.exists() and len(prefs.read_text().splitlines()) == before + 1:
                        shown.append((key, last_reply(pane, "a"), last_reply(pane, "b")))
    run(go())
    picks = [json.loads(x) for x in prefs.read_text().splitlines()]
    assert [k for k, _, _ in shown] == ["f6", "f5"] and len(picks) == 2
    (_, a6, b6), (_, a5, b5) = shown
    f6, f5 = picks
    # F6: B's reply (checkpoint 40) is the better one
    assert f6["chosen"] == [{"role": "assistant", "content": b6}], (f6, a6, b6)
    assert f6["rejected"] == [{"role": "assistant", "content": a6}]
    assert (f6["chosen_checkpoint"], f6["rejected_checkpoint"]) == ("40", "60")
    assert f6["prompt"][-1]["role"] == "user"
    # F5: A's reply (checkpoint 60)
    assert f5["chosen"] == [{"role": "assistant", "content": a5}]
    assert f5["rejected"] == [{"role": "assistant", "content": b5}]
    assert (f5["chosen_checkpoint"], f5["rejected_checkpoint"]) == ("60", "40")
