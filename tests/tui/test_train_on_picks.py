""""Train on my picks", on a REAL tiny chat-tuned run: in the Sample pane's chat, F9 (beside the A/B keys F5-F8, in
the footer) opens the new-run form for a DPO run from this run's checkpoint A on RUN/preferences.jsonl, the pick count
said in the form; below MIN_PICKS pairs it is refused in one line and no form opens. The form's run starts and trains
on the picks (a real DPO run of a few steps)."""

from __future__ import annotations

import json
import time

import pytest
from textual.widgets import Input, Select

from tests.support.chat import pair_records, write_jsonl
from tests.support.tui import make_app, open_sample_on, run, text_of, wait_for
from workbench.tui.widgets.sample import MIN_PICKS

pytestmark = pytest.mark.slow

# the DPO run the form starts: a few steps (as tests/tui/test_ab_picks.py trains the picks from the CLI)
DPO = ["train.max_iters=3", "train.eval_interval=3", "train.eval_iters=2", "data.val_fraction=0.5",
       "train.batch_size=1", "model.seq_len=256", "train.optimizer=adamw", "train.schedule=cosine",
       "train.warmup_iters=1", "data.tokenizer_sample_mb=0.3", "hardware.compile=false"]


def write_picks(path, n: int) -> None:
    """``n`` pairs as the pane's F5 / F6 write them (prompt, chosen and rejected as messages, the checkpoints)."""
    rows = []
    for r in pair_records(n, seed=2):
        rows.append({"prompt": r["prompt"], "chosen": r["chosen"],
                     "rejected": [{"role": "assistant", "content": r["rejected"]}], "run": "sft",
                     "chosen_checkpoint": "40", "rejected_checkpoint": "20", "time": time.time()})
    write_jsonl(path, rows)


def test_f9_opens_a_dpo_run_on_the_picks_or_says_why_not(chat_sft, tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_PRESETS_DIR", str(tmp_path / "user-presets"))
    prefs = chat_sft / "sft" / "preferences.jsonl"
    write_picks(prefs, 3)
    seen: dict = {}

    async def go():
        app = make_app(chat_sft)
        async with app.run_test(size=(160, 48)) as pilot:
            pane = await open_sample_on(pilot, app, "sft")
            assert pane.chat_mode
            footer = {b.binding.key: b.binding.description for b in app.active_bindings.values()
                      if b.binding.show and b.enabled}
            assert footer.get("f9") == "Train on picks" and {"f5", "f6", "f7", "f8"} <= set(footer), footer
            app.query_one("#smp-ckpt-a", Select).value = "40"
            app.query_one("#smp-message", Input).focus()  # (keys reach the pane from the message box, as F5 does)

            # 3 picks: refused in one line, no form
            await pilot.press("f9")
            await pilot.pause()
            said = [str(n.message) for n in app._notifications]
            assert said and said[-1] == (f"3 picks in sft/preferences.jsonl: a DPO run needs at least {MIN_PICKS} "
                                         "(F5 / F6 on two checkpoints' replies save one each)."), said
            assert app.screen.__class__.__name__ != "NewRunScreen"
            seen["refused"] = said[-1]

            # enough picks: the form for a DPO run from checkpoint A on them
            write_picks(prefs, MIN_PICKS + 2)
            await pilot.press("f9")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "NewRunScreen", what="the form")
            form = app.screen
            assert form.query_one("#nr-init", Input).value == "sft:40"
            assert form.query_one("#nr-corpus", Input).value == str(prefs)
            assert form.query_one("#nr-overrides", Input).value == "train.objective=dpo"
            note = text_of(form.query_one("#nr-note"))
            assert note == f"DPO on your {MIN_PICKS + 2} picks from sft (F5 / F6 in Sample)", note
            await wait_for(pilot, lambda: "recommended" in text_of(form.query_one("#nr-estimate")), timeout=60,
                           what=lambda: f"the estimate: {text_of(form.query_one('#nr-estimate'))!r}")
            seen["form"] = note + "\n" + text_of(form.query_one("#nr-estimate"))
            # start it (with a few steps): a real DPO run on the picks
            form.query_one("#nr-name", Input).value = "picks-dpo"
            form.query_one("#nr-overrides", Input).value = "train.objective=dpo " + " ".join(DPO)
            await pilot.pause(0.5)
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ != "NewRunScreen", timeout=60,
                           what=lambda: f"the form to start the run: {text_of(app.screen.query_one('#nr-error'))!r}")
    run(go())
    print(seen["refused"])
    print(seen["form"])
    status = chat_sft / "picks-dpo" / "status.json"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if status.is_file() and json.loads(status.read_text()).get("state") in ("finished", "failed", "crashed"):
            break
        time.sleep(1)
    st = json.loads(status.read_text())
    log = (chat_sft / "picks-dpo" / "train.log").read_text()
    assert st["state"] == "finished", log[-2000:]
    preset = (chat_sft / "picks-dpo" / "preset.toml").read_text()
    assert 'objective = "dpo"' in preset and 'run = "sft"' in preset and "step = 40" in preset, preset
    print("\n".join(log.splitlines()[:3]))
