"""spec.modelCache through the hook app and the simulated Metacontroller: the weights are
downloaded once into a claim, GPU pods wait for them, a new source downloads beside the running
graph, and the claim can outlive the graph."""

import copy
import inspect
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hooks.api.graph import InferaDeployment
from hooks.renderers import model_cache
from tests.support.graphs import GraphBuilder, graph
from tests.support.pod_security import RESTRICTED_CONTAINER
from tests.support.requests import children_by_key
from tests.support.simulator import Metacontroller

SOURCE = "hf://Qwen/Qwen3-0.6B"
CLAIM = ("PersistentVolumeClaim", "qwen-pd-models")
WORKERS = [("Deployment", "qwen-pd-decode"), ("Deployment", "qwen-pd-prefill")]


def cached(**cache: Any) -> GraphBuilder:
    """The PD graph served from the model cache (SOURCE, 20Gi, `cache` on top): its workers load
    /models/Qwen3-0.6B."""
    return (
        graph()
        .model_cache(**({"source": SOURCE, "size": "20Gi"} | cache))
        .arg("prefill", "--model-path", "/models/Qwen3-0.6B")
        .arg("decode", "--model-path", "/models/Qwen3-0.6B")
    )


def jobs(mc: Metacontroller) -> list[str]:
    return sorted(name for kind, name in mc.children if kind == "Job")


def finish(mc: Metacontroller, job: str, complete: bool = True) -> None:
    """The Job controller reports the download's end."""
    condition = (
        {"type": "Complete", "status": "True"}
        if complete
        else {
            "type": "Failed",
            "status": "True",
            "reason": "BackoffLimitExceeded",
            "message": "Job has reached the specified backoff limit",
        }
    )
    mc.set_status("Job", job, {"conditions": [condition]})


def mount(mc: Metacontroller, name: str) -> dict[str, Any]:
    (container,) = [
        c for c in mc.children[("Deployment", name)]["spec"]["template"]["spec"]["containers"] if c["name"] == "infera"
    ]
    (found,) = [m for m in container["volumeMounts"] if m["name"] == "model-cache"]
    return found


def model_cache_digest(repo: str, revision: str | None) -> str:
    obj = cached(source=f"hf://{repo}" + (f"@{revision}" if revision else "")).obj()
    cache = InferaDeployment.from_parent(obj).spec.model_cache
    assert cache is not None
    return cache.digest


def test_workers_wait_for_the_download_then_mount_it_read_only(hooks) -> None:
    mc = Metacontroller(hooks, cached().obj())
    mc.converge()
    job = "qwen-pd-download-" + model_cache_digest("Qwen/Qwen3-0.6B", None)
    assert jobs(mc) == [job]
    assert CLAIM in mc.children and not any(key in mc.children for key in WORKERS)
    status = mc.parent["status"]
    assert status["state"] == "pending"
    assert status["message"].startswith(f"downloading {SOURCE}; decode 0/1 ready; prefill 0/1 ready")
    assert status["modelCache"] == {
        "phase": "Downloading",
        "source": SOURCE,
        "job": job,
        "message": f"downloading {SOURCE}",
    }
    model_ready = next(c for c in status["conditions"] if c["type"] == "ModelReady")
    assert (model_ready["status"], model_ready["reason"]) == ("False", "Downloading")

    finish(mc, job)
    created = sorted(tuple(key) for op, *key in mc.child_writes(mc.sync()) if op == "create")
    assert created == [*WORKERS, ("PodDisruptionBudget", "qwen-pd-decode"), ("PodDisruptionBudget", "qwen-pd-prefill")]
    for _, name in WORKERS:
        assert mount(mc, name) == {
            "name": "model-cache",
            "mountPath": "/models",
            "subPath": job.rsplit("-", 1)[1],
            "readOnly": True,
        }
        volumes = mc.children[("Deployment", name)]["spec"]["template"]["spec"]["volumes"]
        assert {
            "name": "model-cache",
            "persistentVolumeClaim": {"claimName": "qwen-pd-models", "readOnly": True},
        } in volumes
    mc.converge()
    mc.mark_ready()
    mc.converge()
    assert mc.parent["status"]["state"] == "ready"
    assert mc.parent["status"]["modelCache"]["phase"] == "Ready"
    assert mc.sync() == []  # the finished Job is kept as it is: nothing is written at steady state


