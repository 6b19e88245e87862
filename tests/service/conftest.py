"""The service tier: every `hooks` call goes over HTTP to a real `infera-hooks serve`."""

import pytest

from tests.support.service import HookClient


@pytest.fixture(scope="session")
def hooks(hook_url: str, schemas_loaded: None) -> HookClient:
    return HookClient(hook_url)
