"""DeepSpeed 0.19.8: at tp 2 x dp 3 with uneven head shards, the TP ranks' copies of a TP-replicated parameter's
optimizer state differ by rounding, and ds_to_universal refuses the checkpoint.

AutoTP splits a 35-row lm_head 18/17. ZeRO 1 flattens each TP rank's parameters into one buffer, so the two TP ranks
have different flat layouts (the head's shard is 162 or 153 elements), and proj.weight, replicated on both, falls on
different data-parallel partitions (wholly in partition 1 on TP rank 0, across partitions 1 and 2 on TP rank 1). Each
TP rank's data-parallel group reduces its gradient on its own: at dp 3 a three-way sum, whose rounding depends on the
order, so the replicas get gradients an ulp apart. AdamW's moments differ (fp32: 2 of 64 entries of proj.weight's
exp_avg, 9.3e-10; bf16: its float32 master as well, 9.2e-6), the model weights stay equal (nothing warns during
training). engine.save_checkpoint writes both copies; ds_to_universal's affine rebuild of a replicated parameter
demands they agree and raises "Ranks [0, 1] hold different data for the same block of a replicated parameter" (a
message that blames the data a correct run cannot keep equal). Plain PyTorch's answer: one replicated value, and a
checkpoint that converts. With 36 rows (18/18, equal layouts) the same run converts; at dp 2 (a + b == b + a) too.
The optimizer plays no part in the drift: with SGD the replicas' gradients differ from the first step
(cases/deepspeed_topology.toml, replicas_agree).

Run (CPU, 6 processes over gloo, about 60 s):  python ci/repro/deepspeed_universal_replicated_state_differs.py
Exit status 1 while the replicas' state differs or the conversion is refused, 0 once both are fine.

Finding: findings/deepspeed_tp_replica_drift.toml
"""
import importlib
import os
import sys
import tempfile

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, DP, VOCAB, HIDDEN = 2, 3, 35, 8


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.proj = nn.Linear(HIDDEN, HIDDEN)
        self.lm_head = nn.Linear(HIDDEN, VOCAB)
        self.loss_function = None  # the vocab-parallel engine installs its CE here, as on an HF model

    def forward(self, ids):
        logits = self.lm_head(torch.tanh(self.proj(self.embed_tokens(ids))))
        return self.loss_function(logits=logits, labels=ids, vocab_size=VOCAB)


def rank_main(rank, result, directory, dtype):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = Tiny()
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
              "zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True, "steps_per_print": 10**9,
              "tensor_parallel": {"autotp_size": TP, "vocab_parallel_lm_head": True, "partition_config": {
                  "use_default_specs": False, "layer_specs": [{"patterns": [r"proj\.weight$"], "partition_type": "skip"}]}}}
    if dtype == "bf16":
        config["bf16"] = {"enabled": True}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.AdamW(p, lr=0.01), config=config)
    data = torch.Generator().manual_seed(1 + rank // TP)  # each data-parallel replica its own batches
    for _ in range(2):
        engine.backward(engine(torch.randint(0, VOCAB, (2, 6), generator=data)))
        engine.step()
    p = model.proj.weight
    result[rank] = {"weight": p.detach().float().clone(), "fp32": safe_get_full_fp32_param(p).clone(),
                    "exp_avg": safe_get_full_optimizer_state(p, "exp_avg").clone()}
    engine.save_checkpoint(directory, tag="step2")
    engine.destroy()


def convert(directory):
    from deepspeed.checkpoint import ds_to_universal

    sys.argv = ["ds_to_universal", "--input_folder", os.path.join(directory, "step2"), "--output_folder",
                os.path.join(directory, "step2_universal"), "--num_extract_workers", "1", "--num_merge_workers", "1"]
    try:
        ds_to_universal.main(ds_to_universal.parse_arguments())
    except ValueError as exc:
        return str(exc)
    return None


if __name__ == "__main__":
    wrong = False
    for dtype in ("fp32", "bf16"):
        with tempfile.TemporaryDirectory() as directory:
            result = run_ranks(rank_main, TP * DP, directory, dtype, env={"DS_ACCELERATOR": "cpu"}, init=False)
            for key in ("weight", "fp32", "exp_avg"):
                a, b = result[0][key], result[1][key]  # TP ranks 0 and 1 of data-parallel replica 0
                differ = int((a != b).sum())
                print(f"{dtype}: proj.weight {key:8s} TP rank 0 vs 1: {differ} of {a.numel()} differ, "
                      f"max {float((a - b).abs().max()):.3g}")
                wrong |= differ > 0
            refused = convert(directory)
            print(f"{dtype}: ds_to_universal " + (f"refuses: {refused}" if refused else "converts"))
            wrong |= refused is not None
    print("MISMATCH: replicated state differs across TP ranks / conversion refused" if wrong else "replicas agree")
    sys.exit(1 if wrong else 0)
