"""Session fixtures: the real hook service on loopback, and bounded property tests. What tests
import lives in tests/support."""

import datetime
from collections.abc import Iterator

import hypothesis
import pytest

from tests.support.service import HookClient, start_server

# Every property test is bounded in time: 10 s per example at most, and no shrinking (it can
# take minutes on a failure; the blob printed with a failure replays the example, to shrink it
# at leisure). Function-scoped fixtures are fine here: the hook service is shared and stateless.
hypothesis.settings.register_profile(
    "infera",
    deadline=datetime.timedelta(seconds=10),
    phases=[hypothesis.Phase.explicit, hypothesis.Phase.reuse, hypothesis.Phase.generate, hypothesis.Phase.target],
    print_blob=True,
    suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture, hypothesis.HealthCheck.too_slow],
)
hypothesis.settings.load_profile("infera")


@pytest.fixture(scope="session")
def hook_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with start_server(tmp_path_factory.mktemp("hooks")) as url:
        yield url


@pytest.fixture(scope="session")
def hooks(hook_url: str) -> HookClient:
    return HookClient(hook_url)
