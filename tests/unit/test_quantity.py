"""Quantities in the canonical form the API server stores, and stable once stored."""

import pytest

from hooks.quantity import canonical_quantity


@pytest.mark.parametrize(
    ("written", "stored"),
    [
        ("1000m", "1"),
        ("1024Mi", "1Gi"),
        ("1536Mi", "1536Mi"),
        ("1.5Gi", "1536Mi"),
        ("0.5", "500m"),
        ("4", "4"),
        ("2000", "2k"),
        ("1500", "1500"),
        ("64Gi", "64Gi"),
        ("1Ki", "1Ki"),
        ("512", "512"),
        ("0.5Ki", "512"),
        ("0.1Ki", "102400m"),
        ("1e3", "1e3"),
        ("1E6", "1e6"),  # the server may keep "1E6" as written; both forms are stable once stored
        ("1E", "1E"),  # exa, not an exponent
        ("9E", "9E"),
        ("1.953125Ki", "2k"),  # 2000 bytes: written as 2000, read back as decimal 2k
        ("7Ei", "7Ei"),
        ("100m", "100m"),
        ("0.0000000001", "1n"),
        ("+2", "2"),
        ("0Gi", "0"),
        ("16000m", "16"),
        ("1000Gi", "1000Gi"),
    ],
)
def test_canonical(written: str, stored: str) -> None:
    assert canonical_quantity(written) == stored


@pytest.mark.parametrize("bad", ["", "64 GB", "Gi", "1.2.3", "ten", "1ki", "1e1.5", "1e.5"])
def test_rejects_non_quantities(bad: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        canonical_quantity(bad)


@pytest.mark.parametrize("huge", ["8Ei", "16Ei", "1000000P", "1e19", "1e200000", "9223372036854775808"])
def test_rejects_values_the_server_would_clamp(huge: str) -> None:
    with pytest.raises(ValueError, match="out of range"):
        canonical_quantity(huge)


@pytest.mark.parametrize(
    "written",
    ["1000m", "1024Mi", "0.5Ki", "1.953125Ki", "0.1Ki", "1500", "2000", "1e3", "1E", "7Ei", "123456789n", "3.5"],
)
def test_output_is_a_fixed_point(written: str) -> None:
    stored = canonical_quantity(written)
    assert canonical_quantity(stored) == stored
