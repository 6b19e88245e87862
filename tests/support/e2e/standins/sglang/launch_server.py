"""Stand-in for `python -m sglang.launch_server`: SGLang 0.5.17's command line and HTTP server.

Start-up follows SGLang's order, which is what the Infera wrapper's readiness check relies on:
the command line is parsed first (an option SGLang does not have exits 2, before anything is
loaded), a multi-node group forms (sglang.standin.group), then the tokenizer is loaded, the KV event publishers bound (--kv-events-config), and
only then does the HTTP port (and a prefill engine's bootstrap port) open, so `/health` answers
exactly when the engine can serve.

SIGTERM ends the process at once, open streams included: the wrapper stops the engine by
SIGTERM to its process group after draining in-flight work through `/metrics` itself. (SGLang's
own tokenizer manager, unless SGL_FORCE_SHUTDOWN is set, goes on serving its running requests,
checking every 5 s, before it exits; the stand-in does not model that.)
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
from types import FrameType

import uvicorn

from sglang.srt.server_args import ServerArgs

logger = logging.getLogger("sglang.launch_server")


class Server(uvicorn.Server):
    """uvicorn, but SIGTERM does not wait for open connections to finish, and being ready is
    logged as SGLang logs it."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if sig == signal.SIGTERM:
            self.force_exit = True

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        logger.info("The server is fired up and ready to roll!")


def parse_server_args(argv: list[str]) -> ServerArgs:
    parser = argparse.ArgumentParser(prog="python -m sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    return ServerArgs.from_cli_args(parser.parse_args(argv))


def listening_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def serve(server_args: ServerArgs) -> None:
    # Imported here, not at the top: the engine loads transformers, which takes a second, and a
    # command line SGLang refuses must be refused without it.
    from sglang.srt.disaggregation.kv_events import KVEventsConfig, ZmqEventPublisher
    from sglang.standin.engine import Engine
    from sglang.standin.model import Model
    from sglang.standin.prefix_cache import PrefixCache
    from sglang.standin.server import application

    if int(server_args.nnodes or 1) > 1:
        from sglang.standin import group

        engine_group = group.form(int(server_args.nnodes), int(server_args.node_rank or 0), server_args.dist_init_addr)
    else:
        engine_group = None
    model = Model(server_args)
    events = KVEventsConfig.from_cli(server_args.kv_events_config) if server_args.kv_events_config else None
    ranks = int(server_args.dp_size or 1)
    publishers = [
        ZmqEventPublisher(events, rank) if events and events.publisher == "zmq" else None for rank in range(ranks)
    ]
    engine = Engine(
        server_args, model, [PrefixCache(int(server_args.page_size), publisher) for publisher in publishers]
    )
    engine.group = engine_group
    sockets = [listening_socket(server_args.host, server_args.port)]
    if engine.role == "prefill":
        sockets.append(listening_socket(server_args.host, server_args.disaggregation_bootstrap_port))
    logger.info(
        "stand-in SGLang: model=%s role=%s http=%s:%d kv_events=%s",
        server_args.model_path,
        engine.role,
        server_args.host,
        server_args.port,
        [publisher.endpoint for publisher in publishers if publisher],
    )
    config = uvicorn.Config(
        application(engine),
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_keep_alive=5,
    )
    try:
        Server(config).run(sockets=sockets)
    finally:
        for publisher in publishers:
            if publisher:
                publisher.close()


def main(argv: list[str] | None = None) -> None:
    server_args = parse_server_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=(server_args.log_level or "info").upper(), format="[%(asctime)s] %(message)s")
    serve(server_args)


if __name__ == "__main__":
    main()
