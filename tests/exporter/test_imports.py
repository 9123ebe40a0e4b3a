"""The exporter must stay small: no pandas, numpy or scikit-learn anywhere in its import graph, and
no simulator (`--simulate` finds it through an entry point, docs/architecture.md)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("pandas", "numpy", "sklearn", "scipy", "matplotlib")


def test_exporter_imports_no_heavy_libraries() -> None:
    code = (
        "import sys, json\n"
        "import gpulens.exporter.cli, gpulens.exporter.app, gpulens.exporter.server\n"
        "import gpulens.exporter.attribution, gpulens.exporter.backends.gpm\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    modules = json.loads(result.stdout)
    loaded = [m for m in modules if m.split(".")[0] in HEAVY]
    assert loaded == []
    assert [m for m in modules if m == "gpulens.sim" or m.startswith("gpulens.sim.")] == []
