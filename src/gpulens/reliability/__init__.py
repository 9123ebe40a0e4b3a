"""Reliability tooling: the soak run (`python -m gpulens.reliability.soak`)."""
