"""Positions to network inputs and targets: cshogi boards to feature planes (`features`), numba's compiled
loops (`compiled`, `hcpe3_ops`), hcpe3 games replayed into positions (`hcpe3_replay`), legal-move masks
(`legal`) and value targets (`targets`).
"""
