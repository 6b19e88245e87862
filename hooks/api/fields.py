"""The building blocks of the API's types: the base model, quantities, open objects and the
annotated field types several types share."""

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel

from hooks.api.rules import MAX_UNAVAILABLE_PERCENT, MAX_UNAVAILABLE_RULE, cel
from hooks.kubernetes_names import INT32_MAX, LABEL_VALUE_PATTERN, qualified_key_problem
from hooks.quantity import QUANTITY_PATTERN, canonical_quantity

# An image reference holds no whitespace (the API server refuses it around the name).
ImageReference = Annotated[str, Field(min_length=1, pattern=r"^\S*$")]

# In extraPodSpec, the container the operator completes: the one with one of these names, else the first.
PRIMARY_CONTAINER_NAMES = ("main", "infera")


def primary_index(containers: list[dict[str, Any]]) -> int | None:
    """The first container named main or infera, in order of appearance, else the first."""
    named = (index for index, container in enumerate(containers) if container.get("name") in PRIMARY_CONTAINER_NAMES)
    return next(named, 0 if containers else None)


class SpecError(ValueError):
    """The spec is well-typed but cannot be rendered; reported in status, never as an HTTP error."""


def _quantity(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError("must be a Kubernetes quantity such as 4, 500m or 64Gi")
    quantity = canonical_quantity(str(value))
    if quantity.startswith("-"):
        raise ValueError(f"{value!r} must not be negative")
    return quantity


# A resource quantity; users may write `cpu: 4` unquoted, so integers are accepted too. Values
# are canonicalised on read because the API server stores `1000m` as `1` and anything else
# would be re-applied on every sync.
Quantity = Annotated[
    str,
    BeforeValidator(_quantity),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    ),
]


def open_object(description: str) -> Any:
    """An embedded Kubernetes type kept open in the CRD (it is validated when rendered)."""
    return WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True, "description": description})


def nesting(value: Any) -> int:
    """How many objects and lists deep `value` is (0 for a scalar), counted level by level, so
    that a value too deep for recursion is measured too."""
    depth, level = 0, [value]
    while level := [node for node in level if isinstance(node, (dict, list))]:
        depth += 1
        level = [item for node in level for item in (node.values() if isinstance(node, dict) else node)]
    return depth


# Kubernetes types nest about 15 levels deep (a PodSpec's affinity terms): an open object much
# deeper is a mistake, and would take the renderers' recursive steps past Python's limit.
MAX_OPEN_NESTING = 32


def _shallow(value: Any) -> Any:
    if (depth := nesting(value)) > MAX_OPEN_NESTING:
        raise ValueError(f"nests {depth} levels deep, past {MAX_OPEN_NESTING} (Kubernetes objects nest about 15)")
    return value


# With open_object: an open object no deeper than MAX_OPEN_NESTING.
SHALLOW = AfterValidator(_shallow)


class ApiModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
    )


def _unset_if_empty(value: Any) -> Any:
    """An empty list or map as absent, as the API server stores a NetworkPolicy's (Metacontroller
    would re-apply one written out on every sync)."""
    return value or None


UNSET_IF_EMPTY = AfterValidator(_unset_if_empty)


def _qualified_key(key: str) -> str:
    if problem := qualified_key_problem(key):
        raise ValueError(problem)
    return key


# A label key or value, as the API server checks them.
QualifiedKey = Annotated[str, AfterValidator(_qualified_key)]
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]


def max_unavailable_valid(value: Any) -> bool:
    """A PodDisruptionBudget's maxUnavailable that lets a pod go: a positive int32 or 1% to 100%."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return False
    if isinstance(value, int):
        return 1 <= value <= INT32_MAX
    return MAX_UNAVAILABLE_PERCENT.fullmatch(value) is not None


def _max_unavailable(value: Any) -> int | str:
    if not max_unavailable_valid(value):
        raise ValueError(MAX_UNAVAILABLE_RULE)
    return value


# A PodDisruptionBudget's maxUnavailable: pods, or a percentage of the pool.
MaxUnavailable = Annotated[
    int | str,
    BeforeValidator(_max_unavailable),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": True,
            # "100%" at most: bounds the CEL cost estimate of the rule's regular expression.
            "maxLength": 4,
            "x-kubernetes-validations": [
                cel(
                    f"type(self) == int ? self >= 1 && self <= {INT32_MAX} : "
                    f"self.matches('^{MAX_UNAVAILABLE_PERCENT.pattern}$')",
                    MAX_UNAVAILABLE_RULE,
                )
            ],
        }
    ),
]
