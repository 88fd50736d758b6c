"""Which torch device the batched scheduler runs on."""

from __future__ import annotations

import torch


def resolve_device(name: str | None) -> torch.device:
    """None or "auto": CUDA when available, else the CPU; "cpu"; "cuda" or "cuda:N"
    (ValueError when CUDA is not available); anything else is a ValueError."""
    if name is None or name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda" or (name.startswith("cuda:") and name[5:].isdigit()):
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r}: CUDA is not available on this machine; use --device cpu")
        index = int(name[5:]) if ":" in name else 0
        if index >= torch.cuda.device_count():
            raise ValueError(f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s) present")
        return torch.device(name)
    raise ValueError(f"device {name!r}: unknown device; use auto, cpu, cuda or cuda:N")
