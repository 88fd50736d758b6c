"""Write reference/schemas/scenario.schema.json's `config` from the config table
(spec/config.py `config_schema`); tests/test_scenario_input.py checks the shipped
file equals what this writes.  Run it after changing a config field:

    .venv/bin/python scripts/write-scenario-schema.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from schedspec.reference.scenario import SCHEMA_DIR, published_schema


def _leaf(value: Any) -> bool:
    return not isinstance(value, (dict, list)) or (isinstance(value, list) and all(_leaf(v) for v in value)) \
        or (isinstance(value, dict) and all(not isinstance(v, (dict, list)) or
                                            (isinstance(v, list) and all(_leaf(x) for x in v)) for v in value.values()))


def render(value: Any, indent: int = 0) -> str:
    """JSON with an object of plain values on one line, as the shipped schemas are written."""
    if isinstance(value, dict) and value and not _leaf(value):
        pad = "  " * (indent + 1)
        items = [f"{pad}{json.dumps(k)}: {render(v, indent + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + "  " * indent + "}"
    return json.dumps(value, ensure_ascii=False)


if __name__ == "__main__":
    path = SCHEMA_DIR / "scenario.schema.json"
    path.write_text(render(published_schema()) + "\n")
    print(f"wrote {path}")
