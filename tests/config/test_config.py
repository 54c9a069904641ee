"""Presets: every shipped one validates; every rule has a failing case with a clear message."""

from __future__ import annotations

import pytest

from tests.support.cli import REPO, wb
from workbench.config import (
    PresetError,
    apply_overrides,
    load_preset_file,
    parse_toml,
    preset_from_dict,
    preset_paths,
    preset_to_toml,
    resolve_preset,
)

SHIPPED = ["cpu-small", "medium", "gpu-8gb", "apple-m4pro", "gpu-24gb", "datacenter-80gb"]


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_preset_loads_and_validates(name):
    paths = preset_paths()
    assert paths[name][1] == "shipped"
    p = load_preset_file(paths[name][0])
    assert p.name == name
    assert p.model.dim % p.model.n_heads == 0 and p.model.n_heads % p.model.n_kv_heads == 0
    # Round trip through TOML gives the same preset.
    again = preset_from_dict(parse_toml(preset_to_toml(p), "x"), "x")
    assert again == p


def test_gpu_8gb_has_the_seed_values():
    p = resolve_preset("gpu-8gb")
    m, t = p.model, p.train
    assert (m.dim, m.n_layers, m.n_heads, m.n_kv_heads, m.vocab_size, m.seq_len) == (768, 12, 12, 6, 32768, 1024)
    assert (t.batch_size, t.lr, t.max_iters, t.eval_interval, m.dropout) == (24, 3e-4, 10000, 500, 0.1)
    assert t.eval_iters == 0  # auto (plan.schedule.evals), where the seed had 50 batches


BAD = [
    # (toml text, expected fragment of the message)
    ("[model]\ndim = 100\nn_heads = 8\nn_kv_heads = 4", "model.dim = 100 must be divisible by model.n_heads = 8"),
    ("[model]\nn_heads = 8\nn_kv_heads = 3", "model.n_heads = 8 must be divisible by model.n_kv_heads = 3"),
    ("[model]\ndim = 120\nn_heads = 8\nn_kv_heads = 4", "head dim = model.dim / model.n_heads = 15 must be even"),
    ("[train]\nlr = 0.0", "train.lr = 0.0 must be > 0"),
    ("[train]\nlr = 1.5", "train.lr = 1.5 must be <= 1"),
    ("[train]\nbatch_size = 0", "train.batch_size = 0 must be >= 1"),
    ("[model]\nn_layers = -2", "model.n_layers = -2 must be >= 1"),
    ("[train]\nwarmup_iters = 100\nmax_iters = 100", "train.warmup_iters = 100 must be < train.max_iters = 100"),
    ("[train]\nlr = 1e-4\nmin_lr = 1e-3", "train.min_lr = 0.001 must be <= train.lr = 0.0001"),
    ("[train]\nbatch_size = \"8\"", "train.batch_size = '8' must be an integer"),
    ("[train]\nbatch_size = 8.5", "train.batch_size = 8.5 must be an integer"),
    ("[model]\ntie_embeddings = 1", "model.tie_embeddings = 1 must be true or false"),
    ("[hardware]\nprecision = \"fp8\"", "hardware.precision = 'fp8' is not one of auto, fp32, bf16, fp16"),
    ("[hardware]\ndevice = \"tpu\"", "hardware.device = 'tpu' must be auto, cpu, cuda, cuda:N or mps"),
    ("[train]\nlrr = 0.1", "unknown key train.lrr (did you mean 'lr'?)"),
    ("[modle]\ndim = 64", "unknown key 'modle' (did you mean 'model'?)"),
    ("model = 3", "[model] must be a table"),
    ("[data]\nval_fraction = 0.0", "data.val_fraction = 0.0 must be > 0"),
    ("[model]\ndim = = 3", "not valid TOML: "),
    ("[train]\nobjective = \"dpo\"\ndpop_lambda = -1", "train.dpop_lambda = -1.0 must be >= 0"),
    ("[train]\ndpop_lambda = 50", "train.dpop_lambda = 50 is DPOP's penalty on DPO's chosen answers, but "
                                  "train.objective = sft; set train.objective = dpo"),
    ("[train]\nobjective = \"simpo\"\ndpop_lambda = 5", "train.dpop_lambda = 5 is DPOP's penalty on DPO's chosen "
                                                       "answers, but train.objective = simpo"),
]


@pytest.mark.parametrize("text,fragment", BAD, ids=[f[1][:40] for f in BAD])
def test_invalid_preset_rule_has_clear_message(tmp_path, text, fragment):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(PresetError) as ei:
        load_preset_file(path)
    msg = str(ei.value)
    assert fragment in msg
    assert str(path) in msg  # the message names the file
    assert "\n" not in msg   # one line


def test_a_budgeted_runs_warmup_is_not_checked_against_max_iters(tmp_path):
    """With a time budget max_iters is not the run's length (the warmup is a share of the steps the budget buys):
    warmup_iters >= max_iters is no error there (a walk's GRPO command had every other error hidden behind it)."""
    path = tmp_path / "budget.toml"
    path.write_text('[train]\nwarmup_iters = 30\nmax_iters = 20\ntime_budget = "1m"')
    assert load_preset_file(path).train.max_iters == 20


