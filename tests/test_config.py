"""Config models, TOML loading, ``--set`` overrides, flags and one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlperf.config import (
    Config,
    apply_overrides,
    config_from,
    config_to_dict,
    flat_keys,
    load_config,
    loads_config,
    packaged_configs,
    to_toml,
)
from rlperf.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
SHIPPED = ["ci", "classic", "default", "fast", "naive", "smoke"]


def config_error(fn, *args, **kwargs) -> str:
    """Call ``fn``, expect a ConfigError, and return its text after checking it is one line."""
    with pytest.raises(ConfigError) as info:
        fn(*args, **kwargs)
    text = str(info.value)
    assert "\n" not in text, text
    return text


@pytest.fixture
def default() -> Config:
    return load_config(None)


# --- defaults and shipped configs -------------------------------------------------------------


def test_model_defaults_validate() -> None:
    cfg = Config()
    assert cfg.env.num_envs == 256 and cfg.agent.hidden == [256, 256] and cfg.async_.actors == 2
    # A bare Config has no stop condition; the loaders insist on one.
    assert cfg.train.episodes == 0 and cfg.train.steps == 0


def test_default_is_the_packaged_default(default: Config) -> None:
    assert default == load_config("default") == load_config(REPO / "configs" / "default.toml")
    assert default.train.episodes == 5000 and default.train.steps == 0
    assert default.env.num_envs == 256 and default.buffer.push == "batch" and default.buffer.storage == "tensor"


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_configs_load(name: str) -> None:
    assert load_config(REPO / "configs" / f"{name}.toml") == load_config(name)


def test_repo_configs_equal_packaged_copies() -> None:
    packaged = REPO / "rlperf" / "configs"
    assert sorted(packaged_configs()) == SHIPPED
    assert sorted(p.name for p in (REPO / "configs").glob("*.toml")) == [f"{n}.toml" for n in SHIPPED]
    for name in SHIPPED:
        assert (REPO / "configs" / f"{name}.toml").read_bytes() == (packaged / f"{name}.toml").read_bytes(), name


def test_naive_and_fast_differ_only_in_the_knobs() -> None:
    naive, fast = flat_keys(load_config("naive")), flat_keys(load_config("fast"))
    # seed 001 §2: num_envs/4 updates per vector step, and the fix (1-4)
    assert (naive["train.train_ratio"], fast["train.train_ratio"]) == (64, 4)
    assert naive["env.num_envs"] == fast["env.num_envs"] == 256
    assert (naive["buffer.push"], fast["buffer.push"]) == ("loop", "batch")
    assert (naive["buffer.storage"], fast["buffer.storage"]) == ("list", "tensor")
    assert (naive["env.flood_fill"], fast["env.flood_fill"]) == ("bfs", "tensor")
    assert (naive["agent.target_update"], fast["agent.target_update"]) == ("hard", "soft")
    assert (naive["agent.inference"], fast["agent.inference"]) == ("grad", "no_grad")
    assert (naive["train.log_every"], fast["train.log_every"]) == (1, 100)


def test_smoke_is_small() -> None:
    cfg = load_config("smoke")
    assert cfg.train.steps == 2000 and cfg.train.episodes == 0
    assert cfg.env.num_envs == 16 and cfg.env.size == 6 and cfg.agent.hidden == [32, 32]


# --- overrides ----------------------------------------------------------------------------------


def test_overrides_of_each_type(default: Config) -> None:
    cfg = apply_overrides(
        default,
        [
            "env.num_envs=64",
            "train.train_ratio=0.25",
            "agent.double=false",
            "agent.hidden=[128, 128]",
            'env.obs="grid"',
            "buffer.push=loop",
            "run.device = cuda:1",
        ],
    )
    assert cfg.env.num_envs == 64
    assert cfg.train.train_ratio == 0.25
    assert cfg.agent.double is False
    assert cfg.agent.hidden == [128, 128]
    assert cfg.env.obs == "grid"
    assert cfg.buffer.push == "loop"
    assert cfg.run.device == "cuda:1"
    assert default.env.num_envs == 256, "the input config is not modified"


def test_int_is_accepted_for_a_float(default: Config) -> None:
    assert apply_overrides(default, ["train.train_ratio=4"]).train.train_ratio == 4.0


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("agent.gama=0.9", "did you mean 'agent.gamma'?"),
        ("bufer.push=loop", "did you mean 'buffer.push'?"),
        ("train.lr=1e-3", "did you mean 'agent.lr'?"),
    ],
)
def test_unknown_key_suggests(default: Config, override: str, expected: str) -> None:
    assert expected in config_error(apply_overrides, default, [override])


@pytest.mark.parametrize(
    ("override", "names"),
    [
        ("env.num_envs=0", ["env.num_envs", "0", "greater than or equal to 1"]),
        ("env.size=3", ["env.size", "3", "greater than or equal to 4"]),
        ("env.size=65", ["env.size", "65", "less than or equal to 64"]),
        ("train.train_ratio=-1", ["train.train_ratio", "-1", "greater than or equal to 0"]),
        ("buffer.capacity=100", ["buffer.capacity", "buffer.batch_size", "100", "128"]),
        ("env.initial_length=11", ["env.initial_length", "env.size", "11"]),
        ("agent.eps_end=2", ["agent.eps_end", "2", "less than or equal to 1"]),
        ("agent.gamma=0", ["agent.gamma", "greater than 0"]),
        ("buffer.push=fast", ["buffer.push", '"fast"', "'loop' or 'batch'"]),
        ("env.num_envs=many", ["env.num_envs", '"many"', "valid integer"]),
        ("train.checkpoint=1", ["train.checkpoint", "valid boolean"]),
        ("agent.hidden=[64, 0]", ["agent.hidden", "greater than or equal to 1"]),
        ("agent.hidden=[]", ["agent.hidden", "at least 1"]),
        ("run.device=gpu", ["run.device", '"gpu"', "cuda:N"]),
        ("train.train_ratio=inf", ["train.train_ratio", "finite"]),
        ("train.compile=fastest", ["train.compile", "'reduce-overhead'"]),
    ],
)
def test_bad_values_name_key_value_and_allowed(default: Config, override: str, names: list[str]) -> None:
    text = config_error(apply_overrides, default, [override])
    for name in names:
        assert name in text, (name, text)


def descriptions() -> dict[str, str]:
    """Every "section.key" with its description, read from the models."""
    sections = {(info.alias or name): info.annotation for name, info in Config.model_fields.items()}
    return {f"{s}.{k}": f.description or "" for s, model in sections.items() for k, f in model.model_fields.items()}


def test_value_error_hint_is_the_description(default: Config) -> None:
    text = config_error(apply_overrides, default, ["env.num_envs=0"])
    assert descriptions()["env.num_envs"] in text


@pytest.mark.parametrize("override", ["env.num_envs", "envnum_envs=3", "env.=3", "a.b.c=1"])
def test_malformed_overrides(default: Config, override: str) -> None:
    assert "section.key" in config_error(apply_overrides, default, [override])


def test_overrides_validate_together(default: Config) -> None:
    # One at a time each would break capacity ≥ batch_size; together they are fine.
    cfg = apply_overrides(default, ["buffer.batch_size=512", "buffer.capacity=1000", "train.learning_starts=1000"])
    assert (cfg.buffer.capacity, cfg.buffer.batch_size) == (1000, 512)


def test_device_form_is_normalized(default: Config) -> None:
    assert apply_overrides(default, ["run.device=CUDA"]).run.device == "cuda"


# --- stop condition and flags --------------------------------------------------------------------


def test_both_stop_conditions_zero(default: Config) -> None:
    text = config_error(apply_overrides, default, ["train.episodes=0"])
    assert "train.episodes" in text and "train.steps" in text


def test_flags_replace_the_stop_condition() -> None:
    by_steps = config_from(None, steps=1000)
    assert (by_steps.train.episodes, by_steps.train.steps) == (0, 1000)
    by_episodes = config_from("smoke", episodes=50)
    assert (by_episodes.train.episodes, by_episodes.train.steps) == (50, 0)
    both = config_from(None, episodes=10, steps=20)
    assert (both.train.episodes, both.train.steps) == (10, 20)


def test_flags_and_overrides() -> None:
    cfg = config_from(
        "smoke", ["buffer.push=loop"], envs=8, train_ratio=0.5, device="cpu", seed=7, episodes=None, steps=None
    )
    assert cfg.env.num_envs == 8 and cfg.train.train_ratio == 0.5 and cfg.run.device == "cpu" and cfg.run.seed == 7
    assert cfg.buffer.push == "loop"
    assert (cfg.train.episodes, cfg.train.steps) == (0, 2000), "None flags change nothing"


def test_flag_fixes_a_file_without_stop_condition(tmp_path: Path) -> None:
    path = tmp_path / "nostop.toml"
    path.write_text("[env]\nnum_envs = 4\n")
    assert "no stop condition" in config_error(load_config, path)
    assert config_from(path, steps=100).train.steps == 100


def test_flag_values_are_validated() -> None:
    assert "env.num_envs" in config_error(config_from, None, envs=0)


def test_unknown_flag_is_a_programming_error() -> None:
    with pytest.raises(TypeError):
        config_from(None, env=3)


# --- files ---------------------------------------------------------------------------------------


def test_missing_file() -> None:
    text = config_error(load_config, "no/such/config.toml")
    assert "no/such/config.toml" in text and "smoke" in text


def test_unknown_bare_name() -> None:
    assert "nosuchconfig" in config_error(load_config, "nosuchconfig")


def test_malformed_toml_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[run]\nseed = 1\n[env]\nnum_envs = = 3\n")
    text = config_error(load_config, path)
    assert str(path) in text and "line 4" in text


def test_wrong_type_in_file_names_file(tmp_path: Path) -> None:
    path = tmp_path / "types.toml"
    path.write_text('[env]\nnum_envs = "256"\n[train]\nsteps = 10\n')
    text = config_error(load_config, path)
    assert str(path) in text and "env.num_envs" in text


def test_unknown_key_in_file(tmp_path: Path) -> None:
    path = tmp_path / "typo.toml"
    path.write_text("[agent]\ngama = 0.9\n[train]\nsteps = 10\n")
    text = config_error(load_config, path)
    assert str(path) in text and "did you mean 'agent.gamma'?" in text


def test_key_outside_any_section(tmp_path: Path) -> None:
    path = tmp_path / "flat.toml"
    path.write_text("seed = 1\n")
    assert "did you mean 'run.seed'?" in config_error(load_config, path)


def test_section_that_is_not_a_table() -> None:
    assert "[run]" in config_error(loads_config, "run = 3\n[train]\nsteps = 1\n")


def test_partial_file_takes_model_defaults(tmp_path: Path) -> None:
    path = tmp_path / "steps.toml"
    path.write_text("[train]\nsteps = 500\n")
    cfg = load_config(path)
    assert (cfg.train.episodes, cfg.train.steps) == (0, 500), "default.toml's episodes are not inherited"


# --- dumping and the async alias -----------------------------------------------------------------


@pytest.mark.parametrize("name", SHIPPED)
def test_round_trip(name: str) -> None:
    cfg = apply_overrides(load_config(name), ["async.actors=3", "agent.hidden=[8]"])
    assert loads_config(to_toml(cfg)) == cfg


def test_async_alias_both_ways(default: Config) -> None:
    cfg = loads_config("[async]\nactors = 4\nbuffer = \"locked\"\n[train]\nsteps = 1\n")
    assert cfg.async_.actors == 4 and cfg.async_.buffer == "locked"
    cfg = apply_overrides(cfg, ["async.actors=2", "async.wait=sleep"])
    assert cfg.async_.actors == 2 and cfg.async_.wait == "sleep"
    text = to_toml(cfg)
    assert "[async]" in text and "async_" not in text
    assert "async" in config_to_dict(cfg) and flat_keys(cfg)["async.actors"] == 2
    assert "did you mean 'async.actors'?" in config_error(apply_overrides, default, ["async_.actors=2"])


def test_flat_keys_cover_every_field(default: Config) -> None:
    keys = flat_keys(default)
    assert set(keys) == set(descriptions())
    assert keys["env.num_envs"] == 256 and keys["agent.hidden"] == [64, 64]
    assert all(descriptions().values()), "every field has a description"


# --- ε decay: absolute steps or a fraction of the run ------------------------------------------


def test_eps_decay_fraction_applies_when_the_run_length_is_known() -> None:
    from rlperf.dqn import eps_decay_steps, epsilon_at

    by_steps = config_from(None, steps=30_000)  # default.toml: eps_decay_fraction = 0.25
    assert by_steps.agent.eps_decay_fraction == 0.25 and eps_decay_steps(by_steps) == 7_500
    assert epsilon_at(by_steps, 0) == 1.0 and epsilon_at(by_steps, 7_500) == pytest.approx(by_steps.agent.eps_end)
    by_episodes = config_from(None)  # 5000 episodes: the length in env steps is unknown
    assert eps_decay_steps(by_episodes) == 40_000
    # Absolute steps alone switch the fraction off (as --episodes alone clears --steps)...
    absolute = config_from(None, ["agent.eps_decay_steps=20000"], steps=30_000)
    assert absolute.agent.eps_decay_fraction == 0.0 and eps_decay_steps(absolute) == 20_000
    # ...and both given keep both.
    both = config_from(None, ["agent.eps_decay_steps=20000", "agent.eps_decay_fraction=0.5"], steps=30_000)
    assert eps_decay_steps(both) == 15_000
    assert "agent.eps_decay_fraction" in config_error(config_from, None, ["agent.eps_decay_fraction=1.5"])
