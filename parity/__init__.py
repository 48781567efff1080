"""tp-parity: numerical parity verification for tensor-parallel LM output heads and losses."""
