"""Cases -> rank groups -> verdicts: pooled rank processes, the body of a rank, where a rank runs
(placement), and the runner that judges each case with parity.checks.

May import: everything below it (references, observe, subjects, mutation.catalog, matrix, checks).
"""
