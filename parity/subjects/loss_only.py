"""What the loss-only subjects share: one forward and backward of a CE on the vocabulary block of seeded
logits the suite's formula gives each rank (docs/subjects.md#loss-only-subjects)."""
from __future__ import annotations

from importlib.util import find_spec

from parity.observe import collectives
from parity.observe.observations import RankObservations
from parity.observe.partition import shard_slice
from parity.subjects.base import Claims, NoModel, RankContext, Subject, case_seed
from parity.subjects.loss_backward import differentiate
from parity.observe.dtypes import DTYPES
from references.cross_entropy import ce_inputs, ce_reference, sequence_chunk, upstream_objective
from references.trajectory import TrainingSpec

SEED, TOKENS, IGNORE_INDEX = 4321, 24, -100


def tp_group(ctx: RankContext, tp: int):
    """One process group per TP size, made once per process (new_group is collective and not free)."""
    import torch.distributed as dist

    groups = ctx.state.setdefault("plain_tp_groups", {})
    if tp not in groups:
        made = [dist.new_group(list(range(start, start + tp))) for start in range(0, ctx.world_size, tp)]
        groups[tp] = made[ctx.rank // tp]
    return groups[tp]


def sp_group(ctx: RankContext, tp: int, sp: int):
    """This rank's sequence-parallel group: its TP rank's ranks in every TP group (rank // tp is its SP rank)."""
    import torch.distributed as dist

    groups = ctx.state.setdefault("plain_sp_groups", {})
    if (tp, sp) not in groups:
        made = [dist.new_group([tp_rank + tp * k for k in range(sp)]) for tp_rank in range(tp)]
        groups[(tp, sp)] = made[ctx.rank % tp]
    return groups[(tp, sp)]


def record_call(obs: RankObservations, counts: dict, **records) -> RankObservations:
    """One call on seeded tensors into ``obs``: the collectives it issued and each record (kind -> tensor; None:
    not recorded), at step 0, micro-batch 0, in the order given."""
    obs.facts["collectives"] = {(0, 0): dict(counts)}
    for kind, tensor in records.items():
        if tensor is not None:
            obs.record(kind, 0, 0, None, tensor)
    return obs


class LogitsCE(NoModel, Subject):
    """A CE applied to this rank's block of seeded logits; subclasses say which (``loss``); ``measure``: what the
    reference computes ("ce", or "entropy", which takes no target)."""
    framework = "deepspeed"
    measure = "ce"

    def claims(self, values):
        records = {"loss": None, "logits_grad": -1, "logits_after": -1}
        if values.optional("backward", "once") == "create_graph":
            records["logits_hvp"] = -1  # the Hessian-vector product, sharded like the logits
        return Claims(module_types={}, param_shards={}, micro_records=records, exact_records=("logits_after",))

    def training_spec(self, values):
        return TrainingSpec(seed=case_seed(SEED, values), steps=1, micro_batches=1,
                            ignore=values.optional("ignore", "none"))

    def reference(self, values, compute_dtype=None):
        return ce_reference(case_seed(SEED, values), TOKENS, values["vocab"], values.optional("ignore", "none"),
                            DTYPES[values["dtype"]], compute_dtype,
                            self.ignore_index(values), reduction=values.optional("reduction", "none"),
                            backward=values.optional("backward", "once"), measure=self.measure,
                            label_smoothing=values.optional("label_smoothing", 0.0),
                            sequence_parts=values.optional("sp", 1),
                            uneven_chunks=values.optional("sp_chunks", "equal") == "uneven",
                            gathered=values.optional("seq_gather", False),
                            inf_rows=values.optional("inf_rows", "none"))

    def invalid(self, values):
        sp = values.optional("sp", 1)
        if sp > 1 and TOKENS % sp:
            return f"sp {sp} does not split the {TOKENS} tokens into equal chunks"
        if sp > 1 and values.optional("backward", "once") != "once":
            return "sp > 1 takes backward 'once' only"
        if values.optional("seq_gather", False) and (sp == 1 or values.optional("reduction", "none") != "none"):
            return "seq_gather needs sp > 1 and reduction 'none' (gather_sequence_loss gathers per-token losses)"
        if values.optional("sp_chunks", "equal") == "uneven" and (sp == 1 or values.optional("seq_gather", False)):
            # DeepSpeed's gather all-gathers equal chunks and checks nothing: on gloo unequal ones abort a rank
            # (SIGABRT, gloo::EnforceNotMet, docs/inventory.md sp_group row), which would take a pooled rank along.
            return "sp_chunks uneven needs sp > 1 and no seq_gather (the sequence gather takes equal chunks only)"
        if values.optional("inf_rows", "none") == "masked":
            return "inf_rows masked is ds_vocab_kl's (some ids -inf in a student and teacher pair)"
        if values.optional("targets", "valid") == "minus100" and self.ignore_index(values) == -100:
            return "targets minus100 needs another ignore_index (-100 would be an ignored target, not a stray one)"
        return None

    def ignore_index(self, values) -> int:
        """The target id this case ignores: the ``ignore_index`` axis where a subject declares it, else -100."""
        return values.optional("ignore_index", IGNORE_INDEX)

    def loss(self, values, ctx, local, targets, group, part, obs):
        """The subject's CE on this rank's logits block; may note facts in ``obs`` (the backend that ran)."""
        raise NotImplementedError

    def block(self, vocab: int, tp: int, tp_rank: int) -> slice:
        """The vocabulary columns this rank holds."""
        return shard_slice(vocab, tp, tp_rank)

    def run_rank(self, values, ctx):
        tp, vocab = values["tp"], values["vocab"]
        group = tp_group(ctx, tp)
        tp_rank, dp_rank = ctx.tp_dp(tp)
        part = self.block(vocab, tp, tp_rank)
        seed = case_seed(SEED, values)
        logits, targets, upstream = ce_inputs(seed, TOKENS, vocab, values.optional("ignore", "none"),
                                              DTYPES[values["dtype"]], self.ignore_index(values),
                                              values.optional("inf_rows", "none"))
        if values.optional("targets", "valid") == "out_of_range":
            targets[2] = vocab  # one past the last row: no shard owns it
        elif values.optional("targets", "valid") == "minus100":
            targets[2] = -100  # HF's ignore id, an ordinary target once another id is ignored
        # Sequence parallelism: this rank holds its chunk of the rows (dp_rank is its SP rank); a gathered
        # per-token loss is the whole sequence's, so the user weights it with the whole upstream.
        rows = sequence_chunk(TOKENS, values.optional("sp", 1), dp_rank,
                              uneven=values.optional("sp_chunks", "equal") == "uneven")
        logits, targets = logits[rows], targets[rows]
        if not values.optional("seq_gather", False):
            upstream = upstream[rows]
        local = logits[:, part].to(ctx.device).contiguous().requires_grad_(True)
        obs = RankObservations(ctx.rank, tp_rank, dp_rank)
        with collectives.recording() as counts:
            loss = self.loss(values, ctx, local, targets.to(ctx.device), group, part, obs)
            objective = upstream_objective(loss, upstream.to(ctx.device), values.optional("reduction", "none"))
            grad, hvp = differentiate(objective, local, values.optional("backward", "once"), seed, vocab, part)
        return record_call(obs, counts, loss=loss, logits_grad=grad, logits_hvp=hvp, logits_after=local.detach())


class LigerShards:
    """Liger assumes equal vocabulary shards (vocab_start = rank * local_vocab) and needs the package."""

    def markers(self, values):
        return super().markers(values) + ["liger"]

    def requires(self, values):
        # On CPU Liger's kernels run in Triton's interpreter (the rank worker sets TRITON_INTERPRET=1).
        cpu = values["device"] == "cpu"
        return super().requires(values) + (["triton_interpreter"] if cpu else [])

    def needs_equal_shards(self, values) -> bool:
        """False where something else (DeepSpeed's gate) decides whether Liger runs on this layout."""
        return True

    def unavailable_reason(self, values):
        if values["vocab"] % values["tp"] and self.needs_equal_shards(values):
            return "Liger assumes equal vocabulary shards; this vocabulary does not divide by tp"
        if find_spec("liger_kernel") is None:
            return "liger-kernel is not installed (pip install -e '.[liger]')"
        return super().unavailable_reason(values)