def test_a_patched_worker_pool_waits_for_the_download_too(hooks) -> None:
    """A patch may name a worker pool that waits for the weights: the graph downloads, then the
    pool is created patched (it once failed the graph for good: no such child was rendered)."""
    obj = (
        cached()
        .patch(
            "Deployment",
            "qwen-pd-decode",
            {"op": "add", "path": "/metadata/annotations", "value": {"example.com/team": "infer"}},
        )
        .obj()
    )
    mc = Metacontroller(hooks, obj)
    mc.converge()
    assert mc.parent["status"]["state"] == "pending"
    assert not any(key in mc.children for key in WORKERS)
    finish(mc, jobs(mc)[0])
    mc.converge()
    assert mc.children[("Deployment", "qwen-pd-decode")]["metadata"]["annotations"]["example.com/team"] == "infer"


def test_a_mistake_in_a_waiting_worker_pool_fails_before_the_download(hooks) -> None:
    port = {"name": "main", "ports": [{"containerPort": 70000}]}
    obj = cached().extra_pod_spec("decode", containers=[port]).obj()
    mc = Metacontroller(hooks, obj)
    mc.converge()
    assert mc.children == {}  # nothing starts, not even the download
    assert mc.parent["status"]["state"] == "failed"
    assert mc.parent["status"]["message"] == (
        "spec.services.decode.extraPodSpec: the API server would refuse Deployment qwen-pd-decode made from it: "
        "spec.template.spec.containers[0].ports[0].containerPort: 70000 is not a port number (1-65535)"
    )


def test_the_job_name_changes_exactly_with_the_source() -> None:
    assert model_cache_digest("Qwen/Qwen3-0.6B", None) == model_cache_digest("Qwen/Qwen3-0.6B", None)
    assert (
        len(
            {
                model_cache_digest("Qwen/Qwen3-0.6B", None),
                model_cache_digest("Qwen/Qwen3-0.6B", "v2"),
                model_cache_digest("Qwen/Qwen3-8B", None),
            }
        )
        == 3
    )


def test_the_claim_and_the_job_as_rendered(hooks) -> None:
    """Strictly valid (hooks.sync validates each child), hardened, retried a few times, and
    never deleted by a TTL (a Job the hook answers would be created again, downloading again)."""
    obj = (
        cached(storageClassName="fast-rwx", tokenSecretRef={"name": "hf-token", "key": "HF_TOKEN"})
        .replicas(decode=2)
        .obj()
    )
    children = children_by_key(hooks.sync(obj))
    assert children[CLAIM]["spec"] == {
        "accessModes": ["ReadWriteMany"],  # two decode pods may sit on two nodes
        "resources": {"requests": {"storage": "20Gi"}},
        "storageClassName": "fast-rwx",
    }
    (job,) = [child for (kind, _), child in children.items() if kind == "Job"]
    assert job["spec"]["backoffLimit"] == 4 and "ttlSecondsAfterFinished" not in job["spec"]
    pod = job["spec"]["template"]["spec"]
    # The claim writable for the download's group, RuntimeDefault seccomp.
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}, "fsGroup": 65532}
    assert pod["restartPolicy"] == "Never"
    assert pod["automountServiceAccountToken"] is False  # a download never calls the API server
    (container,) = pod["containers"]
    assert container["image"] == "rocm/infera:sglang-v0.1.1"
    assert container["securityContext"] == RESTRICTED_CONTAINER
    assert container["resources"] == {"requests": {"cpu": "500m", "memory": "512Mi"}}
    env = {var["name"]: var.get("value", var.get("valueFrom")) for var in container["env"]}
    assert env["INFERA_MODEL_REPO"] == "Qwen/Qwen3-0.6B"
    assert env["HF_TOKEN"] == {"secretKeyRef": {"name": "hf-token", "key": "HF_TOKEN"}}
    assert env["INFERA_MODEL_DIR"].endswith("/Qwen3-0.6B")


