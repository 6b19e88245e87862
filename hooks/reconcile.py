"""The hooks as pure functions: a parsed Metacontroller request in, the answer out."""

import logging
from collections.abc import Callable, Sequence
from typing import Any

from hooks import admission, preflight, status, vocabulary
from hooks.api import InferaDeployment, SpecError
from hooks.contract import HookRequest, as_kept, as_last_applied, child_key
from hooks.immutable import keep_immutable_fields
from hooks.limits import RenderedSize
from hooks.renderers import autoscaling, discovery, gaie, model_cache, nats
from hooks.renderers.patches import apply_patches, targeting
from hooks.renderers.services import server_service
from hooks.renderers.workloads import workload
from hooks.vocabulary import SERVICE_LABEL

log = logging.getLogger(__name__)


def _where_registered(kind: str) -> str:
    component = vocabulary.BY_KIND[kind].component if kind in vocabulary.BY_KIND else None
    if component is None:
        return "it in metacontroller/compositecontroller.yaml"
    return f"the kustomize component metacontroller/components/{component}"


def render_children(
    idep: InferaDeployment,
    allows: Callable[[dict], bool] = lambda child: True,
    observed: Sequence[dict] = (),
) -> list[dict]:
    """Every desired child, in a stable order: plumbing first, then services by name, with
    spec.patches applied. Each child is measured as it is made: SpecError once one, or all
    together, outgrow the size bounds. From the `observed` children come the replicas an
    autoscaler set and where the model cache's download is.

    GAIE is all or nothing: when `allows` (the kinds the CompositeController registers) refuses
    a gateway object, the graph is rendered as with GAIE off (no sidecars rolled into every GPU
    pod, no router in direct mode), and the gateway objects follow unpatched, for
    withhold_unregistered to name."""
    gateway = gaie.render(idep)
    if not all(allows(child) for child in gateway):
        return _rendered(gaie.without_gateway(idep, gateway), [], allows, list(observed)) + gateway
    return _rendered(idep, gateway, allows, list(observed))


def _rendered(
    idep: InferaDeployment, gateway: list[dict], allows: Callable[[dict], bool], observed: list[dict]
) -> list[dict]:
    sizes = RenderedSize()
    children: list[dict] = []
    live = status.live_replicas(idep, observed)
    download = status.model_download(idep, observed)
    cache_children, kept_jobs = _model_cache_children(idep, download, observed)
    existing = {child_key(child) for child in observed}

    def add(child: dict) -> None:
        sizes.add(child)
        children.append(child)

    for child in discovery.render(idep) + nats.render(idep) + cache_children + gateway:
        add(child)
    for service, svc in sorted(idep.spec.services.items()):
        name = vocabulary.child_name(idep, service)
        # No GPU pod sits idle while the weights move: a new worker pool waits for the download.
        if download and download.phase != "Ready" and svc.is_worker:
            if not any((kind, name) in existing for kind in vocabulary.WORKLOAD_KINDS):
                continue
        add(workload(idep, service, svc, live.get(service), _model_dir(idep, download, service)))
        if not svc.is_worker:
            add(server_service(idep, service, svc))
        for child in autoscaling.render(idep, service, svc):
            # A budget nobody asked for is left out where the controller cannot create it,
            # rather than holding up the pool (default_budgets_left_out says so).
            if child["kind"] != "PodDisruptionBudget" or svc.disruption_budget is not None or allows(child):
                add(child)
    patched = apply_patches(idep.spec.patches or [], children, sizes)
    _check_autoscaler_owned(idep, children, patched)
    admission.check(idep, children, patched)
    return patched + kept_jobs


def _model_cache_children(
    idep: InferaDeployment, download: status.Download | None, observed: list[dict]
) -> tuple[list[dict], list[dict]]:
    """The claim and, unless it exists, the current source's download Job; and the observed
    download Jobs to keep as applied (a Job cannot change): the current one, and those of
    sources running workers still mount. The others are done with and go."""
    cache = idep.spec.model_cache
    if cache is None or download is None:
        return [], []
    rendered = [model_cache.persistent_volume_claim(idep)]
    job = model_cache.download_job(idep)
    if download.job is None:
        rendered.append(job)
    # A failed download whose Job the spec now renders differently (a token added, another
    # downloader) is deleted, and created anew on the next sync: that is the retry.
    # (Its spec: Metacontroller records the metadata with its own label and the namespace added.)
    retried = (
        download.phase == "Failed"
        and download.job is not None
        and as_last_applied(download.job).get("spec") != job["spec"]
    )
    wanted = {vocabulary.download_job_name(idep, digest) for digest in download.mounted.values()}
    if not retried:
        wanted.add(job["metadata"]["name"])
    kept = [
        as_last_applied(child)
        for child in sorted(observed, key=child_key)
        if child.get("kind") == "Job" and child["metadata"].get("name") in wanted
    ]
    return rendered, kept


