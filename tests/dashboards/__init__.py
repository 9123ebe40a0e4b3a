"""Tests of the generated Grafana dashboards (gpulens.dashboards)."""
