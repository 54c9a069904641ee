"""What will run: the one owner of a new run's preset and of a resume's, with every refusal.

``workbench train``, ``estimate``, ``fit`` and the TUI's new-run form ask :func:`plan_new_run`;
``workbench resume`` and the TUI's resume (which runs ``workbench resume``) ask :func:`plan_resume`.
So the same inputs give the same preset or the same one-line refusal wherever they are typed.
No torch: loading the checkpoint to check it is the caller's (the engine's) job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from workbench import rundir
from workbench.config import (
    Preset,
    PresetError,
    TimeBudget,
    apply_overrides,
    overridden_keys,
    parse_override,
    parse_toml,
    preset_from_dict,
    preset_paths,
    preset_to_toml,
    resolve_preset,
)
from workbench.data.mixture.mixture_plan import corpus_arguments, named_source
from workbench.data.tasks.task_files import absolute_task_spec, expand_task_specs, load_task
from workbench.fs import read_json
from workbench.plan.fit.recommend import recommend_preset
from workbench.plan.recipe.finetune import InitSource, init_preset, parse_init_from
from workbench.plan.recipe.objective_plan import objective_plan
from workbench.plan.schedule.horizon import extension
from workbench.reward import RewardError, parse_reward, read_prompts
from workbench.reward.spec import is_file_spec


@dataclass(frozen=True)
class NewRun:
    """A run to start, as ``workbench train``, ``queue add``, a sweep's trial or the new-run form asks for it: the
    one request the run plan takes, and the one builder of the arguments that ask for it (:meth:`cli_args`)."""
    preset: str | None = None          # a name or a .toml path; None: the preset that suits this machine
    overrides: tuple[str, ...] = ()    # --set section.key=value
    corpus: tuple[str, ...] = ()       # --corpus paths and globs (or builtin); empty: the preset's data.corpus
    init_from: str | None = None       # RUN[:CKPT]: start from that checkpoint's weights
    finetune: str = ""                 # with init_from: full | lora (train.finetune); "": the preset's or --set's
    time_budget: TimeBudget | None = None   # --time-budget, parsed where the request is made (train.time_budget)
    name: str | None = None            # the run's id; None: <preset>-<date>-<time>
    force: bool = False                # start (or queue) it even when the estimate says it will not fit (--yes)

    def preset_sets(self) -> tuple[str, ...]:
        """The ``--set`` values the run's preset is made with: the request's own, then the fine-tuning method and
        the time budget (the one place a budget becomes ``train.time_budget``)."""
        budget = (f"train.time_budget={self.time_budget.text}",) if self.time_budget else ()
        return self.set_args() + budget

    def set_args(self) -> tuple[str, ...]:
        """Its ``--set`` arguments: the request's own, then the fine-tuning method (with init_from)."""
        return tuple(self.overrides) + ((f"train.finetune={self.finetune}",) if self.init_from and self.finetune
                                        else ())

    def cli_args(self) -> list[str]:
        """The request as ``workbench train`` takes it, and ``workbench queue add`` (the same arguments; without
        --detach and --runs-dir): the one place a budget becomes ``--time-budget``."""
        args = [self.preset] if self.preset else []
        if self.name:
            args += ["--name", self.name]
        if self.corpus:
            args += ["--corpus", *self.corpus]
        if self.init_from:
            args += ["--init-from", self.init_from]
        if self.time_budget:
            args += ["--time-budget", self.time_budget.text]
        if self.set_args():
            args += ["--set", *self.set_args()]
        if self.force:
            args.append("--yes")
        return args


@dataclass(frozen=True)
class RunPlan:
    preset: Preset                     # validated, data.corpus absolute: what preset.toml will hold
    source: InitSource | None          # the checkpoint it starts from (--init-from)


def default_preset_name(info: dict) -> str:
    """The shipped or user preset that suits the machine ``info`` describes (cpu-small if none is known)."""
    name, _why = recommend_preset(info)
    return name if name in preset_paths() else "cpu-small"


def absolute_corpus(corpus: str | list[str]) -> str | list[str]:
    """Corpus paths and globs made absolute, so the run directory's preset means the same files anywhere (a
    mixture's ``NAME=PATH:WEIGHT`` item keeps its name and weight)."""
    def one(c: str) -> str:
        if (named := named_source(c)) is not None:
            name, path, weight = named
            return f"{name}={one(path)}:{weight}"
        return c if c == "builtin" else str(Path(c).expanduser().absolute())
    return one(corpus) if isinstance(corpus, str) else [one(c) for c in corpus]


def absolute_mixture(sources: list[dict]) -> list[dict]:
    """data.mixture with each source's corpus made absolute (as data.corpus)."""
    return [{**s, "corpus": absolute_corpus(s["corpus"])} for s in sources]


