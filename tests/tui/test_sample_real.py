"""The Sample pane on a REAL tiny run: the real `workbench sample` subprocesses (torch, in
their own processes) stream text from two checkpoints side by side into the pane.

The run is trained once for the session and copied for each test (``real_runs``, tests/tui/conftest.py: about 20
steps of a tiny model on the built-in corpus; the tokenizer and corpus come from the session's shared cache).
"""

from __future__ import annotations

import pytest
from textual.widgets import Input, Select

from tests.support.cli import wb
from tests.support.tui import make_app, open_sample_on, run, text_of, wait_for

pytestmark = pytest.mark.slow


def test_sample_pane_streams_real_text_from_two_checkpoints(real_runs, tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_PRESETS_DIR", str(tmp_path / "user-presets"))
    prompt_text = "import os"

    def cli(step: str) -> str:
        """What the CLI itself prints for a checkpoint with the pane's settings: the pane must show the same."""
        return wb("sample", "t", "--runs-dir", str(real_runs), "--checkpoint", step, f"--prompt={prompt_text}",
                  "--max-new-tokens", "24", "--temperature", "0.8", "--top-k", "50", "--top-p", "0.95",
                  "--seed", "7", check=True).stdout

    cli_a, cli_b = cli("10"), cli("20")
    assert cli_a != cli_b  # two checkpoints, two texts: a column showing the wrong one cannot pass

    async def go():
        app = make_app(real_runs)
        async with app.run_test(size=(160, 48)) as pilot:
            await open_sample_on(pilot, app, "t")
            a = app.query_one("#smp-ckpt-a", Select)
            b = app.query_one("#smp-ckpt-b", Select)
            labels = [str(p) for p, _v in a._options]
            assert any(lbl.startswith("step 10 (val ") for lbl in labels), labels
            assert any(lbl.startswith("step 20 (val ") for lbl in labels), labels
            a.value, b.value = "10", "20"
            app.query_one("#smp-prompt", Input).value = prompt_text
            app.query_one("#smp-max_new_tokens", Input).value = "24"
            app.query_one("#smp-seed", Input).value = "7"
            out_a, out_b = app.query_one("#smp-out-a"), app.query_one("#smp-out-b")
            pieces = {"a": 0, "b": 0}
            for key, out in (("a", out_a), ("b", out_b)):  # count the streamed pieces
                orig = out.append

                def counting(chunk, style="", _orig=orig, _key=key):
                    pieces[_key] += 1
                    return _orig(chunk, style)

                out.append = counting
            app.query_one("#smp-prompt", Input).focus()
            await pilot.press("enter")

            def done(out):
                return "s]" in out.text.plain.splitlines()[-1] or "sampler failed" in out.text.plain

            await wait_for(pilot, lambda: done(out_a) and done(out_b), timeout=120,
                           what=f"both samplers to finish: {getattr(out_a, 'text', '')!r} "
                                f"{getattr(out_b, 'text', '')!r}")
            text_a, text_b = out_a.text.plain, out_b.text.plain
            assert "sampler failed" not in text_a + text_b, (text_a, text_b)
            assert "t @ 10" in str(out_a.border_title) and "t @ 20" in str(out_b.border_title)
            for text in (text_a, text_b):
                assert text.startswith(prompt_text) and not text.startswith(prompt_text * 2), text
                generated = text[len(prompt_text):].rsplit("[", 1)[0].strip()
                assert len(generated) >= 10, text  # real text came out of the model
            # each column exactly what the CLI prints for its checkpoint (prompt once, then the tokens), then
            # the time taken
            assert text_a.rsplit("\n[", 1)[0].rstrip("\n") == cli_a.rstrip("\n")
            assert text_b.rsplit("\n[", 1)[0].rstrip("\n") == cli_b.rstrip("\n")
            # streamed as it came (each column: its pieces plus the closing note); how many pieces
            # depends on the machine's load (a CI run read each column's 24 tokens in one piece), so only
            # "more than one" is certain
            assert pieces["a"] >= 2 and pieces["b"] >= 2, pieces
            # the samples the trainer wrote at its evals
            app.query_one("#smp-trainer").collapsed = False
            await pilot.pause()
            trainer = text_of(app.query_one("#smp-trainer-text"))
            assert "step 10" in trainer and "step 20" in trainer and "import" in trainer
    run(go())


def test_the_pane_and_the_cli_sample_a_checkpoint_alike_by_default(real_runs, tmp_path, monkeypatch):
    """One set of sampling defaults (plan.sampling): `workbench sample` given only the checkpoint and the prompt,
    and the Sample pane with its boxes as they open, give the same tokens (the pane had top-p 0.95 and seed 1337,
    the CLI neither: the same checkpoint sampled two ways)."""
    from workbench.plan.sampling import TEXT
    monkeypatch.setenv("WORKBENCH_PRESETS_DIR", str(tmp_path / "user-presets"))
    prompt_text = "def "
    cli = wb("sample", "t", "--runs-dir", str(real_runs), "--checkpoint", "20", f"--prompt={prompt_text}",
             check=True).stdout

    async def go():
        app = make_app(real_runs)
        async with app.run_test(size=(160, 48)) as pilot:
            await open_sample_on(pilot, app, "t")
            boxes = {k: app.query_one(f"#smp-{k}", Input).value
                     for k in ("temperature", "top_k", "top_p", "max_new_tokens", "seed")}
            assert boxes == {"temperature": f"{TEXT.temperature:g}", "top_k": str(TEXT.top_k),
                             "top_p": f"{TEXT.top_p:g}", "max_new_tokens": str(TEXT.max_new_tokens),
                             "seed": str(TEXT.seed)}
            app.query_one("#smp-ckpt-a", Select).value = "20"
            assert app.query_one("#smp-prompt", Input).value == prompt_text  # the box's own default prompt
            app.query_one("#smp-prompt", Input).focus()
            await pilot.press("enter")
            out = app.query_one("#smp-out-a")
            await wait_for(pilot, lambda: "s]" in out.text.plain.splitlines()[-1] or "failed" in out.text.plain,
                           timeout=120, what=lambda: f"the sampler to finish: {out.text.plain!r}")
            shown = out.text.plain.rsplit("\n[", 1)[0].rstrip("\n")
            assert "failed" not in out.text.plain and len(shown) > len(prompt_text) + 20, out.text.plain
            assert shown == cli.rstrip("\n")
    run(go())
