"""The hooks as pure functions: a parsed Metacontroller request in, the answer out."""

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hooks import admission, generations, preflight, runtime, scheduling, status, vocabulary
from hooks.api.fields import SpecError, primary_index
from hooks.api.graph import InferaDeployment
from hooks.contract import HookRequest, as_kept, as_last_applied, field_at
from hooks.encoding import EncodedChild, canonical_json, sync_answer_json
from hooks.generations import Rollout
from hooks.immutable import encoded, keep_immutable_fields
from hooks.limits import RenderedSize
from hooks.memo import RenderMemo, RolledUp
from hooks.observed import Observed, live_replicas, model_download, service_of, services_changing
from hooks.renderers import autoscaling, discovery, gaie, model_cache, monitoring, nats, network, patches
from hooks.renderers.pods import pod_template
from hooks.renderers.services import server_service
from hooks.renderers.workloads import workload

log = logging.getLogger(__name__)


def _where_registered(kind: str) -> str:
    component = vocabulary.BY_KIND[kind].component if kind in vocabulary.BY_KIND else None
    if component is None:
        return "it in metacontroller/compositecontroller.yaml"
    return f"the kustomize component metacontroller/components/{component}"


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

    def key(self) -> list[Any]:
        return [
            sorted(self.live_replicas.items()),
            sorted(self.workloads),
            self.model_phase,
            sorted(self.mounted.items()),
            self.jobs,
            self.serving,
        ]


def render_children(
    idep: InferaDeployment, allows: Callable[[dict], bool] = lambda child: True, inputs: RenderInputs = RenderInputs()
) -> list[dict]:
    """Every desired child, in a stable order: plumbing first, then services by name, with
    spec.patches applied. Each child is measured as it is made: SpecError once one, or all
    together, outgrow the size bounds. Worker pools that wait for the model download are
    rendered as they will be once it completes (the sync leaves them out until then), so a
    mistake in them fails now, not after a download of hours.

    GAIE is all or nothing: when `allows` (the kinds the CompositeController registers) refuses
    a gateway object, the graph is rendered as with GAIE off (no sidecars rolled into every GPU
    pod, no router in direct mode), and the gateway objects follow unpatched, for
    withhold_unregistered to name."""
    gateway = gaie.render(idep, idep.at_generation(inputs.serving))
    if not all(allows(child) for child in gateway):
        return _rendered(gaie.without_gateway(idep, gateway), [], allows, inputs) + gateway
    return _rendered(idep, gateway, allows, inputs)


def _rendered(
    idep: InferaDeployment, gateway: list[dict], allows: Callable[[dict], bool], inputs: RenderInputs
) -> list[dict]:
    # The front door: at the serving generation, which under BlueGreen may not be `idep`'s.
    front = idep.at_generation(inputs.serving)
    sizes = RenderedSize()
    children: list[dict] = []
    cache_children, kept_jobs = _model_cache_children(idep, inputs)

    def add(child: dict) -> None:
        sizes.add(child)
        children.append(child)

    # The broker's policy nobody asked for is left out where the controller cannot create it,
    # rather than holding up the broker (defaults_left_out says so).
    policies = [child for child in network.plumbing(idep) if network.asked_for(idep) or allows(child)]
    plumbing = discovery.render(idep, _serves_scaling_api(idep)) + nats.render(idep) + policies
    for child in plumbing + cache_children + gateway + monitoring.render(idep):
        add(child)
    # As a pool's budget: left out where the controller cannot create it (defaults_left_out).
    for child in gaie.epp_disruption_budget(idep) if gateway else []:
        if allows(child):
            add(child)
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
            # A budget nobody asked for is left out where the controller cannot create it,
            # rather than holding up the pool (defaults_left_out says so).
            if child["kind"] != "PodDisruptionBudget" or svc.disruption_budget is not None or allows(child):
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


def _previous_status(request: HookRequest) -> dict[str, Any]:
    previous = request.parent.get("status")
    return previous if isinstance(previous, dict) else {}


@dataclass(frozen=True)
class SyncAnswer:
    state: str | None
    status_json: bytes  # the status as canonical JSON
    children: list[EncodedChild]

    def json(self) -> bytes:
        """The answer as canonical JSON, spliced from its parts' encodings."""
        return sync_answer_json(self.status_json, self.children)


def sync(request: HookRequest, now: status.Clock = status.utc_now) -> dict[str, Any]:
    """The sync answer as plain data, computed afresh (the CLI, the tests)."""
    return json.loads(sync_answer(request, now).json())