def test_dpop_with_another_objective_is_refused_on_the_command_line():
    cp = wb("estimate", "cpu-small", "--set", "train.objective=simpo", "--set", "train.dpop_lambda=50")
    assert cp.returncode == 2 and "\n" not in cp.stderr.strip()
    assert "train.dpop_lambda = 50 is DPOP's penalty on DPO's chosen answers, but train.objective = simpo" in cp.stderr
    assert resolve_preset("cpu-small", ["train.objective=dpo", "train.dpop_lambda=50"]).train.dpop_lambda == 50


def test_malformed_toml_names_line_and_column(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[model]\ndim = 64\nn_heads = 8 8\n")
    with pytest.raises(PresetError, match=r"line \d+, column \d+"):
        load_preset_file(path)


def test_overrides_parse_toml_values_and_reject_unknown_keys():
    d = apply_overrides({}, ["train.lr=3e-4", "hardware.compile=true", "data.corpus=builtin",
                             "model.dropout=0.1", "train.sample_prompt='x = '"])
    p = preset_from_dict(d)
    assert p.train.lr == 3e-4 and p.hardware.compile == "true" and p.data.corpus == "builtin"
    assert p.train.sample_prompt == "x = "
    with pytest.raises(PresetError, match=r"unknown key train.max_iter \(did you mean 'max_iters'\?\)"):
        apply_overrides({}, ["train.max_iter=5"])
    with pytest.raises(PresetError, match="expected section.key=value"):
        apply_overrides({}, ["train.max_iters"])


def test_user_presets_override_shipped_and_shipped_found_elsewhere(tmp_path):
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "cpu-small.toml").write_text('name = "cpu-small"\ndescription = "mine"\n')
    (tmp_path / "presets" / "mine.toml").write_text('[train]\nmax_iters = 7\n')
    out = wb("presets", "list", cwd=tmp_path, check=True).stdout
    assert "cpu-small            user     mine" in out
    assert "gpu-8gb              shipped" in out and "mine                 user" in out
    # From a directory with no presets/ the shipped ones are still found.
    other = tmp_path / "elsewhere"
    other.mkdir()
    out = wb("presets", "show", "gpu-24gb", cwd=other, check=True).stdout
    assert "n_layers = 24" in out and "# Number of transformer blocks." in out


def test_presets_copy_never_overwrites(tmp_path):
    cp = wb("presets", "copy", "cpu-small", "fast", "--set", "train.max_iters=500", cwd=tmp_path, check=True)
    made = tmp_path / "presets" / "fast.toml"
    assert made.exists() and "max_iters = 500" in made.read_text()
    before = made.read_bytes()
    cp = wb("presets", "copy", "medium", "fast", cwd=tmp_path)
    assert cp.returncode == 2 and "already exists" in cp.stderr
    assert made.read_bytes() == before


def test_presets_validate_reports_each_file(tmp_path):
    good, bad = tmp_path / "good.toml", tmp_path / "bad.toml"
    good.write_text("[train]\nmax_iters = 10\nwarmup_iters = 2\n")
    bad.write_text("[train]\nmax_iters = 10\nwarmup_iters = 20\n")
    cp = wb("presets", "validate", str(good), str(bad))
    assert cp.returncode == 1
    assert f"ok: {good}" in cp.stdout and "train.warmup_iters = 20 must be < train.max_iters = 10" in cp.stdout
    assert wb("presets", "validate", cwd=REPO).returncode == 0


def test_in_a_checkouts_root_a_users_presets_go_to_presets_user_not_among_the_shipped(tmp_path, monkeypatch):
    """Found walking the docs as a new user: from the checkout's root, where ./presets is the shipped folder,
    `sweep save-best` wrote into it, the preset listed as shipped and left in git's working tree."""
    from workbench.config.preset_files import preset_paths, shipped_presets_dir, user_presets_dir
    monkeypatch.delenv("WORKBENCH_PRESETS_DIR", raising=False)
    monkeypatch.chdir(REPO)
    assert shipped_presets_dir().resolve() == (REPO / "presets").resolve()
    assert user_presets_dir() == (REPO / "presets" / "user").resolve()
    assert all(kind == "shipped" and path.parent == REPO / "presets" for path, kind in preset_paths().values())
    monkeypatch.chdir(tmp_path)   # anywhere else: ./presets, as before
    assert user_presets_dir() == (tmp_path / "presets").resolve()
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "mine.toml").write_text((REPO / "presets" / "cpu-small.toml").read_text())
    assert preset_paths()["mine"] == ((tmp_path / "presets" / "mine.toml").resolve(), "user")
    monkeypatch.setenv("WORKBENCH_PRESETS_DIR", str(tmp_path / "elsewhere"))
    assert user_presets_dir() == (tmp_path / "elsewhere").resolve()
