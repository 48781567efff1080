"""Liger-Kernel 0.8.5's LigerVocabParallelCEFunction, called directly on vocabulary shards.

On CUDA it runs Liger's Triton kernels; on CPU the rank worker sets TRITON_INTERPRET=1 so the same
kernels run in Triton's interpreter (small shapes only). Liger assumes equal shards
(vocab_start = rank * local_vocab): this subject only accepts vocabularies that TP divides.
"""
from __future__ import annotations

from parity.subjects.loss_only import IGNORE_INDEX, TOKENS, LigerShards, LogitsCE


class LigerVocabParallelCE(LigerShards, LogitsCE):
    framework = "liger"
    name = "liger_vocab_ce"
    feature = None
    description = "LigerVocabParallelCEFunction on equal vocabulary shards against the suite's CE"
    axes = {"dtype": None, "vocab": None, "ignore": None, "tp": None, "device": None, "backward": None,
            "targets": None, "label_smoothing": None, "ls_formula": None, "ls_mode": None}

    def loss(self, values, ctx, local, targets, group, part, obs):
        from liger_kernel.ops.vocab_parallel_cross_entropy import LigerVocabParallelCEFunction

        local_vocab = local.shape[-1]
        # Liger's layout is [seq, batch, vocab]; it returns per-token fp32 losses. The smoothing formula and
        # mode are passed as the case names them; the reference stays torch's label_smoothing whatever they
        # are (megatron's formula and the partition mode are documented divergences, cases/liger_ce.toml).
        return LigerVocabParallelCEFunction.apply(local.view(TOKENS, 1, local_vocab), targets.view(TOKENS, 1), group,
                                                  IGNORE_INDEX, values["label_smoothing"],
                                                  values["ls_formula"],
                                                  values["ls_mode"]).view(TOKENS)
