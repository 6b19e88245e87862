"""Session fixtures: the hook app in this process, the real hook service on loopback, the test
tiers as markers, and bounded property tests. What tests import lives in tests/support."""

import datetime
from collections.abc import Iterator
from pathlib import Path

import hypothesis
import pytest

from hooks.app import create_app
from tests.support.apiserver import load_simulated_schemas
from tests.support.schemas import load_schemas
from tests.support.service import HookClient, InProcessClient, start_server

# Every property test is bounded in time: 10 s per example at most, and no shrinking (it can
# take minutes on a failure; the blob printed with a failure replays the example, to shrink it
# at leisure). Function-scoped fixtures are fine here: the hook app is shared and stateless.
hypothesis.settings.register_profile(
    "infera",
    deadline=datetime.timedelta(seconds=10),
    phases=[hypothesis.Phase.explicit, hypothesis.Phase.reuse, hypothesis.Phase.generate, hypothesis.Phase.target],
    print_blob=True,
    suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture, hypothesis.HealthCheck.too_slow],
)
hypothesis.settings.load_profile("infera")

# Each folder of tests/ is a tier, and its tests carry the tier's marker (registered in
# pyproject.toml): `pytest -m "unit or graph"` is the quick loop.
TIERS = ("unit", "graph", "service", "e2e", "cluster", "repository")
TESTS = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = item.path.relative_to(TESTS).parts[0]
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: a test belongs in one of the tier folders {', '.join(TIERS)}")
        item.add_marker(tier)


@pytest.fixture(scope="session")
def hook_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`infera-hooks serve` on loopback, started once for the tests that need a real server."""
    with start_server(tmp_path_factory.mktemp("hooks")) as url:
        yield url


@pytest.fixture(scope="session")
def schemas_loaded() -> None:
    """The schemas every answer is checked against, and the simulated API server's, read once
    before any test's clock starts: a property test's first example must not pay for them."""
    load_schemas()
    load_simulated_schemas()


@pytest.fixture(scope="session")
def hooks(schemas_loaded: None) -> HookClient:
    """The hook app called in this process; tests/service/ overrides it with the real server."""
    return InProcessClient(create_app())
