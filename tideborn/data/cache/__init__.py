"""Decoded positions kept on disk: the checked cache file (`cachefile`), hcpe3 files opened through their
positions caches (`hcpe3`, `hcpe3_compact`).
"""
