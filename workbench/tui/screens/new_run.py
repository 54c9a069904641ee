"""The "new run" form: preset, corpus, name, overrides; validated before launching, or before queueing (its
second action: the run is added to the queue, `workbench queue add`, rather than started now)."""

from __future__ import annotations

import shlex
from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widgets import Button, Input, Label, Select, Static

from workbench.analysis.history import measured_in
from workbench.config import (
    Preset,
    preset_paths,
)
from workbench.data.corpus.kinds import KINDS, PAIRS
from workbench.errors import WorkbenchError
from workbench.machine.detect import Machine, detect
from workbench.plan.preflight import FIRST_RECORDS, NO_CORPUS, corpus_problem, preflight
from workbench.plan.recipe.finetune import compare_methods, method_overrides
from workbench.plan.run_plan import plan_new_run
from workbench.rundir import runs_root, sanitize_run_name
from workbench.tui import launcher
from workbench.tui.launcher import RunRequest
from workbench.tui.screens.dialogs import ConfirmScreen, form_field


def request_preset(req: RunRequest, runs_dir: Path | None = None) -> Preset:
    """The preset the trainer would run for ``req``, decided as `workbench train` decides it (the same
    run plan, so the same refusals), before any process starts (a WorkbenchError or OSError says what
    is wrong)."""
    return plan_new_run(req.new_run(), runs_root(runs_dir)).preset


def check_request(req: RunRequest, runs_dir: Path | None = None) -> str | None:
    """What is wrong with ``req`` (preset, overrides, run name, the checkpoint to start from, the corpus as the
    pre-flight of the `workbench train --detach` it starts checks it before a run exists: listed, its first records
    read against the objective), or None: shown in the form, which stays open."""
    try:
        p = request_preset(req, runs_dir)
        if req.name:
            sanitize_run_name(req.name)
        problem = corpus_problem(p, req.new_run().preset_sets(), FIRST_RECORDS)
    except (WorkbenchError, OSError) as e:
        return str(e)
    return str(problem) if problem is not None else None


PREVIEW_HINT = "ctrl+d: preview the data as the trainer will see it (conversations: what the loss is on)"
PREVIEW_LINES = 10   # lines shown of each document


def preview_text(out: dict) -> Text:
    """``data inspect --json`` as the form shows it: a conversation's trained text in bold green, a
    document's first lines."""
    t = Text()
    if out.get("format") in KINDS:
        return preference_preview(out)
    if out.get("format") == "mixture":
        return mixture_preview(out)
    if out.get("format") == "chat" and out.get("tokenizer", "") is None:  # shown by characters: no tokenizer fits
        t.append(f"template {out['template']}; loss on {out['loss_on']} (bold green); {out['note']}", style="dim")
    elif out.get("format") == "chat":
        over = out["truncated"] + out["dropped"]
        t.append(f"{out['conversations']:,} conversations; template {out['template']}; loss on {out['loss_on']}: "
                 f"{out['trained_fraction']:.1%} of tokens (bold green); rows {out['row_fill']:.0%} filled"
                 + (f"; {over:,} longer than seq_len {out['seq_len']}" if over else ""), style="dim")
    else:
        t.append(f"{out['source']}: text, {out['files']:,} file(s)", style="dim")
    for doc in out["shown"]:
        text, marks = doc["text"], doc.get("trained_spans", [])
        body = Text(text)
        for a, b in marks:
            body.stylize("bold green", a, b)
        lines = body.split("\n")
        t.append(f"\n--- {'conversation' if marks or out.get('format') == 'chat' else 'document'} "
                 f"{doc['index'] + 1} ---\n", style="dim")
        t.append(Text("\n").join(lines[:PREVIEW_LINES]))
        if len(lines) > PREVIEW_LINES or doc.get("cut"):
            t.append(" […]", style="dim")
    return t


