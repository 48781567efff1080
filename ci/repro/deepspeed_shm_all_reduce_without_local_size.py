"""DeepSpeed 0.19.8 on CPU: `init_inference` with tensor parallelism dies of SIGSEGV in its first forward when
the ranks were started by torchrun (or any launcher but DeepSpeed's own).

On CPU, `deepspeed.init_distributed` JIT-builds the shm all-reduce op (comm/torch.py `build_shm_op`) and calls its
`initialize(world_size, rank)`. That sets up the shared-memory workspace only when the environment variable
LOCAL_SIZE equals the world size (ops/csrc/cpu/comm/shm_interface.cpp); DeepSpeed's launcher exports it
(launcher/launch.py), torchrun exports LOCAL_WORLD_SIZE instead. `inference_all_reduce` then takes the op for
every fp32 tensor on an AVX2 CPU whether or not the workspace exists (comm/torch.py: it checks only that the op
is registered and the ISA level), and the op's reduce dereferences the missing workspace. The user's TP
inference head (LmHeadLinearAllreduce) is the first caller. With LOCAL_SIZE set the same model gives the plain
model's logits.

Run (CPU, about 1 min; the first run also JIT-builds the op, 35-100 s): python ci/repro/deepspeed_shm_all_reduce_without_local_size.py
Exit status 1 while the run without LOCAL_SIZE dies (or gives wrong logits), 0 once it gives the plain logits
or refuses with an error.

Finding: findings/deepspeed_shm_all_reduce_without_local_size.toml
"""
import copy
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, HIDDEN = 2, 34, 32


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(VOCAB, HIDDEN)
        self.proj = torch.nn.Linear(HIDDEN, HIDDEN)
        self.lm_head = torch.nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids):
        return self.lm_head(torch.tanh(self.proj(self.embed_tokens(ids))))


def rank_main(rank, result):
    import deepspeed
    from deepspeed.comm import comm as ds_comm

    deepspeed.init_distributed(dist_backend="gloo")  # builds and initialises the shm op, as users get it
    torch.manual_seed(0)
    plain = TinyLM()
    # The documented user-policy path (no ModuleList of blocks for the automatic parser): proj stays whole,
    # set_lm_head shards lm_head as LmHeadLinearAllreduce.
    engine = deepspeed.init_inference(copy.deepcopy(plain), tensor_parallel={"tp_size": TP}, dtype=torch.float32,
                                      replace_with_kernel_inject=False, injection_policy={TinyLM: ("proj",)})
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))
    result[f"rank {rank} before the forward"] = (f"head {type(engine.module.lm_head).__name__}, shm op "
                                                  f"{'built' if ds_comm.cdb.shm_comm_op else 'not built'}, "
                                                  f"kernel level {getattr(ds_comm.cdb, 'shm_vector_kernel_level', 0)}")
    with torch.no_grad():
        err = float((engine(ids) - plain(ids)).abs().max())
    result[f"rank {rank} max |logits - plain|"] = err


def run(env):
    try:
        return run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu", **env}, init=False, timeout=900)
    except Exception as exc:  # a rank killed by a signal ends the spawn with ProcessExitedException
        return {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1]}"}


if __name__ == "__main__":
    os.environ.pop("LOCAL_SIZE", None)
    outcomes = {"LOCAL_SIZE=2 (DeepSpeed's launcher)": run({"LOCAL_SIZE": str(TP)}),
                "LOCAL_SIZE unset (torchrun)": run({})}
    for how, result in outcomes.items():
        for key, value in sorted(result.items()):
            print(f"{how}: {key}: {value}")
    torchrun = outcomes["LOCAL_SIZE unset (torchrun)"]
    right = "error" not in torchrun and all(v < 1e-5 for k, v in torchrun.items() if k.endswith("plain|"))
    print("logits right without LOCAL_SIZE" if right else
          "WRONG: without LOCAL_SIZE init_inference is accepted and the first forward dies in the shm all-reduce")
    sys.exit(0 if right else 1)
