"""Verdicts -> what people read: the console progress and summary, results.jsonl and summary.json
records, summary.md, report.html with its plots, and `parity diff` of two reports.

May import: everything below it (references, observe, subjects, matrix, checks, harness).
"""
