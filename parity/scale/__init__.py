"""Scale cases: production shapes on a GPU, judged by stage-local float64 oracles (docs/speed.md#scale-cases-parity-scale)."""
