"""Command palette (ctrl+p): every action of the workbench, including per-run ones."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Callable, Iterator

from textual.command import DiscoveryHit, Hit, Hits, Provider

from workbench.rundir import LIVE_STATES
from workbench.tui.messages import ResumeRun
from workbench.tui.screens.import_model import ImportModelScreen
from workbench.tui.widgets.curves import CurvesPane
from workbench.tui.widgets.monitor import MonitorPane
from workbench.tui.widgets.presets import PresetsPane
from workbench.tui.widgets.runs import RunsPane
from workbench.tui.widgets.sample import SamplePane

if TYPE_CHECKING:
    from workbench.tui.app import WorkbenchApp

Command = tuple[str, str, Callable[[], object]]


def _in_curves(app: "WorkbenchApp", action: Callable[[], None]) -> None:
    """Show the Loss curves pane, then change its view."""
    app.action_show_tab("curves")
    action()


def _in_presets(app: "WorkbenchApp", action: Callable[[], None]) -> None:
    """Show the Presets pane, then act in it."""
    app.action_show_tab("presets")
    action()


def _in_runs(app: "WorkbenchApp", runs: RunsPane, run_id: str, action: Callable[[], None]) -> None:
    """Show the Runs pane on ``run_id`` (its report card is where an eval's scores appear), then act."""
    app.action_show_tab("runs")
    runs.select_run(run_id)
    action()


def workbench_commands(app: "WorkbenchApp") -> Iterator[Command]:
    for tab, label in app.TAB_LABELS.items():
        yield f"Go to {label}", f"show the {label} pane", partial(app.action_show_tab, tab)
    if not app.panes_ready:  # the first tenth of a second: the other panes are being made
        return
    # the panes' own actions, as their keys run them (the app queries its panes' screen)
    monitor, runs, curves = app.query_one(MonitorPane), app.query_one(RunsPane), app.query_one(CurvesPane)
    sample, presets = app.query_one(SamplePane), app.query_one(PresetsPane)
    rec = app.recommended[0] if app.recommended else "the recommended preset"
    yield "New run…", "start training a preset (detached: keeps running if the TUI closes)", app.action_new_run
    yield "Import model…", "a local Hugging Face model (Llama, Qwen2, Qwen3) as a run to fine-tune from", \
        partial(app.push_screen, ImportModelScreen(app.runs_dir))
    yield f"Train recommended preset ({rec})", "start a run with the preset picked for this machine", \
        app.action_train_recommended
    followed = app.run_data.get(app.monitored) if app.monitored else None
    if followed is not None and followed.state in LIVE_STATES:  # (an ended run is resumed below, with the others)
        yield f"Stop run {app.monitored}", "SIGTERM the trainer; it saves a checkpoint and exits", monitor.action_stop
    for s in app.summaries:
        yield f"Monitor {s.id}", f"{s.state}, step {s.step}", partial(app.monitor, s.id)
        yield f"Loss curves: add {s.id}", "overlay this run's loss", partial(app.open_curves, s.id)
        yield f"Sample from {s.id}", "generate text from its latest checkpoint", partial(app.open_sample, s.id)
        if s.checkpoints and s.state not in ("starting", "running"):
            yield f"Fine-tune from {s.id}…", "a new run from its latest checkpoint: every weight, or LoRA adapters", \
                partial(runs.post_message, RunsPane.FineTuneRequested(f"{s.id}:{s.checkpoints[-1]['step']}"))
        if s.checkpoints:
            step = str(s.checkpoints[-1]["step"])
            yield f"Evaluate {s.id}…", f"score step {step} on tasks (workbench eval); the report card shows them", \
                partial(_in_runs, app, runs, s.id, partial(runs.open_job, "eval", s.id, step))
            yield f"Export {s.id}…", f"step {step} to a Hugging Face directory, GGUF or safetensors", \
                partial(_in_runs, app, runs, s.id, partial(runs.open_job, "export", s.id, step))
        if s.state not in ("starting", "running"):
            yield f"Resume {s.id} from latest", f"{len(s.checkpoints)} checkpoint(s)", \
                partial(app.post_message, ResumeRun(s.id, "latest"))
            yield f"Delete run {s.id}…", "remove its directory (asks first)", partial(runs.confirm_delete, s.id)
    yield "Loss curves: toggle log scale", "", partial(_in_curves, app, curves.action_toggle_log)
    yield "Loss curves: step / tokens on x", "", partial(_in_curves, app, curves.action_toggle_x)
    yield "Loss curves: cycle smoothing", "EMA 0 / 0.6 / 0.9 / 0.97", \
        partial(_in_curves, app, curves.action_cycle_smoothing)
    yield "Loss curves: train / val / both", "", partial(_in_curves, app, curves.action_cycle_show)
    yield "Loss curves: loss / task scores", "the loss, then each task's score (k)", \
        partial(_in_curves, app, curves.action_cycle_task)
    yield "Generate sample", "run the sampler on the chosen checkpoint(s)", sample.action_generate
    yield "Stop sampling", "", sample.action_cancel
    if sample.chat_run:  # the Sample pane shows a run trained on conversations
        yield "Sample: chat / text", "chat with the run, or sample raw text from it (ctrl+t)", sample.action_toggle_chat
    if sample.chat_mode:
        yield "Reset chat", "start the Sample pane's conversation over (ctrl+r)", sample.action_reset_chat
    yield "Save preset", "atomic; shipped presets are saved as a user copy", partial(presets.save, False)
    yield "Save preset as…", "save the editor's preset under a new name", partial(presets.save, True)
    yield "Add preset to queue", "queue a run of the preset chosen in Presets, as saved (ctrl+l there)", \
        partial(_in_presets, app, presets.action_queue)
    yield "Preset on other GPUs", "fits, batch, tokens/s and time on common GPUs (ctrl+g toggles)", \
        partial(_in_presets, app, presets.action_toggle_gpus)
    yield "Refresh hardware", "", app.action_refresh_hardware
    yield "Refresh runs", "", app.action_refresh_runs


class WorkbenchCommands(Provider):
    # (the ignores below: Provider.app is an App[object] and App is invariant in its return type, ours an App[int])
    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, help_text, callback in workbench_commands(self.app):  # type: ignore[arg-type]
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), callback, text=name, help=help_text or None)

    async def discover(self) -> Hits:
        for name, help_text, callback in workbench_commands(self.app):  # type: ignore[arg-type]
            yield DiscoveryHit(name, callback, text=name, help=help_text or None)
