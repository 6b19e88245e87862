"""InferaDeployments for tests, built in one expression instead of poked into nested dicts.

In the spirit of LeaderWorkerSet's test/wrappers: `graph()` starts from an example (the PD
graph of examples/pd-disaggregated.yaml unless told otherwise) as `parent()` hands it over,
every method changes one thing and returns the builder, and `.obj()` returns the plain dict
(`.manifest()`: as a user applies it, without uid, generation and resourceVersion):

    graph().replicas(decode=2).blue_green().obj()
    graph("qwen-gaie", source=GAIE_PD).epp_replicas(3).obj()
    graph().vllm().nodes(decode=2).patch("LeaderWorkerSet", "qwen-pd-decode", *ops).obj()

What a method is given is copied in, so a test's constants are never changed through the
builder. A value of None removes the field (as a JSON merge patch does): `.image(None)`,
`.service("prefill", args=None)`, `.gaie(tokenizerPath=None)`. A method named for a section of
the spec (`nats`, `gaie`, `rollout`, `model_cache`, ...) sets the whole section to what it is
given, whatever the example had there (`gaie` and `model_cache` start from a gateway and a cache
that render); `epp_replicas` and `retain_nats_storage` set their one field and keep the rest. A
service's methods change the fields they name and keep its others.

It builds specs of the API's shape, valid or breaking a rule. A test whose point is a malformed
one (a wrong type, an unknown field, a hostile request) writes that dict by hand; so does an
edit of a running graph (Metacontroller.edit), which changes a live parent, not a new one.
"""

import copy
from pathlib import Path
from typing import Any, Self

from tests.support.requests import PD, as_vllm, parent

# The fields a gateway needs (spec.gaie), for `.gaie()` to be one that renders.
GAIE: dict[str, Any] = {"enabled": True, "tokenizerPath": "Qwen/Qwen3-0.6B", "gatewayName": "gw"}
# A model cache of the PD graph's model.
MODEL_CACHE: dict[str, Any] = {"source": "hf://Qwen/Qwen3-0.6B", "size": "20Gi"}
# What the API server sets on an object: a manifest a user applies has none of it.
SERVER_METADATA = ("uid", "generation", "resourceVersion")


def _set(target: dict[str, Any], fields: dict[str, Any]) -> None:
    """Copies `fields` into `target`; None removes a field."""
    for key, value in fields.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = copy.deepcopy(value)


def _section(fields: dict[str, Any]) -> dict[str, Any]:
    section: dict[str, Any] = {}
    _set(section, fields)
    return section


