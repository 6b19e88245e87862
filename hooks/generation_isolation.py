"""Generation isolation under rollout.strategy BlueGreen: refuse a graph whose spec sets a
router's label selector, or hides it from the hook.

Each generation's routers watch that generation's workers only because the hook alone chooses
their selector; one from anywhere else (spec.envs, a service's env or args, an extraPodSpec
container, a patch) makes a router see, and pair, workers of two versions. The check reads every
rendered container as its process would (hooks/command_line.py) and names the spec field to
blame. It stands apart from preflight's checks of each process (hooks/preflight.py, which runs
it first) because it asks another question: not whether a process would start and work with
its peers, but who sets one flag in any container of the graph.
"""

import itertools
import re

from hooks.api.fields import SpecError, primary_index
from hooks.api.graph import InferaDeployment
from hooks.api.services import ServiceSpec
from hooks.command_line import commands, literal_values, opaque_word, process_words, substituted
from hooks.observed import pod_templates, service_of
from hooks.renderers.patches import target_name, targeting
from hooks.runtime import (
    EPP_MODULE,
    SELECTOR_ABBREVIATION,
    SELECTOR_ENV,
    SELECTOR_FLAG,
    SERVER_MODULE,
    WORKER_MODULES,
    entry_point,
)
from hooks.vocabulary import DEPLOYMENT_LABEL, GENERATION_LABEL, graph_selector

# The routers' entry points: the processes that watch pods through a label selector.
ROUTER_MODULES = (SERVER_MODULE, EPP_MODULE)

# What sets a router's label selector wherever it stands (a command line, a script, a variable's
# value that a shell splits into words): the flag in any spelling the routers' parsers take, or
# the variable given a value (`INFERA_K8S_LABEL_SELECTOR=... python3 -m infera.server`, `export`),
# not merely read (`$INFERA_K8S_LABEL_SELECTOR`).
SELECTOR_SPELLING = re.compile(rf"(?<![\w-]){SELECTOR_ABBREVIATION}[\w-]*")
SELECTOR_ASSIGNED = re.compile(rf"(?<![\w$]){SELECTOR_ENV}(?!\w)")


def check_isolation(idep: InferaDeployment, children: list[dict]) -> None:
    """Under BlueGreen, SpecError naming the spec field that sets a router's label selector, or
    hides it from the hook. Each generation's routers watch that generation's workers only because
    the hook alone chooses their selector; any other (even the graph's whole,
    infera.amd.com/deployment=<name>) makes a router see, and pair, workers of two versions. What
    the processes would read decides (every spelling the routers' parsers take, a `sh -c` script,
    `$(VAR)`); a value the hook would set as well is refused too, so the rule has no exception."""
    for index, var in enumerate(idep.spec.envs or []):
        if var.name == SELECTOR_ENV:
            raise SpecError(
                f"spec.envs[{index}]: sets the label selector of every router ({SELECTOR_ENV}): {_owned(idep)}: remove it"
            )
    selector = graph_selector(idep)
    for child in children:
        for template, _ in pod_templates(child):
            containers = template["spec"]["containers"]
            for index, container in enumerate(containers):
                breach = _selector_breach(container, selector)
                if breach is None:
                    continue
                kind, what = breach
                where = _breach_source(idep, child, containers, index, breach)
                name = container["name"]
                if kind == "unread":
                    raise SpecError(
                        f"{where}: the hook cannot tell which label selector container {name} watches ({what} may "
                        f"hold any flag): {_owned(idep)}: write the router's flags out"
                    )
                if kind == "unset":
                    raise SpecError(
                        f"{where}: container {name} runs {what} without the label selector the hook gives a router "
                        f"(a container of a template's own, or patched, gets none): {_owned(idep)}: leave the "
                        "router's container to the hook"
                    )
                raise SpecError(
                    f"{where}: sets the label selector of container {name} ({what}): {_owned(idep)}: remove it"
                )


def _owned(idep: InferaDeployment) -> str:
    return (
        f"under rollout.strategy BlueGreen it is the hook's ({DEPLOYMENT_LABEL}={idep.name},"
        f"{GENERATION_LABEL}=<generation> for each generation's routers), and with another a router would see "
        "workers of other generations"
    )


