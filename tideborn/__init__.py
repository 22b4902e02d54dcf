"""tideborn: the training side of DLManaka, a deep-learning shogi engine."""

__version__ = "0.1.0"
