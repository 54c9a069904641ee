"""The names of a run directory's files: each spelled once, here (the package docstring says who writes
each). Every module that opens a file of a run names it through these constants, so renaming one, or
finding every reader of one, is a search for the constant."""

from __future__ import annotations

PRESET_FILE = "preset.toml"        # the resolved preset, frozen at start
METRICS_FILE = "metrics.jsonl"     # the trainer's typed records, append-only
STATUS_FILE = "status.json"        # where the run is now, replaced whole
LOG_FILE = "train.log"             # the trainer's stdout and stderr
TASKS_FILE = "tasks.jsonl"         # task scores written by `workbench eval` (typed task records)
SAMPLES_FILE = "samples.jsonl"     # the generations the trainer writes at its evals (train.sample_prompt)
PREFERENCES_FILE = "preferences.jsonl"  # pairs picked in the Sample pane's A/B chat (prompt, chosen, rejected)
RATINGS_FILE = "ratings.jsonl"     # replies rated good or bad there (KTO's prompt, completion, label)
LOCK_FILE = "lock"                 # flock'ed by the one trainer working on the run

# checkpoints/step_NNNNNNN/ holds one complete checkpoint; a checkpoint being written is a directory
# TMP_PREFIX... beside them, renamed into place once complete.
CHECKPOINTS_DIR = "checkpoints"
CKPT_PREFIX = "step_"
TMP_PREFIX = ".tmp_"
CKPT_MODEL = "model.pt"                    # the weights (a LoRA run's: its adapters)
CKPT_OPTIMIZER = "state.pt"                # optimizer, GradScaler and torch RNG states
CKPT_TRAINER_STATE = "trainer_state.json"  # the trainer's own state (workbench.train.state.TrainerState)
CKPT_META = "meta.json"                    # the sidecar, written last: its presence marks the checkpoint complete

INIT_DIR = "init"   # the weights a run started from (init/CKPT_MODEL)

# The files a run's tokenizer may consist of (sentencepiece; or a Hugging Face tokenizer.json and its config), and
# the chat template it renders conversations through (the model's own, or the one the run trained with), with
# other named templates in TEMPLATES_DIR: what a run started from this one (a fine-tune, a branch) must have.
CHAT_TEMPLATE_FILE = "chat_template.jinja"    # transformers 5's name for a model's template
TEMPLATES_DIR = "additional_chat_templates"    # ... and the directory of its other named ones (NAME.jinja)
TOKENIZER_FILES = ("tokenizer.model", "tokenizer.json", "tokenizer_config.json", CHAT_TEMPLATE_FILE)


def ckpt_name(step: int) -> str:
    """The directory name of the checkpoint at ``step`` (inside CHECKPOINTS_DIR)."""
    return f"{CKPT_PREFIX}{step:07d}"


__all__ = ["CHAT_TEMPLATE_FILE", "CHECKPOINTS_DIR", "CKPT_META", "CKPT_MODEL", "CKPT_OPTIMIZER", "CKPT_PREFIX",
           "CKPT_TRAINER_STATE", "INIT_DIR", "LOCK_FILE", "LOG_FILE", "METRICS_FILE", "PRESET_FILE", "SAMPLES_FILE",
           "STATUS_FILE", "TASKS_FILE", "TEMPLATES_DIR", "TMP_PREFIX", "TOKENIZER_FILES", "ckpt_name"]
