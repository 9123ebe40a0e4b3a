#!/usr/bin/env python3
"""Run the GPU conformance check from a source checkout, installed or not.

On a borrowed GPU machine gpulens is carried as source and cannot be pip-installed (no network),
so this script maps the checkout's folders onto the `gpulens.*` package names the same way
setup.py does, then runs `gpulens conformance run`. Usage:

    python tools/gpu_conformance.py --out "$OUT/conformance"
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "gpulens": ROOT / "src" / "gpulens",
    "gpulens.exporter": ROOT / "exporter",
    "gpulens.analyzer": ROOT / "analyzer",
    "gpulens.sim": ROOT / "sim",
    "gpulens.devtools": ROOT / "devtools",
}


def map_source_packages() -> None:
    """Import the checkout's packages under their installed names (no-op when installed)."""
    for name, path in PACKAGES.items():
        spec = importlib.util.spec_from_file_location(
            name, path / "__init__.py", submodule_search_locations=[str(path)]
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)


if __name__ == "__main__":
    try:
        import gpulens.exporter  # noqa: F401
    except ImportError:
        map_source_packages()
        # the exporter check starts `gpulens-exporter` as a child: it must map the sources too
        os.environ["GPULENS_EXPORTER_COMMAND"] = f"{sys.executable} {Path(__file__).resolve()} --exporter"
    if sys.argv[1:2] == ["--exporter"]:
        from gpulens.exporter.cli import main as exporter_main

        sys.exit(exporter_main(sys.argv[2:]))
    from gpulens.cli import main

    sys.exit(main(["conformance", "run", *sys.argv[1:]]))
