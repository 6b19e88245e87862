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


def canonical_quantity(text: str) -> str:
    """Return `text` as the API server would store it; ValueError if it is not a quantity."""
    text = text.strip()
    match = _QUANTITY.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (e.g. 4, 500m, 64Gi)")
    number_end = match.end(2)
    number, suffix = Fraction(text[:number_end]), text[number_end:]

    if suffix in _BINARY_SUFFIXES:
        value, binary, exponent_form = number * 1024 ** _BINARY_SUFFIXES[suffix], True, False
    elif suffix[:1] in ("e", "E"):
        value, binary, exponent_form = number * Fraction(10) ** int(Fraction(suffix[1:])), False, True
    else:
        value, binary, exponent_form = number * Fraction(10) ** _DECIMAL_SUFFIXES[suffix], False, False

    # The API server keeps nano precision and rounds anything finer up (away from zero).
    nanos = value * 10**9
    whole_nanos = math.ceil(abs(nanos))
    if whole_nanos == 0:
        return "0"
    sign = "-" if value < 0 else ""

    if binary and whole_nanos >= 1024 * 10**9 and whole_nanos % 10**9 == 0:
        mantissa, power = whole_nanos // 10**9, 0
        while mantissa % 1024 == 0 and power < 6:
            mantissa //= 1024
            power += 1
        return f"{sign}{mantissa}{_BINARY_BY_POWER.get(power, '')}"

    # Decimal: the largest exponent (a multiple of 3, at least -9) that keeps the mantissa whole.
    mantissa, exponent = whole_nanos, -9
    max_exponent = 10**6 if exponent_form else 18
    while exponent < max_exponent and mantissa % 1000 == 0:
        mantissa //= 1000
        exponent += 3
    if exponent_form:
        return f"{sign}{mantissa}{'' if exponent == 0 else f'e{exponent}'}"
    return f"{sign}{mantissa}{_DECIMAL_BY_EXPONENT[exponent]}"
