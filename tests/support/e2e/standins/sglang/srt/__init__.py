"""Stand-in for `sglang.srt`: only the modules the Infera runtime imports."""
