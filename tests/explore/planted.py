"""Planted bugs of the kinds the explore strategy families draw, for their self-tests (tests/explore/test_families.py).

Loaded into parent and rank processes through PARITY_SUBJECT_MODULES=tests.explore.planted (no subjects of its own):
its mutants are registered beside the catalog's, so PARITY_MUTANT names them, without joining the kill matrix of
parity/mutation/catalog.py (a bug of a user's config key is no defect the default matrix must kill).
"""
from __future__ import annotations

from parity.mutation.catalog import COLUMN, VOCAB, Mutant, _swap, register

SUBJECTS = []


def _clip_written_halved():
    from deepspeed.runtime import config
    from deepspeed.runtime.constants import GRADIENT_CLIPPING, GRADIENT_CLIPPING_DEFAULT

    def get_gradient_clipping(param_dict):
        value = config.get_scalar_param(param_dict, GRADIENT_CLIPPING, GRADIENT_CLIPPING_DEFAULT)
        return value / 2 if GRADIENT_CLIPPING in param_dict else value  # upstream: value

    return _swap(config, "get_gradient_clipping", get_gradient_clipping)


register(Mutant(
    "config_clip_written_halved",
    "DeepSpeedConfig reads a gradient_clipping the user wrote as half its value (left out, the default 1.0 holds)",
    "deepspeed.runtime.config.get_gradient_clipping", "grad_norm / weights (clipped steps)", (COLUMN, VOCAB),
    _clip_written_halved))
