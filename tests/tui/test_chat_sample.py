"""The Sample pane's chat mode on a REAL tiny chat-tuned run: each message goes to the real `workbench chat`
subprocess (torch in its own process) with the column's whole conversation so far, the reply streams into the
transcript, and it is exactly what the CLI answers for the same conversation (greedy). A/B: each checkpoint
keeps its own replies. A text run keeps text sampling.

The run is the Sample pane's chat tests' ``sft`` (60 steps of a tiny model on generated conversations; trained once
for the session, this module's copy: tests/tui/conftest.py chat_sft), its checkpoints 60 and 30 in columns A and B."""

from __future__ import annotations

import json

import pytest
from textual.widgets import Input, Select

from tests.support.cli import wb
from tests.support.tui import make_app, open_sample_on, run, wait_for

TOKENS = "16"


def shown(app, selector: str) -> bool:
    """Whether the row holding the widget is shown (the pane hides the rows of the mode it is not in)."""
    return bool(app.query_one(selector).parent.display)


def cli_reply(root, checkpoint: str, *args: str, stdin: str | None = None) -> str:
    """What `workbench chat --json` answers (greedy), with the pane's token limit."""
    if stdin is None:
        cp = wb("chat", "sft", "--runs-dir", str(root), "--checkpoint", checkpoint, "--max-new-tokens", TOKENS,
                "--json", *args, check=True)
    else:  # a conversation so far: wb() gives no stdin, so it goes in a file
        path = root.parent / "conversation.json"
        path.write_text(stdin)
        cp = wb("chat", "sft", "--runs-dir", str(root), "--checkpoint", checkpoint, "--max-new-tokens", TOKENS,
                "--json", "--conversation", str(path), *args, check=True)
    return json.loads(cp.stdout)["reply"]