def sync_answer(request: HookRequest, now: status.Clock = status.utc_now, memo: RenderMemo | None = None) -> SyncAnswer:
    """The desired children and status. With a memo, a parent, registered kinds and observed
    inputs rendered before are not rendered again."""
    memo = memo or RenderMemo(0)
    try:
        entry = memo.parent(request.parent)
        registered = None if request.registered is None else sorted(request.registered)
        rollout = _rollout(
            entry.idep(), request, lambda what, compute: memo.generation(entry, [registered, *what], compute)
        )
        idep = entry.idep().at_generation(rollout.desired if rollout else "")
        inputs = RenderInputs.of(idep, request.by_key, rollout)
        # The generation rendered is part of the key: which one is the spec's may follow what
        # is observed (generations.named_otherwise).
        key = [registered, idep.graph_generation, inputs.key()]
        children = memo.rendered(entry, key, lambda: _checked_render(idep, request, inputs))
        restored, lost = _restored(idep, request, rollout) if rollout else ([], [])
        children = children + _kept_generations(request, rollout) + restored
        children, unregistered = withhold_unregistered(request, children)
        children, notices = keep_immutable_fields(children, request.by_key)
        answered = {(child.kind, child.name) for child in children}
        notices += status.autoscaler_notices(idep, inputs.live_replicas, answered)
        notices += defaults_left_out(idep, request)
    except SpecError as error:
        return _keep_observed(request, str(error), now)
    except Exception as error:  # a renderer bug must not delete a running fleet either
        log.exception("rendering %s failed", request.parent["metadata"]["name"])
        # Say what failed, not where: an exception's text can hold file paths and internals.
        message = f"internal error while rendering ({type(error).__name__}); the hook's log has the details"
        return _keep_observed(request, message, now)
    previous = _previous_status(request)
    changing = services_changing(idep, children, request.by_key)

    rollout_read = generations.RolloutRead.of(rollout) if rollout else None
    missing, coming = _not_observed(request, children, rollout)
    inputs_read = status.StatusInputs.of(
        request.by_key,
        previous,
        notices=notices,
        unregistered=unregistered,
        changing=changing,
        rollout=rollout_read,
        missing=missing,
        coming=coming,
        lost=lost,
        unscheduled=scheduling.unscheduled(request.related),
    )

    def roll_up() -> tuple[RolledUp, bool]:
        clock = ReadClock(now)
        rolled_up = status.roll_up(idep, inputs_read, clock)
        return (rolled_up.state, canonical_json(status.as_wire(rolled_up))), not clock.read

    state, status_json = memo.status(entry, inputs_read.key(), roll_up)
    return SyncAnswer(state, status_json, children)


def _rollout(
    idep: InferaDeployment, request: HookRequest, remembered: Callable[[list[str], Callable[[], str]], str]
) -> Rollout | None:
    """Which generations to answer, or None for a graph that has only ever run outside BlueGreen.
    `remembered(what, compute)` looks up in the memo what `compute` makes of the spec (a digest of
    what its workloads run), or computes it."""

    def rendered_at(generation: str) -> list[dict[str, Any]]:
        inputs = RenderInputs(model_phase=None if idep.spec.model_cache is None else "Ready", serving=generation)
        return render_children(idep.at_generation(generation), request.allows, inputs)

    def spec_digest() -> str:
        return remembered(["generation"], lambda: generations.digest(rendered_at("")))

    def workloads_at(generation: str) -> dict[str, str]:
        digests = remembered(
            ["workloads", generation], lambda: json.dumps(generations.workload_digests(rendered_at(generation)))
        )
        return json.loads(digests)

    desired = spec_digest() if idep.spec.blue_green else ""
    recorded = field_at(_previous_status(request), "rollout", "servingGeneration")
    recorded = recorded if isinstance(recorded, str) else None
    observed = request.by_key
    rollout = generations.plan(idep.at_generation(desired), observed, recorded)
    if not idep.spec.blue_green and rollout.served | rollout.present <= {""}:
        return None
    if idep.spec.blue_green and (named := generations.named_otherwise(rollout, observed, workloads_at)):
        rollout = generations.plan(idep.at_generation(named), observed, recorded)
    generations.check_switch(rollout, observed, spec_digest, workloads_at)
    return rollout


def _kept_generations(request: HookRequest, rollout: Rollout | None) -> list[EncodedChild]:
    """The children of generations still served that the spec no longer renders, as applied."""
    if rollout is None or not rollout.kept:
        return []
    kept = [
        child
        for child in request.children
        if generations.belongs_to_a_generation(child) and generations.generation_of(child) in rollout.kept
    ]
    return [encoded(child) for child in as_kept(kept, request.children)]


def _restored(idep: InferaDeployment, request: HookRequest, rollout: Rollout) -> tuple[list[EncodedChild], list[str]]:
    """The children of the serving generation, while it is not the spec's, that are gone: those
    this spec renders exactly as that generation recorded them, to create anew, and why the
    others cannot be."""
    restoration = generations.restoration(rollout, request.by_key, idep)
    if restoration is None:
        return [], []
    at = idep.at_generation(restoration.generation)
    cache = None if idep.spec.model_cache is None else "Ready"
    inputs = RenderInputs(live_replicas(at, request.by_key), model_phase=cache, serving=restoration.generation)
    children, lost = generations.restore(restoration, render_children(at, request.allows, inputs), rollout)
    return [encoded(child) for child in children], [lost] if lost else []


