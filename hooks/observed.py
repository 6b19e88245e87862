"""Reading children, rendered or as observed: where a workload keeps its pod templates."""


def pod_templates(child: dict) -> list[tuple[dict, bool]]:
    """The pod templates of a workload, each with whether it is rank 0 of its group."""
    spec = child.get("spec") or {}
    if child["kind"] in ("Deployment", "StatefulSet"):
        return [(spec["template"], True)]
    if child["kind"] == "LeaderWorkerSet":
        group = spec["leaderWorkerTemplate"]
        return [(group.get("leaderTemplate") or group["workerTemplate"], True), (group["workerTemplate"], False)]
    return []
