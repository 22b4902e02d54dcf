"""tideborn: the training side of DLManaka, a deep-learning shogi engine."""

__version__ = "0.1.0"
"""The version, written only here: pyproject.toml reads it (setuptools dynamic version), `--version` prints it."""