@pytest.mark.slow
def test_chat_mode_answers_as_the_cli_does_and_resets(chat_sft, tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_PRESETS_DIR", str(tmp_path / "user-presets"))
    assert (chat_sft / "sft" / "chat_template.jinja").is_file()
    first, second = "Sort: 3 1 2", "Reverse the words: apple river stone"
    want_a1, want_b1 = cli_reply(chat_sft, "60", "--message", first), cli_reply(chat_sft, "30", "--message", first)
    assert want_a1.strip() and want_a1 != want_b1  # two checkpoints, two answers: a mixed-up column cannot pass

    async def go():
        app = make_app(chat_sft)
        async with app.run_test(size=(160, 48)) as pilot:
            pane = await open_sample_on(pilot, app, "sft")
            # a chat-tuned run opens in chat mode: the chat rows shown, the text prompt hidden, the keys offered
            assert pane.chat_mode
            assert shown(app, "#smp-message") and not shown(app, "#smp-prompt")
            keys = {b.binding.key for b in app.active_bindings.values() if b.enabled}
            assert {"ctrl+r", "ctrl+t"} <= keys
            out_a, out_b = app.query_one("#smp-out-a"), app.query_one("#smp-out-b")
            assert "Type a message" in out_a.text.plain
            app.query_one("#smp-ckpt-a", Select).value = "60"
            app.query_one("#smp-ckpt-b", Select).value = "30"
            app.query_one("#smp-chat-max_new_tokens", Input).value = TOKENS
            app.query_one("#smp-message", Input).focus()

            async def send(text: str) -> None:
                app.query_one("#smp-message", Input).value = text
                await pilot.press("enter")
                await wait_for(pilot, lambda: not pane.chat.replying, timeout=120,
                               what=lambda: f"both replies: {out_a.text.plain!r} {out_b.text.plain!r}")

            await send(first)
            text_a, text_b = out_a.text.plain, out_b.text.plain
            assert "failed" not in text_a + text_b, (text_a, text_b)
            assert f"you> {first}\nmodel> {want_a1}  [" in text_a
            assert f"you> {first}\nmodel> {want_b1}  [" in text_b
            assert "sft @ 60" in str(out_a.border_title) and "sft @ 30" in str(out_b.border_title)
            assert app.query_one("#smp-message", Input).value == ""

            # the second message goes with each column's own conversation: its own first reply
            await send(second)
            for out, ck, first_reply in ((out_a, "60", want_a1), (out_b, "30", want_b1)):
                history = [{"role": "user", "content": first}, {"role": "assistant", "content": first_reply},
                           {"role": "user", "content": second}]
                want = cli_reply(chat_sft, ck, stdin=json.dumps({"messages": history}))
                assert f"you> {second}\nmodel> {want}  [" in out.text.plain, (out.text.plain, want)
                assert pane.chat.conversations[f"#smp-out-{'a' if ck == '60' else 'b'}"] == [
                    *history, {"role": "assistant", "content": want}]

            # ctrl+r: a new conversation (the transcripts cleared, nothing remembered)
            await pilot.press("ctrl+r")
            await pilot.pause()
            assert "you>" not in out_a.text.plain and "you>" not in out_b.text.plain
            assert "Type a message" in out_a.text.plain and pane.chat.conversations == {}
            # and the next message starts from nothing: the CLI's answer to it alone
            await send(first)
            assert f"you> {first}\nmodel> {want_a1}  [" in out_a.text.plain
            assert second not in out_a.text.plain

            # ctrl+t: sample raw text from the chat run instead
            await pilot.press("ctrl+t")
            await pilot.pause()
            assert not pane.chat_mode and shown(app, "#smp-prompt")
            assert not shown(app, "#smp-message")
    run(go())


def test_a_text_run_keeps_text_sampling(runs_dir):
    async def go():
        app = make_app(runs_dir)
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_for(pilot, lambda: len(app.summaries) == 3, what="the run list")
            app.open_sample("alpha")
            await pilot.pause()
            pane = app.query_one("#sample-pane")
            assert not pane.chat_run and not pane.chat_mode
            assert shown(app, "#smp-prompt") and not shown(app, "#smp-message")
            keys = {b.binding.key for b in app.active_bindings.values() if b.enabled}
            assert "ctrl+g" in keys and not {"ctrl+r", "ctrl+t"} & keys
            await pilot.press("ctrl+t")  # no chat mode to switch to
            assert not pane.chat_mode
    run(go())


@pytest.fixture(scope="module")
def young_chat_run(chat_sft_once, tmp_path_factory):
    """A finished chat run (the session's ``sft``), copied into a runs directory without its chat_template.jinja:
    the run as the pane first lists it, before the trainer's start has written the template."""
    import shutil
    root = tmp_path_factory.mktemp("chat-young")
    shutil.copytree(chat_sft_once / "sft", root / "sft")
    template = root / "sft" / "chat_template.jinja"
    return root, template, template.read_bytes()


@pytest.mark.parametrize("seen_by", ["tab", "listing"])
def test_a_run_that_gains_its_template_opens_in_chat_mode(young_chat_run, seen_by):
    """The pane chose the run when it started (its template not written yet); once the run has it, showing the
    Sample tab again, or the next listing of the runs while the tab is shown, opens chat mode, and ctrl+t
    switches to text and back."""
    root, template, text = young_chat_run
    template.unlink(missing_ok=True)

    async def go():
        app = make_app(root)
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_for(pilot, lambda: app.summaries, what="the run list")
            await pilot.press("5")
            pane = app.query_one("#sample-pane")
            await wait_for(pilot, lambda: pane.run_id == "sft", what="run sft chosen")
            assert not pane.chat_mode and shown(app, "#smp-prompt")
            template.write_bytes(text)          # the trainer's start writes it
            if seen_by == "tab":
                await pilot.press("1")
                await pilot.press("5")
            else:
                app.action_refresh_runs()
            await wait_for(pilot, lambda: pane.chat_mode, what="chat mode")
            assert pane.chat_run
            assert shown(app, "#smp-message") and not shown(app, "#smp-prompt")
            await pilot.press("ctrl+t")
            await pilot.pause()
            assert not pane.chat_mode and shown(app, "#smp-prompt")
            await pilot.press("ctrl+t")
            await pilot.pause()
            assert pane.chat_mode
    run(go())


def test_escape_leaves_the_message_box_so_digits_switch_tabs(young_chat_run):
    """In the message box digits are text (a message may hold numbers); escape leaves it (the footer says so),
    and then 1-6 switch tabs again."""
    root, template, text = young_chat_run
    template.write_bytes(text)

    async def go():
        app = make_app(root)
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_for(pilot, lambda: app.summaries, what="the run list")
            await pilot.press("5")
            pane = app.query_one("#sample-pane")
            await wait_for(pilot, lambda: pane.chat_mode, what="chat mode")
            box = app.query_one("#smp-message", Input)
            box.focus()
            await pilot.press("1", "2")
            assert box.value == "12" and app.query_one("#tabs").active == "sample"
            keys = {b.binding.key: b.binding.description for b in app.active_bindings.values() if b.enabled}
            assert keys.get("escape") == "Leave the box", keys
            await pilot.press("escape")
            await pilot.pause()
            assert not box.has_focus
            await pilot.press("1")
            await wait_for(pilot, lambda: app.query_one("#tabs").active == "hardware", what="the Hardware tab")
    run(go())
