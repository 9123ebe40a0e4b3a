"""The live stack is started once for the package: test_queries_e2e.py and test_render.py need
the same exporters, Prometheus and analyzer run, and each start waits about 20 s for samples."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.dashboards.live import Stack, started_stacks


@pytest.fixture(scope="package")
def live_stacks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Stack | BaseException]]:
    with started_stacks(tmp_path_factory.mktemp("dashboards-e2e")) as stacks:
        yield stacks