def test_a_new_source_downloads_beside_the_running_graph_then_rolls_the_workers(hooks) -> None:
    mc = Metacontroller(hooks, cached().obj())
    mc.converge()
    (old,) = jobs(mc)
    finish(mc, old)
    mc.converge()
    mc.mark_ready()
    mc.converge()
    mc.edit(lambda spec: spec["modelCache"].update(source=f"{SOURCE}@v2"))
    writes = mc.sync()
    (new,) = [name for name in jobs(mc) if name != old]
    assert mc.child_writes(writes) == [("create", "Job", new)]  # the workers keep serving the old directory
    assert mount(mc, "qwen-pd-decode")["subPath"] == old.rsplit("-", 1)[1]
    assert mc.parent["status"]["state"] == "ready" and mc.parent["status"]["modelCache"]["phase"] == "Downloading"

    finish(mc, new)
    assert sorted(mc.child_writes(mc.sync())) == [("update", *key) for key in WORKERS]
    assert mount(mc, "qwen-pd-decode")["subPath"] == new.rsplit("-", 1)[1]
    assert mc.child_writes(mc.sync()) == [("delete", "Job", old)]  # no workload uses its directory now
    assert mc.sync() == []


def test_a_failed_download_fails_the_graph_and_keeps_what_runs(hooks) -> None:
    mc = Metacontroller(hooks, cached().obj())
    mc.converge()
    (old,) = jobs(mc)
    finish(mc, old)
    mc.converge()
    mc.edit(lambda spec: spec["modelCache"].update(source="hf://Qwen/Qwen3-8B"))
    mc.sync()
    (new,) = [name for name in jobs(mc) if name != old]
    before = copy.deepcopy({key: mc.children[key] for key in WORKERS})
    finish(mc, new, complete=False)
    mc.sync()
    status = mc.parent["status"]
    assert status["state"] == "failed"
    assert status["message"].startswith(
        "downloading hf://Qwen/Qwen3-8B failed (BackoffLimitExceeded: Job has reached the specified backoff limit); "
        "running workers are kept"
    )
    assert {key: mc.children[key] for key in WORKERS} == before


def test_the_claim_keeps_what_cannot_change_and_grows(hooks) -> None:
    mc = Metacontroller(hooks, cached().obj())
    mc.converge()
    mc.edit(lambda spec: spec["modelCache"].update(size="40Gi"))
    assert mc.child_writes(mc.sync()) == [("update", *CLAIM)]
    assert mc.children[CLAIM]["spec"]["resources"]["requests"]["storage"] == "40Gi"
    mc.edit(lambda spec: spec["modelCache"].update(size="10Gi", storageClassName="other"))
    assert mc.child_writes(mc.sync()) == []
    message = mc.parent["status"]["message"]
    assert "modelCache.size not applied to PersistentVolumeClaim qwen-pd-models: 10Gi is less than its 40Gi" in message
    assert "modelCache.storageClassName change not applied to PersistentVolumeClaim qwen-pd-models" in message


@pytest.mark.parametrize("retain", [False, True])
def test_teardown_removes_the_download_after_the_workers_and_keeps_the_claim_if_asked(hooks, retain: bool) -> None:
    mc = Metacontroller(hooks, cached(retainStorage=retain).obj())
    mc.converge()
    (job,) = jobs(mc)
    finish(mc, job)
    mc.converge()
    deleted: list[tuple[str, str]] = []
    while not mc.finalized:
        writes = mc.finalize()
        deleted += [(kind, name) for op, kind, name in writes if op == "delete"]
        mc.pods_finish_draining()
    assert deleted.index(("Job", job)) > max(deleted.index(key) for key in WORKERS)
    if retain:
        # Let go, not deleted: no owner, so garbage collection leaves it when the graph is gone.
        assert CLAIM not in deleted and mc.children[CLAIM]["metadata"]["ownerReferences"] == []
    else:
        assert CLAIM in deleted


