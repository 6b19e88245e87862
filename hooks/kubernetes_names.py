"""Kubernetes' own rules for names, keys and values, as the API server applies them: the API's
types and admission both hold what they check to these."""

import re
from typing import Any

DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# The most characters of a DNS label (and of a label value), and of a DNS subdomain.
DNS_LABEL_MAX = 63
DNS_SUBDOMAIN_MAX = 253
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# Gateway API's hostname: lower-case DNS names, optionally with a leading wildcard label.
HOSTNAME = r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# Kubernetes label/annotation keys: an optional DNS-subdomain prefix and a name.
QUALIFIED_NAME = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
# Kubernetes 1.32+ (RelaxedEnvironmentVariableValidation, on by default): any printable ASCII but '='.
ENV_NAME = re.compile(r"[ -<>-~]+")
INT32_MAX = 2**31 - 1
# The API server's bound on one object's annotations, keys and values together.
MAX_ANNOTATIONS_BYTES = 256 * 1024


LABEL_VALUE = re.compile(LABEL_VALUE_PATTERN)


def shown(value: Any) -> str:
    """A value as a message quotes it: at most about 100 characters, whatever its size."""
    text = repr(value)
    return text if len(text) <= 100 else f"{text[:100]}... ({len(text):,} characters)"


def qualified_key_problem(key: str) -> str | None:
    """Why `key` is not a label or annotation key, or None."""
    if QUALIFIED_NAME.fullmatch(key) and len(key.rpartition("/")[0]) <= 253:
        return None
    return f"{shown(key)} is not a valid label or annotation key (e.g. example.com/team)"


def label_value_valid(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= 63 and LABEL_VALUE.fullmatch(value) is not None


def annotations_bytes(annotations: dict[str, str]) -> int:
    """What the API server counts against MAX_ANNOTATIONS_BYTES."""
    return sum(len(key.encode()) + len(value.encode()) for key, value in annotations.items())


def env_name_problem(name: str) -> str | None:
    """Why `name` is not an environment variable name the API server accepts, or None."""
    if ENV_NAME.fullmatch(name):
        return None
    return f"{shown(name)} is not a valid environment variable name (printable ASCII characters other than '=')"


def is_extended_resource(name: str) -> bool:
    """Kubernetes' extended resources (devices such as amd.com/gpu): domain-prefixed, outside
    kubernetes.io, not a quota name. Their requests must equal their limits."""
    return "/" in name and "kubernetes.io/" not in name and not name.startswith("requests.")
