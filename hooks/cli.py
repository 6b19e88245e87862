"""`infera-hooks`: serve the hooks, preview what an InferaDeployment renders, print the CRD."""

import argparse
import sys
from typing import Any

import yaml

from hooks import reconcile
from hooks.app import DEFAULT_MAX_REQUEST_BYTES, create_app
from hooks.contract import parse_request
from hooks.crd import crd_yaml


def serve(bind: str, workers: int, timeout: int, max_request_bytes: int) -> None:
    from gunicorn.app.base import BaseApplication  # gunicorn is not importable on every platform

    class HookServer(BaseApplication):
        def load_config(self) -> None:
            self.cfg.set("bind", [bind])
            self.cfg.set("workers", workers)
            self.cfg.set("timeout", timeout)
            # Let Metacontroller's in-flight calls finish on SIGTERM (rolling updates, drains).
            self.cfg.set("graceful_timeout", 20)
            self.cfg.set("accesslog", "-")
            # /tmp may be the only writable place with a read-only root filesystem.
            self.cfg.set("worker_tmp_dir", "/tmp")

        def load(self) -> Any:
            return create_app(max_request_bytes)

    HookServer().run()


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="infera-hooks", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve_cmd = commands.add_parser("serve", help="serve the Metacontroller hooks under gunicorn")
    serve_cmd.add_argument("--bind", default="0.0.0.0:8080", help="HOST:PORT (default 0.0.0.0:8080)")
    serve_cmd.add_argument("--workers", type=int, default=2, help="gunicorn worker processes (default 2)")
    serve_cmd.add_argument("--timeout", type=int, default=30, help="seconds before a stuck worker restarts")
    serve_cmd.add_argument(
        "--max-request-bytes",
        type=int,
        default=DEFAULT_MAX_REQUEST_BYTES,
        help=f"larger request bodies get 413 (default {DEFAULT_MAX_REQUEST_BYTES // (1024 * 1024)} MiB)",
    )
    render_cmd = commands.add_parser("render", help="print the children and status a YAML file renders to")
    render_cmd.add_argument("file", help="an InferaDeployment YAML file, or - for standard input")
    commands.add_parser("crd", help="print the InferaDeployment CRD generated from the API model")
    args = parser.parse_args(argv)

    if args.command == "serve":
        serve(args.bind, args.workers, args.timeout, args.max_request_bytes)
    elif args.command == "render":
        sys.stdout.write(render(args.file))
    else:
        sys.stdout.write(crd_yaml())
