"""The new-run form's data preview (ctrl+d): the chosen corpus as the trainer will see it, through the real
`workbench data inspect --json` in a subprocess: a conversation's answers (and their end-of-turn token) in bold
green, its prompt not; a text corpus's first documents; a changed request makes the preview stale."""

from __future__ import annotations

from textual.widgets import Input

from tests.support.chat import conversations, write_jsonl
from tests.support.cli import TINY
from tests.support.tui import make_app, run, text_of, wait_for
from workbench.tui.screens.new_run import PREVIEW_HINT


def styled_runs(widget) -> list[tuple[str, str]]:
    """The preview's text split by style: (text, style) for each styled span."""
    t = widget.content   # the rich Text the form gave it
    return [(t.plain[s.start:s.end], str(s.style)) for s in t.spans]


def shown(preview, want: str) -> bool:
    """``want`` is in the preview; an error there ends the wait at once (the assertion after it says)."""
    return want in text_of(preview) or text_of(preview).startswith("preview: ")


def test_the_form_previews_what_the_loss_is_on(runs_dir, tmp_path):
    recs = conversations(200, seed=3)
    corpus = write_jsonl(tmp_path / "chat.jsonl", recs)
    sets = " ".join([*TINY, "model.seq_len=64", "model.vocab_size=400"])

    async def go():
        app = make_app(runs_dir)
        async with app.run_test(size=(160, 48)) as pilot:
            app.action_new_run("cpu-small")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "NewRunScreen", what="the form")
            form = app.screen
            await wait_for(pilot, lambda: bool(form.query("#nr-preview")), what="the form's widgets")
            preview = form.query_one("#nr-preview")
            assert text_of(preview) == PREVIEW_HINT
            form.query_one("#nr-corpus", Input).value = str(corpus)
            form.query_one("#nr-overrides", Input).value = sets
            form.query_one("#nr-corpus", Input).focus()  # typing there: the key still previews (Input has ctrl+d)
            await pilot.pause()
            await pilot.press("ctrl+d")
            await wait_for(pilot, lambda: shown(preview, "--- conversation 2 ---"), timeout=120,
                           what=lambda: f"the preview ({text_of(preview)!r})")
            text = text_of(preview)
            assert "--- conversation 2 ---" in text, text
            assert text.startswith("200 conversations; template chatml (built-in); loss on assistant: "), text
            marked = [s for s, style in styled_runs(preview) if style == "bold green"]
            for rec, got in zip(recs[:2], marked):   # each answer and its end of turn, nothing else
                assert got == rec["messages"][-1]["content"] + "<|im_end|>"
                user = rec["messages"][-2]["content"]
                assert f"<|im_start|>user\n{user}<|im_end|>" in text
            assert len(marked) == 2
            # a changed request: the preview is stale and says how to see it again
            form.query_one("#nr-overrides", Input).value = sets + " train.loss_on=all"
            await wait_for(pilot, lambda: text_of(preview) == PREVIEW_HINT, what="the stale preview cleared")
            await pilot.press("ctrl+d")
            await wait_for(pilot, lambda: shown(preview, "loss on all: 100.0% of tokens"), timeout=120,
                           what=lambda: f"the loss-on-all preview ({text_of(preview)!r})")
            assert "loss on all: 100.0% of tokens" in text_of(preview), text_of(preview)
            # a text corpus with train.loss_on set: refused in the form, as `workbench train` refuses it
            form.query_one("#nr-corpus", Input).value = "builtin"
            await pilot.pause()
            await pilot.press("ctrl+d")
            await wait_for(pilot, lambda: "applies to chat data, but builtin ("
                           in text_of(form.query_one("#nr-error")), what="the refusal")
            # a text corpus: its first documents, nothing marked
            form.query_one("#nr-overrides", Input).value = sets
            await pilot.pause()
            await pilot.press("ctrl+d")
            await wait_for(pilot, lambda: shown(preview, "--- document 2 ---"), timeout=120,
                           what=lambda: f"the text preview ({text_of(preview)!r})")
            assert "--- document 2 ---" in text_of(preview), text_of(preview)
            assert not [s for s, style in styled_runs(preview) if style == "bold green"]
            # a missing corpus: one line in the form (checked before any preview or start; the form stays open)
            form.query_one("#nr-corpus", Input).value = str(tmp_path / "missing.jsonl")
            await pilot.pause()
            await pilot.press("ctrl+d")
            want = (f"corpus '{tmp_path / 'missing.jsonl'}' does not exist; "
                    "give a text file, a directory of text files, or builtin (the built-in corpus)")
            await wait_for(pilot, lambda: text_of(form.query_one("#nr-error")) == want, timeout=60, what="the error")
            await pilot.press("ctrl+s")
            await pilot.pause()
            assert app.screen is form and text_of(form.query_one("#nr-error")) == want
    run(go())


def test_the_form_previews_preference_pairs_with_their_trained_answers(runs_dir, tmp_path):
    """ctrl+d on a file of pairs: each prompt once, then the chosen and the rejected answer, each answer (and its
    end of turn) in bold green, as `data inspect` shows them."""
    recs = [{"prompt": r["messages"][:-1], "chosen": r["messages"][-1]["content"],
             "rejected": r["messages"][-1]["content"] + " no"} for r in conversations(60, seed=3)]
    corpus = write_jsonl(tmp_path / "pairs.jsonl", recs)
    sets = " ".join([*TINY, "model.seq_len=64", "model.vocab_size=400", "train.objective=simpo"])

    async def go():
        app = make_app(runs_dir)
        async with app.run_test(size=(160, 48)) as pilot:
            app.action_new_run("cpu-small")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "NewRunScreen", what="the form")
            form = app.screen
            await wait_for(pilot, lambda: bool(form.query("#nr-preview")), what="the form's widgets")
            preview = form.query_one("#nr-preview")
            form.query_one("#nr-corpus", Input).value = str(corpus)
            form.query_one("#nr-overrides", Input).value = sets
            form.query_one("#nr-corpus", Input).focus()
            await pilot.pause()
            await pilot.press("ctrl+d")
            await wait_for(pilot, lambda: shown(preview, "--- pair 2 ---"), timeout=120,
                           what=lambda: f"the preview ({text_of(preview)!r})")
            text = text_of(preview)
            assert text.startswith("60 pairs; template chatml (built-in)"), text
            marked = [s for s, style in styled_runs(preview) if style == "bold green"]
            for rec, (chosen, rejected) in zip(recs[:2], zip(marked[::2], marked[1::2])):
                assert chosen == rec["chosen"] + "<|im_end|>" and rejected == rec["rejected"] + "<|im_end|>"
                assert f"<|im_start|>user\n{rec['prompt'][-1]['content']}<|im_end|>" in text
            assert len(marked) == 4 and text.count("chosen: ") == 2 and text.count("rejected: ") == 2
    run(go())
