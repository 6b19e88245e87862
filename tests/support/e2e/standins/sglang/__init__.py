"""Stand-in for the `sglang` package (SGLang 0.5.17), for tests on machines without GPUs.

The Infera worker wrapper imports `sglang.srt.server_args` and runs `python -m
sglang.launch_server`; both are here, and behave as SGLang 0.5.17 does for everything the Infera
runtime does with an engine. The engine itself is `sglang.standin`: no model runs, the replies
are made up, but the command line, the HTTP API, the metrics, the KV events and the PD handshake
are SGLang's.
"""

__version__ = "0.5.17"
