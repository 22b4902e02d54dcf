"""`tideborn match`: two checkpoints play each other with their policies; the score as Elo (docs/match.md)."""
