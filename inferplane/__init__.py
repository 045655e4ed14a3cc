"""inferplane: a unified control plane for LLM inference fleets."""

__version__ = "0.1.0"
