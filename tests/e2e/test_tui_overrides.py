"""The override editor: every setting with value, docstring and origin; bad values rejected as typed,
by the `--set` parser and the settings' own checks; a diff against the base config; a saved TOML that
keeps the base file's comments and that `train` itself accepts."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from textual.widgets import DataTable, Input, Static

from tests.helpers.common import until
from tideborn.tui.app import create_app
from tideborn.tui.options import TuiOptions
from tideborn.tui.overrides import OverrideModel
from tideborn.tui.plan import LaunchPlan
from tideborn.tui.screens.confirm import ConfirmScreen
from tideborn.tui.screens.dashboard import DashboardScreen
from tideborn.tui.screens.override_editor import OverrideEditorScreen, SaveScreen

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """A directory with a copy of the smoke config and no project file in sight."""
    monkeypatch.delenv("TIDEBORN_PROJECT_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    shutil.copy(REPO / "configs" / "smoke.toml", tmp_path / "smoke.toml")
    return tmp_path


def plan_in(workdir: Path, *overrides: str) -> LaunchPlan:
    return LaunchPlan(config="smoke.toml", overrides=overrides, cwd=workdir)


def test_rows_cover_every_setting_with_doc_and_origin(workdir):
    model = OverrideModel(plan_in(workdir, "runtime.max_steps=40"))
    rows = {row.key: row for row in model.rows()}
    assert rows["optim.lr"].source == "config" and rows["optim.lr"].text == "0.05"
    assert rows["model.blocks"].source == "preset" and rows["model.blocks"].text == "2"
    assert rows["runtime.seed"].source == "default"
    assert rows["runtime.max_steps"].source == "override" and rows["runtime.max_steps"].base_text == "20"
    assert all(row.doc for row in rows.values()), [k for k, r in rows.items() if not r.doc]
    (workdir / "tideborn.toml").write_text("[runtime]\nseed = 7\n")
    assert {r.key: r for r in OverrideModel(plan_in(workdir)).rows()}["runtime.seed"].source == "tideborn.toml"


@pytest.mark.parametrize("key, text, message", [
    ("optim.lr", "fast", r"not a TOML value"),
    ("optim.lr", "-1", r"optim.lr must be > 0"),
    ("optim.lr", '"0.1"', r"expects a number"),
    ("optim.lrr", "0.1", r"did you mean optim.lr"),
    ("runtime.max_steps", "1.5", r"expects an integer"),
    ("optim.optimizer", "adam", r"must be one of sgd, adamw"),
])
def test_bad_values_are_rejected_with_the_reason(workdir, key, text, message):
    model = OverrideModel(plan_in(workdir))
    problem = model.check(key, text)
    assert problem is not None and re.search(message, problem), problem
    assert model.apply(key, text) == problem
    assert model.plan.overrides == ()


def test_an_edit_equal_to_the_base_drops_the_override(workdir):
    model = OverrideModel(plan_in(workdir))
    assert model.apply("optim.lr", "0.01") is None
    assert model.diff() == [("optim.lr", "0.05", "0.01")]
    assert model.apply("runtime.device", "cpu") is None  # a bare word for a string, as --set allows
    assert model.apply("optim.lr", "0.05") is None
    assert model.plan.overrides == () and model.diff() == []


def test_saved_toml_keeps_comments_and_train_accepts_it(workdir):
    model = OverrideModel(plan_in(workdir, "runtime.max_steps=40", "optim.betas=[0.8, 0.95]", "loss.value_lambda=0.5"))
    saved = model.save(Path("edited.toml"))
    text = saved.read_text()
    assert "# Smoke run: a tiny network on synthetic data" in text  # the base file's comments
    assert 'device = "cpu"           # the same result on every machine' in text
    assert "max_steps = 40" in text and "[loss]" in text
    settings = trainer_config(saved, workdir)
    assert settings["runtime"]["max_steps"] == 40 and settings["optim"]["betas"] == [0.8, 0.95]
    assert settings["loss"]["value_lambda"] == 0.5 and settings["optim"]["lr"] == 0.05


def trainer_config(path: Path, cwd: Path) -> dict:
    """`python -m tideborn.trainer config --config PATH`: the trainer's own reading of the file."""
    result = subprocess.run([sys.executable, "-m", "tideborn.trainer", "config", "--config", str(path)], cwd=cwd,
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


async def open_editor(pilot) -> OverrideEditorScreen:
    dashboard = pilot.app.screen
    assert isinstance(dashboard, DashboardScreen)
    await until(pilot, dashboard.ready.is_set, "the dashboard")
    await pilot.press("e")
    await until(pilot, lambda: isinstance(pilot.app.screen, OverrideEditorScreen), "the editor")
    await pilot.pause()
    return pilot.app.screen


async def edit(pilot, editor: OverrideEditorScreen, key: str, text: str) -> None:
    table = editor.query_one("#settings", DataTable)
    table.move_cursor(row=table.get_row_index(key))
    await pilot.press("enter")
    field = editor.query_one("#value", Input)
    assert field.has_focus
    field.value = ""
    await pilot.press(*text)


async def test_editor_validates_as_you_type_then_saves_a_file_train_accepts(workdir):
    run_dir = workdir / "runs" / "new"
    options = TuiOptions(run_dir=run_dir, plan=plan_in(workdir), use_nvml=False, follow=False)
    app = create_app(options)
    async with app.run_test(size=(100, 32)) as pilot:
        editor = await open_editor(pilot)
        table = editor.query_one("#settings", DataTable)
        assert table.row_count > 40
        await edit(pilot, editor, "optim.lr", "-2")
        error = editor.query_one("#error", Static)
        assert "optim.lr must be > 0" in str(error.render())
        assert editor.query_one("#value", Input).has_class("-invalid")
        await pilot.press("enter")  # not taken: the field keeps focus and the plan is unchanged
        assert editor.editing == "optim.lr"
        assert editor.model.plan.override_of("optim.lr") is None
        editor.query_one("#value", Input).value = ""
        await pilot.press(*"0.02")
        assert str(error.render()) == "ok"
        await pilot.press("enter")
        assert editor.editing is None and table.has_focus
        assert editor.model.plan.override_of("optim.lr") == "0.02"
        diff = str(editor.query_one("#diff", Static).render())
        assert "optim.lr: 0.05" in diff and "0.02" in diff
        await edit(pilot, editor, "runtime.max_steps", "33")
        await pilot.press("enter")
        await pilot.press("ctrl+o")
        await until(pilot, lambda: isinstance(pilot.app.screen, SaveScreen), "the save dialog")
        path_field = pilot.app.screen.query_one("#save-path", Input)
        assert path_field.value == "smoke-edited.toml"
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(pilot.app.screen, OverrideEditorScreen), "the save to finish")
        await pilot.press("escape")  # back to the dashboard, keeping the edits for the start key
        assert isinstance(pilot.app.screen, DashboardScreen)
        assert app.plan.override_of("optim.lr") == "0.02" and app.plan.override_of("runtime.max_steps") == "33"
    saved = workdir / "smoke-edited.toml"
    assert "# Smoke run" in saved.read_text()
    settings = trainer_config(saved, workdir)
    assert settings["optim"]["lr"] == 0.02 and settings["runtime"]["max_steps"] == 33
    assert settings["runtime"]["out_dir"] == str(run_dir.resolve())  # aimed at the run the TUI shows


