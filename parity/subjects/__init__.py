"""Subject registry. Adding a framework = one module here + one case file under cases/.

PARITY_SUBJECT_MODULES (comma-separated module names, each with a SUBJECTS list) adds subjects
from elsewhere, e.g. the deliberately broken subjects of the self-tests. Rank processes inherit
the variable, so they resolve the same names.
"""
from __future__ import annotations

import importlib
import os

from parity.subjects.deepspeed_autotp import ColumnGatheredHead, VocabParallelHead
from parity.subjects.deepspeed_ce import (DeepSpeedFusedLinearCE, DeepSpeedLigerGuardedCE, DeepSpeedLigerWithoutGroup,
                                         DeepSpeedVocabParallelCE)
from parity.subjects.deepspeed_direct import DirectColumnGatheredHead, DirectRowParallelHead, DirectVocabParallelHead
from parity.subjects.deepspeed_embedding import DirectVocabParallelEmbedding
from parity.subjects.deepspeed_inference import InferenceHead
from parity.subjects.deepspeed_rejects import DeepSpeedRejection
from parity.subjects.deepspeed_row import RowParallelHead
from parity.subjects.deepspeed_tied import TiedRowParallelHead, TiedVocabParallelHead
from parity.subjects.hf_tp_plan import HFPlanColumnHead, HFPlanRowHead, HFPlanTiedHead
from parity.subjects.liger_ce import LigerVocabParallelCE
from parity.subjects.torch_tp import (TorchColumnGatheredHead, TorchRowParallelHead, TorchVocabParallelEmbedding,
                                      TorchVocabParallelHead)

SUBJECTS = {s.name: s for s in [ColumnGatheredHead(), VocabParallelHead(), RowParallelHead(),
                                LigerVocabParallelCE(), DeepSpeedVocabParallelCE(), DeepSpeedLigerGuardedCE(), DeepSpeedLigerWithoutGroup(),
                                DeepSpeedFusedLinearCE(), TiedRowParallelHead(), TiedVocabParallelHead(),
                                DirectVocabParallelEmbedding(), DirectColumnGatheredHead(), DirectVocabParallelHead(),
                                DirectRowParallelHead(), DeepSpeedRejection(), InferenceHead(),
                                HFPlanColumnHead(), HFPlanRowHead(), HFPlanTiedHead(),
                                TorchColumnGatheredHead(), TorchVocabParallelHead(), TorchRowParallelHead(),
                                TorchVocabParallelEmbedding()]}
ENV_VAR = "PARITY_SUBJECT_MODULES"


def register_modules(names: str) -> None:
    for module in filter(None, (n.strip() for n in names.split(","))):
        for subject in importlib.import_module(module).SUBJECTS:
            SUBJECTS[subject.name] = subject


def add_subject_modules(names: str) -> None:
    """Register here and in every rank process started from now on."""
    current = [n for n in os.environ.get(ENV_VAR, "").split(",") if n]
    os.environ[ENV_VAR] = ",".join(current + [n for n in names.split(",") if n not in current])
    register_modules(names)


register_modules(os.environ.get(ENV_VAR, ""))
