"""The gpulens rightsizing analyzer (installed as `gpulens.analyzer`).

sources/ (Prometheus, history files) -> profile -> recommend -> plan -> emit, plus archetypes,
report, publish, importers and simulate; `cli` wires them to `gpulens <command>`. See
docs/analyzer.md.
"""
