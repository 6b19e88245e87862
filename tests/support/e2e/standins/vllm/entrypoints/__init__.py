"""Stand-in for the parts of vLLM 0.25.1 the Infera vLLM wrapper imports (its command line)."""
