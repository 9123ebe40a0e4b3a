"""The gpulens mixin: one config (selector, cluster label, runbook URLs) for rules and dashboards."""
