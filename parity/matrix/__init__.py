"""Case file -> cases: the axes, the TOML case matrices expanded into stably ordered cases, the
selection both entry points share (`select`), and the coverage table.

May import: references, parity.observe, parity.subjects (the registry says which axes a subject has).
"""
