"""The runtime monitor: vLLM's scheduler checked against the spec, call by call,
from vLLM's own state (`lift`), and vLLM's own scheduler tests run under it."""
