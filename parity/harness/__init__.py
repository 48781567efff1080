"""Cases -> rank groups -> verdicts: pooled rank processes, the body of a rank, where a rank runs
(placement), the runner that judges each case with parity.checks, and job processes that run several
runners side by side (job_processes.py, built on runner.py, never the other way round).

May import: everything below it (references, observe, subjects, mutation.catalog, matrix, checks).
"""
