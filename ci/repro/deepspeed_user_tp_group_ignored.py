"""DeepSpeed 0.19.8: a TP group the user passes to AutoTP training is never used.

World 4, TP 2, the user's TP groups {0,2} and {1,3} (DP groups {0,1} and {2,3}); each TP group gets
one batch, the two DP replicas different batches, as that layout requires. The user can pass the group
three documented ways (deepspeed.tp_model_init's table of inputs, deepspeed/__init__.py):

- `tp_model_init(model, tp_size, dtype, tp_group=g)` or the config's `tensor_parallel.tp.tp_group`: global
  rank 0 crashes at the end of deepspeed.initialize (engine.py:713, printing the config, whose
  _param_dict now holds the ProcessGroup): "TypeError: Object of type ProcessGroup is not JSON
  serializable", after AutoTP has sharded the model. Every other rank returns an engine whose head is
  sharded over the mesh's groups {0,1}/{2,3} (`_configure_tensor_parallel_states` builds the mesh
  unconditionally, engine.py:958, and `AutoTP.set_tensor_parallel_config` ignores the passed group in
  training mode, auto_tp.py:395-400).
- `deepspeed.initialize(..., mpu=user_mpu)` ("mpu used to build TP group"): no crash, every rank's engine
  uses the mesh's groups, not the mpu's; the first forward then raises "Data inconsistency within the TP
  group. Please check the Dataloader implementation", although the data is right for the user's groups.

Run (CPU, 4 processes over gloo, about 60 s):  python ci/repro/deepspeed_user_tp_group_ignored.py
Exit status 1 while some rank crashes in initialize or shards over a group other than the user's.

Finding: findings/deepspeed_user_tp_group_ignored.toml
"""
import importlib
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

WORLD, TP, VOCAB, HIDDEN = 4, 2, 34, 32


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.lm_head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids):
        logits = self.lm_head(torch.tanh(self.embed_tokens(ids)))
        return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB).float(), ids[:, 1:].reshape(-1))


class UserMpu:
    """Megatron-style mpu over the user's layout: TP groups {0,2},{1,3}, DP groups {0,1},{2,3}."""

    def __init__(self, rank, tp_group, dp_group):
        self.rank, self.tp_group, self.dp_group = rank, tp_group, dp_group

    def get_model_parallel_group(self): return self.tp_group
    def get_model_parallel_world_size(self): return TP
    def get_model_parallel_rank(self): return self.rank // 2
    get_tensor_model_parallel_group = get_model_parallel_group
    get_tensor_model_parallel_world_size = get_model_parallel_world_size
    get_tensor_model_parallel_rank = get_model_parallel_rank
    def get_data_parallel_group(self): return self.dp_group
    def get_data_parallel_world_size(self): return WORLD // TP
    def get_data_parallel_rank(self): return self.rank % 2


def rank_main(rank, result, how):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed
    import torch.distributed as tdist

    deepspeed.init_distributed(dist_backend="gloo")
    user_tp = {r: g for g in (tdist.new_group([0, 2]), tdist.new_group([1, 3])) for r in tdist.get_process_group_ranks(g)}
    user_dp = {r: g for g in (tdist.new_group([0, 1]), tdist.new_group([2, 3])) for r in tdist.get_process_group_ranks(g)}
    torch.manual_seed(0)
    model = Tiny()
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "steps_per_print": 10**9,
              "zero_optimization": {"stage": 0},
              "tensor_parallel": {"partition_config": {"use_default_specs": False, "layer_specs": [
                  {"patterns": [r"lm_head\.weight$"], "partition_type": "column", "gather_output": True}]}}}
    mpu = None
    if how == "tp_model_init(tp_group=)":
        deepspeed.tp_model_init(model, tp_size=TP, dtype=torch.float32, tp_group=user_tp[rank])
    else:
        config["tensor_parallel"]["autotp_size"] = TP
        mpu = UserMpu(rank, user_tp[rank], user_dp[rank])
    out = {"user": tdist.get_process_group_ranks(user_tp[rank])}
    try:
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), mpu=mpu,
                                          optimizer=lambda p: torch.optim.SGD(p, lr=0.05), config=config)
    except Exception as exc:
        out["initialize"] = f"{type(exc).__name__}: {exc}"
        result[rank] = out
        return
    out["head"] = tdist.get_process_group_ranks(engine.module.lm_head.mp_group)
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(rank % 2))  # one batch per DP index
    try:
        engine.backward(engine(ids))
        out["forward"] = "ok"
    except Exception as exc:
        out["forward"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:110]}"
    result[rank] = out


if __name__ == "__main__":
    wrong = False
    for how in ("tp_model_init(tp_group=)", "initialize(mpu=)"):
        print(how)
        for rank, out in sorted(run_ranks(rank_main, WORLD, how, env={"DS_ACCELERATOR": "cpu"}, init=False).items()):
            print(f"  rank {rank}: user's TP group {out['user']}; " + (
                f"initialize raised {out['initialize'][:90]}" if "initialize" in out else
                f"head sharded over {out['head']}; first forward: {out['forward']}"))
            wrong |= "initialize" in out or out["head"] != out["user"]
    print("MISMATCH: the user's TP group is not the one DeepSpeed uses" if wrong else "the user's groups are used")
    sys.exit(1 if wrong else 0)
