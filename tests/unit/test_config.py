"""Settings as a user writes them: `--set` values, the precedence of the layers, presets, and `config` JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.common import SMOKE_CONFIG, assert_user_error, describe, run_trainer
from tideborn.config.load import load_settings
from tideborn.errors import UserError
from tideborn.trainer.cli import main


def settings_with(*overrides: str, **kwargs):
    return load_settings(None, overrides, **kwargs).settings


# -- --set typing ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("item", "section", "name", "expected"), [
    ("runtime.max_steps=7", "runtime", "max_steps", 7),
    ("optim.lr=1e-3", "optim", "lr", 0.001),
    ("optim.lr=2", "optim", "lr", 2.0),  # an integer given for a float setting
    ("optim.nesterov=false", "optim", "nesterov", False),
    ("runtime.compile=true", "runtime", "compile", True),
    ('runtime.device="cpu"', "runtime", "device", "cpu"),
    ("runtime.device=cpu", "runtime", "device", "cpu"),  # a bare word for a string setting
    ("runtime.out_dir=runs/a b", "runtime", "out_dir", "runs/a b"),
    ('data.train=["a.hcpe","b.hcpe"]', "data", "train", ("a.hcpe", "b.hcpe")),
    ("optim.betas=[0.9, 0.99]", "optim", "betas", (0.9, 0.99)),
    ("optim.decay_steps=[10, 20]", "optim", "decay_steps", (10, 20)),
    (" optim.lr = 0.25 ", "optim", "lr", 0.25),
])
def test_set_values_are_typed_by_the_setting(item: str, section: str, name: str, expected: object,
                                            workdir: Path) -> None:
    value = getattr(getattr(settings_with(item), section), name)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(("item", "message"), [
    ("optim.lr=fast", r"--set optim\.lr=fast: 'fast' is not a TOML value .*strings need quotes"),
    ("optim.lr=1e-", r"'1e-' is not a TOML value"),
    ("optim.betas=[0.9,", r"'\[0\.9,' is not a TOML value"),
    ("runtime.max_steps=abc", r"'abc' is not a TOML value"),
    ('runtime.max_steps="7"', r"runtime\.max_steps expects an integer, got \"7\" \(a string\)"),
    ("runtime.max_steps=7.5", r"runtime\.max_steps expects an integer, got 7\.5 \(a number\)"),
    ("optim.nesterov=1", r"optim\.nesterov expects a boolean \(true/false\), got 1 \(an integer\)"),
    ("optim.lr=true", r"optim\.lr expects a number, got true \(a boolean\)"),
    ("runtime.device=1", r"runtime\.device expects a string, got 1 \(an integer\)"),
    ("data.train=a.hcpe", r"'a\.hcpe' is not a TOML value"),  # a list setting takes no bare words
    ('data.train="a.hcpe"', r"data\.train expects a list of strings, got \"a\.hcpe\" \(a string\)"),
    ("optim.betas=[0.9]", r"optim\.betas expects a list of 2 numbers, got \[0\.9\]"),
    ('optim.betas=[0.9, "x"]', r"optim\.betas expects a list of 2 numbers"),
    ("optim.decay_steps=[1.5]", r"optim\.decay_steps expects a list of integers"),
    ("optim.lr", r"--set optim\.lr: expected section\.key=value"),
    ("lr=0.1", r"--set lr=0\.1: expected a dotted key section\.key"),
    ("optim.lr.x=1", r"expected a dotted key"),
])
def test_bad_set_values_are_refused_with_the_key_and_what_was_expected(item: str, message: str,
                                                                       workdir: Path) -> None:
    with pytest.raises(UserError, match=message):
        settings_with(item)


def test_validation_errors_name_the_key_and_where_the_value_came_from(workdir: Path) -> None:
    with pytest.raises(UserError, match=r"^optim\.lr must be > 0; got -1\.0 \(from --set optim\.lr=-1\)$"):
        settings_with("optim.lr=-1")


# -- precedence -----------------------------------------------------------------------------------

def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_precedence_defaults_then_project_file_then_config_then_set(workdir: Path) -> None:
    write(workdir / "tideborn.toml", "[optim]\nlr = 0.2\nweight_decay = 0.001\nbatch_size = 32\n"
                                     "[runtime]\nmax_steps = 50\n")
    config = write(workdir / "run.toml", "[optim]\nlr = 0.3\nbatch_size = 16\n")

    resolved = load_settings(config, ["optim.lr=0.4"], environ={}, cwd=workdir)
    s = resolved.settings

    assert s.optim.lr == 0.4                    # --set beats everything
    assert s.optim.batch_size == 16             # --config beats tideborn.toml
    assert s.optim.weight_decay == 0.001        # tideborn.toml beats the defaults
    assert s.runtime.max_steps == 50
    assert s.optim.momentum == 0.9              # the default where nobody says otherwise
    assert resolved.project_file == workdir / "tideborn.toml"
    assert resolved.sources["optim.lr"] == "--set optim.lr=0.4"
    assert resolved.sources["optim.batch_size"] == str(config)
    assert resolved.sources["optim.weight_decay"] == str(workdir / "tideborn.toml")
    assert resolved.sources["optim.momentum"] == "the defaults"


def test_project_file_named_by_the_environment_wins_and_its_paths_resolve_against_its_dir(
        workdir: Path, tmp_path: Path) -> None:
    write(workdir / "tideborn.toml", "[optim]\nlr = 0.2\n")  # ignored: the environment names another
    project = write(tmp_path / "elsewhere" / "proj.toml",
                    '[paths]\ndata_root = "data"\nruns_root = "../runs"\n[optim]\nlr = 0.3\n')

    resolved = load_settings(None, [], environ={"TIDEBORN_PROJECT_FILE": str(project)}, cwd=workdir)

    assert resolved.project_file == project
    assert resolved.settings.optim.lr == 0.3
    assert Path(resolved.settings.paths.data_root) == (tmp_path / "elsewhere" / "data").resolve()
    assert Path(resolved.settings.paths.runs_root).resolve() == (tmp_path / "runs").resolve()


def test_project_file_in_the_current_directory_is_used_when_the_environment_names_none(workdir: Path) -> None:
    write(workdir / "tideborn.toml", '[paths]\nruns_root = "/abs/runs"\ndata_root = "teacher"\n')
    s = load_settings(None, [], environ={}, cwd=workdir).settings
    assert s.paths.runs_root == "/abs/runs"  # absolute paths stay as written
    assert Path(s.paths.data_root) == (workdir / "teacher").resolve()


def test_a_project_file_named_by_the_environment_must_exist(workdir: Path) -> None:
    with pytest.raises(UserError, match=r"TIDEBORN_PROJECT_FILE=.*nope\.toml: no such file"):
        load_settings(None, [], environ={"TIDEBORN_PROJECT_FILE": str(workdir / "nope.toml")}, cwd=workdir)


def test_project_file_values_apply_to_the_real_config_command(workdir: Path) -> None:
    """The CLI reads the project file from the environment too, end to end in a real process."""
    project = write(workdir / "proj" / "tideborn.toml", '[paths]\nruns_root = "runs"\n[optim]\nlr = 0.125\n')
    result = run_trainer("config", "--config", str(SMOKE_CONFIG), cwd=workdir,
                         env={"TIDEBORN_PROJECT_FILE": str(project)})
    assert result.returncode == 0, describe(result)
    printed = json.loads(result.stdout)
    assert printed["optim"]["lr"] == 0.05  # smoke.toml sets lr, and --config beats tideborn.toml
    assert printed["optim"]["weight_decay"] == 1e-4
    assert printed["paths"]["runs_root"] == str((workdir / "proj" / "runs").resolve())


def test_network_preset_sets_model_fields(workdir: Path) -> None:
    s = load_settings(None, [], {"network": "resnet5x64"}, environ={}).settings
    assert (s.model.blocks, s.model.channels) == (5, 64)
    assert s.run.network == "resnet5x64"


def test_explicit_model_fields_in_the_config_beat_the_preset(workdir: Path) -> None:
    config = write(workdir / "run.toml", '[run]\nnetwork = "resnet5x64"\n[model]\nchannels = 48\n')
    resolved = load_settings(config, [], environ={}, cwd=workdir)
    assert (resolved.settings.model.blocks, resolved.settings.model.channels) == (5, 48)
    assert resolved.sources["model.blocks"] == "network preset resnet5x64"
    assert resolved.sources["model.channels"] == str(config)


def test_network_flag_beats_the_configs_preset_and_set_beats_both(workdir: Path) -> None:
    s = load_settings(SMOKE_CONFIG, ["model.blocks=3"], {"network": "resnet10x192"}, environ={}).settings
    assert (s.model.blocks, s.model.channels) == (3, 192)


# -- config JSON ----------------------------------------------------------------------------------

def config_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["config", *argv]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return out


def test_config_json_fed_back_as_config_gives_identical_json(workdir: Path, capsys) -> None:
    first = config_json(["--config", str(SMOKE_CONFIG), "--set", "optim.lr=1e-3", "--set",
                         'data.train=["a.hcpe","b.hcpe"]', "--set", "optim.betas=[0.9, 0.99]",
                         "--set", "runtime.out_dir=runs/x", "--network", "resnet5x64"], capsys)
    (workdir / "out.json").write_text(first)
    second = config_json(["--config", "out.json"], capsys)

    assert second == first
    printed = json.loads(first)
    assert printed["optim"]["lr"] == 0.001
    assert printed["data"]["train"] == ["a.hcpe", "b.hcpe"]
    assert printed["optim"]["betas"] == [0.9, 0.99]
    assert printed["model"]["blocks"] == 5
    assert printed["runtime"]["out_dir"] == "runs/x"


def test_config_json_round_trip_through_the_console_script(workdir: Path) -> None:
    first = run_trainer("config", "--config", str(SMOKE_CONFIG), "--set", "optim.accumulation_steps=4",
                        cwd=workdir, script=True)
    assert first.returncode == 0 and first.stderr == "", describe(first)
    (workdir / "out.json").write_text(first.stdout)
    second = run_trainer("config", "--config", "out.json", cwd=workdir, script=True)
    assert second.returncode == 0, describe(second)
    assert second.stdout == first.stdout
    assert json.loads(second.stdout)["optim"]["accumulation_steps"] == 4


def test_config_from_checkpoint_prints_the_settings_it_was_trained_with(template_run: Path, workdir: Path,
                                                                       capsys) -> None:
    from tideborn.network.checkpoint import load_checkpoint

    checkpoint = template_run / "step-000000004.pt"
    printed = json.loads(config_json(["--from-checkpoint", str(checkpoint)], capsys))

    assert printed == load_checkpoint(checkpoint)["settings"]
    assert printed["runtime"]["max_steps"] == 4
    assert printed["runtime"]["out_dir"] == str(template_run)
    assert printed["run"]["network"] == "resnet2x32"


def test_config_from_checkpoint_takes_no_other_settings(template_run: Path, workdir: Path, capsys) -> None:
    rc = main(["config", "--from-checkpoint", str(template_run / "step-000000004.pt"), "--set", "optim.lr=1"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert_user_error(err, r"--from-checkpoint prints the checkpoint's own settings; it takes no --config, --set")


def test_config_from_a_missing_checkpoint_is_a_user_error(workdir: Path, capsys) -> None:
    rc = main(["config", "--from-checkpoint", "gone.pt"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert_user_error(err, r"gone\.pt: no such checkpoint")
