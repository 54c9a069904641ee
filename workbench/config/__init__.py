"""Presets: the [model] / [train] / [data] / [hardware] sections as dataclasses (``schema``: each key's
documentation, type and limits; ``validate``: a preset from parsed TOML, checked against them and the
rules between keys, every failure a :class:`PresetError` that names the file, the key, the value and
what is allowed), the table of objectives, one row of facts for each ``train.objective`` that every
layer asks (``objectives``), TOML text and --set items (``overrides``), ``train.time_budget``'s durations such as
"1h30m" (``duration``) and
the preset files (``preset_files``: found by name, loaded, and the one writer of user presets), and a preset's
text as the editor holds it (``editing``). Plain data:
no "auto" is decided here (see ``workbench.plan.settings``). Imports neither torch nor textual."""

from workbench.config.duration import TimeBudget, budget_seconds
from workbench.config.editing import validate_preset_text, with_name
from workbench.config.overrides import apply_overrides, overridden_keys, parse_override, parse_toml
from workbench.config.preset_files import (
    check_preset_name,
    load_preset_file,
    preset_paths,
    preset_source_path,
    preset_to_toml,
    resolve_preset,
    save_user_preset,
    shipped_presets_dir,
    toml_string,
    user_preset_path,
    user_presets_dir,
    write_user_preset,
)
from workbench.config.schema import (
    SECTIONS,
    DataConfig,
    HardwareConfig,
    ModelConfig,
    Preset,
    PresetError,
    TrainConfig,
)
from workbench.config.validate import (
    chat_role_map,
    eval_share_list,
    lora_projections,
    lora_target_list,
    preset_from_dict,
)

__all__ = ["SECTIONS", "DataConfig", "HardwareConfig", "ModelConfig", "Preset", "PresetError", "TimeBudget",
           "TrainConfig", "apply_overrides", "budget_seconds", "chat_role_map", "check_preset_name", "eval_share_list",
           "load_preset_file", "lora_projections", "lora_target_list", "overridden_keys", "parse_override",
           "parse_toml", "preset_from_dict", "preset_paths", "preset_source_path", "preset_to_toml",
           "resolve_preset", "save_user_preset", "shipped_presets_dir", "toml_string", "user_preset_path",
           "user_presets_dir", "validate_preset_text", "with_name", "write_user_preset"]
