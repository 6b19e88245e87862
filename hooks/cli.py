"""`infera-hooks`: serve the hooks, preview what an InferaDeployment renders, print the CRD."""

import argparse
import math
import sys
from collections.abc import Callable

import yaml

from hooks import reconcile
from hooks.auth import TokenFile, TokenFileError
from hooks.contract import DEFAULT_MAX_REQUEST_BYTES, parse_request
from hooks.crd import crd_yaml
from hooks.server import ServeOptions, serve


def render(path: str) -> str:
    """The answer /sync would give for the InferaDeployment(s) in `path`, with nothing observed."""
    with open(path, encoding="utf-8") if path != "-" else sys.stdin as stream:
        documents = [doc for doc in yaml.safe_load_all(stream) if doc]
    parents = [doc for doc in documents if doc.get("kind") == "InferaDeployment"]
    if not parents:
        raise SystemExit(f"{path}: no InferaDeployment found")
    out = []
    for parent in parents:
        answer = reconcile.sync(parse_request({"parent": parent, "children": {}}))
        out.append(yaml.safe_dump({"status": answer["status"]}, sort_keys=True))
        out += [yaml.safe_dump(child, sort_keys=True) for child in answer["children"]]
    return "---\n".join(out)


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
    serve_cmd.add_argument("--bind", default="0.0.0.0:8080", help="HOST:PORT (default 0.0.0.0:8080)")
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
    render_cmd = commands.add_parser("render", help="print the children and status a YAML file renders to")
    render_cmd.add_argument("file", help="an InferaDeployment YAML file, or - for standard input")
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
        sys.stdout.write(render(args.file))
    else:
        sys.stdout.write(crd_yaml())
