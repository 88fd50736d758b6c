"""Counterexample search: run the engine on drawn scenarios until one reaches a
goal, then shrink it (`schedspec counterexample`).

- goals.py: the goals, named predicates over one run's transitions (starvation,
  thrash, hol-blocking, liveness, every registry property, ...);
- counterexample.py: the per-goal draws, `evaluate` (one run, judged) and
  `search` (random search + reference/shrink.py's shrinker).

It runs scenarios, so it proves nothing: the proofs are in proofs/ (z3), which
does not import this folder.  Layer 3, beside reference/, gpu/ and proofs/:
it imports spec/, base/ and reference/ only.
"""
