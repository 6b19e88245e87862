"""The control plane tier's programs are the pinned releases, built from the module proxy."""

import subprocess

from tests.support.controlplane import KUBERNETES_VERSION, programs


def version_of(program: str, *flags: str) -> str:
    return subprocess.run(
        [str(programs()[program]), *flags], capture_output=True, text=True, check=True, timeout=60
    ).stdout


def test_the_kubernetes_programs_are_the_pinned_release() -> None:
    for program in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        assert version_of(program, "--version") == f"Kubernetes {KUBERNETES_VERSION}\n"
    assert f'"gitVersion": "{KUBERNETES_VERSION}"' in version_of("kubectl", "version", "--client", "-o", "json")


def test_etcd_is_the_release_kubernetes_uses() -> None:
    assert version_of("etcd", "--version").splitlines()[0] == "etcd Version: 3.6.8"
