"""The environment of every container the graph runs: what the operator injects (read by the
runtime when a command line leaves it out) and the user's variables. spec.envs may override the
operator's defaults but not what the runtime must read (the pod's identity, the broker, the
selector); a service's own env comes last and overrides everything."""

from typing import Any

from hooks.api.env import EnvVar
from hooks.api.graph import InferaDeployment
from hooks.api.services import ServiceSpec
from hooks.renderers import nats, security
from hooks.runtime import MODEL_LOAD_SECONDS, NATS_ENV, READY_TIMEOUT_ENV, ROUTERS, SELECTOR_ENV, Process, client_url
from hooks.vocabulary import graph_selector


def field_env(name: str, field_path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": field_path}}}


def env_var(var: EnvVar) -> dict[str, Any]:
    """An API EnvVar as the API server stores it: an empty value is stored as absent."""
    rendered: dict[str, Any] = {"name": var.name}
    if var.value:
        rendered["value"] = var.value
    if var.value_from is not None:
        rendered["valueFrom"] = var.value_from.model_dump(by_alias=True, exclude_none=True)
    return rendered


def last_wins(env: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A name set twice keeps its first position and its last value, so users override what the
    operator injects without producing duplicate names (which the API server only warns about)."""
    by_name: dict[str, dict[str, Any]] = {}
    for var in env:
        by_name[var["name"]] = var
    return list(by_name.values())


def operator_env(idep: InferaDeployment, process: Process) -> list[dict[str, Any]]:
    """The workers' model-load budget, spec.envs, then what the runtime reads: NATS_SERVER (the
    NATS clients' fallback when a template's command gives no --nats-server), the pod's identity
    (a worker patches its own Pod and advertises POD_IP; the server finds its InferaDeployment
    from its Pod) and the routers' selector (read when a template's command gives none)."""
    # A default the user may set otherwise, in spec.envs too: first, so a later value wins.
    env = [{"name": READY_TIMEOUT_ENV, "value": str(MODEL_LOAD_SECONDS)}] if process == Process.WORKER else []
    if process in ROUTERS:
        env.append(dict(security.HOME_ENV))  # its user has no home on the read-only root
    env += [env_var(var) for var in idep.spec.envs or []]
    url = client_url(idep)
    if url:
        env += nats.token_env(idep)
        env.append({"name": NATS_ENV, "value": url})
    env += [
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        field_env("POD_IP", "status.podIP"),
    ]
    if process in ROUTERS and idep.spec.discovery_backend == "kubernetes":
        env.append({"name": SELECTOR_ENV, "value": graph_selector(idep)})
    return last_wins(env)


def service_env(idep: InferaDeployment, svc: ServiceSpec) -> list[dict[str, Any]]:
    """A server's or worker's primary container: the operator's env, then the service's own."""
    process = Process.WORKER if svc.is_worker else Process.SERVER
    return last_wins(operator_env(idep, process) + [env_var(var) for var in svc.env or []])
