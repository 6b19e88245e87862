"""`infera-hooks`: serve the hooks, preview what an InferaDeployment renders, print the CRD."""

import argparse
import copy
import importlib.metadata
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from hooks import DISTRIBUTION, reconcile, vocabulary
from hooks.api.graph import GROUP, KIND, VERSION, unknown_field
from hooks.auth import TokenFile, TokenFileError
from hooks.contract import DEFAULT_MAX_REQUEST_BYTES, LAST_APPLIED_ANNOTATION, field_at, parse_request
from hooks.crd import crd_yaml
from hooks.kubernetes_names import shown
from hooks.server import ServeOptions, serve

PROG = "infera-hooks"
SERVED_API_VERSION = f"{GROUP}/{VERSION}"
# What `kubectl get idep -o yaml` prints (a List), and what the API itself lists (kubectl get --raw).
LIST_KINDS = ("List", f"{KIND}List")
OBJECT_FIELDS = {"apiVersion", "kind", "metadata", "spec", "status"}


class RenderError(Exception):
    """What `render` says about its file in one line on stderr before exiting 1."""


def said(path: str, text: str) -> str:
    """A line of `render` on stderr about its file."""
    return f"{PROG} render: {path}: {text}"


@dataclass(frozen=True)
class Rendered:
    manifests: str  # the children, as YAML documents: stdout
    report: list[str]  # stderr: the documents skipped, then a line per InferaDeployment
    failed: bool


def render(path: str, namespace: str | None = None, model_downloaded: bool = False) -> Rendered:
    """What /sync would create for the InferaDeployment(s) in `path` (or - for stdin), with
    nothing observed yet: like `helm template`, only the children, byte-identical between runs,
    for review, `kubectl diff`-style checks and CI linting of specs. Not for `kubectl apply`:
    objects created that way lack Metacontroller's controller reference, and block it.

    Documents may be InferaDeployments, or Lists of them as `kubectl get idep -o yaml` prints
    them: a preview is of a fresh graph, so their status (a previous run's) is not read, and
    what the API server writes into metadata changes no child. Other kinds and empty documents
    are skipped, saying so. An invalid spec fails with the message the hook would put in its
    status. `model_downloaded`: the graph once the model cache's download Job is complete, as
    the hook renders it then (it creates the worker pools, and checks them, only then)."""
    parents, report = _inferadeployments(path, _documents(path))
    manifests, failed = [], False
    for where, parent in parents:
        if namespace:
            # Rendered in that namespace, as the hook renders a parent there: what names it (the
            # discovery RoleBinding's subject, the Gateway's default namespace) follows.
            parent = {**parent, "metadata": {**parent["metadata"], "namespace": namespace}}
        answer = _sync(parent, [])
        downloaded = _after_download(parent, answer) if model_downloaded else None
        if downloaded is not None:
            answer = downloaded
        elif model_downloaded and answer["status"]["state"] != "failed":
            report.append(said(path, f"{where}: --model-downloaded has no effect without spec.modelCache"))
        status = answer["status"]
        failed |= status["state"] == "failed"
        # What --model-downloaded assumes leads, in the hook's words (status.modelCache.message).
        assumed = field_at(status, "modelCache", "message") if downloaded is not None else None
        message = "; ".join(filter(None, [assumed, status["message"]]))
        report.append(f"{parent['metadata']['name']}: {status['state']}: {message}")
        for child in answer["children"]:
            if parent["metadata"].get("namespace"):
                child["metadata"]["namespace"] = parent["metadata"]["namespace"]
            manifests.append(yaml.safe_dump(child, sort_keys=True))
    return Rendered("---\n".join(manifests), report, failed)


def _documents(path: str) -> list[Any]:
    try:
        with open(path, encoding="utf-8") if path != "-" else sys.stdin as stream:
            return list(yaml.safe_load_all(stream))
    except OSError as error:
        raise RenderError(error.strerror or str(error)) from None
    except yaml.YAMLError as error:
        where = getattr(error, "problem_mark", None)
        at = f" (line {where.line + 1}, column {where.column + 1})" if where else ""
        raise RenderError(f"not valid YAML{at}: {getattr(error, 'problem', None) or error}") from None


