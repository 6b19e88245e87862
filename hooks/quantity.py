"""Kubernetes resource quantities in the canonical form the API server stores.

The API server rewrites every quantity it stores (`1000m` -> `1`, `1024Mi` -> `1Gi`,
`0.5` -> `500m`). Metacontroller re-applies any desired field that differs from the stored
object, so the hook must emit exactly the stored form. This mirrors the rules of
k8s.io/apimachinery's `Quantity.CanonicalizeBytes`.
"""

import math
import re
from fractions import Fraction

QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_QUANTITY = re.compile(QUANTITY_PATTERN)

_BINARY_SUFFIXES = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_BY_EXPONENT = {exp: suffix for suffix, exp in _DECIMAL_SUFFIXES.items()}
_BINARY_BY_POWER = {power: suffix for suffix, power in _BINARY_SUFFIXES.items()}


# The API server clamps larger values; refusing them is clearer than a silently different value.
MAX_QUANTITY = 2**63 - 1
# Exponents beyond this are out of range anyway; the bound keeps parsing cheap.
MAX_EXPONENT = 30


def _parse(text: str) -> tuple[Fraction, str]:
    """The exact value of a quantity and its format: binary, exponent or decimal."""
    match = _QUANTITY.fullmatch(text)
    if not match:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (e.g. 4, 500m, 64Gi)")
    number_end = match.end(2)
    number, suffix = Fraction(text[:number_end]), text[number_end:]
    if suffix in _BINARY_SUFFIXES:
        return number * 1024 ** _BINARY_SUFFIXES[suffix], "binary"
    if len(suffix) > 1:  # e/E followed by an exponent; a lone E is the exa suffix
        if not re.fullmatch(r"[+-]?[0-9]+", suffix[1:]):
            raise ValueError(f"{text!r} is not a Kubernetes quantity: the exponent must be a whole number")
        exponent = int(suffix[1:])
        if abs(exponent) > MAX_EXPONENT:
            raise ValueError(f"{text!r} is out of range for a Kubernetes quantity")
        return number * Fraction(10) ** exponent, "exponent"
    return number * Fraction(10) ** _DECIMAL_SUFFIXES[suffix], "decimal"


def _format(value: Fraction, form: str) -> str:
    # The API server keeps nano precision and rounds anything finer up (away from zero).
    whole_nanos = math.ceil(abs(value) * 10**9)
    if whole_nanos == 0:
        return "0"
    sign = "-" if value < 0 else ""

    if form == "binary" and whole_nanos >= 1024 * 10**9 and whole_nanos % 10**9 == 0:
        mantissa, power = whole_nanos // 10**9, 0
        while mantissa % 1024 == 0 and power < 6:
            mantissa //= 1024
            power += 1
        return f"{sign}{mantissa}{_BINARY_BY_POWER.get(power, '')}"

    # Decimal: the largest exponent (a multiple of 3, at least -9) that keeps the mantissa whole.
    mantissa, exponent = whole_nanos, -9
    max_exponent = MAX_EXPONENT if form == "exponent" else 18
    while exponent < max_exponent and mantissa % 1000 == 0:
        mantissa //= 1000
        exponent += 3
    if form == "exponent":
        return f"{sign}{mantissa}{'' if exponent == 0 else f'e{exponent}'}"
    return f"{sign}{mantissa}{_DECIMAL_BY_EXPONENT[exponent]}"


def canonical_quantity(text: str) -> str:
    """Return `text` as the API server stores it; ValueError if it is not a quantity.

    The result is a fixed point: the server stores exactly this string for it. (A value such as
    1.953125Ki is written as 2000, which the server reads back as a decimal and stores as 2k.)
    """
    text = text.strip()
    value, form = _parse(text)
    if abs(value) > MAX_QUANTITY:
        raise ValueError(f"{text!r} is out of range for a Kubernetes quantity")
    canonical = _format(value, form)
    while (again := _format(*_parse(canonical))) != canonical:
        canonical = again
    return canonical


def quantity_value(text: str) -> Fraction:
    """The exact value of a quantity; ValueError if it is not one."""
    return _parse(text.strip())[0]
