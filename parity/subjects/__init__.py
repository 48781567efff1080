"""Subject registry. Adding a framework = one module here + one case file under cases/.

PARITY_SUBJECT_MODULES (comma-separated module names, each with a SUBJECTS list) adds subjects
from elsewhere, e.g. the deliberately broken subjects of the self-tests. Rank processes inherit
the variable, so they resolve the same names. A name resolves against sys.path and then the current
directory: the `parity` console script's sys.path holds its bin directory, not the directory it was
started from, so `tests.faulty_subjects` would not import from there otherwise.
"""
from __future__ import annotations

import importlib
import os
import sys

from parity.subjects.deepspeed_autotp import ColumnGatheredHead, VocabParallelHead
from parity.subjects.deepspeed_ce import (DeepSpeedFusedLinearCE, DeepSpeedLigerGuardedCE, DeepSpeedLigerWithoutGroup,
                                         DeepSpeedVocabParallelCE, DeepSpeedVocabParallelCEModule,
                                         DeepSpeedVocabParallelEntropy, DeepSpeedVocabParallelLogProbs,
                                         DeepSpeedVocabSequenceParallelCE)
from parity.subjects.deepspeed_kl import DeepSpeedVocabParallelKL
from parity.subjects.deepspeed_direct import DirectColumnGatheredHead, DirectRowParallelHead, DirectVocabParallelHead
from parity.subjects.deepspeed_embed_spec import EmbeddingSpecHead
from parity.subjects.deepspeed_embedding import DirectVocabParallelEmbedding
from parity.subjects.deepspeed_inference import InferenceHead
from parity.subjects.deepspeed_reach import HeuristicBlocksHead, PresetLlamaHead, SpecReachHead
from parity.subjects.deepspeed_rejects import DeepSpeedRejection
from parity.subjects.deepspeed_row import RowParallelHead
from parity.subjects.deepspeed_tied import (TiedColumnGatheredHead, TiedPlanHead, TiedRowParallelHead,
                                            TiedVocabParallelHead)
from parity.subjects.deepspeed_universal import UniversalColumnGathered, UniversalRowParallel, UniversalVocabParallel
from parity.subjects.hf_tp_plan import HFPlanColumnHead, HFPlanRowHead, HFPlanTiedHead
from parity.subjects.liger_ce import LigerVocabParallelCE
from parity.subjects.megatron_tp import (MegatronColumnGatheredHead, MegatronVocabParallelEmbedding,
                                         MegatronVocabParallelHead)
from parity.subjects.torch_tp import (TorchColumnGatheredHead, TorchRowParallelHead, TorchVocabParallelEmbedding,
                                      TorchVocabParallelHead)

SUBJECTS = {s.name: s for s in [ColumnGatheredHead(), VocabParallelHead(), RowParallelHead(),
                                LigerVocabParallelCE(), DeepSpeedVocabParallelCE(), DeepSpeedLigerGuardedCE(), DeepSpeedLigerWithoutGroup(),
                                DeepSpeedFusedLinearCE(), DeepSpeedVocabParallelLogProbs(), DeepSpeedVocabParallelEntropy(),
                                DeepSpeedVocabParallelKL(), DeepSpeedVocabParallelCEModule(), DeepSpeedVocabSequenceParallelCE(),
                                TiedRowParallelHead(), TiedVocabParallelHead(), TiedColumnGatheredHead(), TiedPlanHead(),
                                DirectVocabParallelEmbedding(), DirectColumnGatheredHead(), DirectVocabParallelHead(),
                                DirectRowParallelHead(), DeepSpeedRejection(), InferenceHead(),
                                HFPlanColumnHead(), HFPlanRowHead(), HFPlanTiedHead(),
                                EmbeddingSpecHead(), SpecReachHead(), UniversalColumnGathered(), UniversalVocabParallel(),
                                UniversalRowParallel(), PresetLlamaHead(), HeuristicBlocksHead(),
                                TorchColumnGatheredHead(), TorchVocabParallelHead(), TorchRowParallelHead(),
                                TorchVocabParallelEmbedding(),
                                MegatronColumnGatheredHead(), MegatronVocabParallelHead(), MegatronVocabParallelEmbedding()]}
ENV_VAR = "PARITY_SUBJECT_MODULES"
# The frameworks under test (Subject.framework), as `parity run/list --framework` names them.
FRAMEWORKS = ("deepspeed", "liger", "torch", "megatron")


class SubjectModuleError(ImportError):
    """A PARITY_SUBJECT_MODULES entry that cannot be imported or has no SUBJECTS: a usage error.
    Raised while parity.subjects itself is being imported, so callers recognise it by this flag."""
    usage_error = True


def _import(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        here = os.getcwd()
        # Only a miss of the named module itself (not of something it imports) earns the retry.
        if not exc.name or not (name == exc.name or name.startswith(exc.name + ".")) or here in sys.path:
            raise
        sys.path.append(here)  # appended: the current directory never shadows installed packages
        return importlib.import_module(name)


def register_modules(names: str) -> None:
    for module in filter(None, (n.strip() for n in names.split(","))):
        try:
            imported = _import(module)
        except ImportError as exc:
            raise SubjectModuleError(f"{ENV_VAR}: cannot import {module!r} (looked on sys.path and in "
                                     f"{os.getcwd()}): {exc}") from None
        if not hasattr(imported, "SUBJECTS"):
            raise SubjectModuleError(f"{ENV_VAR}: module {module!r} has no SUBJECTS list")
        for subject in imported.SUBJECTS:
            SUBJECTS[subject.name] = subject


def add_subject_modules(names: str) -> None:
    """Register here and in every rank process started from now on."""
    current = [n for n in os.environ.get(ENV_VAR, "").split(",") if n]
    os.environ[ENV_VAR] = ",".join(current + [n for n in names.split(",") if n not in current])
    register_modules(names)


register_modules(os.environ.get(ENV_VAR, ""))
