"""Observations -> checks -> verdict: the comparison with the reference and the float64 oracle,
every numerical bound (tolerances), and the verdict of a case.

May import: references, parity.observe, parity.subjects, parity.matrix.
"""
