"""DeepSpeed 0.19.8: a checkpoint saved where AutoTP left a TP rank an empty shard of the head trains and saves
without a word, and then ds_to_universal dies converting it with a bare TypeError: 'NoneType' object is not iterable.

The row-parallel head (a partition_config "row" spec on lm_head) at hidden 2 over tp 4 gives ranks 2-3 a (vocab, 0)
weight shard; the gathered column head ("column" spec, gather_output) at vocab 3 over tp 4 gives rank 3 a (0, hidden)
one. ZeRO 1 keeps no optimizer fragment for a zero-element parameter, and the empty rank's PARAM_SHAPES omit it, so
_merge_zero_shards (checkpoint/ds_to_universal.py), which has a branch to fill exactly such a gap with an empty
placeholder, reads the missing rank's recorded shape as None and fails in its own guard
(assert math.prod(missing_shape) == 0, on the "step" state). No universal checkpoint is written, and a resume with
checkpoint.load_universal then fails on every rank ("latest_universal does not exist"). Plain PyTorch saves and
resumes the same model; DeepSpeed's vocab-parallel head refuses such a split up front (at initialize), these two heads
accept it and train.

Run (CPU, 4 processes over gloo, about 75 s):  python ci/repro/deepspeed_universal_empty_shard.py [row|column]
Exit status 1 while the conversion fails, 0 once it converts.

Finding: findings/deepspeed_autotp_empty_shard_crashes.toml
"""
import importlib
import os
import sys
import tempfile

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP = 4
HEADS = {"row": (2, 2, {"partition_type": "row"}),  # vocab, hidden, the head's spec
         "column": (3, 8, {"partition_type": "column", "gather_output": True})}


class Tiny(nn.Module):
    def __init__(self, vocab, hidden):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.lm_head = nn.Linear(hidden, vocab)

    def forward(self, ids):
        logits = self.lm_head(torch.tanh(self.proj(self.embed_tokens(ids))))
        return nn.functional.cross_entropy(logits.flatten(0, 1).float(), ids.flatten())


def rank_main(rank, result, directory, head):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    vocab, hidden, spec = HEADS[head]
    torch.manual_seed(0)
    model = Tiny(vocab, hidden)
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
              "zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True, "steps_per_print": 10**9,
              "tensor_parallel": {"autotp_size": TP, "partition_config": {"use_default_specs": False, "layer_specs": [
                  {"patterns": [r"proj\.weight$"], "partition_type": "skip"},
                  {"patterns": [r"lm_head\.weight$"], **spec}]}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.AdamW(p, lr=0.05), config=config)
    result[rank] = tuple(model.lm_head.weight.shape)
    engine.backward(engine(torch.randint(0, vocab, (2, 6), generator=torch.Generator().manual_seed(1))))
    engine.step()
    engine.save_checkpoint(directory, tag="step1")
    engine.destroy()


if __name__ == "__main__":
    from deepspeed.checkpoint import ds_to_universal

    head = sys.argv[1] if len(sys.argv) > 1 else "row"
    with tempfile.TemporaryDirectory() as directory:
        results = run_ranks(rank_main, TP, directory, head, env={"DS_ACCELERATOR": "cpu"}, init=False)
        print(f"{head} head trained and saved; lm_head.weight shards per TP rank:",
              [results[r] for r in range(TP)])
        sys.argv = ["ds_to_universal", "--input_folder", os.path.join(directory, "step1"), "--output_folder",
                    os.path.join(directory, "step1_universal"), "--num_extract_workers", "1", "--num_merge_workers", "1"]
        try:
            ds_to_universal.main(ds_to_universal.parse_arguments())
        except TypeError as exc:
            print(f"MISMATCH: ds_to_universal of a checkpoint with an empty {head} head shard raises TypeError: {exc}")
            sys.exit(1)
    print("the checkpoint with an empty head shard converts")
    sys.exit(0)
