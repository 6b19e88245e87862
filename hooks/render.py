"""The desired children: every child a graph needs, rendered from its spec and a few facts
observed of its children, checked as the API server and the runtime would check them, and
encoded. A pure function of plain data: the sync calls it through the memo, tests and the CLI
directly."""

from dataclasses import dataclass, field
from typing import Any

from hooks import admission, generations, preflight, runtime, vocabulary
from hooks.api.fields import primary_index
from hooks.api.graph import InferaDeployment
from hooks.contract import Registration, as_last_applied
from hooks.encoding import EncodedChild
from hooks.generations import Rollout
from hooks.immutable import encoded
from hooks.limits import RenderedSize
from hooks.observed import Observed, live_replicas, model_download, service_of
from hooks.registration import EVERY_KIND, defaults_left_out, gateway_registered, keeps_default
from hooks.renderers import autoscaling, discovery, gaie, model_cache, monitoring, nats, network, patches, placement
from hooks.renderers.pods import pod_template
from hooks.renderers.services import server_service
from hooks.renderers.workloads import workload


@dataclass(frozen=True)
class RenderInputs:
    """What a render reads from the observed children, as plain data. With the parent and the
    registered kinds it is everything a render depends on, and so the render memo's key."""

    # The replicas each autoscaled service's workload has now.
    live_replicas: dict[str, int] = field(default_factory=dict)
    # The workloads that exist, while the model downloads (a new worker pool waits for it).
    workloads: frozenset[tuple[str, str]] = frozenset()
    # The model cache's download phase (None without a model cache), the source digest each
    # service's workload mounts, and the observed Jobs by name as last applied.
    model_phase: str | None = None
    mounted: dict[str, str] = field(default_factory=dict)
    jobs: dict[str, Any] = field(default_factory=dict)
    # The generation the front door (servers' Services, HTTPRoute, autoscalers) is rendered at.
    serving: str = ""

    @classmethod
    def of(cls, idep: InferaDeployment, observed: Observed, rollout: Rollout | None = None) -> "RenderInputs":
        """From the observed children by (kind, name), for `idep` at the desired generation."""
        # An autoscaler's count is that of the generation it scales now: a new one starts there.
        live = live_replicas(idep.at_generation(rollout.front) if rollout else idep, observed)
        serving = rollout.serving if rollout else idep.graph_generation
        download = model_download(idep, observed)
        if download is None:
            return cls(live, serving=serving)
        # Which workloads exist matters only while new worker pools wait for the download.
        workloads = (
            frozenset(key for key in observed if key[0] in vocabulary.WORKLOAD_KINDS)
            if download.phase != "Ready"
            else frozenset()
        )
        jobs = {name: as_last_applied(child) for (kind, name), child in observed.items() if kind == "Job"}
        return cls(live, workloads, download.phase, download.mounted, jobs, serving)


def render_children(
    idep: InferaDeployment, registration: Registration = EVERY_KIND, inputs: RenderInputs = RenderInputs()
) -> list[dict]:
    """Every desired child, in a stable order: plumbing first, then services by name, with
    spec.patches applied. Each child is measured as it is made: SpecError once one, or all
    together, outgrow the size bounds. Worker pools that wait for the model download are
    rendered as they will be once it completes (the sync leaves them out until then), so a
    mistake in them fails now, not after a download of hours.

    GAIE is all or nothing: when `registration` (the kinds the CompositeController registers) refuses
    a gateway object, the graph is rendered as with GAIE off (no sidecars rolled into every GPU
    pod, no router in direct mode), and the gateway objects follow unpatched, for
    withhold_unregistered to name."""
    gateway = gaie.render(idep, idep.at_generation(inputs.serving))
    if not gateway_registered(gateway, registration):
        return _rendered(gaie.without_gateway(idep, gateway), [], registration, inputs) + gateway
    return _rendered(idep, gateway, registration, inputs)


def _rendered(
    idep: InferaDeployment, gateway: list[dict], registration: Registration, inputs: RenderInputs
) -> list[dict]:
    # The front door: at the serving generation, which under BlueGreen may not be `idep`'s.
    front = idep.at_generation(inputs.serving)
    sizes = RenderedSize()
    children: list[dict] = []
    cache_children, kept_jobs = _model_cache_children(idep, inputs)

    def add(child: dict) -> None:
        sizes.add(child)
        children.append(child)

    policies = [
        child for child in network.plumbing(idep) if keeps_default(registration, child, network.asked_for(idep))
    ]
    plumbing = discovery.render(idep, _serves_scaling_api(idep)) + nats.render(idep) + policies
    for child in plumbing + cache_children + gateway + monitoring.render(idep):
        add(child)
    for child in gaie.epp_disruption_budget(idep) if gateway else []:
        if keeps_default(registration, child, asked_for=False):
            add(child)
    placement.check_pinned_domains(idep)
    waiting = _waiting_for_model(idep, inputs)
    for service, svc in sorted(idep.spec.services.items()):
        model_dir = _model_dir(idep, inputs, service, waiting)
        pods = workload(idep, service, svc, inputs.live_replicas.get(service), model_dir)
        add(pods)
        if not svc.is_worker:
            add(server_service(front, service, svc))
        for child in network.service_policies(idep, service, svc, pods):
            add(child)
        for child in autoscaling.render(front, service, svc):
            asked_for = child["kind"] != "PodDisruptionBudget" or svc.disruption_budget is not None
            if keeps_default(registration, child, asked_for):
                add(child)
    patched = patches.apply_patches(idep.spec.patches or [], children, sizes, lambda child: _owned_fields(idep, child))
    admission.check(idep, children, patched)
    if idep.graph_generation:
        patched = generations.with_templates_recorded(patched)
    sizes.check_recorded(patched, idep.metadata.namespace, idep.metadata.uid)
    return patched + kept_jobs