def _inferadeployments(path: str, documents: list[Any]) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """The InferaDeployments to render, each with where it is (`document 2`, `document 1 item 3`),
    and a line for each document skipped. RenderError for what no API server would take: a
    document that is no object, an InferaDeployment of another version or without a name."""
    objects = []
    for number, document in enumerate(documents, 1):
        where = f"document {number}"
        if isinstance(document, dict) and document.get("kind") in LIST_KINDS:
            _check_api_version(f"{where} ({_described(document)})", document)
            items = document.get("items")
            if not isinstance(items, list):
                raise RenderError(f"{where} ({_described(document)}): items must be a list")
            objects += [(f"{where} item {index}", item) for index, item in enumerate(items, 1)]
        else:
            objects.append((where, document))
    parents, skipped = [], []
    for where, obj in objects:
        if obj is None:
            skipped.append(said(path, f"skipped {where}: empty"))
        elif not isinstance(obj, dict):
            # kubectl refuses it too: most likely a mangled file, which a lint must not pass.
            shape = "a list" if isinstance(obj, list) else f"the scalar {shown(obj)}"
            raise RenderError(f"{where} is {shape}, not a Kubernetes object")
        elif obj.get("kind") != KIND:
            skipped.append(said(path, f"skipped {where} ({_described(obj)}): not an {KIND}"))
        else:
            described = f"{where} ({_described(obj)})"
            _check_api_version(described, obj)
            # The parent's own fields: the API server keeps nothing else of an object (the hook
            # never sees more), so `sepc:` would silently render as a spec without services.
            unknown = sorted(set(obj) - OBJECT_FIELDS)
            if unknown:
                raise RenderError(f"{described}: {unknown[0]}: {unknown_field(unknown[0], OBJECT_FIELDS)}")
            name = field_at(obj, "metadata", "name")
            # The API server's words, not the hook contract's ('parent.metadata.name' is missing).
            if name is None or name == "":
                raise RenderError(f"{described}: metadata.name is missing")
            if not isinstance(name, str):
                raise RenderError(f"{described}: metadata.name must be a string, not {shown(name)}")
            # A fresh graph: a previous run's status would carry its conditions over.
            parents.append((described, {key: value for key, value in obj.items() if key != "status"}))
    if not parents:
        raise RenderError(f"no {KIND} found")
    return parents, skipped


def _described(obj: dict[str, Any]) -> str:
    """`Kind name`, as far as the object says."""
    words = [str(part) for part in (obj.get("kind"), field_at(obj, "metadata", "name")) if part]
    return " ".join(words) or "no kind"


def _check_api_version(described: str, obj: dict[str, Any]) -> None:
    """An InferaDeployment(List) of a version the CRD does not serve would not be stored at all."""
    api_version = obj.get("apiVersion")
    if obj.get("kind") != "List" and api_version != SERVED_API_VERSION:  # a List is core v1's
        what = f"apiVersion {api_version} is not served" if api_version else "apiVersion is missing"
        raise RenderError(f"{described}: {what}: use {SERVED_API_VERSION}")


def _sync(parent: dict[str, Any], observed: list[dict[str, Any]]) -> dict[str, Any]:
    """The sync answer for `parent` with `observed` children, in a request as Metacontroller
    sends it when the bundle and all its components are installed: every kind the hook can
    emit is registered, and keys the children (`{}` where none is observed). The parent's name
    was checked: the request contract refuses nothing else of a parent."""
    children: dict[str, dict[str, Any]] = {f"{kind.kind}.{kind.api_version}": {} for kind in vocabulary.CHILD_KINDS}
    for child in observed:
        children[f"{child['kind']}.{child['apiVersion']}"][child["metadata"]["name"]] = child
    return reconcile.sync(parse_request({"parent": parent, "children": children}))


def _after_download(parent: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any] | None:
    """The sync answer once the download Job in `answer` (a first sync's) is complete, its
    children created meanwhile, or None when there is none (no model cache, or an invalid spec)."""
    job = field_at(answer, "status", "modelCache", "job")
    if job is None:
        return None
    return _sync(parent, [_created(child, complete=child["kind"] == "Job") for child in answer["children"]])


