"""Where profiles come from: a Prometheus-compatible HTTP API or a history directory."""
