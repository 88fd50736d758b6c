"""Proof obligations over the spec: z3 (one scheduler step as a symbolic
function, every registry property and the state invariant as obligations with
witnesses and bad variants; the starvation condition as unbounded theorems),
and CrossHair contracts.  See proofs/README.md.  (Counterexample search runs
the engine and proves nothing: it is in proofs/search/.)

z3 is imported by these modules; CLI code imports them inside functions.
"""
