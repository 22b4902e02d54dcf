"""Settings: the schema (`schema`: frozen dataclasses, one per TOML section) and how its layers resolve (`load`:
`load_settings`)."""