def checked_eval_tasks(tasks: str | list[str], limit: int) -> str | list[str]:
    """``train.eval_tasks`` with files made absolute, each task read (its first ``limit`` items), so a task
    that cannot be scored is refused before the run starts (a TaskError naming the file and line)."""
    specs = [tasks] if isinstance(tasks, str) else list(tasks)
    specs = [absolute_task_spec(s) for s in specs if s.strip()]
    for spec in expand_task_specs(specs):
        load_task(spec, limit=limit)
    return "" if not specs else specs[0] if len(specs) == 1 else specs


def corpus_values(corpus: tuple[str, ...] | list[str]) -> dict[str, dict]:
    """``--corpus`` items as preset values (a list stays a list: it never becomes TOML text)."""
    if not corpus:
        return {}
    return {"data": corpus_arguments(list(corpus))}


def plan_new_run(req: NewRun, runs_root: Path, info: dict | None = None) -> RunPlan:
    """The preset a new run will use, or a WorkbenchError saying what is wrong with the request.
    ``info``: the machine (``detect()``), needed only when no preset is named."""
    if req.preset is None and info is None:
        raise PresetError("name a preset (`workbench presets list`)")
    name = req.preset or default_preset_name(info or {})
    sets = list(req.preset_sets())
    p = resolve_preset(name, sets, corpus_values(req.corpus))
    p.data.corpus = absolute_corpus(p.data.corpus)
    p.data.mixture = absolute_mixture(p.data.mixture)
    p.train.eval_tasks = checked_eval_tasks(p.train.eval_tasks, p.train.task_limit)
    # a preset written from a fine-tune (a run's preset.toml, `sweep save-best`) names the checkpoint it starts from
    init_from = req.init_from or (f"{p.init['run']}:{p.init['step']}" if p.init else None)
    if not init_from:
        objective_plan(p)  # a reference objective needs a model to start from
        if p.train.finetune == "lora":
            raise PresetError("train.finetune = lora trains adapters on weights that exist: start from a checkpoint "
                              "with --init-from RUN (a run of yours, or a model brought in by `workbench import`)")
        return RunPlan(p, None)
    src = parse_init_from(runs_root, init_from)
    p = init_preset(p, src, sets)
    if objective_plan(p).samples:
        p.train.reward = checked_reward(p)
    return RunPlan(p, src)


def checked_reward(p: Preset) -> str:
    """A GRPO run's train.reward (a file's path made absolute, as the corpus's), checked before its run directory
    exists: the reward parsed (a user file loaded), the prompts file read by the reward package's reader, each
    record holding the field the reward reads; a RewardError (one line) for each way it can fail."""
    spec = p.train.reward.strip()
    if is_file_spec(spec):
        file, name = spec.rsplit(":", 1)
        spec = f"{Path(file).expanduser().absolute()}:{name}"
    reward = parse_reward(spec)
    corpus = p.data.corpus
    if not isinstance(corpus, str) or corpus == "builtin":
        raise RewardError(f"train.objective = {p.train.objective} trains on one prompts file (JSONL records with a "
                          "'prompt', or text one prompt a line); give it with --corpus PROMPTS.jsonl")
    for prompt in read_prompts(corpus).items:
        reward.check_record(prompt.record, prompt.where)
    return spec


# ----------------------------------------------------------------------------- resuming

# Keys that change what the checkpoint's tensors mean; resuming with other values is refused.
SHAPE_KEYS = ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden", "tie_embeddings", "head_size",
              "attn_bias", "qk_norm")
# Training keys that change what a checkpoint's tensors are (a LoRA run's checkpoints hold its adapters), or what
# the run optimises against its data (a preference run's objective and reference).
ADAPTER_KEYS = ("finetune", "lora_rank", "lora_alpha", "lora_targets", "objective")


@dataclass(frozen=True)
class ResumeRequest:
    """``workbench resume RUN`` as asked."""
    run: str
    checkpoint: str | None = None      # latest (None), best, or a step number
    more: int | None = None            # --more N
    name: str | None = None            # the branch's id
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class ResumePlan:
    run_dir: Path                      # the run resumed
    ckpt: dict                         # the checkpoint it goes on from (rundir.list_checkpoints entry)
    preset: Preset                     # the preset it goes on with (overrides applied)
    data: dict                         # that preset as data (a branch's preset.toml)
    overrides: tuple[str, ...]         # what changes (--set, and --more as train.max_iters)
    branching: bool                    # True: a new run continues ckpt (it is not the latest)
    notes: tuple[str, ...] = field(default=())   # what the caller should tell the user

    def branch_toml(self) -> str:
        """The preset.toml of the branch this plan makes (``rundir.make_branch``): :func:`branch_toml`."""
        return branch_toml(self.run_dir, self.ckpt, self.data)


def branch_toml(run_dir: Path, ckpt: dict, data: dict) -> str:
    """A branch's preset.toml: the preset ``data`` it goes on with, and ``[parent]``, the run and step it continues
    (its lineage)."""
    data = dict(data, parent={"run": Path(run_dir).name, "step": int(ckpt["step"])})
    try:
        preset = preset_from_dict(data, str(Path(run_dir) / rundir.PRESET_FILE), name=data.get("name"))
    except PresetError as e:
        raise rundir.RunError(str(e)) from None
    return preset_to_toml(preset)


