"""DeepSpeed 0.19.8: a TP group handed to init_inference never reaches the output head.

World 4, TP 2, the user's TP groups {0,2} and {1,3} (each TP group runs its own batch); the custom model takes the
user-policy path (injection_policy), whose head set_lm_head shards as LmHeadLinearAllreduce. The group can be
handed over two documented ways (inference/config.py:46,52):

- `tensor_parallel={"tp_size": 2, "tp_group": g}`: the group is read into engine.mp_group (inference/engine.py:83)
  and replaced, because tp_size > 1 sends the engine to _create_model_parallel_group (engine.py:116-118), which
  makes new_group(range(tp_size)) = {0, 1} (or reuses a group a first engine cached on the class, engine.py:280-289).
  Ranks 2 and 3 are no members of it and raise in AutoTP ("AutoTP shard sizes [] for layer 'lm_head' do not sum to
  the dimension size 32 with tp_size=-1"); ranks 0 and 1 then wait in init_inference's RNG broadcast
  (engine.py:179-182) until killed, or fail when their peers' connections close.
- `tensor_parallel={"mpu": user_mpu}`: tp_size is taken from the mpu's group and engine.mp_group is set
  (engine.py:113-115), but config.tensor_parallel.tp_group stays None, and AutoTP reads the config's
  (replace_module.py:316): lm_head becomes an LmHeadLinearAllreduce with no group, the whole [34, 32] weight on every
  rank, no all-reduce, without a warning. The logits are right; memory and compute are not split.

Run (CPU, 4 processes over gloo, each route launched on its own; 3-5 min, the hung route is killed after 150 s):
python ci/repro/deepspeed_inference_user_tp_group_ignored.py
Exit status 1 while a rank's head is not sharded over the user's group ([34, 16] over {0,2} or {1,3}) with the
unsharded model's logits.

Finding: findings/deepspeed_inference_tp_group.toml
"""
import copy
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
        self.proj = nn.Linear(HIDDEN, HIDDEN)
        self.lm_head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids):
        return self.lm_head(torch.tanh(self.proj(self.embed_tokens(ids))))


class UserMpu:
    """Megatron-style mpu over the user's layout: TP groups {0,2},{1,3}, DP groups {0,1},{2,3}."""

    def __init__(self, rank, tp_group, dp_group):
        self.rank, self.tp_group, self.dp_group = rank, tp_group, dp_group

    def get_model_parallel_group(self): return self.tp_group
    def get_model_parallel_world_size(self): return TP
    def get_model_parallel_rank(self): return self.rank // 2
    def get_data_parallel_group(self): return self.dp_group
    def get_data_parallel_world_size(self): return WORLD // TP
    def get_data_parallel_rank(self): return self.rank % 2


def rank_main(rank, result, route):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed
    import torch.distributed as dist

    deepspeed.init_distributed(dist_backend="gloo")
    tp_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    dp_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    tp_group, dp_group = tp_groups[rank % 2], dp_groups[rank // 2]
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(rank % 2))  # one batch per TP group
    torch.manual_seed(0)
    model = Tiny()
    plain = copy.deepcopy(model)
    tensor_parallel = ({"tp_size": TP, "tp_group": tp_group} if route == "tp_group"
                       else {"mpu": UserMpu(rank, tp_group, dp_group)})
    result[rank] = "stopped inside init_inference"

    def say(outcome):  # printed too: a route that hangs is killed with its result dict
        result[rank] = outcome
        print(f"{route}, rank {rank}: {outcome}", flush=True)

    try:
        engine = deepspeed.init_inference(model, tensor_parallel=tensor_parallel, dtype=torch.float32,
                                          replace_with_kernel_inject=False, injection_policy={Tiny: ("proj",)})
    except Exception as exc:  # a crash is part of what the user gets
        say(f"init_inference raised {type(exc).__name__}: {str(exc).splitlines()[0][:150]}")
        return
    head = engine.module.lm_head
    if head.mp_group is None:  # no group: the head reduces nothing
        members = "no group"
    else:
        members = dist.get_process_group_ranks(head.mp_group) if dist.get_rank(head.mp_group) >= 0 else "not a member"
    shape = list(head.weight.shape)
    result[rank] = f"{type(head).__name__} over {members}, weight {shape}; stopped inside the forward"
    with torch.no_grad():
        error = float((engine(ids) - plain(ids)).abs().max())
    say(f"{type(head).__name__} over {members}, weight {shape}; logits differ from plain by {error:.3g}")


if __name__ == "__main__":
    wrong = False
    for route in ("tp_group", "mpu"):
        try:
            result = run_ranks(rank_main, WORLD, route, env={"DS_ACCELERATOR": "cpu"}, timeout=150)
            hung = ""
        except TimeoutError as exc:  # the ranks' last words are lost with them: say where they were
            result, hung = {}, str(exc)
        if hung:
            print(f"{route}: {hung} (hung)")
            wrong = True
            continue
        for rank, outcome in sorted(result.items()):
            want = f"over {[0, 2] if rank % 2 == 0 else [1, 3]}, weight {[VOCAB, HIDDEN // TP]}; logits differ from plain by 0"
            ok = want in outcome
            wrong |= not ok
            print(f"{route}, rank {rank}: {outcome}" + ("" if ok else f"  <- the user's TP group is "
                                                         f"{[0, 2] if rank % 2 == 0 else [1, 3]}"))
    print("WRONG: a rank's head is not sharded over the user's group" if wrong else "the user's groups are used")
    sys.exit(1 if wrong else 0)
