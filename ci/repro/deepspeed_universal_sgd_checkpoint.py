"""DeepSpeed 0.19.8: ds_to_universal cannot convert the checkpoint of a model trained with torch.optim.SGD; it stops
with a bare KeyError: 'exp_avg'.

extract_zero_shards (checkpoint/ds_to_universal.py) reads state["exp_avg"] and state["exp_avg_sq"] from every ZeRO
optimizer state group unconditionally: Adam's moments. torch.optim.SGD's state holds momentum_buffer (None without
momentum), so the conversion of an AutoTP x ZeRO 1 checkpoint (tp 2, the documented universal-checkpoint path) dies
in its first step, naming neither the optimizer nor what it supports. Plain PyTorch saves and resumes SGD (its state
dict round-trips); DeepSpeed's own load_checkpoint at the same topology does too. Not AutoTP-specific: the same holds
at tp 1.

Run (CPU, 2 processes over gloo, about 20 s):  python ci/repro/deepspeed_universal_sgd_checkpoint.py
Exit status 1 while the conversion fails, 0 once it converts.

Finding: findings/deepspeed_universal_sgd_checkpoint.toml
"""
import importlib
import os
import sys
import tempfile

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, HIDDEN = 2, 35, 8


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


def rank_main(rank, result, directory):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = Tiny()
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
              "zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True, "steps_per_print": 10**9,
              "tensor_parallel": {"autotp_size": TP, "vocab_parallel_lm_head": True, "partition_config": {
                  "use_default_specs": False, "layer_specs": [{"patterns": [r"proj\.weight$"], "partition_type": "skip"}]}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=0.05), config=config)
    engine.backward(engine(torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(1))))
    engine.step()
    engine.save_checkpoint(directory, tag="step1")
    engine.destroy()


if __name__ == "__main__":
    from deepspeed.checkpoint import ds_to_universal

    with tempfile.TemporaryDirectory() as directory:
        run_ranks(rank_main, TP, directory, env={"DS_ACCELERATOR": "cpu"}, init=False)
        sys.argv = ["ds_to_universal", "--input_folder", os.path.join(directory, "step1"), "--output_folder",
                    os.path.join(directory, "step1_universal"), "--num_extract_workers", "1", "--num_merge_workers", "1"]
        try:
            ds_to_universal.main(ds_to_universal.parse_arguments())
        except KeyError as exc:
            print(f"MISMATCH: ds_to_universal of an SGD checkpoint raises KeyError {exc}")
            sys.exit(1)
    print("the SGD checkpoint converts")
    sys.exit(0)
