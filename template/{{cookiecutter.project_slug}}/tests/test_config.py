import pytest

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.config import (
    DEFAULT_PRESET,
    Config,
    command_settings,
    parse_args,
    typed_settings,
)
from {{ cookiecutter.package_name }}.errors import ConfigError


def test_no_arguments_give_the_default_preset():
    assert parse_args([]) == Config.for_preset(DEFAULT_PRESET)


def test_shakespeare_char_preset_with_nanogpts_recipe_is_nanogpts():
    cfg = Config.for_preset("shakespeare_char", "nanogpt")
    shape = (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size, cfg.batch_size)
    assert shape == (6, 6, 384, 256, 64)
    assert (cfg.dropout, cfg.learning_rate, cfg.beta2) == (0.2, 1e-3, 0.99)
    assert (cfg.max_iters, cfg.warmup_iters, cfg.lr_decay_steps) == (5000, 100, 5000)
    assert cfg.optimizer == "adamw"
    assert parse_args(["--preset=shakespeare_char", "--recipe=nanogpt"]) == cfg


def test_the_fast_recipe_is_the_default_where_it_measured_faster():
    fast = parse_args(["--preset=shakespeare_char"])
    assert fast.recipe == "fast"
    assert (fast.optimizer, fast.max_iters, fast.lr_decay_steps) == ("muon", 1250, 1250)
    # the train split on 20 batches; the val split, which decides stops, on all
    assert (fast.eval_batches("train"), fast.eval_batches("val")) == (20, 200)
    # uncompiled: on CUDA each step is replayed as a graph instead
    assert (fast.compile, fast.train_graph) == ("false", "auto")
    # the model and the rest of nanoGPT's settings stay the preset's
    nanogpt = Config.for_preset("shakespeare_char", "nanogpt")
    assert (fast.n_layer, fast.dropout, fast.learning_rate) == (6, 0.2, 1e-3)
    assert fast == Config.for_preset("shakespeare_char")
    assert fast != nanogpt
    # presets without a faster recipe are the same under both
    for preset in ("tiny", "gpt2"):
        assert Config.for_preset(preset, "fast").to_dict() | {"recipe": "x"} == (
            Config.for_preset(preset, "nanogpt").to_dict() | {"recipe": "x"}
        )
    # settings typed win over the recipe
    typed = parse_args(["--preset=shakespeare_char", "--optimizer=adamw"])
    assert (typed.optimizer, typed.max_iters) == ("adamw", 1250)


def test_an_unknown_recipe_names_the_known_ones():
    with pytest.raises(
        ConfigError, match=r"unknown recipe 'quick' \(known: fast, nanogpt\)"
    ):
        parse_args(["--recipe=quick"])


def test_typing_a_recipe_counts_what_it_sets_as_typed():
    typed = typed_settings(["--preset=shakespeare_char", "--recipe=nanogpt"])
    assert {"recipe", "optimizer", "max_iters", "lr_decay_iters"} <= typed


def test_overrides_take_the_type_of_the_setting():
    cfg = parse_args(["--max_iters=7", "--dropout=0.5", "--bias=true", "--start=a=b"])
    assert (cfg.max_iters, cfg.dropout, cfg.bias, cfg.start) == (7, 0.5, True, "a=b")


def test_overrides_apply_on_top_of_the_chosen_preset():
    cfg = parse_args(["--n_layer=3", "--preset=shakespeare_char"])
    assert (cfg.preset, cfg.n_layer, cfg.n_embd) == ("shakespeare_char", 3, 384)


def test_dashes_in_keys_work_like_underscores():
    assert parse_args(["--max-iters=3"]).max_iters == 3


def test_an_unknown_key_is_refused_with_the_closest_names():
    with pytest.raises(
        ConfigError,
        match=r"--max_iter: unknown setting 'max_iter'.*"
        r"did you mean 'max_iters'",
    ):
        parse_args(["--max_iter=5"])


def test_a_value_of_the_wrong_type_names_the_argument():
    with pytest.raises(ConfigError, match=r"--batch_size=abc on the command line"):
        parse_args(["--batch_size=abc"])


def test_an_out_of_range_value_says_where_it_came_from():
    with pytest.raises(
        ConfigError,
        match=r"n_embd=100 \(--n_embd=100 on the command line\): "
        r"must be divisible by n_head=3",
    ):
        parse_args(["--n_head=3", "--n_embd=100"])


def test_an_unknown_preset_lists_the_presets():
    with pytest.raises(
        ConfigError, match="unknown preset 'shakespeare'.*shakespeare_char"
    ):
        parse_args(["--preset=shakespeare"])


def test_an_argument_without_a_value_is_refused():
    with pytest.raises(ConfigError, match="not of the form --key=value"):
        parse_args(["--bias"])


def help_of(command, capsys) -> list[str]:
    assert main([command, "--help"]) == 0
    return capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("command", ["prepare", "train", "sample", "bench"])
def test_help_lists_the_commands_settings_in_two_aligned_columns(command, capsys):
    header, *lines = help_of(command, capsys)
    assert header.startswith(f"settings for `{command}`")
    settings = [line.split()[0] for line in lines if line.startswith("  --")]
    assert [s.split("=")[0][2:] for s in settings] == list(command_settings(command))
    # Every help text, and every wrapped line of one, starts in one column.
    starts = {len(line) - len(line[2:].split(maxsplit=1)[1]) for line in lines
              if line.startswith("  --")}  # fmt: skip
    starts |= {len(line) - len(line.lstrip()) for line in lines
               if not line.startswith("  --")}  # fmt: skip
    assert len(starts) == 1, lines


def test_train_help_leaves_out_what_only_prepare_and_sample_read(capsys):
    out = "\n".join(help_of("train", capsys))
    assert "--max_iters=" in out and "--init_from=" in out
    for other in ("--input_file=", "--val_fraction=", "--start=", "--num_samples="):
        assert other not in out
    sample = "\n".join(help_of("sample", capsys))
    assert "--num_samples=" in sample and "--max_iters=" not in sample


def test_an_unknown_command_gets_a_suggestion(capsys):
    assert main(["trian"]) == 2
    assert "did you mean 'train'" in capsys.readouterr().err


def test_a_bad_setting_exits_with_the_message(capsys):
    assert main(["train", "--learning_rate=-1"]) == 2
    assert "learning_rate=-1.0" in capsys.readouterr().err


@pytest.mark.parametrize("setting", ["--patience=-1", "--target_val_loss=-0.5"])
def test_the_stopping_settings_refuse_negative_values(setting):
    name = setting[2:].split("=")[0]
    with pytest.raises(ConfigError, match=rf"{name}=.*: must not be negative"):
        parse_args([setting])
