"""The example scenarios shipped with the package (reference/examples/)."""

from __future__ import annotations

import difflib
from pathlib import Path

EXAMPLES_DIR = Path(__file__).parent / "examples"

# The order `schedspec examples` shows them in.
ORDER = ["table3-b8", "table3-b16", "table3-b32", "group-a", "group-b",
         "chunked-off-no-fit", "preemption", "static-waste", "prefix-shared-system-prompt",
         "prefix-resume-hit", "prefix-eviction", "async-preemption"]


def example_names() -> list[str]:
    present = {p.stem for p in EXAMPLES_DIR.glob("*.json")}
    return [n for n in ORDER if n in present] + sorted(present - set(ORDER))


def resolve_scenario_path(path_or_name: str) -> str:
    """A path as given, or a shipped example by name (`table3-b16`, also
    `table3-b16.json`) when no such file exists.  A bare name that is neither
    raises UsageError listing the shipped examples."""
    p = Path(path_or_name)
    if p.exists():
        return path_or_name
    bare = path_or_name and "/" not in path_or_name and "\\" not in path_or_name
    stem = path_or_name[:-5] if path_or_name.endswith(".json") else path_or_name
    if bare:
        candidate = EXAMPLES_DIR / f"{stem}.json"
        if stem in example_names() and candidate.exists():
            return str(candidate)
        if not path_or_name.endswith(".json"):
            from .errors import UsageError, shown

            names = example_names()
            close = difflib.get_close_matches(stem, names, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise UsageError(f"{shown(path_or_name)}: no such file or shipped example; {hint}"
                             f"examples: {', '.join(names)}")
    return path_or_name