def _sets_selector(text: str) -> bool:
    spelled = any(SELECTOR_FLAG.startswith(found.group()) for found in SELECTOR_SPELLING.finditer(text))
    return spelled or SELECTOR_ASSIGNED.search(text) is not None


def _runs_worker(command: list[str]) -> bool:
    return any(word == "-m" and module in WORKER_MODULES.values() for word, module in itertools.pairwise(command))


def _selector_breach(container: dict, selector: str) -> tuple[str, str] | None:
    """How the spec sets the container's label selector, or keeps the hook from setting it:
    ("command", the flag or variable), ("env", the variable), ("unread", a word the hook cannot
    expand in a router's command), ("unset", the router's module: it has neither the hook's flag
    nor its variable); None when only the hook does. A worker's own command is left to the
    worker's checks (its engine exits on a router's flags)."""
    command = list(container.get("command") or [])
    # The hook's own `--k8s-label-selector <selector>`, in the command it renders, is not read.
    own = next((i for i in range(len(command) - 1) if command[i : i + 2] == [SELECTOR_FLAG, selector]), None)
    read = container if own is None else {**container, "command": command[:own] + command[own + 2 :]}
    for words in commands(process_words(read) or []):
        if not _runs_worker(words):
            for word in words:
                if _sets_selector(word):
                    return "command", SELECTOR_FLAG if SELECTOR_SPELLING.search(word) else SELECTOR_ENV
    entry = entry_point(container)
    if entry is not None and entry.module in WORKER_MODULES.values():
        return None
    env = [var for var in container.get("env") or [] if var.get("name") == SELECTOR_ENV]
    if env not in ([], [{"name": SELECTOR_ENV, "value": selector}]):
        return "env", SELECTOR_ENV
    if entry is None or entry.module not in ROUTER_MODULES:
        return None
    if entry.opaque:
        return "unread", opaque_word(entry.argv) or ""
    if own is None and not env:
        return "unset", entry.module
    return None


def _breach_source(
    idep: InferaDeployment, child: dict, containers: list[dict], index: int, breach: tuple[str, str]
) -> str:
    """The spec field that says what breaches the isolation in containers[index] of a rendered
    child: its service's extraPodSpec container, args or env; else the patches on the child."""
    service = service_of(child)
    svc = idep.spec.services.get(service or "")
    if svc is not None:
        where = f"spec.services.{service}"
        said = _saying(svc, where, containers[index], index == primary_index(containers), breach)
        if said is not None:
            return said
    else:
        where = f"{child['kind']} {target_name(child)}"
    targeted = targeting(idep.spec.patches or [], child)
    return f"{targeted} ({child['kind']} {target_name(child)})" if targeted else where


def _saying(svc: ServiceSpec, where: str, container: dict, primary: bool, breach: tuple[str, str]) -> str | None:
    kind, what = breach
    templates = (svc.extra_pod_spec or {}).get("containers") or []
    at = next((i for i, template in enumerate(templates) if template.get("name") == container["name"]), None)
    if at is None and primary and templates:
        at = primary_index(templates)
    template = templates[at] if at is not None else {}
    own = f"{where}.extraPodSpec.containers[{at}]"
    if kind == "unset":
        return own if at is not None else None
    if kind == "env":
        env = [(f"{own}.env[{j}]", var.get("name")) for j, var in enumerate(template.get("env") or [])]
        env += [(f"{where}.env[{j}]", var.name) for j, var in enumerate(svc.env or [])] if primary else []
        return next((path for path, name in env if name == SELECTOR_ENV), None)
    values = literal_values(container.get("env") or [])
    fields = [(f"{own}.{key}", template[key]) for key in ("command", "args") if key in template]
    if primary and "args" not in template:
        fields += [(f"{where}.args[{j}]", [arg]) for j, arg in enumerate(svc.args or [])]
    for path, words in fields:
        said = [substituted(word, values) for word in words]
        if any(_sets_selector(word) if kind == "command" else what in word for word in said):
            return path
    return None
