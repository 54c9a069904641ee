"""Presets pane: shipped and user presets, a TOML editor validated as you type, the estimate, and
(ctrl+g, in place of the editor) the preset on other GPUs: ``workbench estimate PRESET --compare``.

The pane saves presets itself (atomically; a shipped preset as a user copy); "train with it" asks
the app to open the new-run form, "add to queue" (ctrl+l) to queue a run of it, as saved, and ctrl+f the sweep
form on it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Group, JustifyMethod
from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.timer import Timer
from textual.widgets import OptionList, Static, TextArea
from textual.widgets.option_list import Option

from workbench.analysis.history import previous_run
from workbench.analysis.summary import RunSummary
from workbench.config import (
    Preset,
    PresetError,
    check_preset_name,
    preset_paths,
    shipped_presets_dir,
    user_presets_dir,
    validate_preset_text,
    with_name,
    write_user_preset,
)
from workbench.errors import WorkbenchError
from workbench.machine.detect import Machine, detect
from workbench.plan.compare import compare
from workbench.plan.fit.flops import count_params
from workbench.plan.fit.memory import estimate_memory
from workbench.plan.report import EstimateReport, History, build_report
from workbench.tui import display
from workbench.tui.screens.dialogs import NameScreen
from workbench.tui.widgets.pane import Pane


def estimate_table(p: Preset, machine_info: dict | None = None, history: History | None = None) -> Table:
    """The estimate box: on the hardware the app shows (``machine_info``; None: detected now), with the
    tokens/s a previous run of the preset measured (``history``, as `workbench estimate` finds it) and the
    time to max_iters `workbench estimate` gives (evaluations included)."""
    t = Table.grid(padding=(0, 1))
    t.add_column(style="dim")
    t.add_column()
    t.add_row("params", f"{display.si(count_params(p.model))} (estimate)")
    t.add_row("tokens/step", f"{p.tokens_per_step():,}")
    try:
        machine = Machine.from_info(machine_info or detect())
        memory = f"{display.human_bytes(estimate_memory(p, machine=machine).total)} (estimate)"
        r: EstimateReport | None = build_report(p, machine, history=history)
    except WorkbenchError as e:  # e.g. a device this machine does not have
        memory, r = str(e), None
    t.add_row("total tokens", total_tokens(p, r))
    t.add_row("memory", memory)
    if p.hardware.expected_memory_gb:
        t.add_row("sized for", f"{p.hardware.expected_memory_gb:g} GB")
    if r and r.tokens_per_s and r.time:
        prev = r.previous_run
        t.add_row("tokens/s", f"{display.si(r.tokens_per_s)} "
                              + (f"(measured, {prev['run']})" if prev else "(estimate)"))
        t.add_row("time", f"{display.duration(r.time.total_s)} (evals included)")
    t.add_row("other GPUs", "ctrl+g")
    return t


def total_tokens(p: Preset, report: EstimateReport | None) -> str:
    """The tokens a run of ``p`` trains on: its steps' (max_iters), or with a time budget the steps the estimate
    fits in it (``report``: build_report's, whose time the box shows too; None: no estimate) — max_iters is then
    only a first guess, which this line showed."""
    if not p.train.time_budget:
        return display.si(p.tokens_per_step() * p.train.max_iters)
    steps = report.time.steps if report and report.time else None
    if not steps:
        return f"what {p.train.time_budget} trains (speed not known here)"
    return f"{display.si(p.tokens_per_step() * int(steps))} (estimate: ~{int(steps):,} steps in {p.train.time_budget})"


def gpu_table(result: dict) -> Group:
    """``compare``'s rows as the pane shows them: narrow enough for 80 columns beside the list."""
    t = Table(box=None, padding=(0, 1), pad_edge=False, show_edge=False, header_style="bold")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("GPU", "left"), ("memory", "right"), ("fits", "left"), ("batch", "right"), ("tok/s", "right"),
        ("time", "right"), ("energy", "right"))
    for col, just in columns:
        t.add_column(col, justify=just, no_wrap=True)
    for r in result["rows"]:
        fits = Text("yes", style="green") if r["fits"] else Text("no", style="red")
        t.add_row(r["gpu"].removeprefix("Apple "), f"{r['estimate'] / 2**30:.1f}/{r['available'] / 2**30:.0f}G", fits,
                  f"{r['batch_size']}x{r['grad_accum']}" if r["fit_batch"] else "—", display.si(r["tokens_per_s"]),
                  display.duration(r["time_s"]), "—" if r["kwh"] is None else f"{r['kwh']:.2g} kWh")
    head = Text.assemble((f"{result['preset']} on other GPUs", "bold"),
                         (f"  ({result['params'] / 1e6:.0f} M params, {result['tokens'] / 1e6:,.0f} M tokens; "
                          "estimates)", "dim"))
    foot = Text("memory: estimate / usable GiB; fits: within 90 %; batch: what `fit` would choose; MFU measured on "
                "an H100 and scaled by model size. Prices and details: `workbench estimate "
                f"{result['preset']} --compare`. ctrl+g: back to the editor", style="dim")
    return Group(head, t, foot)