def _created(child: dict[str, Any], complete: bool) -> dict[str, Any]:
    """A rendered child as Metacontroller reports it once created: with the record of what was
    applied, which the hook answers again; a Job `complete` as its controller says it."""
    observed = copy.deepcopy(child)
    observed["metadata"].setdefault("annotations", {})[LAST_APPLIED_ANNOTATION] = json.dumps(child, sort_keys=True)
    if complete:
        observed["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    return observed


def positive(number: type[int] | type[float]) -> Callable[[str], int | float]:
    """An argparse type: a number above zero (`--workers 0` would start a master that serves nothing)."""

    def parse(text: str) -> int | float:
        try:
            value = number(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not 0 < value < math.inf:  # nan compares false both ways
            raise argparse.ArgumentTypeError(f"must be a finite number above 0, not {text}")
        return value

    return parse


class PrintVersion(argparse.Action):
    """`--version`: the installed distribution's version, looked up only when asked for."""

    def __init__(self, option_strings: list[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        try:
            version = importlib.metadata.version(DISTRIBUTION)
        except importlib.metadata.PackageNotFoundError:
            parser.exit(1, f"{DISTRIBUTION}: not installed (pip install .), so no version is known\n")
        sys.stdout.write(f"{DISTRIBUTION} {version}\n")
        parser.exit()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__)
    parser.add_argument("--version", action=PrintVersion, help="print the installed version and exit")
    commands = parser.add_subparsers(dest="command", required=True)
    serve_cmd = commands.add_parser("serve", help="serve the Metacontroller hooks under gunicorn")
    # Loopback by default: a command for trying the hooks out should not expose them (without
    # auth) to the network. The image and the hook Deployment bind 0.0.0.0 explicitly.
    serve_cmd.add_argument("--bind", default="127.0.0.1:8080", help="HOST:PORT (default 127.0.0.1:8080)")
    serve_cmd.add_argument("--workers", type=positive(int), default=2, help="gunicorn worker processes (default 2)")
    serve_cmd.add_argument(
        "--timeout", type=positive(int), default=30, help="seconds before a stuck worker restarts (default 30)"
    )
    serve_cmd.add_argument(
        "--client-timeout",
        type=positive(float),
        default=10.0,
        help="seconds a client has to send a request body (then 408) or to take an answer "
        "(then it is disconnected); default 10, Metacontroller's hook timeout",
    )
    serve_cmd.add_argument(
        "--max-request-bytes",
        type=positive(int),
        default=DEFAULT_MAX_REQUEST_BYTES,
        help=f"larger request bodies get 413 (default {DEFAULT_MAX_REQUEST_BYTES // (1024 * 1024)} MiB)",
    )
    serve_cmd.add_argument(
        "--auth-token-file", help="require `Authorization: Bearer <token>` on the hooks, the token read from FILE"
    )
    serve_cmd.add_argument("--certfile", help="serve HTTPS with this PEM certificate (chain)")
    serve_cmd.add_argument("--keyfile", help="the private key of --certfile")
    render_cmd = commands.add_parser(
        "render",
        help="preview the children an InferaDeployment becomes, for review, diffs and CI linting of specs",
        description="Print the children the InferaDeployment(s) in FILE become, as the hook first creates them: "
        "YAML on stdout, byte-identical between runs, for review, kubectl diff-style checks and CI linting of specs; "
        "a status line per InferaDeployment, and each document skipped, on stderr. Exit 1 when a spec is invalid "
        "or the file cannot be read as InferaDeployments. Not for kubectl apply: objects created that way lack "
        "Metacontroller's controller reference, and block it.",
    )
    render_cmd.add_argument(
        "file",
        metavar="FILE",
        help="YAML with InferaDeployments or Lists of them (kubectl get idep -o yaml), or - for standard input",
    )
    render_cmd.add_argument(
        "-n", "--namespace", help="set this namespace on every child (default: the parent's, if set)"
    )
    render_cmd.add_argument(
        "--model-downloaded",
        action="store_true",
        help="render the graph as it is once spec.modelCache's download is complete (with the worker pools, which "
        "wait for it); no effect without a model cache",
    )
    commands.add_parser("crd", help="print the InferaDeployment CRD generated from the API model")
    args = parser.parse_args(argv)

    if args.command == "serve":
        if bool(args.certfile) != bool(args.keyfile):
            serve_cmd.error("--certfile and --keyfile go together")
        try:
            auth = TokenFile(args.auth_token_file) if args.auth_token_file else None
        except TokenFileError as error:
            serve_cmd.error(str(error))
        serve(
            ServeOptions(
                args.bind,
                args.workers,
                args.timeout,
                args.client_timeout,
                args.max_request_bytes,
                auth,
                args.certfile,
                args.keyfile,
            )
        )
    elif args.command == "render":
        try:
            rendered = render(args.file, args.namespace, args.model_downloaded)
        except RenderError as error:
            sys.exit(said(args.file, str(error)))
        sys.stdout.write(rendered.manifests)
        sys.stderr.write("".join(f"{line}\n" for line in rendered.report))
        sys.exit(1 if rendered.failed else 0)
    else:
        sys.stdout.write(crd_yaml())
