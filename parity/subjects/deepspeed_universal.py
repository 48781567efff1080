"""DeepSpeed 0.19.8's universal checkpoint for an AutoTP-sharded head, the user's path end to end: train, save,
convert, resume at the case's tp x dp, train on (docs/subjects.md#universal-checkpoint)."""
from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile

import torch

from parity.observe.dtypes import DTYPES
from parity.observe.observations import RankObservations
from parity.subjects.deepspeed_autotp import (ColumnGatheredHead, EngineUpdate, VocabParallelHead, install_tp_groups,
                                              rank_decisions, reset_deepspeed_state, setup_deepspeed)
from parity.subjects.deepspeed_row import RowParallelHead
import parity.subjects.driver as driver  # the module, not the package: no import cycle
from parity.subjects.driver import attribute
from references.adamw_trajectory import adamw, train_adamw_reference
from references.trajectory import step_num_items

# The axes a resume case varies: the head's usual ones less those the AdamW reference or the resume loop has no
# model of (clipping, switches, save/process/model_init variants).
RESUME_AXES = {"dtype": None, "reduction": None, "vocab": None, "hidden": None, "bias": None, "zero": (1, 2),
               "gas": None, "save_tp": None, "tp": None, "dp": None, "optimizer": None, "device": None}
SAVED_AFTER = 2  # steps trained before the checkpoint; the resumed engine trains the rest
# What a checkpoint restores per parameter beside the model weight: the float32 master, and the optimizer's moments.
STATES = {"adamw": ("fp32", "exp_avg", "exp_avg_sq"), "sgd": ("fp32",)}


