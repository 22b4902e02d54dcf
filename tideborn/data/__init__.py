"""Teacher data: hcpe and PackedSfenValue readers, features and targets, batches, the training loader,
and the `python -m tideborn.data inspect|verify|convert|split` tools.

Importing the package loads nothing heavy; `batch`, `legal`, `loader` and `targets` need torch,
the rest numpy and cshogi.
"""
