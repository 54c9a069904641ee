"""The Sample pane's text half: a prompt and the sampling settings (their defaults the one definition's,
``plan.sampling.TEXT``, as ``workbench sample`` has them), and each column the prompt's continuation from its
checkpoint: one ``workbench sample`` a column, streamed in with its echo of the prompt left out."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Input, Label

from workbench.plan.sampling import TEXT, Sampling
from workbench.tui import launcher
from workbench.tui.widgets.sample_output import Column, Reader, SampleOutput, setting_name

if TYPE_CHECKING:
    from pathlib import Path

# (setting, its label, how the box's text is read)
SETTINGS = (("temperature", "temp", float), ("top_k", "top-k", int), ("top_p", "top-p", float),
            ("max_new_tokens", "tokens", int), ("seed", "seed", int))


class TextControls(Vertical):
    """The prompt and the settings (rows shown in text mode)."""

    DEFAULT_CSS = "TextControls { height: auto; }"

    def compose(self) -> ComposeResult:
        with Horizontal(classes="sample-row smp-text"):
            yield Input("def ", placeholder="prompt", id="smp-prompt")
            yield Button("Generate", id="smp-go", variant="primary")
        with Horizontal(classes="sample-row smp-text", id="smp-params"):
            for key, label, _cast in SETTINGS:
                yield Label(label, classes="param-label")
                yield Input(f"{getattr(TEXT, key):g}", id=f"smp-{key}", classes="param", type="number")

    def settings(self) -> Sampling:
        """The settings in the boxes, checked: ValueError with a clear message for a bad one."""
        values: dict = {}
        for key, _label, cast in SETTINGS:
            raw = self.query_one(f"#smp-{key}", Input).value.strip()
            try:
                values[key] = cast(raw)
            except ValueError:
                raise ValueError(f"{setting_name(key)} must be {'an integer' if cast is int else 'a number'}, "
                                 f"not {raw!r}") from None
        return Sampling(**values).check(setting_name)

    @property
    def prompt(self) -> str:
        return self.query_one("#smp-prompt", Input).value

    def start(self, runs_dir: Path, run: str, columns: list[Column], sampling: Sampling,
              stream: Callable[[list[str], Reader], object]) -> None:
        """Each column's continuation of the prompt: its sampler started through ``stream`` (a worker)."""
        prompt, s = self.prompt, sampling
        for col in columns:
            col.out.reset(f"{run} @ {col.shown}  T={s.temperature} k={s.top_k} p={s.top_p} seed={s.seed}", prompt)
            stream(launcher.sample_argv(runs_dir, run, col.checkpoint, prompt, s), Continuation(col.out, prompt))


class Continuation:
    """A column's sampler output (a :class:`Reader`): the text after the prompt, then the time it took."""

    def __init__(self, out: SampleOutput, prompt: str):
        self.out, self.echo = out, launcher.PromptEcho(prompt)

    def unstarted(self, error: OSError) -> None:
        self.out.append(f"\n[could not start the sampler: {error}]", "bold red")

    def text(self, chunk: str) -> None:
        if (chunk := self.echo.strip(chunk)):
            self.out.append(chunk)

    def ended(self, rc: int, err: str, cancelled: bool, seconds: float) -> None:
        if rc != 0 and not cancelled:
            self.out.append(f"\n[sampler failed: {err or f'exit status {rc}'}]", "bold red")
        else:
            self.out.finish(f"[{seconds:.1f}s]")
