"""Stand-in for `sglang.srt.disaggregation`: the KV event wire format."""
