"""Proof obligations over the spec (z3, CrossHair): to come in the next issues."""
