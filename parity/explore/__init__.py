"""`parity explore`: property-based search (hypothesis) for cases no case file enumerates.

domains.py says what the search may draw (each subject's axes over their whole domains, minus the
points that are not parity cases); known.py decides whether a failing explored case is a documented
divergence of the case files; search.py runs the search under a wall-time budget through the
harness's runner and prints a shrunk failure as a ready case-file entry.

Sits on top, beside the CLI: may import everything below it (matrix, checks, harness, report).
"""
