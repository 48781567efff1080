"""Scale cases: production shapes on a GPU, judged by stage-local float64 oracles (README "Scale cases")."""
