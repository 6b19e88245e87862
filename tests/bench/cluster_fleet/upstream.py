"""The comparison a user makes: what the upstream Go operator writes for the same fleet, counted
from its source (../shared/upstream/operator, internal/controller/inferadeployment_controller.go).

Its Reconcile ends with RequeueAfter 15 s, so every graph is reconciled every 15 s. Each pass
create-or-updates every child with a mutate function that assigns the builder's whole spec
(copySpec), which lacks what the API server defaults (a Deployment's revisionHistoryLimit and
pod template defaults, a Service's sessionAffinity, a StatefulSet's updateStrategy); the
semantic comparison never matches, so each Deployment, StatefulSet and Service is updated on
every pass. A LeaderWorkerSet is merged instead, but its pod template carries a
`creationTimestamp: null` the CRD's schema prunes and ports without the protocol the CRD
defaults: updated every pass too. ServiceAccounts, Roles, RoleBindings, InferencePools and
HTTPRoutes match and are not written. The status is updated unconditionally. Its CRD has no
autoscaling, disruption budget or network policy, so it makes none of those children.

Its client is controller-runtime's (v0.20.1, QPS 20 and burst 30 per resource's client, no
flags set) with one reconcile at a time, which caps what it can send.
"""

from tests.bench.cluster_fleet import fleet

SECONDS_BETWEEN_RECONCILES = 15
CLIENT_QPS = 20
# Updates per reconcile of one converged graph, by the resource they go to.
UPDATES = {
    "pd": {"deployments": 3, "services": 2, "statefulsets": 1, "inferadeployments/status": 1},
    "mixed": {"deployments": 2, "services": 2, "statefulsets": 1, "inferadeployments/status": 1},
    "multinode": {
        "deployments": 1,
        "leaderworkersets": 1,
        "services": 2,
        "statefulsets": 1,
        "inferadeployments/status": 1,
    },
    # No server: the picker's Deployment and Service instead.
    "gaie": {"deployments": 3, "services": 2, "statefulsets": 1, "inferadeployments/status": 1},
    "autoscaled": {"deployments": 3, "services": 2, "statefulsets": 1, "inferadeployments/status": 1},
}
assert set(UPDATES) == set(fleet.SHAPES)


def updates_per_pass(graphs: int) -> dict[str, int]:
    """Every resource's updates in one pass over the fleet (the shapes in turn)."""
    shapes = list(fleet.SHAPES)
    total: dict[str, int] = {}
    for index in range(graphs):
        for resource, count in UPDATES[shapes[index % len(shapes)]].items():
            total[resource] = total.get(resource, 0) + count
    return total


def writes_per_second(graphs: int) -> tuple[float, float]:
    """What it asks for (every graph every 15 s), and what its client's per-resource rate limit
    lets through (the resource with the most updates per pass sets the pace)."""
    per_pass = updates_per_pass(graphs)
    asked = sum(per_pass.values()) / SECONDS_BETWEEN_RECONCILES
    seconds_per_pass = max(SECONDS_BETWEEN_RECONCILES, max(per_pass.values()) / CLIENT_QPS)
    return asked, sum(per_pass.values()) / seconds_per_pass
