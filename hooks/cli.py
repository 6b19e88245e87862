"""`infera-hooks`: serve the hooks, preview what an InferaDeployment renders, print the CRD."""

import argparse
import os
import shutil
import sys
from dataclasses import dataclass
from typing import Any

import yaml

from hooks import admission, metrics_dir, reconcile
from hooks.contract import DEFAULT_MAX_REQUEST_BYTES, parse_request
from hooks.crd import crd_yaml


@dataclass(frozen=True)
class ServeOptions:
    bind: str
    workers: int
    timeout: int
    max_request_bytes: int
    auth_token_file: str | None
    certfile: str | None
    keyfile: str | None


def serve(options: ServeOptions) -> None:
    # prometheus_client picks its multi-process storage when it is first imported, so the
    # directory must exist before the app (and its metrics) is imported.
    metrics_directory = metrics_dir.create()
    master = os.getpid()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_directory
    from gunicorn.app.base import BaseApplication

    from hooks.app import TokenFile, create_app
    from hooks.observability import LOGGING

    auth = TokenFile(options.auth_token_file) if options.auth_token_file else None
    # Workers inherit the compiled schema validators instead of each compiling them on a call.
    admission.warm_up()

    class HookServer(BaseApplication):
        def load_config(self) -> None:
            self.cfg.set("bind", [options.bind])
            self.cfg.set("workers", options.workers)
            self.cfg.set("timeout", options.timeout)
            # On SIGTERM, in-flight hook calls finish before the workers exit.
            self.cfg.set("graceful_timeout", 20)
            self.cfg.set("logconfig_dict", LOGGING)
            # /tmp may be the only writable place with a read-only root filesystem.
            self.cfg.set("worker_tmp_dir", "/tmp")
            self.cfg.set("child_exit", lambda _server, worker: metrics_dir.fold_dead_worker(metrics_directory, worker.pid))
            if "control_socket_disable" in self.cfg.settings:
                # Unused, and it would need a writable home directory.
                self.cfg.set("control_socket_disable", True)
            if options.certfile:
                self.cfg.set("certfile", options.certfile)
                self.cfg.set("keyfile", options.keyfile)

        def load(self) -> Any:
            return create_app(options.max_request_bytes, auth)

    try:
        HookServer().run()
    finally:
        # A gunicorn worker is a fork that leaves through this same frame when it exits: only
        # the master owns the directory, which its replacement workers still write to.
        if os.getpid() == master:
            shutil.rmtree(metrics_directory, ignore_errors=True)


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
            parser.error("--certfile and --keyfile go together")
        serve(
            ServeOptions(
                args.bind, args.workers, args.timeout, args.max_request_bytes, args.auth_token_file, args.certfile, args.keyfile
            )
        )
    elif args.command == "render":
        sys.stdout.write(render(args.file))
    else:
        sys.stdout.write(crd_yaml())
