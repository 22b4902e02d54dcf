"""The positions a run trains and evaluates on: the training and held-out sources (`sources`), averaged
duplicates (`average`, `average_merge`), and per-file eval scales (`evalfix`).
"""