def test_the_download_command_writes_its_marker_last_and_only_on_success(tmp_path: Path) -> None:
    """The Job's own command line, run here with a stand-in huggingface_hub."""
    standin = tmp_path / "standin" / "huggingface_hub"
    standin.mkdir(parents=True)
    (standin / "__init__.py").write_text(
        "import os, pathlib\n"
        "def snapshot_download(repo_id, revision=None, local_dir=None):\n"
        "    if os.environ.get('FAIL'):\n"
        "        raise SystemExit('network down')\n"
        "    assert not (pathlib.Path(local_dir).parent / '.complete').exists()\n"
        "    (pathlib.Path(local_dir) / 'config.json').write_text(repo_id + '@' + str(revision))\n"
    )
    idep = InferaDeployment.from_parent(cached(source=f"{SOURCE}@main").obj())
    (container,) = model_cache.download_job(idep)["spec"]["template"]["spec"]["containers"]
    cache = tmp_path / "cache"
    env = {var["name"]: var["value"] for var in container["env"] if "value" in var}
    env["INFERA_MODEL_DIR"] = env["INFERA_MODEL_DIR"].replace(model_cache.CACHE_PATH, str(cache), 1)
    command = [sys.executable if word == "python3" else word for word in container["command"]]
    run = lambda **extra: subprocess.run(  # noqa: E731
        command, env={**os.environ, **env, "PYTHONPATH": str(standin.parent), **extra}, capture_output=True, text=True
    )
    marker = Path(env["INFERA_MODEL_DIR"]).parent / ".complete"
    assert run(FAIL="1").returncode != 0 and not marker.exists()
    assert run().returncode == 0 and marker.exists()
    assert (Path(env["INFERA_MODEL_DIR"]) / "config.json").read_text() == "Qwen/Qwen3-0.6B@main"
    assert run(FAIL="1").returncode == 0  # done once: never again


def test_the_default_downloader_calls_snapshot_download_as_huggingface_hub_defines_it() -> None:
    huggingface_hub = pytest.importorskip("huggingface_hub", reason="installed with the runtime's dependencies")
    parameters = inspect.signature(huggingface_hub.snapshot_download).parameters
    assert {"repo_id", "revision", "local_dir"} <= set(parameters)


@pytest.mark.parametrize(
    ("cache", "message"),
    [
        (cached(source="s3://bucket/model"), "modelCache.source"),
        (cached(mountPath="/dev/shm"), "mountPath must be an absolute path without"),
        (cached(size="0"), "modelCache.size must be more than 0"),
        (cached(mountPath="/dev"), "mountPath must be an absolute path without"),
        (cached(mountPath="/models/.."), "mountPath must be an absolute path without"),
        (cached().image(None), "modelCache needs an image for its download Job"),
        (cached().worker("models"), "service name models is reserved"),
    ],
)
def test_a_bad_model_cache_fails_in_status(hooks, cache: GraphBuilder, message: str) -> None:
    obj = cache.obj()
    status = hooks.sync(obj)["status"]
    assert status["state"] == "failed" and message in status["message"]


def test_a_failed_download_is_retried_when_the_spec_renders_its_job_anew(hooks) -> None:
    """A gated repository without its token fails; adding the token replaces the failed Job."""
    mc = Metacontroller(hooks, cached(source="hf://meta-llama/Llama-3.1-8B").obj())
    mc.converge()
    (job,) = jobs(mc)
    finish(mc, job, complete=False)
    mc.sync()
    assert mc.parent["status"]["message"].startswith("downloading hf://meta-llama/Llama-3.1-8B failed")
    assert f"fix the spec, or delete Job {job} to try again" in mc.parent["status"]["message"]
    assert mc.sync() == []  # the same spec: the failed Job stays, for its logs
    mc.edit(lambda spec: spec["modelCache"].update(tokenSecretRef={"name": "hf-token", "key": "HF_TOKEN"}))
    assert mc.child_writes(mc.sync()) == [("delete", "Job", job)]
    assert mc.child_writes(mc.sync()) == [("create", "Job", job)]
    (container,) = mc.children[("Job", job)]["spec"]["template"]["spec"]["containers"]
    assert "HF_TOKEN" in [var["name"] for var in container["env"]]
    assert mc.parent["status"]["modelCache"]["phase"] == "Downloading"


def test_the_default_access_mode_counts_every_worker_pod(hooks) -> None:
    """Two pools of one pod each may sit on two nodes: a single-node claim would not attach."""
    claim = children_by_key(hooks.sync(cached().obj()))[CLAIM]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    single = cached().without("prefill").service("decode", role="mixed").obj()
    children = children_by_key(hooks.sync(single))
    assert children[CLAIM]["spec"]["accessModes"] == ["ReadWriteOnce"]
    # Then a new source's download prefers the node the worker (and the claim) is on.
    (job,) = [child for (kind, _), child in children.items() if kind == "Job"]
    affinity = job["spec"]["template"]["spec"]["affinity"]["podAffinity"]
    (term,) = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"] == {
        "labelSelector": {
            "matchLabels": {"infera.amd.com/deployment": "qwen-pd", "infera.amd.com/component": "worker"}
        },
        "topologyKey": "kubernetes.io/hostname",
    }
