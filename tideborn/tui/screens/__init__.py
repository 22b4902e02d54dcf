"""The app's screens: a run's dashboard, the run picker, the override editor, help and confirmations."""
