"""The stand-in engine behind `python -m sglang.launch_server` (not a module of SGLang).

- `model`: the tokenizer at --tokenizer-path/--model-path, and the made-up replies;
- `prefix_cache`: each DP rank's radix cache, as far as KV events and cached tokens show it;
- `scheduler`: admission, the request states SGLang's metrics count, and the served-request log;
- `engine`: what a request goes through, by role (mixed, prefill, decode);
- `bootstrap`: the PD handshake between a prefill and a decode engine over the bootstrap port;
- `server`: the HTTP API, SGLang's OpenAI-compatible one plus the test-only `/standin/requests`.
"""