def optimizer_state(engine, params: dict, states: tuple) -> dict:
    """This rank's TP-local copy of what a checkpoint holds per parameter (weight, master, ``states``), through
    DeepSpeed's own safe_get_full_* API."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    def plain(t):
        return None if t is None else t.detach().to("cpu", torch.float64).numpy().copy()

    found = {}
    for name, p in params.items():
        found[name] = {"weight": plain(p), "fp32": plain(safe_get_full_fp32_param(p))}
        for state in states:
            if state != "fp32":
                found[name][state] = plain(safe_get_full_optimizer_state(p, state))
    return found


def convert_to_universal(checkpoint_dir: str, output_dir: str) -> None:
    """ds_to_universal as its CLI runs it, in this process, with one worker each
    (docs/subjects.md#universal-checkpoint)."""
    from deepspeed.checkpoint import ds_to_universal

    argv = ["ds_to_universal", "--input_folder", checkpoint_dir, "--output_folder", output_dir,
            "--num_extract_workers", "1", "--num_merge_workers", "1"]
    saved_argv, sys.argv = sys.argv, argv
    try:
        ds_to_universal.main(ds_to_universal.parse_arguments())
    finally:
        sys.argv = saved_argv


def shared_directory(rank: int) -> str:
    """One checkpoint folder for the whole rank group (global rank 0 makes it; the group shares one file system)."""
    import torch.distributed as dist

    box = [tempfile.mkdtemp(prefix="parity_uc_") if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class UniversalResume:
    """Mixin over an engine head: the head's config and claims, a save / convert / resume loop of its own."""

    def invalid(self, values):
        world = values["tp"] * values["dp"]
        if world % values["save_tp"]:
            return f"save_tp {values['save_tp']} does not divide the world {world} (tp x dp of the resume)"
        if (values["dp"] * values["gas"]) % (world // values["save_tp"]):
            return "the resumed run's micro-batches of a step do not split evenly over the save layout's DP ranks"
        return None

    def world_size(self, values):
        return values["tp"] * values["dp"]

    # The engine head's methods read its own axes, which a resume case does not vary: they see them at their defaults.
    def tensor_parallel_config(self, values):
        return super().tensor_parallel_config(self.head_values(values))

    def requires(self, values):
        return super().requires(self.head_values(values))

    def model_spec(self, values):
        return super().model_spec(self.head_values(values))

    def unavailable_reason(self, values):
        return super().unavailable_reason(self.head_values(values))

    def claims(self, values):
        base = super().claims(self.head_values(values))
        modules = dict(base.module_types)
        if values["tp"] == 1:  # autotp_size 1: AutoTP leaves the model as it is
            modules = {path: ("Linear" if path == self.head_values(values)["head"] else cls)
                       for path, cls in modules.items() if path != "loss_function"}
        return dataclasses.replace(base, module_types=modules, micro_records={}, loss_backend=None,
                                   reports_grad_norm=False)

    def decided(self, values):
        # ZeRO 1/2's optimizer: the one whose checkpoint ds_to_universal converts (its param_slice_mappings).
        return {**super().decided(self.head_values(values)), "optimizer": "DeepSpeedZeroOptimizer"}

    def records_master_weights(self, values):
        return False  # the resumed masters are held bitwise to the saved ones (parity/checks/resume.py)

    def reference(self, values, compute_dtype=None):
        if values["optimizer"] == "sgd":
            return super().reference(values, compute_dtype)
        return train_adamw_reference(self.model_spec(values), self.training_spec(values), DTYPES[values["dtype"]],
                                     compute_dtype)

    def reference_key(self, values):
        if values["optimizer"] == "sgd":
            return ("train_reference", self.model_spec(values), self.training_spec(values), values["dtype"])
        return ("train_adamw_reference", self.model_spec(values), self.training_spec(values), values["dtype"])

    def head_values(self, values):
        """The engine head's own axes a resume case does not vary, at the registry's defaults, for its ds_config
        and claims."""
        return values.widened("head", "backend", "grain", "ignore_index")

    def engine(self, values, train, model, load_universal: bool):
        import deepspeed

        config = self.ds_config(self.head_values(values), train)
        if load_universal:
            config["checkpoint"] = {"load_universal": True}
        optimizer = {"adamw": lambda p: adamw(p, train.lr),
                     "sgd": lambda p: torch.optim.SGD(p, lr=train.lr)}[values["optimizer"]]
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), optimizer=optimizer,
                                          config=config)
        return engine

    def train_steps(self, engine, values, train, steps, dp_rank, dp_size, obs=None):
        """Steps of the reference's data, in contiguous equal chunks of its global batch for this layout's DP size;
        ``obs``: where losses and weights go (None: the saving run) (docs/subjects.md#universal-checkpoint)."""
        spec = self.model_spec(values)
        chunk = values["dp"] * train.micro_batches // dp_size

        def batches(step):
            flat = [b for d in range(values["dp"]) for b in train.batches(step, d, spec.vocab, spec.ignore_index)]
            return ([{k: t.to(engine.device) for k, t in b.items()} for b in flat[dp_rank * chunk:(dp_rank + 1) * chunk]],
                    step_num_items(train, step, spec.vocab, spec.ignore_index))

        scratch = RankObservations(-1, -1, -1) if obs is None else obs
        driver.train(driver.Run(scratch, dataclasses.replace(train, dp=dp_size, micro_batches=chunk),
                                lambda batch, n: self.forward(engine, batch, n, spec),
                                EngineUpdate(engine, dict(engine.module.named_parameters()), values, masters=False,
                                             records=False), batches,
                                spec.reduction, output_kind=None, steps=steps, captured=None,
                                outputs_after_backward=False))

    def run_rank(self, values, ctx):
        import torch.distributed as dist

        setup_deepspeed(ctx)
        spec, train = self.model_spec(values), self.training_spec(values)
        dtype = DTYPES[values["dtype"]]
        world, save_tp, tp = ctx.world_size, values["save_tp"], values["tp"]
        tp_rank, dp_rank = ctx.tp_dp(tp)
        obs = RankObservations(ctx.rank, tp_rank, dp_rank)
        directory = shared_directory(ctx.rank)
        try:
            # The run that saves: the save layout, its own ds_config (its DP size sets the micro-batch split).
            install_tp_groups(ctx, save_tp)
            save_tp_rank, save_dp_rank = ctx.tp_dp(save_tp)
            save_dp = world // save_tp
            save_train = dataclasses.replace(train, dp=save_dp, micro_batches=values["dp"] * train.micro_batches // save_dp)
            model = self.build(values, dtype).to(ctx.device)
            engine = self.engine(values.replace(tp=save_tp, dp=save_dp), save_train, model, load_universal=False)
            try:
                self.train_steps(engine, values, train, range(SAVED_AFTER), save_dp_rank, save_dp)
                obs.facts["checkpointed"] = {"tp_rank": save_tp_rank, "dp_rank": save_dp_rank,
                                             "state": optimizer_state(engine, dict(model.named_parameters()),
                                                                      STATES[values["optimizer"]])}
                engine.save_checkpoint(directory, tag=f"global_step{SAVED_AFTER}")
            finally:
                engine.destroy()
            dist.barrier()
            if ctx.rank == 0:
                convert_to_universal(os.path.join(directory, f"global_step{SAVED_AFTER}"),
                                     os.path.join(directory, f"global_step{SAVED_AFTER}_universal"))
            dist.barrier()
            # The resumed run: a fresh process state, as a new job has, then the case's layout.
            reset_deepspeed_state()
            install_tp_groups(ctx, tp)
            model = self.build(values, dtype).to(ctx.device)
            engine = self.engine(values, train, model, load_universal=True)
            try:
                head = attribute(model, self.head_values(values)["head"])
                obs.facts["rank_decisions"] = rank_decisions(engine, head)
                params = dict(model.named_parameters())
                for name, p in params.items():
                    obs.record("weight", -1, None, name, p)  # the user's model as built, before the load
                engine.load_checkpoint(directory)
                # What the resumed engine holds once loaded, as a user checks it: the claimed modules and each
                # parameter's TP-local shape (structure[...], parity/checks/compare.py check_structure).
                driver.record_structure(obs, model, self.claims(values))
                obs.facts["structure"]["params"] = {name: driver.param_structure(p) for name, p in params.items()}
                # AdamW's own step count (its bias correction) on every flat partition the torch optimizer steps.
                steps = sorted({float(st["step"]) for st in engine.optimizer.optimizer.state.values() if "step" in st})
                obs.facts["resumed"] = {"global_steps": int(engine.global_steps), "optimizer_steps": steps,
                                        "state": optimizer_state(engine, params, STATES[values["optimizer"]])}
                for name, p in params.items():  # the weights the resumed run starts from: the saved step's
                    obs.record("weight", SAVED_AFTER - 1, None, name, p)
                self.train_steps(engine, values, train, range(SAVED_AFTER, train.steps), dp_rank, values["dp"],
                                 obs)
            finally:
                engine.destroy()
        finally:
            dist.barrier()
            if ctx.rank == 0:
                shutil.rmtree(directory, ignore_errors=True)
        return obs


class UniversalColumnGathered(UniversalResume, ColumnGatheredHead):
    name = "uc_column_gathered"
    feature = None
    description = ("column_gathered's head trained at save_tp, saved, converted by ds_to_universal and resumed "
                   "with checkpoint.load_universal at tp x dp; AdamW")
    axes = RESUME_AXES


class UniversalVocabParallel(UniversalResume, VocabParallelHead):
    name = "uc_vocab_parallel"
    feature = None
    description = "as uc_column_gathered, the vocabulary-parallel head (VocabParallelLinear + its CE)"
    # The reductions its CE hook serves (vocab_parallel); head "output": a head only through lm_head_patterns, whose
    # name AutoTP's universal-checkpoint metadata does not take for a vocabulary parameter ('embed'/'lm_head' in it).
    axes = {**RESUME_AXES, "reduction": ("mean", "num_items"), "head": ("lm_head", "output")}


class UniversalRowParallel(UniversalResume, RowParallelHead):
    name = "uc_row_parallel"
    feature = None
    description = "as uc_column_gathered, the row-parallel head (LinearAllreduceWithReplicatedInput)"
    axes = RESUME_AXES