def _model_dir(idep: InferaDeployment, download: status.Download | None, service: str) -> str | None:
    """The cache directory a service's pods mount: the current source's once downloaded; until
    then the one its running workers mount (they keep serving it), or none."""
    cache = idep.spec.model_cache
    if cache is None or download is None:
        return None
    return cache.digest if download.phase == "Ready" else download.mounted.get(service)


# What spec.services.<name>.autoscaling decides, by kind: a patch setting it would fight the autoscaler.
AUTOSCALER_OWNED = {
    "Deployment": ("replicas",),
    "LeaderWorkerSet": ("replicas",),
    "HorizontalPodAutoscaler": ("scaleTargetRef", "minReplicas", "maxReplicas"),
}


def _check_autoscaler_owned(idep: InferaDeployment, rendered: list[dict], patched: list[dict]) -> None:
    for before, after in zip(rendered, patched, strict=True):
        svc = idep.spec.services.get(_service_of(after) or "")
        if after is before or svc is None or svc.autoscaling is None:
            continue
        for field in AUTOSCALER_OWNED.get(after["kind"], ()):
            if (after.get("spec") or {}).get(field) != before["spec"].get(field):
                raise SpecError(
                    f"{targeting(idep.spec.patches or [], after)} ({after['kind']} {after['metadata']['name']}): "
                    f"spec.{field} is set by spec.services.{_service_of(after)}.autoscaling, not by a patch"
                )


def _previous_status(request: HookRequest) -> dict[str, Any]:
    previous = request.parent.get("status")
    return previous if isinstance(previous, dict) else {}


def sync(request: HookRequest, now: status.Clock = status.utc_now) -> dict[str, Any]:
    try:
        idep = InferaDeployment.from_parent(request.parent)
        live = status.live_replicas(idep, request.children)
        children = render_children(idep, request.allows, request.children)
        preflight.check_graph(idep, children)
        children, unregistered = withhold_unregistered(request, children)
        children, notices = keep_immutable_fields(children, request.children)
        notices += status.autoscaler_notices(idep, live, children) + default_budgets_left_out(idep, request)
    except SpecError as error:
        return _keep_observed(request, str(error), now)
    except Exception as error:  # a renderer bug must not delete a running fleet either
        log.exception("rendering %s failed", request.parent["metadata"]["name"])
        # Say what failed, not where: an exception's text can hold file paths and internals.
        message = f"internal error while rendering ({type(error).__name__}); the hook's log has the details"
        return _keep_observed(request, message, now)
    return {
        "status": status.as_wire(
            status.roll_up(idep, request.children, _previous_status(request), now, notices, unregistered)
        ),
        "children": children,
    }


def default_budgets_left_out(idep: InferaDeployment, request: HookRequest) -> list[str]:
    """Say that the default disruption budgets are missing, and why."""
    budget = vocabulary.BY_KIND["PodDisruptionBudget"]
    if request.allows({"kind": budget.kind, "apiVersion": budget.api_version}):
        return []
    services = [
        service
        for service, svc in sorted(idep.spec.services.items())
        if svc.disruption_budget is None and svc.budget_max_unavailable is not None
    ]
    if not services:
        return []
    return [
        f"no PodDisruptionBudget for {', '.join(services)}: this CompositeController does not register "
        f"{budget.kind} ({budget.api_version}); enable {_where_registered(budget.kind)}"
    ]


def _service_of(child: dict[str, Any]) -> str | None:
    return (child["metadata"].get("labels") or {}).get(SERVICE_LABEL)


def withhold_unregistered(
    request: HookRequest, children: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[str]]:
    """Children of a kind the CompositeController does not register would fail the whole sync.

    Every child of an affected service (or plumbing part) is withheld instead and that part's
    observed children are kept exactly as applied; the rest of the graph is still rendered.
    Returns the children to answer and one message per withheld child.
    """
    withheld = [child for child in children if not request.allows(child)]
    if not withheld:
        return children, []
    blocked = {_service_of(child) for child in withheld}
    answer = [child for child in children if _service_of(child) not in blocked]
    answer += as_kept([child for child in request.children if _service_of(child) in blocked], request.children)
    messages = [
        f"{child['kind']} {child['metadata']['name']} cannot be created: this CompositeController does not "
        f"register {child['kind']} ({child['apiVersion']}); enable "
        f"{_where_registered(child['kind'])}"
        for child in withheld
    ]
    return answer, messages


def _keep_observed(request: HookRequest, message: str, now: status.Clock) -> dict[str, Any]:
    """A bad spec fails loudly in status and keeps every observed child exactly as applied (an
    autoscaled workload at the autoscaler's count), creating nothing new."""
    generation = request.parent["metadata"].get("generation")
    return {
        "status": status.as_wire(
            status.failed(message, generation if isinstance(generation, int) else 0, _previous_status(request), now)
        ),
        "children": as_kept(request.children, request.children),
    }
