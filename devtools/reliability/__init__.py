"""Reliability tooling: the soak run (`python -m gpulens.devtools.reliability.soak`)."""