def _waiting_for_model(idep: InferaDeployment, inputs: RenderInputs) -> set[str]:
    """The worker services left out until the model download completes: no GPU pod sits idle
    while the weights move, so a new worker pool waits for them (one already running keeps
    serving what it mounts)."""
    if inputs.model_phase in (None, "Ready"):
        return set()
    return {
        service
        for service, svc in idep.spec.services.items()
        if svc.is_worker
        and not any(
            (kind, vocabulary.generation_name(idep, service)) in inputs.workloads for kind in vocabulary.WORKLOAD_KINDS
        )
    }


def _serves_scaling_api(idep: InferaDeployment) -> bool:
    """Whether a server's router serves the scaling API, as its rendered primary container
    starts it: the servers' identity then grants what that API calls."""
    for service, svc in idep.spec.services.items():
        if svc.is_worker:
            continue
        containers = pod_template(idep, service, svc)["spec"]["containers"]
        primary = containers[primary_index(containers) or 0]
        started = runtime.entry_point(primary)
        if started is not None and runtime.scaling_api_enabled(started.argv, primary.get("env") or []):
            return True
    return False


def _model_cache_children(idep: InferaDeployment, inputs: RenderInputs) -> tuple[list[dict], list[dict]]:
    """The claim and, unless it exists, the current source's download Job; and the observed
    download Jobs to keep as applied (a Job cannot change): the current one, and those of
    sources running workers still mount. The others are done with and go."""
    cache = idep.spec.model_cache
    if cache is None or inputs.model_phase is None:
        return [], []
    rendered = [model_cache.persistent_volume_claim(idep)]
    job = model_cache.download_job(idep)
    applied = inputs.jobs.get(job["metadata"]["name"])
    if applied is None:
        rendered.append(job)
    # A failed download whose Job the spec now renders differently (a token added, another
    # downloader) is deleted, and created anew on the next sync: that is the retry.
    # (Its spec: Metacontroller records the metadata with its own label and the namespace added.)
    retried = inputs.model_phase == "Failed" and applied is not None and applied.get("spec") != job["spec"]
    wanted = {vocabulary.download_job_name(idep, digest) for digest in inputs.mounted.values()}
    if not retried:
        wanted.add(job["metadata"]["name"])
    return rendered, [inputs.jobs[name] for name in sorted(wanted) if name in inputs.jobs]


def _model_dir(idep: InferaDeployment, inputs: RenderInputs, service: str, waiting: set[str]) -> str | None:
    """The cache directory a service's pods mount: the current source's once downloaded, or for
    a pool that waits for it; until then the one its running workers mount (they keep serving
    it), or none."""
    cache = idep.spec.model_cache
    if cache is None or inputs.model_phase is None:
        return None
    if inputs.model_phase == "Ready" or service in waiting or idep.spec.blue_green:
        # Under BlueGreen a new source makes a new generation, which waits for its download.
        return cache.digest
    return inputs.mounted.get(vocabulary.generation_name(idep, service))


# What spec.services.<name>.autoscaling decides, by kind: a patch setting it would fight the autoscaler.
AUTOSCALER_OWNED = {
    "Deployment": ("replicas",),
    "LeaderWorkerSet": ("replicas",),
    "HorizontalPodAutoscaler": ("scaleTargetRef", "minReplicas", "maxReplicas"),
}


def _owned_fields(idep: InferaDeployment, child: dict) -> list[patches.Owned]:
    """What no patch may change in a rendered child: what it always owns, and what its service's
    autoscaler does."""
    service = service_of(child)
    svc = idep.spec.services.get(service or "")
    autoscaled = () if svc is None or svc.autoscaling is None else AUTOSCALER_OWNED.get(child["kind"], ())
    return [
        *patches.owned_fields(child),
        *((("spec", field), f"spec.services.{service}.autoscaling") for field in autoscaled),
    ]


def desired_children(
    idep: InferaDeployment, registration: Registration, inputs: RenderInputs
) -> tuple[list[EncodedChild], list[str]]:
    """The children to answer for `idep` (at the generation it renders), checked and encoded:
    worker pools that wait for the model download are left out (rendered and checked all the
    same), and under BlueGreen only their workloads. And what the spec's defaults leave out
    where the controller cannot create them (registration.defaults_left_out), for the status."""
    children = render_children(idep, registration, inputs)
    preflight.check_graph(idep, children)
    waiting = _waiting_for_model(idep, inputs)
    # Under BlueGreen the serving generation's pods stay: their budget, autoscaler and policies too.
    withheld = vocabulary.WORKLOAD_KINDS if idep.spec.blue_green else None
    answered = [
        encoded(child)
        for child in children
        if service_of(child) not in waiting or (withheld is not None and child["kind"] not in withheld)
    ]
    return answered, defaults_left_out(idep, registration)