class GraphBuilder:
    """An InferaDeployment under construction; see the module's docstring."""

    def __init__(self, source: Path | dict[str, Any]) -> None:
        self._obj = parent(source)

    def obj(self) -> dict[str, Any]:
        """The InferaDeployment as the API server hands it to Metacontroller (a copy: the
        builder may go on to make another)."""
        return copy.deepcopy(self._obj)

    def manifest(self) -> dict[str, Any]:
        """The InferaDeployment as a user applies it: without the metadata the API server sets."""
        obj = self.obj()
        for key in SERVER_METADATA:
            obj["metadata"].pop(key, None)
        return obj

    @property
    def _spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self._obj["spec"]
        return spec

    def _service(self, name: str) -> dict[str, Any]:
        services: dict[str, dict[str, Any]] = self._spec["services"]
        if name not in services:
            raise KeyError(f"the graph has no service {name!r} (it has {', '.join(services)}): add it first")
        return services[name]

    # --- metadata ---------------------------------------------------------------------------

    def name(self, name: str) -> Self:
        self._obj["metadata"]["name"] = name
        return self

    def metadata(self, **fields: Any) -> Self:
        """metadata fields, as given (labels and annotations whole; None removes one)."""
        _set(self._obj["metadata"], fields)
        return self

    # --- the spec's own fields --------------------------------------------------------------

    def spec(self, **fields: Any) -> Self:
        """Top-level fields of the spec, as given (None removes one)."""
        _set(self._spec, fields)
        return self

    def image(self, image: str | None) -> Self:
        return self.spec(image=image)

    def backend(self, framework: str) -> Self:
        return self.spec(backendFramework=framework)

    def vllm(self) -> Self:
        """The same graph on vLLM: the backend, and vLLM's own args for every worker (as_vllm)."""
        as_vllm(self._obj)
        return self

    def discovery(self, backend: str, endpoint: str | None = None) -> Self:
        """discoveryBackend, and etcdEndpoint when given."""
        return self.spec(discoveryBackend=backend, etcdEndpoint=endpoint)

    def envs(self, *variables: dict[str, Any]) -> Self:
        """spec.envs, every service's variables."""
        return self.spec(envs=list(variables))

    def nats(self, **fields: Any) -> Self:
        """spec.nats, the whole section: `.nats(deploy=False)` is a graph without the managed broker."""
        return self.spec(nats=_section(fields))

    def retain_nats_storage(self) -> Self:
        """The broker's claim outlives the graph (nats.retainStorage), the rest of nats kept."""
        self._spec.setdefault("nats", {})["retainStorage"] = True
        return self

    def gaie(self, **fields: Any) -> Self:
        """spec.gaie, the whole section: the gateway on, with a tokenizer and a Gateway unless
        `fields` say otherwise (None leaves one out)."""
        return self.spec(gaie=_section({**GAIE, **fields}))

    def epp_replicas(self, replicas: int) -> Self:
        """The Endpoint Pickers' count (gaie.eppReplicas), the rest of gaie kept."""
        self._spec.setdefault("gaie", {})["eppReplicas"] = replicas
        return self

    def model_cache(self, **fields: Any) -> Self:
        """spec.modelCache, the whole section: the PD graph's model, 20Gi, unless `fields` say otherwise."""
        return self.spec(modelCache=_section({**MODEL_CACHE, **fields}))

    def monitoring(self, **fields: Any) -> Self:
        """spec.monitoring, the whole section (none of it: every default)."""
        return self.spec(monitoring=_section(fields))

    def network_policy(self, **fields: Any) -> Self:
        """spec.networkPolicy, the whole section: `.network_policy(isolate="graph")`."""
        return self.spec(networkPolicy=_section(fields))

    def rollout(self, **fields: Any) -> Self:
        """spec.rollout, the whole section."""
        return self.spec(rollout=_section(fields))

    def placement(self, **fields: Any) -> Self:
        """spec.placement, the whole section: `.placement(topologyKey="rack", mode="Preferred")`."""
        return self.spec(placement=_section(fields))

    def blue_green(self) -> Self:
        return self.rollout(strategy="BlueGreen")

    def patches(self, *patches: dict[str, Any]) -> Self:
        """spec.patches, all of them, each {"target": ..., "patch": [...]}."""
        return self.spec(patches=list(patches))

    def patch(self, kind: str, name: str, *operations: dict[str, Any]) -> Self:
        """One more entry of spec.patches: JSON patch `operations` on child `kind`/`name`."""
        self._spec.setdefault("patches", []).append(
            {"target": {"kind": kind, "name": name}, "patch": copy.deepcopy(list(operations))}
        )
        return self

    # --- services ---------------------------------------------------------------------------

    def service(self, name: str, **fields: Any) -> Self:
        """Fields of service `name`, its others kept (None removes one)."""
        _set(self._service(name), fields)
        return self

    def worker(self, name: str, **fields: Any) -> Self:
        """Service `name`, a worker with `fields` and nothing else (replacing one of that name)."""
        self._spec["services"][name] = _section({"componentType": "worker", **fields})
        return self

    def server(self, name: str, **fields: Any) -> Self:
        """Service `name`, a server with `fields` and nothing else (replacing one of that name)."""
        self._spec["services"][name] = _section({"componentType": "server", **fields})
        return self

    def without(self, *names: str) -> Self:
        """The graph without services `names`."""
        for name in names:
            self._service(name)
            del self._spec["services"][name]
        return self

    def only(self, *names: str) -> Self:
        """The graph with services `names` alone (none: no service, to add them afresh)."""
        for name in names:
            self._service(name)
        self._spec["services"] = {name: svc for name, svc in self._spec["services"].items() if name in names}
        return self

    def replicas(self, **counts: int) -> Self:
        """Replica counts by service: `.replicas(prefill=1, decode=2)`."""
        for name, count in counts.items():
            self.service(name, replicas=count)
        return self

    def nodes(self, **counts: int) -> Self:
        """Nodes per group by service (numberOfNodes): `.nodes(decode=2)`."""
        for name, count in counts.items():
            self.service(name, numberOfNodes=count)
        return self

    def args(self, service: str, *args: str) -> Self:
        """The service's args, all of them."""
        return self.service(service, args=list(args))

    def add_args(self, service: str, *args: str) -> Self:
        """More args after the service's own."""
        svc = self._service(service)
        svc["args"] = [*svc.get("args", []), *args]
        return self

    def arg(self, service: str, flag: str, value: str) -> Self:
        """The value of `flag` in the service's args, in place (after them if it has none)."""
        args = self._service(service).setdefault("args", [])
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args.extend([flag, value])
        return self

    def env(self, service: str, *variables: dict[str, Any]) -> Self:
        """The service's env, all of it."""
        return self.service(service, env=list(variables))

    def resources(self, service: str, **resources: Any) -> Self:
        """The service's resources, all of them: `.resources("decode", gpu=8, memory="1024Gi")`."""
        return self.service(service, resources=resources)

    def autoscaling(self, service: str, **fields: Any) -> Self:
        """The service's autoscaling, all of it."""
        return self.service(service, autoscaling=fields)

    def extra_pod_spec(self, service: str, **pod_spec: Any) -> Self:
        """The service's extraPodSpec, all of it: `.extra_pod_spec("decode", hostNetwork=True)`."""
        return self.service(service, extraPodSpec=pod_spec)


def graph(name: str | None = None, source: Path | dict[str, Any] = PD) -> GraphBuilder:
    """The InferaDeployment of `source` (an example's path, or a parent's dict: copied), as
    parent() hands it over: the PD example unless told otherwise, named `name` if given."""
    built = GraphBuilder(source)
    return built if name is None else built.name(name)
