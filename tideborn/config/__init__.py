"""Settings: the schema (frozen dataclasses, one per TOML section) and how its layers resolve."""

from tideborn.config.load import Resolved, load_settings
from tideborn.config.schema import RESUME_FIXED_KEYS, SettingError, Settings

__all__ = ["RESUME_FIXED_KEYS", "Resolved", "Settings", "SettingError", "load_settings"]
