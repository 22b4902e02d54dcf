"""Teacher data, in floors; each imports only those below it (the layers contract in pyproject.toml):

    tools      python -m tideborn.data inspect|verify|convert|split
    training   the batch-source protocol, the data opened once, the data order, the watched window, the loader
    sets       the training and held-out sources, averaging, per-file eval scales
    cache      decoded positions kept on disk (hcpe3 positions caches)
    formats | decode   record layouts, game records and indexes | positions to feature planes and targets

Importing the package loads nothing heavy; `training.batch`, `training.loader`, `decode.legal` and
`decode.targets` need torch, the rest numpy and cshogi.
"""
