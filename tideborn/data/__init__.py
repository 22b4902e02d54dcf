"""Teacher data: hcpe and PackedSfenValue readers, features and targets, the training loader, evaluation,
and the `python -m tideborn.data inspect|verify|convert|split` tools.

Importing the package loads nothing heavy; `loader` and `evaluation` need torch, the rest numpy and cshogi.
"""
