"""The engine: a clock-free model of a vLLM-like server and its emulated HTTP body."""
