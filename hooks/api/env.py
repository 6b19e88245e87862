"""Environment variables, as in a Kubernetes container: a value or one source (a pod field, a
resource, a ConfigMap or Secret key)."""

import re
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, WithJsonSchema, field_validator, model_validator

from hooks.api.fields import ApiModel, Quantity
from hooks.api.rules import (
    ENV_SOURCE_RULE,
    ENV_VALUE_RULE,
    READY_TIMEOUT_ENV,
    cel,
    ready_timeout_problem,
    with_validations,
)
from hooks.kubernetes_names import DNS_SUBDOMAIN, ENV_NAME, env_name_problem, qualified_key_problem

# The pod fields an environment variable may read (the Downward API), besides metadata.labels['<key>']
# and metadata.annotations['<key>'].
ENV_FIELD_PATHS = (
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.serviceAccountName",
    "status.hostIP",
    "status.hostIPs",
    "status.podIP",
    "status.podIPs",
)
SUBSCRIPTED_FIELD_PATH = re.compile(r"metadata\.(labels|annotations)\['([^']*)'\]")
# The container resources an environment variable may read, and the divisors each accepts.
CPU_DIVISORS = ("1m", "1")
BYTE_DIVISORS = ("1", "1k", "1M", "1G", "1T", "1P", "1E", "1Ki", "1Mi", "1Gi", "1Ti", "1Pi", "1Ei")
ENV_RESOURCES = (
    "limits.cpu",
    "limits.memory",
    "limits.ephemeral-storage",
    "requests.cpu",
    "requests.memory",
    "requests.ephemeral-storage",
)


class ObjectFieldSelector(ApiModel):
    """A field of the pod."""

    # A one-value Literal would become `const`, which CRD schemas do not support.
    api_version: Annotated[Literal["v1"], WithJsonSchema({"type": "string", "enum": ["v1"]})] = "v1"
    """Schema version of fieldPath; only v1 (the API server stores it when omitted)."""
    field_path: str
    """metadata.name, metadata.namespace, metadata.uid, metadata.labels['<key>'], metadata.annotations['<key>'], spec.nodeName, spec.serviceAccountName, status.hostIP(s) or status.podIP(s)."""

    @field_validator("field_path")
    @classmethod
    def _supported(cls, path: str) -> str:
        subscripted = SUBSCRIPTED_FIELD_PATH.fullmatch(path)
        if path in ENV_FIELD_PATHS or (subscripted and qualified_key_problem(subscripted.group(2)) is None):
            return path
        raise ValueError(
            f"{path!r} is not a pod field an environment variable can read ({', '.join(ENV_FIELD_PATHS)}, metadata.labels['<key>'], metadata.annotations['<key>'])"
        )


class ResourceFieldSelector(ApiModel):
    """A resource limit or request of a container."""

    container_name: str | None = None
    """The container; this one when unset."""
    resource: str
    """limits.cpu, limits.memory, limits.ephemeral-storage, requests.* of the same, or limits/requests.hugepages-<size>."""
    divisor: Quantity | None = None
    """Unit of the value: 1m or 1 for cpu; 1, 1k, 1Ki, 1M, 1Mi, ... for the others."""

    @model_validator(mode="after")
    def _supported(self) -> "ResourceFieldSelector":
        if not (
            self.resource in ENV_RESOURCES or self.resource.startswith(("limits.hugepages-", "requests.hugepages-"))
        ):
            raise ValueError(
                f"resource {self.resource!r} is not one an environment variable can read ({', '.join(ENV_RESOURCES)}, limits.hugepages-<size>, requests.hugepages-<size>)"
            )
        divisors = CPU_DIVISORS if self.resource.endswith(".cpu") else BYTE_DIVISORS
        if self.divisor is not None and self.divisor not in divisors:
            raise ValueError(f"divisor {self.divisor!r} is not one of {', '.join(divisors)} for {self.resource}")
        return self


class KeySelector(ApiModel):
    """A key of a ConfigMap or Secret in the InferaDeployment's namespace."""

    name: Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)]
    """Name of the ConfigMap or Secret."""
    key: Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")]
    """The key to read."""
    optional: bool | None = None
    """Start the pod even when the object or key is missing."""


class EnvVarSource(ApiModel):
    """Where a variable's value comes from: exactly one source."""

    model_config = with_validations(
        cel(
            " + ".join(
                f"(has(self.{key}) ? 1 : 0)"
                for key in ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef")
            )
            + " == 1",
            ENV_SOURCE_RULE,
        )
    )

    field_ref: ObjectFieldSelector | None = None
    """A field of the pod, e.g. status.podIP."""
    resource_field_ref: ResourceFieldSelector | None = None
    """A resource limit or request of a container."""
    config_map_key_ref: KeySelector | None = None
    """A key of a ConfigMap."""
    secret_key_ref: KeySelector | None = None
    """A key of a Secret."""

    @model_validator(mode="after")
    def _one_source(self) -> "EnvVarSource":
        sources = (self.field_ref, self.resource_field_ref, self.config_map_key_ref, self.secret_key_ref)
        if sum(source is not None for source in sources) != 1:
            raise ValueError(ENV_SOURCE_RULE)
        return self


class EnvVar(ApiModel):
    """An environment variable, as in a Kubernetes container."""

    model_config = with_validations(cel("!has(self.value) || self.value == '' || !has(self.valueFrom)", ENV_VALUE_RULE))

    name: Annotated[str, Field(min_length=1, json_schema_extra={"pattern": f"^{ENV_NAME.pattern}$"})]
    """Name of the variable: printable ASCII characters other than '='."""
    value: str | None = None
    """Literal value; `$(VAR)` references to earlier variables are expanded by Kubernetes."""
    value_from: EnvVarSource | None = None
    """Source of the value (fieldRef, resourceFieldRef, configMapKeyRef, secretKeyRef)."""

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        if problem := env_name_problem(name):
            raise ValueError(problem)
        return name

    @field_validator("value")
    @classmethod
    def _ready_timeout(cls, value: str | None, info: ValidationInfo) -> str | None:
        if (
            value is not None
            and info.data.get("name") == READY_TIMEOUT_ENV
            and (problem := ready_timeout_problem(value))
        ):
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _one_value(self) -> "EnvVar":
        if self.value and self.value_from is not None:
            raise ValueError(ENV_VALUE_RULE)
        # Without a value or a source the variable is set, to "": the wrapper then waits its
        # default while the startup probe waits what the operator set.
        if self.name == READY_TIMEOUT_ENV and self.value is None and self.value_from is None:
            raise ValueError(ready_timeout_problem(""))
        return self
