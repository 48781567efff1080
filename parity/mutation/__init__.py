"""Planted bugs the suite must catch.

catalog.py is the list of mutants. Every rank process loads it (the harness plants the mutant
named by the run's settings at rank start), so it stands beside the subjects and imports only
references and the frameworks under test. parity/mutants.py runs the matrix once per mutant and
decides which were killed; it sits on top, beside the CLI.
"""