async def test_editor_drop_key_removes_an_override_and_escape_cancels_an_edit(workdir):
    options = TuiOptions(run_dir=workdir / "r", plan=plan_in(workdir, "optim.lr=0.3"), use_nvml=False, follow=False)
    async with create_app(options).run_test(size=(100, 32)) as pilot:
        editor = await open_editor(pilot)
        await edit(pilot, editor, "runtime.seed", "5")
        await pilot.press("escape")
        assert editor.editing is None and editor.model.plan.override_of("runtime.seed") is None
        table = editor.query_one("#settings", DataTable)
        table.move_cursor(row=table.get_row_index("optim.lr"))
        await pilot.press("d")
        assert editor.model.plan.override_of("optim.lr") is None


async def test_editor_launch_key_starts_the_run_with_the_edits(workdir, monkeypatch):
    """Ctrl+R hands the edited plan, once confirmed, to runcontrol.launch_run, aimed at the run the TUI shows."""
    import tideborn.tui.screens.dashboard as dashboard_module

    asked = []

    def fake_launch(request, cwd=None, env=None):
        asked.append((request, cwd))
        raise dashboard_module.UserError("not launching in a test")

    monkeypatch.setattr(dashboard_module, "launch_run", fake_launch)
    run_dir = workdir / "runs" / "edited"
    options = TuiOptions(run_dir=run_dir, plan=plan_in(workdir), use_nvml=False, follow=False)
    async with create_app(options).run_test(size=(100, 32)) as pilot:
        editor = await open_editor(pilot)
        await edit(pilot, editor, "optim.lr", "0.03")
        await pilot.press("enter", "ctrl+r")
        await until(pilot, lambda: isinstance(pilot.app.screen, ConfirmScreen), "the start confirmation")
        assert "optim.lr=0.03" in pilot.app.screen.question
        await pilot.press("y")
        await until(pilot, lambda: asked, "the launch")
    request, cwd = asked[0]
    assert cwd == workdir and request.config == "smoke.toml"
    assert "optim.lr=0.03" in request.overrides
    assert f"runtime.out_dir={json.dumps(str(run_dir.resolve()))}" in request.overrides


def test_a_distributed_launch_is_started_again_through_torchrun(tmp_path):
    import json as _json

    from tideborn.tui.options import parse_options
    from tideborn.tui.plan import LaunchPlan

    options = parse_options(["--config", "configs/smoke.toml", "--nproc-per-node", "2"], cwd=tmp_path)
    assert options.plan.request().trainer_argv()[1:6] == ["-m", "torch.distributed.run", "--standalone",
                                                           "--nproc-per-node", "2"]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "launch.json").write_text(_json.dumps({"config": "configs/smoke.toml", "overrides": [],
                                                      "flags": {}, "nproc_per_node": 2, "cwd": str(tmp_path)}))
    assert LaunchPlan.from_launch_file(run_dir).request().nproc_per_node == 2


