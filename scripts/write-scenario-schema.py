"""Write what the tables of fields state elsewhere: reference/schemas/scenario.schema.json
(reference/scenario.py `published_schema`: the config's part from spec/config.py, the
rest from reference/scenario_fields.py) and the bounds table of docs/formats.md
(scenario_fields.py `bounds_table`).  tests/test_scenario_input.py checks that both
equal what this writes.  Run it after changing a field:

    .venv/bin/python scripts/write-scenario-schema.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from schedspec.reference.scenario import MAX_CACHED_PROMPT_TOKENS, SCHEMA_DIR, published_schema
from schedspec.reference.scenario_fields import bounds_table

FORMATS_MD = Path(__file__).resolve().parents[1] / "docs" / "formats.md"
TABLE_START = "<!-- bounds table: scripts/write-scenario-schema.py writes it -->\n"
TABLE_END = "<!-- end of the bounds table -->"


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


def with_bounds_table(doc: str) -> str:
    """docs/formats.md's text with its bounds table as the tables of fields state it."""
    start = doc.index(TABLE_START) + len(TABLE_START)
    return doc[:start] + bounds_table(MAX_CACHED_PROMPT_TOKENS) + doc[doc.index(TABLE_END, start):]


if __name__ == "__main__":
    path = SCHEMA_DIR / "scenario.schema.json"
    path.write_text(render(published_schema()) + "\n")
    print(f"wrote {path}")
    FORMATS_MD.write_text(with_bounds_table(FORMATS_MD.read_text()))
    print(f"wrote the bounds table of {FORMATS_MD}")