def model_differences(preset_model: dict, ckpt_model: dict) -> list[str]:
    return [f"model.{k}: checkpoint {ckpt_model.get(k)!r}, preset {preset_model.get(k)!r}"
            for k in SHAPE_KEYS if k in ckpt_model and ckpt_model.get(k) != preset_model.get(k)]


def being_trained(run_dir: Path) -> rundir.RunError:
    return rundir.RunError(f"run {run_dir.name} is already being trained; "
                           f"stop it first with `workbench stop {run_dir.name}`")


def _latest_at_or_before(run_dir: Path, step: int, default: dict) -> dict:
    return next((c for c in reversed(rundir.list_checkpoints(run_dir)) if c["step"] <= step), default)


def checkpoint_state(ckpt: dict) -> dict:
    """A checkpoint's trainer state (``trainer_state.json``: where a budgeted run's horizon is kept), or {}."""
    return read_json(Path(ckpt["path"]) / rundir.CKPT_TRAINER_STATE) or {}


def plan_resume(req: ResumeRequest, runs_root: Path) -> ResumePlan:
    """Which checkpoint a resume goes on from, in place or as a branch, with which preset; or a
    WorkbenchError. A decayed wsd run extended with ``more`` goes on from where its decay began."""
    run_dir = rundir.resolve_run(runs_root, req.run)
    if not rundir.list_checkpoints(run_dir) and rundir.RunLock(run_dir).held_by_other():
        raise being_trained(run_dir)  # before "no checkpoint yet": the run is young, not broken
    ckpt = rundir.select_checkpoint(run_dir, req.checkpoint)
    if ckpt.get("reason") == "import":
        raise rundir.RunError(f"run {run_dir.name} is a model brought in by `workbench import`, not a run to "
                              f"continue; train from it with `workbench train PRESET --init-from {run_dir.name}`")
    path = run_dir / rundir.PRESET_FILE
    old = preset_from_dict(parse_toml(path.read_text(encoding="utf-8"), str(run_dir)), str(path))
    notes: list[str] = []
    more_from = int(ckpt["step"])
    budgeted = bool(old.train.time_budget)
    ext = extension(old, checkpoint_state(ckpt), more_from, req.more) if req.more and req.more > 0 else None
    if ext is not None:
        notes.append(ext.note)  # the same line the TUI's "+ more steps" dialog shows (plan.schedule.horizon.extension)
        if ext.from_step != more_from:
            # wsd past its decay: the stable phase continues from the decay start, and a new decay ends the
            # longer run (its first decay stays, in this run)
            ckpt = _latest_at_or_before(run_dir, ext.from_step, ckpt)
            if ckpt["step"] != ext.from_step:
                notes.append(f"note: no checkpoint at step {ext.from_step}, where the decay began; going on from "
                             f"{ckpt['name']}")
    branching = not rundir.is_latest_checkpoint(run_dir, ckpt)
    if not branching and rundir.RunLock(run_dir).held_by_other():
        raise being_trained(run_dir)
    if req.name and not branching:
        raise rundir.RunError(f"--name names a new run, made when resuming from a checkpoint other than the latest; "
                              f"{ckpt['name']} is {run_dir.name}'s latest, so it continues in place")
    overrides = list(req.overrides)
    for item in overrides:
        sec, key, _value = parse_override(item)
        if sec == "data" or (sec == "model" and key != "dropout") or (sec == "train" and key in ADAPTER_KEYS):
            raise PresetError(f"--set {item!r}: {sec}.{key} cannot change when resuming (it changes the "
                              "model or its data); start a new run with `workbench train` instead")
    if req.more is not None:
        if req.more < 1:
            raise rundir.RunError(f"--more {req.more}: give the number of steps to add, at least 1")
        if "train.max_iters" in overridden_keys(overrides):
            raise rundir.RunError("give --more N or --set train.max_iters=M, not both")
        assert ext is not None  # made above for a positive --more
        overrides.append(f"train.max_iters={ext.end_step}")
        if budgeted:  # more steps, not more time: the extension is counted in steps (the note says so)
            overrides.append("train.time_budget=")
            if ext.warmup is not None and ext.warmup != old.train.warmup_iters:  # the budget's warmup, kept
                overrides.append(f"train.warmup_iters={ext.warmup}")
    data = apply_overrides(parse_toml(path.read_text(encoding="utf-8"), str(path)), overrides)
    p = preset_from_dict(data, str(path), name=data.get("name"), user_set=overridden_keys(overrides))
    diffs = model_differences(data.get("model", {}), ckpt.get("model") or {})
    if diffs:
        raise rundir.RunError(f"checkpoint {ckpt['name']} does not fit the run's preset: {'; '.join(diffs)}; "
                              "restore those values in preset.toml or start a new run")
    return ResumePlan(run_dir, ckpt, p, data, tuple(overrides), branching, tuple(notes))
