"""Strict JSON for the files users give (scenarios, state vectors): the parser
hooks that keep what plain `json.loads` would let slip, in place, so that the
one-line error can name the field it sits in (a duplicate key, NaN or Infinity).
Each reader walks the parsed tree and reports the first one."""

from __future__ import annotations

from typing import Any

import jsonschema
from jsonschema import validators


class Refused:
    """A JSON value the parser met but the format refuses, kept where it was."""

    def __init__(self, message: str):
        self.message = message


class DuplicateKeys(dict):
    """An object in which `duplicate` appears more than once (the last value kept)."""

    def __init__(self, pairs, key):
        super().__init__(pairs)
        self.duplicate = key


def object_pairs(pairs: list[tuple[str, Any]]) -> dict:
    """`object_pairs_hook`: a dict, or a DuplicateKeys naming the first repeated key."""
    d = dict(pairs)
    if len(d) != len(pairs):
        seen = set()
        for k, _ in pairs:
            if k in seen:
                return DuplicateKeys(pairs, k)
            seen.add(k)
    return d


def refuse_constant(text: str) -> Refused:
    """`parse_constant`: NaN, Infinity and -Infinity are not JSON numbers."""
    return Refused(f"= {text} is not a JSON number; NaN and Infinity are not allowed")


def is_json_integer(checker, instance) -> bool:
    """JSON Schema calls 4.0 an integer; the formats' integer fields take integers only."""
    return isinstance(instance, int) and not isinstance(instance, bool)


# Draft 2020-12 with that integer: the validator of every schema in schemas/.
StrictValidator = validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer", is_json_integer))


__all__ = ["DuplicateKeys", "Refused", "StrictValidator", "is_json_integer", "object_pairs", "refuse_constant"]
