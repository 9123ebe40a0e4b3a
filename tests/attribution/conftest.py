import pytest

from tests.attribution.fakes import FakeNode


@pytest.fixture
def node(tmp_path):
    return FakeNode(tmp_path)
