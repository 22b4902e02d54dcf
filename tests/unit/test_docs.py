"""The settings reference in docs/training.md is generated from the schema and must be current."""

from pathlib import Path

from tideborn.config import reference

ROOT = Path(__file__).resolve().parents[2]


def test_settings_reference_is_current():
    text = (ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    assert reference.current_block(text) == reference.render(), (
        "docs/training.md's settings reference is stale: run `python -m tideborn.config.reference --write`")


def test_every_setting_has_a_docstring():
    import dataclasses

    from tideborn.config import schema

    for name, cls in schema.SECTIONS.items():
        docs = reference.field_docstrings(cls)
        missing = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
        assert not missing, f"[{name}] fields without a docstring: {missing}"
