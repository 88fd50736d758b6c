"""A proof obligation as data, and what discharging it yields.

One record per obligation: which registry property (spec/properties.py) or
state invariant it proves, what kind of claim it is, the bound it holds under,
the result it must give, and the known-bad rule variants on which it must be
refuted.  `schedspec prove` runs every record three ways:

1. the claim itself, on the correct rules: the expected result (normally
   "proved": z3 found the negation unsatisfiable);
2. its premises alone: satisfiable, with a witness (a scenario file) that shows
   the claim is not vacuous;
3. the claim on each bad variant: "refuted", with the counterexample, so the
   obligation is shown able to fail.

`unknown` (a z3 timeout or an incomplete answer) is never a pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal

# A kind says what is claimed:
#   "step"       - the property holds on every step from a state that satisfies the state invariant;
#   "inductive"  - the state invariant is preserved by a transition (schedule+update, add_request, abort);
#   "initial"    - the initial (empty) state satisfies the invariant;
#   "theorem"    - a closed-form statement over unbounded integers (e.g. the starvation condition);
#   "loop"       - a property for any number of requests, by loop invariants (proofs/loop_claims.py);
#   "pool"       - a prefix-caching property for any number of blocks and requests, by an
#                  invariant of the pool operations (proofs/pool_invariants.py);
#   "encoder"    - an encoder-input property for any number of requests, items and cache
#                  entries, by invariants of the encoder operations (proofs/encoder_invariants.py).
Kind = Literal["step", "inductive", "initial", "theorem", "loop", "pool", "encoder"]
Status = Literal["proved", "refuted", "unknown"]


@dataclass(frozen=True)
class Bound:
    """The finite part of an obligation's domain; `None` fields are unbounded."""

    max_running: int | None = None
    max_waiting: int | None = None
    steps: int = 1
    note: str = ""

    def __str__(self) -> str:
        if self.max_running is None and self.max_waiting is None:
            return self.note or "unbounded"
        parts = [f"running<={self.max_running}", f"waiting<={self.max_waiting}"]
        if self.steps != 1:
            parts.append(f"steps={self.steps}")
        if self.note:
            parts.append(self.note)
        return ", ".join(parts)


@dataclass(frozen=True)
class Result:
    status: Status
    seconds: float
    detail: str = ""
    # For "refuted": the counterexample (a concrete pre-state, as plain data).
    model: dict[str, Any] | None = None


@dataclass(frozen=True)
class Obligation:
    name: str
    property: str  # a name in spec.properties.PROPERTIES or spec.invariants.STATE_INVARIANTS
    kind: Kind
    bound: Bound
    # The claim under a rule variant ("correct" = the spec's rules).
    discharge: Callable[[str], Result]
    # Satisfiability of the premises, with a witness scenario (built on demand).
    witness: Callable[[], tuple[Result, Any]]
    # Rule variants on which the claim must come back "refuted".
    bad_variants: tuple[str, ...] = ()
    expected: Status = "proved"
    doc: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
