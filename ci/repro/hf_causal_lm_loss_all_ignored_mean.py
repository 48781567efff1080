"""transformers 5.24 ForCausalLMLoss: a mean loss over a micro-batch whose labels are all ignored is nan.

An HF causal LM computes its own loss when given labels (`fixed_cross_entropy`: F.cross_entropy with
reduction "mean" unless the trainer passes num_items_in_batch). Over labels that are all -100 that is
0 / 0 = nan, unsharded, exactly as plain torch's cross_entropy; DeepSpeed's AutoTP running the model's
HF tp_plan (cases/hf_tp_plan.toml, `hf_plan_column` / `hf_plan_row`) returns the same nan, since the
loss is the model's own. DeepSpeed's vocab-parallel CE and the suite's reference define that loss as 0.
The gradient of the nan loss is zero (finite): training is unaffected unless the loss is logged,
summed or used for a decision. A cross-framework semantic difference, kept visible as a known
divergence (found by `parity explore`).

Run (CPU, one process, a few seconds):  python ci/repro/hf_causal_lm_loss_all_ignored_mean.py
Exit status 1 while the unsharded HF loss is nan for an all-ignored mean, 0 once it is finite.
"""
import math
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

torch.manual_seed(0)
config = LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                     num_key_value_heads=2, attn_implementation="eager")
model = LlamaForCausalLM(config)
input_ids = torch.randint(0, 16, (2, 6))
labels = torch.full((2, 6), -100)
loss = model(input_ids=input_ids, labels=labels).loss
loss.backward()
finite = all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
print(f"HF LlamaForCausalLM (unsharded), labels all -100, mean loss: {loss.item()} (gradient finite: {finite})")
partly = labels.clone()
partly[0, 3] = 5
print(f"the same with one label kept: {float(model(input_ids=input_ids, labels=partly).loss.detach()):.4f}")
print("DeepSpeed vocab_parallel_cross_entropy / the suite's reference, all ignored: 0.0")
sys.exit(1 if math.isnan(loss.item()) else 0)