def _not_observed(
    request: HookRequest, children: list[EncodedChild], rollout: Rollout | None
) -> tuple[list[str], list[str]]:
    """The children of the answer that are not observed ("Kind name"): those the graph serves
    with, and those it does not serve with yet: the incoming generation's of a rollout, and a
    model download (the model cache's phase says where it is)."""
    incoming = rollout.desired if rollout and rollout.serving != rollout.desired else None
    missing: list[str] = []
    coming: list[str] = []
    for child in children:
        if (child.kind, child.name) in request.by_key:
            continue
        later = child.kind == "Job"
        if incoming is not None and not later:
            body = json.loads(child.body)  # rare: a child just answered, or one whose create fails
            later = generations.belongs_to_a_generation(body) and generations.generation_of(body) == incoming
        (coming if later else missing).append(f"{child.kind} {child.name}")
    return missing, coming


class ReadClock:
    """A clock that remembers whether it was read."""

    def __init__(self, clock: status.Clock) -> None:
        self.clock = clock
        self.read = False

    def __call__(self) -> datetime:
        self.read = True
        return self.clock()


def _checked_render(idep: InferaDeployment, request: HookRequest, inputs: RenderInputs) -> list[EncodedChild]:
    children = render_children(idep, request.allows, inputs)
    preflight.check_graph(idep, children)
    waiting = _waiting_for_model(idep, inputs)
    # Under BlueGreen the serving generation's pods stay: their budget, autoscaler and policies too.
    withheld = vocabulary.WORKLOAD_KINDS if idep.spec.blue_green else None
    return [
        encoded(child)
        for child in children
        if service_of(child) not in waiting or (withheld is not None and child["kind"] not in withheld)
    ]


def defaults_left_out(idep: InferaDeployment, request: HookRequest) -> list[str]:
    """Say that the default disruption budgets, or the broker's default NetworkPolicy, are
    missing, and why."""
    notices = []
    budget = vocabulary.BY_KIND["PodDisruptionBudget"]
    services = [
        service
        for service, svc in sorted(idep.spec.services.items())
        if svc.disruption_budget is None and autoscaling.budget_max_unavailable(svc) is not None
    ]
    if gaie.epp_disruption_budget(idep):
        services.append(vocabulary.EPP_SUFFIX)
    if services and not request.registers(budget.kind, budget.api_version):
        notices.append(
            f"no PodDisruptionBudget for {', '.join(services)}: this CompositeController does not register "
            f"{budget.kind} ({budget.api_version}); enable {_where_registered(budget.kind)}"
        )
    if network.asked_for(idep) or not idep.spec.nats.deploy:
        return notices
    policy = vocabulary.BY_KIND["NetworkPolicy"]
    unprotected = "no NetworkPolicy for the NATS broker, so any pod of the cluster may connect to it"
    if host_network := network.host_network_services(idep):
        notices.append(
            f"{unprotected}: {', '.join(host_network)} {'runs' if len(host_network) == 1 else 'run'} on the node's "
            f"network, which a policy cannot tell from the node's own traffic; set networkPolicy.isolate to broker "
            f"to have it anyway (then those pods reach the broker only from its node)"
        )
    elif not request.registers(policy.kind, policy.api_version):
        notices.append(
            f"{unprotected}: this CompositeController does not register {policy.kind} ({policy.api_version}); "
            f"enable {_where_registered(policy.kind)}"
        )
    return notices


def withhold_unregistered(request: HookRequest, children: list[EncodedChild]) -> tuple[list[EncodedChild], list[str]]:
    """Children of a kind the CompositeController does not register would fail the whole sync.

    Every child of an affected service (or plumbing part) is withheld instead and that part's
    observed children are kept exactly as applied; the rest of the graph is still rendered.
    Returns the children to answer and one message per withheld child.
    """
    withheld = [child for child in children if not request.registers(child.kind, child.api_version)]
    if not withheld:
        return children, []
    blocked = {child.service for child in withheld}
    answer = [child for child in children if child.service not in blocked]
    kept = [child for child in request.children if service_of(child) in blocked]
    answer += [encoded(child) for child in as_kept(kept, request.children)]
    messages = [
        f"{child.kind} {child.name} cannot be created: this CompositeController does not "
        f"register {child.kind} ({child.api_version}); enable {_where_registered(child.kind)}"
        for child in withheld
    ]
    return answer, messages


def _keep_observed(request: HookRequest, message: str, now: status.Clock) -> SyncAnswer:
    """A bad spec fails loudly in status and keeps every observed child exactly as applied (an
    autoscaled workload at the autoscaler's count), creating nothing new."""
    generation = request.parent["metadata"].get("generation")
    failed = status.failed(message, generation if isinstance(generation, int) else 0, _previous_status(request), now)
    kept = [encoded(child) for child in as_kept(request.children, request.children)]
    return SyncAnswer(failed.state, canonical_json(status.as_wire(failed)), kept)
