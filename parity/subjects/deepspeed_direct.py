"""DeepSpeed 0.19.8 AutoTP output heads built directly (no engine), so that a failure can be localised to the
layer or to the engine around it (docs/subjects.md#direct-heads)."""
from __future__ import annotations

from parity.observe.observations import RankObservations
import parity.subjects.driver as driver  # the module, not the package: no import cycle
from parity.subjects.base import NAMED_HEADS, RankContext, head_claims
from parity.subjects.driver import record_structure
from parity.subjects.plain_sgd import PlainSGDHead
from parity.subjects.deepspeed_autotp import (DeepSpeedSubject, backend_per_micro, install_tp_groups, record_loss_backend,
                                              setup_deepspeed)
from parity.observe.dtypes import DTYPES
from references.tiny_lm import build_model, capture_head_input_and_grad

DIRECT_AXES = {"dtype": ("fp32", "bf16"), "reduction": None, "vocab": None, "hidden": None, "bias": None,
               "head": NAMED_HEADS, "ignore": None, "gas": None, "tp": None, "device": None}


class DirectHead(PlainSGDHead, DeepSpeedSubject):
    """Builds the layer around the tiny LM's head; the driver trains it with plain SGD."""
    axes = DIRECT_AXES
    layer_class = ""

    def build_head(self, head, group, values):
        raise NotImplementedError

    def install_loss(self, model, layer, group) -> bool:
        """Returns whether DeepSpeed's CE is the loss (then the backend that ran is recorded)."""
        return False

    def run_rank(self, values: dict, ctx: RankContext) -> RankObservations:
        from deepspeed.module_inject.layers import set_autotp_mode
        from deepspeed.utils import groups

        setup_deepspeed(ctx)
        tp = values["tp"]
        install_tp_groups(ctx, tp)
        tp_rank, dp_rank = ctx.tp_dp(tp)
        spec, train = self.model_spec(values), self.training_spec(values)
        dtype = DTYPES[values["dtype"]]
        model = build_model(spec, train.seed, dtype).to(ctx.device)  # a fresh model per case: nothing to copy
        set_autotp_mode(training=True)
        group = groups.get_tensor_model_parallel_group()
        layer = self.build_head(model.head, group, values)
        model.replace_head(layer)
        ds_loss = self.install_loss(model, layer, group)

        obs = RankObservations(ctx.rank, tp_rank, dp_rank)
        record_structure(obs, model, self.claims(values))
        captured: dict = {}
        capture_head_input_and_grad(model, captured)
        backend_log: list = []
        backends: dict = {}
        with record_loss_backend(backend_log):
            driver.train(driver.Run(obs, train, lambda batch, n: model(**batch, num_items_in_batch=n),
                                    driver.PlainUpdate.sgd(model, dtype, train.lr),
                                    driver.lm_batches(train, spec, dp_rank, ctx.device), spec.reduction,
                                    captured=captured, micro_context=backend_per_micro(backend_log, backends)))
        if ds_loss:
            obs.facts["loss_backend"] = backends
        return obs


class DirectColumnGatheredHead(DirectHead):
    name = "direct_column_gathered"
    feature = "column head (gathered logits)"
    description = ("LinearLayer(gather_output=True) built directly around the head (no engine): column-parallel "
                   "weight and bias, full-vocabulary logits, the suite's CE on top; plain SGD.")

    def build_head(self, head, group, values):
        from deepspeed.module_inject.layers import LinearLayer

        return LinearLayer(head, group, gather_output=True, name=values["head"])

    def claims(self, values):
        return head_claims(values["head"], "LinearLayer", 0)


class DirectVocabParallelHead(DirectHead):
    name = "direct_vocab_parallel"
    feature = "vocab-parallel head + CE"
    description = ("VocabParallelLinear + VocabParallelCausalLMLoss (torch backend) built directly (no engine): "
                   "rank-local logits, the distributed CE as model.loss_function; plain SGD.")
    # VocabParallelCausalLMLoss reduces to mean, or to sum / num_items_in_batch when given one.
    axes = {**DIRECT_AXES, "reduction": ("mean", "num_items")}

    def build_head(self, head, group, values):
        from deepspeed.module_inject.layers import VocabParallelLinear

        return VocabParallelLinear(head, group, name=values["head"])

    def install_loss(self, model, layer, group):
        from deepspeed.sequence.cross_entropy import VocabParallelCausalLMLoss

        model.loss_function = VocabParallelCausalLMLoss(tp_group=layer.mp_group,
                                                        vocab_start_index=layer.vocab_start_index,
                                                        vocab_end_index=layer.vocab_end_index,
                                                        ignore_index=model.spec.ignore_index, backend="torch")
        return True

    def claims(self, values):
        return head_claims(values["head"], "VocabParallelLinear", 0, vocab_loss=True, loss_backend="torch")


class DirectRowParallelHead(DirectHead):
    name = "direct_row_parallel"
    feature = "row head"
    description = ("LinearAllreduceWithReplicatedInput built directly around the head (no engine): weight sharded "
                   "along hidden, bias replicated, full logits after the all-reduce, the suite's CE; plain SGD.")

    def build_head(self, head, group, values):
        from deepspeed.module_inject.layers import LinearAllreduceWithReplicatedInput

        return LinearAllreduceWithReplicatedInput(head, group, name=values["head"])

    def claims(self, values):
        return head_claims(values["head"], "LinearAllreduceWithReplicatedInput", 1, None)
