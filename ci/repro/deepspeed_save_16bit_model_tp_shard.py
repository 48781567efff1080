"""DeepSpeed 0.19.8: engine.save_16bit_model under AutoTP training without ZeRO 3 writes rank 0's
tensor-parallel shards, not the model's weights, silently.

save_16bit_model (runtime/engine.py) consolidates only when ZeRO 3 partitions the weights
(_zero3_consolidated_16bit_state_dict, which since #8168 also gathers the TP shards through
GatherReplacedLayerParams). At ZeRO 0, 1 and 2 it takes self.module_state_dict(), i.e. nn.Module.state_dict()
of the AutoTP-rewritten model, and rank 0 writes that: a vocab-parallel or gathered column head's weight and
bias as rank 0's vocabulary rows (18 of 35 at tp 2), a row head's weight as rank 0's hidden columns. The TP-aware
gather the same engine has (_consolidated_16bit_state_dict -> _replace_module_consolidated_state_dict, what
accelerate calls for a TP engine) is never used by it. No error or warning at save; loading the file into the
unsharded model (what the file is for) fails with a size mismatch, and a loader that skips mismatched shapes
re-initializes the head.

Run (CPU, 2 processes over gloo, about 15 s):  python ci/repro/deepspeed_save_16bit_model_tp_shard.py
Exit status 1 while a saved tensor is not the whole weight (the TP shards concatenated), 0 once they agree.

Finding: findings/deepspeed_save_16bit_model_tp_shard.toml
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
HEADS = {  # the three training heads AutoTP builds for lm_head
    "vocab_parallel": {"vocab_parallel_lm_head": True, "vocab_parallel_ce_backend": "torch"},
    "column_gathered": {"partition_config": {"use_default_specs": False, "layer_specs": [
        {"patterns": [r"lm_head\.weight$"], "partition_type": "column", "gather_output": True}]}},
    "row_parallel": {"partition_config": {"use_default_specs": False, "layer_specs": [
        {"patterns": [r"lm_head\.weight$"], "partition_type": "row"}]}},
}


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.proj = nn.Linear(HIDDEN, HIDDEN)
        self.lm_head = nn.Linear(HIDDEN, VOCAB)
        self.loss_function = None  # the vocab-parallel engine installs its CE here, as on an HF model

    def forward(self, ids):
        logits = self.lm_head(torch.tanh(self.proj(self.embed_tokens(ids))))
        if self.loss_function is not None:
            return self.loss_function(logits=logits, labels=ids, vocab_size=VOCAB)
        return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB).float(), ids[:, 1:].reshape(-1))


def save_after_one_step(rank, head, zero, directory):
    import deepspeed

    torch.manual_seed(0)
    model = Tiny()
    proj = {"patterns": [r"proj\.weight$"], "partition_type": "skip"}
    tp = {"autotp_size": TP, **HEADS[head]}
    tp.setdefault("partition_config", {"use_default_specs": False, "layer_specs": []})["layer_specs"].insert(0, proj)
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
              "zero_optimization": {"stage": zero}, "zero_allow_untested_optimizer": True,
              "steps_per_print": 10**9, "tensor_parallel": tp}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=0.5), config=config)
    engine.backward(engine(torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(1))))
    engine.step()
    shards = {name: p.detach().clone() for name, p in model.named_parameters()}
    engine.save_16bit_model(directory, f"{head}_zero{zero}.bin")  # every rank calls it, as documented
    engine.destroy()
    return shards


def rank_main(rank, result, directory):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    result[rank] = {(head, zero): save_after_one_step(rank, head, zero, directory)
                    for head in HEADS for zero in (0, 1, 2)}


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as directory:
        result = run_ranks(rank_main, TP, directory, env={"DS_ACCELERATOR": "cpu"}, init=False)
        wrong = False
        for (head, zero), shards in result[0].items():
            saved = torch.load(os.path.join(directory, f"{head}_zero{zero}.bin"))
            for name, shard in shards.items():
                full = Tiny().state_dict()[name]
                others = [result[r][(head, zero)][name] for r in range(TP)]
                if all(o.shape == full.shape for o in others):
                    whole = others[0]  # replicated: every rank's copy is the weight
                else:
                    dim = next(d for d in range(full.dim()) if others[0].shape[d] != full.shape[d])
                    whole = torch.cat(others, dim=dim)
                ok = saved[name].shape == whole.shape and torch.equal(saved[name], whole)
                if not ok:
                    print(f"{head:15s} zero {zero}: {name:14s} saved {tuple(saved[name].shape)}, the model's is "
                          f"{tuple(full.shape)}; equal to rank 0's shard: {torch.equal(saved[name], shards[name])}")
                wrong |= not ok
            try:
                Tiny().load_state_dict(saved)
            except RuntimeError as exc:
                print(f"{head:15s} zero {zero}: the unsharded model's load_state_dict raises: "
                      f"{str(exc).splitlines()[1].strip()}")
    print("MISMATCH: save_16bit_model wrote rank 0's tensor-parallel shards" if wrong else "saved weights are whole")
    sys.exit(1 if wrong else 0)
