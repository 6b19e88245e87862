"""The cluster tier's shared fixtures: a module's own control plane with the bundle installed, and
a test's own namespace on it."""

from collections.abc import Iterator

import pytest

from tests.support.cluster import graph_namespace
from tests.support.localcluster import Installed, installed_bundle
from tests.support.prerequisites import need_schemas


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Installed]:
    """One control plane per module: its graphs never meet another module's. The stand-in
    Metacontroller's errors fail the module, but for those a test expects and takes out."""
    with installed_bundle(tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2]), need_schemas()) as done:
        yield done
    assert done.driver is not None and done.driver.errors == []


@pytest.fixture
def namespace(installed: Installed, request: pytest.FixtureRequest) -> Iterator[str]:
    """The test's own namespace (its parameter), emptied once the test is done."""
    with graph_namespace(installed.cluster, str(request.param)) as namespace:
        yield namespace
