"""Strict JSON for the files users give (scenarios, state vectors): the parser
hooks that keep what plain `json.loads` would let slip, in place, so that the
one-line error can name the field it sits in (a duplicate key, NaN or Infinity).
Each reader walks the parsed tree and reports the first one.  Also the validator
class of their schemas (integers strict), and the state-vector reader's quick
schema check (`fast_valid`)."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import jsonschema
from jsonschema import validators

from schedspec.spec.config import TYPE_WORDS  # the words of the config's errors, for every file's


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


# --- a quick schema check, for the state-vector schema's keywords -----------------------
# Scenario files need none: their fields' tables check them and word the errors
# (reference/scenario_fields.py).  A state vector has no such table; jsonschema checks
# it, about 4 times slower than this on the vectors of a campaign (290 vectors of the
# shipped examples: 0.86 s against 0.22 s) and 20 us per token id of a state.  So the
# vector reader asks this first and trusts its yes; on a no jsonschema decides and
# words the error: one schema, this check only a shortcut to jsonschema's yes.

_FAST_TYPES = {
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
}
_ANNOTATIONS = frozenset({"title", "description", "$schema", "$id"})


@lru_cache(maxsize=None)
def _pattern(text: str) -> re.Pattern:
    return re.compile(text)


def _same(a: Any, b: Any) -> bool:
    """JSON equality as const and enum mean it: true is not 1."""
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def fast_valid(schema: Any, value: Any) -> bool:
    """Whether `value` meets `schema` (references inlined), for the keywords the
    state-vector schema uses.  Only a yes is trusted: on a no, or a keyword this
    does not know, jsonschema decides and words the error."""
    if schema is True:
        return True
    if not isinstance(schema, dict):
        return False
    for key, want in schema.items():
        if key in _ANNOTATIONS:
            continue
        if key == "type":
            if not any(_FAST_TYPES[k](value) for k in (want if isinstance(want, list) else [want])):
                return False
        elif key == "const":
            if not _same(value, want):
                return False
        elif key == "enum":
            if not any(_same(value, w) for w in want):
                return False
        elif key in ("minimum", "maximum", "exclusiveMaximum"):
            if _FAST_TYPES["number"](value) and not (value >= want if key == "minimum" else value <= want
                                                     if key == "maximum" else value < want):
                return False
        elif key in ("minLength", "maxLength"):
            if isinstance(value, str) and not (len(value) >= want if key == "minLength" else len(value) <= want):
                return False
        elif key == "pattern":
            if isinstance(value, str) and not _pattern(want).search(value):
                return False
        elif key in ("properties", "required", "additionalProperties", "propertyNames"):
            if isinstance(value, dict) and not _fast_object(key, want, schema, value):
                return False
        elif key in ("items", "prefixItems", "minItems", "maxItems"):
            if isinstance(value, list) and not _fast_array(key, want, schema, value):
                return False
        elif key == "allOf":
            if not all(fast_valid(s, value) for s in want):
                return False
        elif key == "anyOf":
            if not any(fast_valid(s, value) for s in want):
                return False
        elif key == "if":
            branch = schema.get("then") if fast_valid(want, value) else schema.get("else")
            if branch is not None and not fast_valid(branch, value):
                return False
        elif key not in ("then", "else"):
            return False  # a keyword this checker does not know: let jsonschema decide
    return True


def _fast_object(key: str, want: Any, schema: dict, value: dict) -> bool:
    if key == "properties":
        return all(fast_valid(want[k], v) for k, v in value.items() if k in want)
    if key == "required":
        return all(k in value for k in want)
    if key == "propertyNames":
        return all(fast_valid(want, k) for k in value)
    known = schema.get("properties", {})  # additionalProperties
    return all(fast_valid(want, v) for k, v in value.items() if k not in known)


def _fast_array(key: str, want: Any, schema: dict, value: list) -> bool:
    if key == "minItems":
        return len(value) >= want
    if key == "maxItems":
        return len(value) <= want
    if key == "prefixItems":
        return all(fast_valid(s, v) for s, v in zip(want, value))
    skip = len(schema.get("prefixItems", ()))  # items: the items after prefixItems
    rest = value[skip:] if skip else value
    # Token ids, block ids and request ids, most of a state's values: one pass.
    plain = {k: v for k, v in want.items() if k not in _ANNOTATIONS} if isinstance(want, dict) else None
    if plain == {"type": "string"}:
        return all(type(v) is str for v in rest)
    if plain is not None and set(plain) == {"type", "pattern"} and plain["type"] == "string":
        search = _pattern(plain["pattern"]).search
        return all(type(v) is str and search(v) for v in rest)
    if plain is not None and plain.get("type") == "integer" and set(plain) <= {"type", "minimum"}:
        lo = plain.get("minimum")
        return all(type(v) is int and (lo is None or v >= lo) for v in rest)
    return all(fast_valid(want, v) for v in rest)


__all__ = ["DuplicateKeys", "Refused", "StrictValidator", "TYPE_WORDS", "fast_valid", "is_json_integer", "object_pairs",
           "refuse_constant"]