class PresetsPane(Horizontal, Pane):
    MAIN_WIDGET = "#preset-list"
    BINDINGS = [
        Binding("ctrl+s", "save", "Save"),
        Binding("ctrl+o", "save_as", "Save as…"),
        Binding("ctrl+t", "train", "Train with it"),
        Binding("ctrl+r", "revert", "Revert", show=False),
        Binding("ctrl+g", "toggle_gpus", "Other GPUs"),
        Binding("ctrl+l", "queue", "Queue"),   # (the new-run form's "Add to queue" key too)
        Binding("ctrl+f", "sweep", "Sweep"),   # (the editor keeps ctrl+w, ctrl+e... for itself)
    ]

    @dataclass
    class TrainRequested(Message):
        """Open the new-run form on this preset (None: the recommended one)."""
        preset: str | None

    @dataclass
    class QueueRequested(Message):
        """Queue a run of this preset (``workbench queue add PRESET``; the Queue tab's ``a`` asks the same)."""
        preset: str

    @dataclass
    class SweepRequested(Message):
        """Open the sweep form on this preset (``workbench sweep PRESET --set-grid ...``; the Queue tab's ``s``)."""
        preset: str

    @dataclass
    class GpusCompared(Message):
        """The preset named ``preset`` was estimated on the GPU table's common GPUs (``plan.compare``)."""
        preset: str
        result: dict

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.current: str | None = None
        self.buffers: dict[str, str] = {}  # unsaved edits per preset, kept while switching
        self.paths: dict[str, tuple[Path, str]] = {}
        self.valid: Preset | None = None
        self._measured: dict[str, dict | None] = {}  # what earlier runs measured, per preset and device
        self._check_timer: Timer | None = None
        self.showing_gpus = False  # the other-GPUs view in place of the editor (ctrl+g)

    def compose(self) -> ComposeResult:
        with Vertical(id="preset-side"):
            yield OptionList(id="preset-list")
            yield Static("", id="preset-estimate")
        with Vertical(id="preset-main"):
            # plain text here; TOML highlighting is switched on in on_mount when it is available
            yield TextArea("", id="preset-editor", show_line_numbers=True, soft_wrap=False,
                           tab_behavior="indent")
            with VerticalScroll(id="preset-gpus"):
                yield Static("", id="preset-gpus-table")
            yield Static("", id="preset-status")

    def on_mount(self) -> None:
        self._use_toml_highlighting()
        self.query_one("#preset-list", OptionList).border_title = "presets"
        self.query_one("#preset-estimate", Static).border_title = "estimate"
        gpus = self.query_one("#preset-gpus", VerticalScroll)
        gpus.border_title = "this preset on other GPUs"
        gpus.display = False
        self.reload()

    def _use_toml_highlighting(self) -> None:
        """Highlight TOML when tree-sitter and its TOML grammar are installed (textual[syntax]).

        Optional: without tree-sitter Textual quietly shows plain text, but with tree-sitter and
        no TOML grammar it raises, and the editor must work either way."""
        editor = self.query_one("#preset-editor", TextArea)
        try:
            editor.language = "toml"
        except Exception:
            editor.language = None

    def reload(self, select: str | None = None) -> None:
        self.paths = preset_paths()
        ol = self.query_one("#preset-list", OptionList)
        ol.clear_options()
        for name, (_path, kind) in sorted(self.paths.items()):
            mark = "*" if name in self.buffers else " "
            ol.add_option(Option(Text.assemble(f"{mark}{name} ", (f"[{kind}]", "dim")), id=name))
        # first the preset the Hardware pane recommends for this machine (a new user's ctrl+l or ctrl+t is then
        # for what fits here, not for the first name in the list: apple-m4pro on a Linux laptop)
        recommended = (getattr(self.app, "recommended", None) or ("",))[0]
        first = recommended if recommended in self.paths else (sorted(self.paths)[0] if self.paths else None)
        target = select or self.current or first
        # the machine not read yet (the app opened on another tab): the recommended one once it is known
        self.awaiting_recommendation = not select and not self.current and not recommended
        if target in self.paths:
            ol.highlighted = ol.get_option_index(target)
            self.load(target)

    def recommendation_known(self, name: str) -> None:
        """The Hardware pane read the machine after this pane showed its first preset (the app opened on another
        tab): the recommended one is shown instead, so the Queue tab's `a` and `s` and ctrl+t are for what fits
        here (a walk's sweep form opened on apple-m4pro), unless the user has chosen one since."""
        if getattr(self, "awaiting_recommendation", False) and name in self.paths and name != self.current \
                and not self.buffers:
            self.awaiting_recommendation = False
            self.reload(select=name)
        self.awaiting_recommendation = False

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if event.option.id and event.option.id != self.current:
            self.awaiting_recommendation = False   # the user chose
            self.load(event.option.id)

    def load(self, name: str) -> None:
        editor = self.query_one("#preset-editor", TextArea)
        if self.current and self.current in self.paths:
            self._stash(self.current)
        self.current = name
        path, kind = self.paths[name]
        text = self.buffers.get(name)
        if text is None:
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as e:
                text = f"# cannot read {path}: {e}\n"
        with self.prevent(TextArea.Changed):
            editor.load_text(text)
        editor.border_title = f"{name} [{kind}]  {path}"
        self.check()

    def _stash(self, name: str) -> None:
        """Keep the editor's text of preset ``name`` (the one shown) as its unsaved buffer, or drop the buffer where
        the text is the file's."""
        editor = self.query_one("#preset-editor", TextArea)
        try:
            on_disk = self.paths[name][0].read_text(encoding="utf-8")
        except OSError:
            on_disk = None
        if editor.text != on_disk:
            self.buffers[name] = editor.text
        else:
            self.buffers.pop(name, None)

    def on_text_area_changed(self, event: TextArea.Changed) -> None:
        # validate as you type, but not on every keystroke of a fast typist
        if self._check_timer is not None:
            self._check_timer.stop()
        self._check_timer = self.set_timer(0.25, self.check)

    def check(self) -> None:
        if not self.current:
            return
        text = self.query_one("#preset-editor", TextArea).text
        self.valid, err = validate_preset_text(text, self.current)
        status = self.query_one("#preset-status", Static)
        status.set_class(bool(err), "error")
        status.update(Text(f"✗ {err}", style="bold red") if err else Text("✓ valid", style="green"))
        box = self.query_one("#preset-estimate", Static)
        if self.valid is not None:
            box.update(estimate_table(self.valid, self.app.machine_now(), self.history))
        else:  # never the last valid preset's numbers beside this one's editor
            box.update(Text(f"no estimate: {self.current}'s text has an error (see below the editor)", style="yellow"))
        if self.showing_gpus:
            self.compare_gpus()

    def editor_text(self) -> str:
        return self.query_one("#preset-editor", TextArea).text

    def history(self, preset: Preset, device: str) -> dict | None:
        """What the newest run of ``preset`` on ``device`` measured (`workbench estimate`'s rule), read once
        per list of runs."""
        key = json.dumps([preset.name, preset.to_dict()["model"], preset.train.batch_size, device])
        if key not in self._measured:
            self._measured[key] = previous_run(preset, self.app.runs_dir, device)
        return self._measured[key]

    def set_measured(self, runs: list[RunSummary]) -> None:
        """The runs changed: what they measured is read again when next needed."""
        seen = [(s.id, s.step) for s in runs]
        if seen != getattr(self, "_runs_seen", None):
            self._runs_seen, self._measured = seen, {}

    # ------------------------------------------------------------------ saving

    def action_save(self) -> None:
        self.save(as_new=False)

    def action_save_as(self) -> None:
        self.save(as_new=True)

    def save(self, as_new: bool = False) -> None:
        """Write the editor's preset: a user preset in place, a shipped one as a user copy of the same
        name; under a new name (asked for) with ``as_new``, or where that copy would replace the
        shipped file itself. A file on disk is never replaced by an invalid preset."""
        self.check()
        name = self.current
        if not name:
            return
        if self.valid is None:
            self.notify("Not saved: the preset has an error (see below the editor). "
                        "A file on disk is never replaced by an invalid one.", severity="error")
            return
        kind = self.paths[name][1]
        user_dir = user_presets_dir()
        if as_new or (kind == "shipped" and user_dir.resolve() == shipped_presets_dir().resolve()):
            def chosen(new: str | None) -> None:
                if new:
                    self._write(new, rename=True)

            hint = "" if as_new else " (shipped presets in this directory are kept; save a copy)"
            self.app.push_screen(NameScreen(f"Save preset as{hint}:", f"{name}-copy", self._new_name_error), chosen)
            return
        self._write(name, rename=False)

    def _new_name_error(self, new: str) -> str | None:
        try:
            check_preset_name(new)
        except PresetError as e:
            return str(e)
        if new in self.paths:
            return f"a preset named {new!r} exists already; choose another name"
        return None

    def _write(self, name: str, rename: bool) -> None:
        """Write the editor's text as the user preset ``name`` (with ``name`` inside when ``rename``: a new
        preset, which must not exist yet), then show it."""
        text = self.editor_text()
        try:
            target = write_user_preset(name, with_name(text, name) if rename else text, overwrite=not rename)
        except PresetError as e:
            self.notify(f"Not saved: {e}", severity="error")
            return
        if self.current:
            self.buffers.pop(self.current, None)
        self.current = None  # do not stash the editor over the saved file
        user_copy = not rename and self.paths.get(name, ("", ""))[1] == "shipped"
        self.notify(f"Saved {target}" + (" (a user copy: it overrides the shipped preset)" if user_copy else ""))
        self.reload(select=name)

    def action_train(self) -> None:
        """Train with the preset shown, as saved: an error or unsaved changes in the editor are said first (the
        form would start the file on disk, not what the editor shows)."""
        if self.saved_or_say("train with"):
            self.post_message(self.TrainRequested(self.current))

    def action_queue(self) -> None:
        """Queue a run of the preset shown, as saved (``workbench queue add``, as the Queue tab's ``a``)."""
        if self.current and self.saved_or_say("queue"):
            self.post_message(self.QueueRequested(self.current))

    def action_sweep(self) -> None:
        """Open the sweep form on the preset shown, as saved (its trials are runs of the file on disk)."""
        if self.current and self.saved_or_say("sweep"):
            self.post_message(self.SweepRequested(self.current))

    def saved_or_say(self, verb: str) -> bool:
        """Whether the preset shown is what its file holds, so a run of it (``verb``: "train with", "queue")
        runs what the editor shows; else the user is told, in one line, why not and what to do."""
        name = self.current
        if not name:
            return True
        self.check()
        if self.valid is None:
            self.notify(f"{name} has an error (see below the editor): fix it, or revert it with ctrl+r, to {verb} "
                        "it.", severity="error")
            return False
        if self._differs_from_disk(name, self.editor_text()):
            self.notify(f"{name} has unsaved changes: save them with ctrl+s to {verb} them, or revert them with "
                        "ctrl+r.", severity="warning")
            return False
        return True

    def _differs_from_disk(self, name: str, text: str) -> bool:
        try:
            return text != self.paths[name][0].read_text(encoding="utf-8")
        except (OSError, KeyError):
            return True

    def unsaved(self) -> list[str]:
        """The presets with changes not saved (quitting would lose them), each named as a question would name it:
        ``cpu-small (it has an error)`` where its text does not validate."""
        drafts = dict(self.buffers)
        if self.current and self.current in self.paths:
            text = self.editor_text()
            if self._differs_from_disk(self.current, text):
                drafts[self.current] = text
            else:
                drafts.pop(self.current, None)
        return [name + ("" if validate_preset_text(text, name)[0] is not None else " (it has an error)")
                for name, text in sorted(drafts.items())]

    # ------------------------------------------------------------------ other GPUs

    NARROW = 110  # below this many columns the GPU table takes the preset list's place too

    def action_toggle_gpus(self) -> None:
        """Show the preset on the common GPUs in place of the editor, or the editor again."""
        self.showing_gpus = not self.showing_gpus
        editor = self.query_one("#preset-editor", TextArea)
        editor.display = not self.showing_gpus
        self.query_one("#preset-gpus", VerticalScroll).display = self.showing_gpus
        self._fit_gpu_table()
        if self.showing_gpus:
            self.compare_gpus()
        self.focus_main()  # the pane's keys stay live while the editor (or the list) is hidden

    def focus_main(self) -> None:
        """The preset list, or the GPU table while it is shown (the list may be hidden beside it)."""
        if self.showing_gpus:
            table = self.query_one("#preset-gpus", VerticalScroll)
            table.screen.set_focus(table)
        else:
            super().focus_main()

    def on_resize(self) -> None:
        self._fit_gpu_table()

    def _fit_gpu_table(self) -> None:
        self.query_one("#preset-side").display = not (self.showing_gpus and self.size.width < self.NARROW)

    def compare_gpus(self) -> None:
        """Estimate the editor's preset on the common GPUs (in a worker: a few hundred estimates)."""
        if self.valid is None:
            self.query_one("#preset-gpus-table", Static).update(
                Text("The preset has an error (see below); fix it to see it on other GPUs.", style="yellow"))
            return
        self._compare(self.valid)

    @work(thread=True, exclusive=True, group="gpus", exit_on_error=False)
    def _compare(self, preset: Preset) -> None:
        self.post_message(self.GpusCompared(preset.name, compare(preset)))

    @on(GpusCompared)
    def _gpus_compared(self, msg: GpusCompared) -> None:
        if self.showing_gpus and msg.preset == (self.valid.name if self.valid else None):
            self.query_one("#preset-gpus-table", Static).update(gpu_table(msg.result))

    def action_revert(self) -> None:
        if self.current:
            self.buffers.pop(self.current, None)
            name, self.current = self.current, None
            self.load(name)
