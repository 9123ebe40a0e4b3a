"""Start-up helpers for programs launched by `gpulens sim run` (see `launcher.py`)."""