# -- the editor's traps ---------------------------------------------------------------------------------

async def test_cursor_moves_resolve_no_settings_and_queued_keys_edit_the_row_they_reached(workdir, monkeypatch):
    options = TuiOptions(run_dir=workdir / "r", plan=plan_in(workdir), use_nvml=False, follow=False)
    async with create_app(options).run_test(size=(100, 32)) as pilot:
        editor = await open_editor(pilot)
        table = editor.query_one("#settings", DataTable)
        calls = []
        real_rows = editor.model.rows
        monkeypatch.setattr(editor.model, "rows", lambda: calls.append(1) or real_rows())
        table.move_cursor(row=table.get_row_index("optim.lr"))
        await pilot.pause()
        keys = [k.value for k in table.rows]
        target = keys[keys.index("optim.lr") + 2]
        calls.clear()
        await pilot.press("down", "down", "down", "up", "enter")  # queued: Enter edits the row reached
        assert editor.editing == target
        assert calls == []  # no row was looked up by resolving every setting again


async def test_slash_finds_a_setting_by_its_key(workdir):
    options = TuiOptions(run_dir=workdir / "r", plan=plan_in(workdir), use_nvml=False, follow=False)
    async with create_app(options).run_test(size=(100, 32)) as pilot:
        editor = await open_editor(pilot)
        await pilot.press("slash")
        await until(pilot, lambda: pilot.app.screen is not editor, "the search field")
        await pilot.press(*"max_steps", "enter")
        await until(pilot, lambda: pilot.app.screen is editor, "the search to end")
        assert editor._highlighted_key() == "runtime.max_steps"
        await pilot.press("slash")
        await until(pilot, lambda: pilot.app.screen is not editor, "the search field")
        pilot.app.screen.query_one(Input).value = "zzz-no-such"
        await pilot.press("enter")
        await until(pilot, lambda: pilot.app.screen is editor, "the search to end")
        assert editor._highlighted_key() == "runtime.max_steps"  # no match: the cursor stays


SEVEN_OK = {"optim.lr", "optim.warmup_steps", "optim.batch_size", "optim.grad_clip_norm",
            "optim.weight_decay", "optim.policy_entropy_beta", "loss.policy_weight", "loss.value_weight",
            "loss.value_lambda_decay_steps", "data.workers", "data.prefetch_batches", "data.eval_positions",
            "data.eval_scale", "model.blocks", "model.channels", "runtime.seed"}
"""Settings for which 7 is a valid value."""


async def test_the_table_keeps_its_place_after_an_edit(workdir):
    options = TuiOptions(run_dir=workdir / "r", plan=plan_in(workdir), use_nvml=False, follow=False)
    async with create_app(options).run_test(size=(100, 24)) as pilot:
        editor = await open_editor(pilot)
        table = editor.query_one("#settings", DataTable)
        keys = [k.value for k in table.rows]
        key = next(k for k in reversed(keys) if k and not k.startswith("[") and k.endswith("seed"))
        table.move_cursor(row=table.get_row_index(key))
        await pilot.pause()
        await pilot.press("pageup", "up", "up")  # the cursor now sits higher in the view than move_cursor puts it
        # Up to a setting (past a section's title row) that takes 7: where a page up lands depends on how
        # many settings there are, and 7 is out of range for some (optim.momentum).
        while editor._highlighted_key() not in SEVEN_OK:
            await pilot.press("up")
        await pilot.pause()
        row, scroll = table.cursor_row, table.scroll_y
        edited = editor._highlighted_key()
        assert scroll > 0
        await pilot.press("enter")
        editor.query_one("#value", Input).value = ""
        await pilot.press(*"7", "enter")
        await pilot.pause()
        assert editor.model.plan.override_of(edited) == "7"
        assert (table.cursor_row, table.scroll_y) == (row, scroll)
        assert "7" in str(table.get_cell(edited, "value"))


async def test_q_in_the_editor_asks_before_losing_edits(workdir):
    options = TuiOptions(run_dir=workdir / "r", plan=plan_in(workdir), use_nvml=False, follow=False)
    app = create_app(options)
    async with app.run_test(size=(100, 32)) as pilot:
        editor = await open_editor(pilot)
        await edit(pilot, editor, "runtime.seed", "5")
        await pilot.press("enter")
        await pilot.press("q")
        await until(pilot, lambda: isinstance(pilot.app.screen, ConfirmScreen), "the quit question")
        assert "runtime.seed" in pilot.app.screen.question
        await pilot.press("n")
        await until(pilot, lambda: pilot.app.screen is editor, "back in the editor")
        assert app.is_running and editor.model.plan.override_of("runtime.seed") == "5"
        await pilot.press("ctrl+o")
        await until(pilot, lambda: isinstance(pilot.app.screen, SaveScreen), "the save dialog")
        await pilot.press("enter")
        await until(pilot, lambda: pilot.app.screen is editor, "the save to finish")
        await pilot.press("q")  # saved: nothing to lose
        await until(pilot, lambda: not app.is_running, "the app to quit")