def mixture_preview(out: dict) -> Text:
    """A mixture as ``data inspect --json`` gives it: the realized mixture over the run (a row per source: its
    share, sequences, tokens, repeats; what `train` would refuse), then each source's first documents."""
    T, unit = out["seq_len"], "rows" if out.get("chat") else "sequences"
    t = Text(f"mixture over {out['horizon_sequences']:,} {unit} of {T} tokens (each source's share within one "
             "after every step)" + ("" if out["exact"] else "; counts by the order") + "\n", style="dim")
    total = sum(s["weight"] for s in out["sources"])
    rows = [("source", "share", unit, "tokens", "repeats")] + [
        (s["name"], f"{s['weight'] / total:.1%}", f"{s['sequences']:,}", f"{s['tokens']:,}", f"{s['repeats']:.2f}")
        for s in out["sources"]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    t.append("\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                       for r in rows))
    for why in out.get("refused", []):
        t.append(f"\n`train` would refuse it: {why}", style="red")
    for s in out["sources"]:
        for doc in s.get("shown", []):
            lines = Text(doc["text"]).split("\n")
            t.append(f"\n--- {s['name']}: {'conversation' if out.get('chat') else 'document'} {doc['index'] + 1} "
                     "---\n", style="dim")
            t.append(Text("\n").join(lines[:PREVIEW_LINES]))
            if len(lines) > PREVIEW_LINES or doc.get("cut"):
                t.append(" […]", style="dim")
    return t


def preference_preview(out: dict) -> Text:
    """Preference records as ``data inspect --json`` gives them: each prompt once, then its chosen and rejected
    answers (or the rated answer and its label), their trained tokens in bold green."""
    pairs = out["format"] == PAIRS
    t = Text(f"{out['items']:,} {'pairs' if pairs else 'labelled answers'}; template {out['template']}; the answers' "
             "trained tokens in bold green", style="dim")
    for item in out["shown"]:
        t.append(f"\n--- {'pair' if pairs else 'answer'} {item['index'] + 1} ---\n", style="dim")
        t.append(Text("\n").join(Text(item["prompt"]).split("\n")[:PREVIEW_LINES]))
        names = ["chosen", "rejected"] if pairs else ["good" if item["label"] else "bad"]
        for name, answer, trained in zip(names, item["answers"], item["trained"]):
            body = Text(answer.rstrip("\n"))
            at = 0
            for run in trained:
                k = answer.find(run, at)
                if k >= 0:
                    body.stylize("bold green", k, k + len(run))
                    at = k + len(run)
            t.append(f"\n{name}: ", style="dim")
            t.append(body)
    return t


def recommended_method(req: RunRequest, machine_info: dict | None, runs_dir: Path | None) -> tuple[str | None, str]:
    """The fine-tuning method `workbench estimate --init-from` recommends for ``req`` (full, lora, lora+ac: the
    first that fits) and why; (None, why) when none fits or the request cannot be estimated."""
    try:
        mt = compare_methods(request_preset(req, runs_dir), Machine.from_info(machine_info or detect()))
    except (WorkbenchError, OSError):
        return None, ""
    return mt["recommended"], mt["why"]


def estimate_text(req: RunRequest, machine_info: dict | None, runs_dir: Path | None
                  ) -> tuple[bool | None, str, str]:
    """(fits, what to show, why its time budget cannot buy a complete run or "") for the run ``req`` describes on this
    machine: memory and time, by estimate (a budget's plan: plan.schedule.budget_plan.plan_budget, as `train` says
    it)."""
    try:
        pf = preflight(req.new_run(), runs_root(runs_dir), Machine.from_info(machine_info or detect()),
                       history=measured_in(runs_dir), corpus=NO_CORPUS)  # the corpus: check_request's
    except (WorkbenchError, OSError) as e:
        return None, f"estimate: {e}", ""
    p, check = pf.preset, pf.check
    return check.fits, "\n".join(check.lines() + mixture_shares(p)), check.budget_problem


def mixture_shares(p: Preset) -> list[str]:
    """A mixture's sources in the estimate: each one's share and the sequences the run's horizon gives it (the
    apportionment: known before anything is read; its repeats need the sources prepared: ctrl+d)."""
    from workbench.data.mixture.mixture_data import active_sources
    from workbench.data.mixture.mixture_plan import apportion

    active = active_sources(p.data)
    if len(active) < 2:
        return []
    t = p.train
    total, n = sum(s["weight"] for s in active), t.max_iters * t.batch_size * t.grad_accum
    counts = apportion([s["weight"] for s in active], n)
    when = ("its first guess at the budget's steps is planned when it starts" if t.time_budget else
            f"over {n:,} sequences of {p.model.seq_len} tokens")
    return [f"mixture ({when}): " + ", ".join(
        f"{s['name']} {s['weight'] / total:.1%}" + ("" if t.time_budget else f" ({c:,})")
        for s, c in zip(active, counts)) + "; ctrl+d: its table (the sources prepared)"]


class NewRunScreen(ModalScreen["RunRequest | None"]):
    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "start", "Start"),
                Binding("ctrl+l", "add_to_queue", "Add to queue", priority=True),
                # priority: an Input would take ctrl+d (delete right) while the user is typing in it
                Binding("ctrl+d", "preview", "Preview data", priority=True)]
    DEFAULT_CSS = "#nr-finetune { width: 14; }\n#nr-preview-box { height: auto; max-height: 20; }"

    def __init__(self, preset: str | None = None, overrides: str = "", machine_info: dict | None = None,
                 runs_dir: Path | None = None, init_from: str = "", corpus: str = "builtin", note: str = ""):
        """``machine_info``: the hardware the estimate is for (default: detected now); ``init_from``:
        RUN[:STEP] to start from (fine-tuning), filled in; ``corpus`` filled in; ``note``: a line under the title
        saying what the form was opened for (e.g. a DPO run on the Sample pane's picks, and how many)."""
        super().__init__()
        self.preset = preset
        self.overrides = overrides
        self.init_from = init_from
        self.corpus = corpus
        self.note = note
        self.machine_info = machine_info
        self.runs_dir = runs_dir
        self.fits: bool | None = None
        self._timer: Timer | None = None
        self.method_chosen = False  # the user chose full or LoRA: the recommendation no longer sets it
        self._method_shown = "lora"  # what the select shows by the form's doing (its first value, the recommended)
        self.queued = False  # the request was dismissed to be queued (add to queue), not started now

    def compose(self) -> ComposeResult:
        names = sorted(preset_paths())
        initial = self.preset if self.preset in names else (names[0] if names else Select.NULL)
        with Vertical(classes="dialog wide", id="new-run"):
            yield Label("[b]Start a new run[/b]")
            if self.note:
                yield Label(Text(self.note, style="bold cyan"), id="nr-note")
            yield form_field("preset", Select([(n, n) for n in names], value=initial, allow_blank=False,
                                              id="nr-preset"))
            yield form_field("corpus", Input(self.corpus, id="nr-corpus", placeholder="builtin, a path, or a "
                                             "mixture: web=web.jsonl:0.7 code=src/:0.3"))
            yield form_field("name", Input("", placeholder="(automatic)", id="nr-name"))
            yield form_field("budget", Input("", placeholder="(max_iters) or a time: 45m, 2h - the schedule follows "
                                                             "the clock", id="nr-budget"))
            yield form_field("--set", Input(self.overrides, placeholder="train.max_iters=500 model.dim=128 …",
                                            id="nr-overrides"))
            # start from a checkpoint: fine-tune it, fully or with LoRA
            yield form_field("from", Input(self.init_from, placeholder="(scratch) or RUN[:STEP] to fine-tune",
                                           id="nr-init"),
                             Select([("LoRA", "lora"), ("full", "full")], value="lora", allow_blank=False,
                                    id="nr-finetune"))
            yield Static("", id="nr-estimate")
            yield Static("", id="nr-error", classes="error")
            with VerticalScroll(id="nr-preview-box"):
                yield Static(Text(PREVIEW_HINT, style="dim"), id="nr-preview")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Start (ctrl+s)", id="start", variant="success")
                yield Button("Add to queue (ctrl+l)", id="queue", variant="primary")
                yield Button("Cancel (esc)", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#nr-preset", Select).focus()  # tab order: preset, corpus, name, budget, --set
        self.show_estimate()

    def show_estimate(self) -> None:
        if not self.is_attached or not self.query("#nr-estimate"):  # dismissed meanwhile
            return
        advice = self._recommend_method()
        self.fits, text, problem = estimate_text(self.request(), self.machine_info, self.runs_dir)
        fit_style: dict[bool | None, str] = {True: "green", False: "bold red"}
        style = "bold red" if problem else fit_style.get(self.fits, "dim")
        self.query_one("#nr-estimate", Static).update(Text(text + advice, style=style))

    def _recommend_method(self) -> str:
        """A fine-tune: the method `estimate --init-from` recommends chosen (until the user chooses one), and a
        line saying which and why."""
        req = self.request()
        if not req.init_from:
            return ""
        rec, why = recommended_method(req, self.machine_info, self.runs_dir)
        if rec is None:
            return f"\nmethod: {why}" if why else ""
        if not self.method_chosen:
            self._method_shown = "full" if rec == "full" else "lora"
            with self.prevent(Select.Changed):
                self.query_one("#nr-finetune", Select).value = self._method_shown
        extra = " (with --set hardware.activation_checkpointing=true)" if rec == "lora+ac" else ""
        return f"\nmethod: {' '.join(method_overrides(rec))} recommended{extra}: {why}"

    @on(Select.Changed, "#nr-finetune")
    def _method_chosen(self, event: Select.Changed) -> None:
        """Only a value the form did not set is the user's choice: the select's own Changed as it mounts (its
        first value) is not (it was taken for one, so a form opened with `n` never followed the recommendation)."""
        if event.value != self._method_shown:
            self.method_chosen = True

    def _estimate_soon(self) -> None:
        if self._timer is not None:
            self._timer.stop()
        self._timer = self.set_timer(0.3, self.show_estimate)

    def on_select_changed(self) -> None:
        self._estimate_soon()
        self._preview_stale()

    def on_input_changed(self) -> None:
        self._estimate_soon()
        self._preview_stale()

    def _preview_stale(self) -> None:
        if self.query("#nr-preview"):
            self.query_one("#nr-preview", Static).update(Text(PREVIEW_HINT, style="dim"))

    def action_preview(self) -> None:
        """Show the corpus's first documents as `workbench data inspect` sees them for this request."""
        req = self.request()
        err = check_request(req, self.runs_dir)
        if err:
            self.query_one("#nr-error", Static).update(err)
            return
        self.query_one("#nr-error", Static).update("")
        self.query_one("#nr-preview", Static).update(Text("preparing the preview (a chat corpus is tokenized "
                                                         "once, into the cache the run will use)…", style="dim"))
        self._preview(req)

    @work(thread=True, exclusive=True, group="preview", exit_on_error=False)
    def _preview(self, req: RunRequest) -> None:
        try:
            out = launcher.inspect_data(runs_root(self.runs_dir), req)
        except (WorkbenchError, OSError, ValueError) as e:
            self.app.call_from_thread(self._show_preview, req, Text(f"preview: {e}", style="red"))
            return
        self.app.call_from_thread(self._show_preview, req, preview_text(out))

    def _show_preview(self, req: RunRequest, text: Text) -> None:
        if self.is_attached and self.query("#nr-preview") and req == self.request():  # not changed meanwhile
            self.query_one("#nr-preview", Static).update(text)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "start":
            self.action_start()
        elif event.button.id == "queue":
            self.action_add_to_queue()
        else:
            self.dismiss(None)

    def on_input_submitted(self) -> None:
        self.action_start()

    def request(self) -> RunRequest:
        try:
            sets = shlex.split(self.query_one("#nr-overrides", Input).value)
        except ValueError:
            sets = self.query_one("#nr-overrides", Input).value.split()
        init_from = self.query_one("#nr-init", Input).value.strip()
        return RunRequest(preset=str(self.query_one("#nr-preset", Select).value),
                          corpus=self.query_one("#nr-corpus", Input).value.strip(),
                          name=self.query_one("#nr-name", Input).value.strip(),
                          overrides=[s.removeprefix("--set=") for s in sets if s != "--set"],
                          init_from=init_from, time_budget=self.query_one("#nr-budget", Input).value.strip(),
                          finetune=str(self.query_one("#nr-finetune", Select).value) if init_from else "")

    def action_add_to_queue(self) -> None:
        """Queue the run (`workbench queue add`: the runner starts it in its turn) instead of starting it now."""
        self.action_start(queue=True)

    def action_start(self, queue: bool = False) -> None:
        req = self.request()
        err = check_request(req, self.runs_dir)
        if err:
            self.query_one("#nr-error", Static).update(err)
            return
        self.fits, text, problem = estimate_text(req, self.machine_info, self.runs_dir)
        if self.fits is not False and not problem:
            self.queued = queue
            self.dismiss(req)
            return

        def answer(yes: bool | None) -> None:
            if yes:
                self.queued = queue
                self.dismiss(req)

        what = "Queue" if queue else "Start"
        why = ("does not fit this machine" if self.fits is False else
               "cannot buy a complete run in its time budget")  # `train` refuses both unless --yes
        self.app.push_screen(ConfirmScreen(f"By the estimate, [b]{req.preset}[/b] {why}:\n\n"
                                           f"{text}\n\n{what} it anyway?", f"{what} anyway"), answer)

    def action_cancel(self) -> None:
        self.dismiss(None)
