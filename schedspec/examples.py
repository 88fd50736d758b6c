"""The example scenarios shipped with the package (reference/examples/)."""

from __future__ import annotations

from pathlib import Path

from . import reference

EXAMPLES_DIR = Path(reference.__file__).parent / "examples"

# The order `schedspec examples` shows them in.
ORDER = ["table3-b8", "table3-b16", "table3-b32", "group-a", "group-b",
         "chunked-off-no-fit", "preemption", "static-waste"]


def example_names() -> list[str]:
    present = {p.stem for p in EXAMPLES_DIR.glob("*.json")}
    return [n for n in ORDER if n in present] + sorted(present - set(ORDER))


def resolve_scenario_path(path_or_name: str) -> str:
    """A path as given, or a shipped example by name when no such file exists."""
    if Path(path_or_name).exists() or path_or_name.endswith(".json"):
        return path_or_name
    candidate = EXAMPLES_DIR / f"{path_or_name}.json"
    return str(candidate) if candidate.exists() else path_or_name
