"""Liger-Kernel 0.8.5's LigerVocabParallelCEFunction, called directly on equal vocabulary shards (on CPU in
Triton's interpreter; docs/subjects.md#liger-kernel)."""
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
