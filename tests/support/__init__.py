"""Helpers shared by the test suite: real Prometheus / Alertmanager processes, free ports."""
