"""Quantities exactly as the API server stores them (k8s.io/apimachinery's canonical form)."""

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
        ("1E6", "1e6"),
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


@pytest.mark.parametrize("bad", ["", "64 GB", "Gi", "1.2.3", "ten", "1ki"])
def test_rejects_non_quantities(bad: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        canonical_quantity(bad)
