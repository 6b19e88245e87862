"""`infera-hooks`: serve the hooks, preview what an InferaDeployment renders, print the CRD."""

import argparse
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass

import yaml

from hooks import reconcile
from hooks.auth import TokenFile, TokenFileError
from hooks.contract import DEFAULT_MAX_REQUEST_BYTES, BadRequest, parse_request
from hooks.crd import crd_yaml
from hooks.server import ServeOptions, serve


class RenderError(Exception):
    """What `render` says in one line on stderr before exiting 1."""


@dataclass(frozen=True)
class Rendered:
    manifests: str  # the children, as YAML documents: stdout
    summary: list[str]  # one line per InferaDeployment: stderr
    failed: bool


def render(path: str, namespace: str | None = None) -> Rendered:
    """What /sync would create for the InferaDeployment(s) in `path` (or - for stdin), with
    nothing observed yet: like `helm template`, only the children, byte-identical between runs.
    An invalid spec fails with the message the hook would put in its status."""
    try:
        with open(path, encoding="utf-8") if path != "-" else sys.stdin as stream:
            documents = [doc for doc in yaml.safe_load_all(stream) if doc]
    except OSError as error:
        raise RenderError(f"{path}: {error.strerror or error}") from None
    except yaml.YAMLError as error:
        where = getattr(error, "problem_mark", None)
        at = f" (line {where.line + 1}, column {where.column + 1})" if where else ""
        raise RenderError(f"{path}: not valid YAML{at}: {getattr(error, 'problem', None) or error}") from None
    parents = [doc for doc in documents if isinstance(doc, dict) and doc.get("kind") == "InferaDeployment"]
    if not parents:
        raise RenderError(f"{path}: no InferaDeployment found")
    manifests, summary, failed = [], [], False
    for parent in parents:
        name = (parent.get("metadata") or {}).get("name")
        if namespace and isinstance(parent.get("metadata"), dict):
            # Rendered in that namespace, as the hook renders a parent there: what names it (the
            # discovery RoleBinding's subject, the Gateway's default namespace) follows.
            parent = {**parent, "metadata": {**parent["metadata"], "namespace": namespace}}
        try:
            answer = reconcile.sync(parse_request({"parent": parent, "children": {}}))
        except BadRequest as error:
            raise RenderError(f"{path}: {error}") from None
        status = answer["status"]
        failed |= status["state"] == "failed"
        summary.append(f"{name}: {status['state']}: {status['message']}")
        for child in answer["children"]:
            if parent["metadata"].get("namespace"):
                child["metadata"]["namespace"] = parent["metadata"]["namespace"]
            manifests.append(yaml.safe_dump(child, sort_keys=True))
    return Rendered("---\n".join(manifests), summary, failed)


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="infera-hooks", description=__doc__)
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
        "render", help="print the children a YAML file's InferaDeployment(s) become (status summary on stderr)"
    )
    render_cmd.add_argument("file", help="an InferaDeployment YAML file, or - for standard input")
    render_cmd.add_argument(
        "-n", "--namespace", help="set this namespace on every child (default: the parent's, if set)"
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
            rendered = render(args.file, args.namespace)
        except RenderError as error:
            sys.exit(f"infera-hooks render: {error}")
        sys.stdout.write(rendered.manifests)
        sys.stderr.write("".join(f"{line}\n" for line in rendered.summary))
        sys.exit(1 if rendered.failed else 0)
    else:
        sys.stdout.write(crd_yaml())
