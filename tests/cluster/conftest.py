"""The cluster tier's shared fixtures: a module's own control plane with the bundle installed, and
a test's own namespace on it."""

from collections.abc import Iterator

import pytest

from tests.support.cluster import graph_namespace
from tests.support.localcluster import Installed, installed_bundle
from tests.support.metacontroller import TEST_ARGUMENTS
from tests.support.prerequisites import need_schemas


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Installed]:
    """One control plane per module: its graphs never meet another module's. An error
    Metacontroller logs fails the module, but for those a test causes on purpose."""
    workdir = tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2])
    with installed_bundle(workdir, need_schemas(), TEST_ARGUMENTS) as done:
        yield done
        assert done.metacontroller.errors() == []


@pytest.fixture
def namespace(installed: Installed, request: pytest.FixtureRequest) -> Iterator[str]:
    """The test's own namespace (its parameter), emptied once the test is done."""
    with graph_namespace(installed.cluster, str(request.param)) as namespace:
        yield namespace
