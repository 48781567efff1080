"""Unsharded references: the suite's own model, loss, optimizer and training loop.

Nothing here may import deepspeed or liger (tests/references/test_references.py enforces it):
a reference that shared code with a subject could not catch that subject's bugs.
"""
