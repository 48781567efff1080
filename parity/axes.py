"""The axes a case can vary, their allowed values, defaults and how each appears in a case id.

Ids are built from every axis a subject declares, in the subject's order, so adding a value to a
matrix never renames an existing case.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Axis:
    name: str
    values: tuple | None  # None: any integer >= minimum
    default: object
    label: Callable[[object], str]
    minimum: int = 1
    help: str = ""
    # Left out of case ids at its default, so adding such an axis renames no existing case.
    quiet_default: bool = False
    # A regular expression a string value may match besides ``values`` (names made at run time, as arch_config's)
    pattern: str = ""

    def allowed(self) -> str:
        if self.values is None:
            return f"an integer >= {self.minimum}"
        return ", ".join(map(repr, self.values)) + (f", or a string matching {self.pattern}" if self.pattern else "")

    def accepts(self, value) -> bool:
        if self.pattern and isinstance(value, str) and re.fullmatch(self.pattern, value):
            return True
        if self.values is not None:
            # bool is an int in Python: keep True from matching 1 and the reverse.
            return any(type(value) is type(v) and value == v for v in self.values)
        return type(value) is int and value >= self.minimum


# Axes every subject has without declaring them (parity.matrix.cases.subject_axes), appended after the
# subject's own in case-id order; quiet at their default, so no existing id changes.
UNIVERSAL_AXES = ("seed",)

# ds_reject's variants (parity/subjects/deepspeed_rejects.py builds each one); "none" is no rejection.
REJECTIONS = (
    "none",
    "tied_row_max_norm", "tied_row_sparse", "tied_vocab_max_norm", "tied_vocab_sparse", "tied_vocab_scale_grad",
    "row_tied_non_embedding", "hf_plan_unsupported_style", "hf_plan_colwise_head", "row_shape", "row_partition_dim0", "gather_shape",
    "vocab_empty_shard", "vocab_no_head", "liger_without_vocab_head", "tp_size_mismatch",
    "loss_function_missing", "loss_function_read_only", "loss_function_setter_ignored", "column_no_gather",
    "zero2_prescale", "zero2_predivide", "zero3_prescale", "zero0_bf16_fp32_accum",
    "strict_unmatched_proj", "strict_unmatched_head", "heuristic_unnamed_model", "heuristic_gpt2_family",
    "heuristic_gpt2_vocab_head", "preset_unknown_name", "preset_llama_gqa",
    "spec_key_gather_outputs", "spec_key_pattern",
    "vocab_two_heads", "vocab_nested_heads", "heuristic_two_heads", "hf_plan_two_heads",
    "user_tp_group_tp_model_init", "user_tp_group_config", "user_tp_group_mpu",
    "tp_model_init_size_conflict", "tp_model_init_dtype_conflict", "tp_model_init_dtype_unchecked",
    "compile_autotp_eager_column", "compile_autotp_row_head", "autocast_unknown_module", "autocast_zero_quantized_weights",
    "ce_bad_reduction", "ce_bad_backend", "ce_uneven_no_bounds", "ce_start_without_end", "ce_target_out_of_range",
    "ce_empty_shard", "ce_overlapping_bounds",
    "fused_bad_reduction", "fused_size_zero", "fused_start_without_end", "fused_target_out_of_range",
)


# Every causal-LM model_type of the installed transformers (5.24.0): references.zoo.architectures(), written out
# because importing transformers would cost `parity list` seconds (tests/subjects/test_zoo.py holds the two equal).
ARCHITECTURES = (
    'afmoe', 'apertus', 'apertus1p5_text', 'arcee', 'aria_text', 'axk1', 'axk2', 'bailing_hybrid', 'bamba',
    'bart', 'beam', 'bert', 'bert-generation', 'big_bird', 'bigbird_pegasus', 'biogpt', 'bitnet', 'blenderbot',
    'blenderbot-small', 'bloom', 'blt', 'camembert', 'codegen', 'cohere', 'cohere2', 'cohere2_moe',
    'cohere_compass_text', 'cpmant', 'ctrl', 'cwm', 'data2vec-text', 'dbrx', 'deepseek_v2', 'deepseek_v3',
    'deepseek_v32', 'deepseek_v4', 'diffllama', 'doge', 'dory', 'dots1', 'dots3_note', 'dots3_note_text',
    'electra', 'emu3', 'ernie', 'ernie4_5', 'ernie4_5_moe', 'exaone', 'exaone4', 'exaone_moe', 'falcon',
    'falcon_h1', 'falcon_mamba', 'flex_olmo', 'flint', 'fuyu', 'gemma', 'gemma2', 'gemma3', 'gemma3_text',
    'gemma3n', 'gemma3n_text', 'gemma4', 'gemma4_assistant', 'gemma4_text', 'gemma4_unified',
    'gemma4_unified_assistant', 'gemma4_unified_text', 'git', 'glm', 'glm4', 'glm4_moe', 'glm4_moe_lite',
    'glm_moe_dsa', 'got_ocr2', 'gpt-sw3', 'gpt2', 'gpt_bigcode', 'gpt_neo', 'gpt_neox', 'gpt_neox_japanese',
    'gpt_oss', 'gptj', 'granite', 'granite_swa', 'granitemoe', 'granitemoe_swa', 'granitemoehybrid',
    'granitemoeshared', 'helium', 'hrm_text', 'hunyuan_v1_dense', 'hunyuan_v1_moe', 'hy_v3', 'hy_v4',
    'hyperclovax', 'inkling2_loop_text', 'inkling2_text', 'inkling_text', 'internlm3', 'iquestcoder', 'jais2',
    'jamba', 'jetmoe', 'kimi_linear', 'kolibri1', 'laguna', 'lara_mini', 'lfm2', 'lfm2_moe', 'lfm3', 'llama',
    'llama4', 'llama4_text', 'longcat_flash', 'mamba', 'mamba2', 'marian', 'mbart', 'megatron-bert', 'mellum',
    'mimo_v2_flash', 'minicpm3', 'minimax', 'minimax_m2', 'minimax_m3_vl_text', 'ministral', 'ministral3',
    'mistral', 'mixtral', 'mllama', 'modernbert-decoder', 'moshi', 'moss_transcribe_diarize', 'mpt', 'musicgen',
    'musicgen_melody', 'mvp', 'nanochat', 'nemotron', 'nemotron_h', 'olmo', 'olmo2', 'olmo3', 'olmo_hybrid',
    'olmoe', 'openai-gpt', 'opt', 'pegasus', 'persimmon', 'phi', 'phi3', 'phi4_multimodal', 'phimoe', 'plbart',
    'prophetnet', 'qwen2', 'qwen2_moe', 'qwen3', 'qwen3_5', 'qwen3_5_moe', 'qwen3_5_moe_text', 'qwen3_5_text',
    'qwen3_moe', 'qwen3_next', 'qwen4_exp', 'qwen4_exp_text', 'recurrent_gemma', 'reformer', 'rembert', 'roberta',
    'roberta-prelayernorm', 'roc_bert', 'roformer', 'rwkv', 'sarvam_mla', 'sarvam_moe', 'seed_oss', 'smollm3',
    'solar_open', 'stablelm', 'starcoder2', 'trocr', 'vaultgemma', 'whisper', 'xglm', 'xlm', 'xlm-roberta',
    'xlm-roberta-xl', 'xlnet', 'xlstm', 'xmod', 'youtu', 'zamba', 'zamba2', 'zaya',
)


def _flag(true_label, false_label):
    return lambda v: true_label if v else false_label


AXES: dict[str, Axis] = {a.name: a for a in [
    Axis("backend", ("torch", "liger"), "torch", str, help="vocabulary-parallel CE backend requested"),
    Axis("dtype", ("fp32", "bf16", "fp16"), "fp32", str,
         help="model dtype; bf16/fp16 also enable DeepSpeed's bf16/fp16 optimizer (fp32 master weights)"),
    Axis("reduction", ("none", "sum", "mean", "num_items"), "mean", str,
         help="loss reduction; num_items = sum / non-ignored targets in the step (HF num_items_in_batch)"),
    Axis("vocab", None, 34, lambda v: f"v{v}"),
    Axis("hidden", None, 32, lambda v: f"h{v}"),
    Axis("tied", (False, True), False, _flag("tied", "untied"), help="head weight shared with the embedding"),
    Axis("bias", (True, False), True, _flag("bias", "nobias")),
    Axis("head", ("lm_head", "embed_out", "model.lm_head", "output", "layers.1.lm_head"), "lm_head",
         lambda v: v.replace(".", "_"),
         help="where the output head lives: lm_head, embed_out, nested as model.lm_head, or output (a name only "
              "partition_config.lm_head_patterns makes a head; vocab_parallel only), or layers.1.lm_head (registered "
              "in the last block of the ModuleList, as a per-block multi-token-prediction head; heuristic_blocks only)"),
    Axis("ignore", ("none", "scattered", "micro", "step"), "scattered", lambda v: f"ign_{v}",
         help="ignore_index pattern: none, scattered, + a whole micro-batch ignored, + a whole step ignored"),
    Axis("zero", (0, 1, 2, 3), 0, lambda v: f"zero{v}", minimum=0),
    Axis("gas", None, 2, lambda v: f"gas{v}", help="micro-batches accumulated per optimizer step"),
    Axis("tp", None, 2, lambda v: f"tp{v}"),
    Axis("grain", None, 1, lambda v: f"grain{v}", help="tensor_parallel.tp.tp_grain_size", quiet_default=True),
    Axis("clip", (0.0, 0.05, 1.0), 0.0, lambda v: "noclip" if v == 0 else f"clip{v:g}",
         help="gradient_clipping (max global grad norm); 0 = off", quiet_default=True),
    Axis("clip_key", ("set", "unset"), "set", lambda v: f"clipkey_{v}", quiet_default=True,
         help="column_gathered: gradient_clipping written in the config (the clip axis's value, 0 "
              "included), or left out, as a user who never asked for clipping writes it: DeepSpeed 0.19.8 then "
              "clips at its default 1.0 (runtime/constants.py), where the plain-torch reference (clip 0) does not"),
    Axis("dp", None, 1, lambda v: f"dp{v}", quiet_default=True),
    Axis("sp", None, 1, lambda v: f"sp{v}", quiet_default=True,
         help="loss-only subjects: sequence-parallel size; each rank holds its TP rank's vocabulary shard of its "
              "SP rank's contiguous sequence chunk (world tp x sp; SP rank = rank // tp, the DP slot)"),
    Axis("sp_chunks", ("equal", "uneven"), "equal", lambda v: f"spc_{v}", quiet_default=True,
         help="loss-only subjects with sp: the sequence chunks' sizes: equal, or uneven (references/cross_entropy.py "
              "sequence_chunk_sizes: 24 tokens as 15/9 over SP 2, 10/8/6 over SP 3)"),
    Axis("seq_gather", (False, True), False, _flag("gseq", "nogseq"), quiet_default=True,
         help="loss-only subjects with sp: gather_sequence_loss, the per-token loss all-gathered over the SP "
              "group (the whole sequence's on every rank) instead of the rank's own chunk"),
    Axis("device", ("cpu", "cuda"), "cpu", str),
    Axis("head_input", ("sequence", "flat"), "sequence", lambda v: {"sequence": "in_bth", "flat": "in_nh"}[v],
         help="hidden state reaching the head: sequence-shaped [B,T,H] or flattened [B*T,H]", quiet_default=True),
    Axis("chunk", None, 0, lambda v: f"chunk{v}" if v else "chunk_auto", minimum=0,
         help="tokens per chunk of a fused linear+CE (its chunk_size); 0 passes None (the function's default)", quiet_default=True),
    Axis("backward", ("once", "twice", "create_graph"), "once", lambda v: f"bwd_{v}",
         help="loss-only subjects: one backward; two retained-graph backwards (gradients exactly 2x); or "
              "autograd.grad(create_graph=True) then a Hessian-vector product", quiet_default=True),
    Axis("padding", ("none", "first", "last"), "none", lambda v: {"none": "nopad", "first": "pad0",
                                                                   "last": "padlast"}[v],
         help="embedding padding_idx: none, token 0, or token vocab-1 (tied subjects and embed_spec_untied)"),
    Axis("hf_head", ("colwise_gather_output", "colwise_rep", "rowwise"), "colwise_gather_output",
         lambda v: f"plan_{v}", help="the HF tp_plan style given to lm_head (hf_tp_plan subjects only)"),
    Axis("vocab_parallel_lm_head", ("true", "false", "unset"), "unset", lambda v: f"vplm_{v}",
         help="tensor_parallel.vocab_parallel_lm_head: true, false, or left out (None: DeepSpeed's auto path "
              "for a tied head with an embedding_rowwise plan; hf_tp_plan subjects, and preset_llama / "
              "heuristic_blocks with true or false)"),
    Axis("reach", ("model_types_config", "anchored", "model_types"), "model_types_config", lambda v: f"reach_{v}",
         help="spec_reach: the head's gathered column spec as DeepSpeed may not apply it: model_types_config, the "
              "head's escaped path restricted to model_types ['llama'] on the model given config.model_type 'llama' "
              "(the spec applies); model_types, the same spec on the model without config; anchored, the pattern "
              "lm_head\\.weight$ on a nested model.lm_head (re.match anchors at the start)"),
    Axis("embed_spec", ("none", "row", "column"), "none", lambda v: f"espec_{v}",
         help="an explicit partition_config spec for embed_tokens.weight, visited by the AutoTP walk before "
              "the head (tied subjects only)"),
    Axis("variant", REJECTIONS, "none", str, quiet_default=True,
         help="which documented DeepSpeed error path a rejection case drives (ds_reject only)"),
    Axis("triton", ("device", "claimed"), "device", lambda v: f"triton_{v}", quiet_default=True,
         help="what DeepSpeed's Liger gate is told about Triton: the device's own answer, or 'claimed' (a harness "
              "shortcut for CPU ranks: the gate sees the accelerator answer as CUDA does, Liger then runs in "
              "Triton's interpreter; vocab_parallel only)"),
    Axis("ignore_index", (-100, 0, 3), -100, lambda v: f"ignidx{v}", minimum=-100, quiet_default=True,
         help="the label id the model ignores: -100 (HF's default, not passed) or 0 (a pad id the model passes "
              "to its loss_function as ignore_index=0, as an HF model forwards its caller's loss kwargs); on the "
              "loss-only CEs (ds_vocab_ce, ds_vocab_ce_module) the ignore_index passed: 0 or 3 (an id inside TP rank "
              "0's shard), whose drawn and scattered targets are then the ignored ones"),
    Axis("label_smoothing", (0.0, 0.1), 0.0, lambda v: f"ls{v:g}", quiet_default=True,
         help="the CE's label smoothing, torch's F.cross_entropy(label_smoothing=...) semantics in the reference "
              "(megatron vocab-parallel subjects and liger_vocab_ce)"),
    Axis("ls_formula", ("pytorch", "megatron"), "pytorch", lambda v: f"lsf_{v}", quiet_default=True,
         help="Liger's label_smoothing_formula: pytorch (a/V on every class, torch's) or megatron (NeMo's "
              "a*K/(K-1); liger_vocab_ce only)"),
    Axis("ls_mode", ("global", "partition"), "global", lambda v: f"lsm_{v}", quiet_default=True,
         help="Liger's label_smoothing_mode: global (the smoothing term over the whole vocabulary) or partition "
              "(over the rank's own shard; liger_vocab_ce only)"),
    Axis("global_vocab", ("unset", "exact", "under", "over"), "unset", lambda v: f"gvs_{v}", quiet_default=True,
         help="the global_vocab_size passed to DeepSpeed's vocab_parallel_cross_entropy (which trusts it and skips "
              "its shard-layout validation): not passed, the vocabulary, one less, one more (ds_vocab_ce, ds_liger_ce)"),
    Axis("process", ("fresh", "after_zero3", "after_autocast"), "fresh",
         lambda v: {"fresh": "proc_fresh", "after_zero3": "after_zero3", "after_autocast": "after_autocast"}[v],
         quiet_default=True,
         help="the rank process a case's model is built in: fresh (the harness puts back what earlier cases left "
              "replaced), or one where a ZeRO 3 engine (after_zero3) or a torch_autocast bf16 engine (after_autocast) "
              "ran and was destroyed first, as in a user's process that trains a second model after such a run (the "
              "user's path the harness's reset would hide)"),
    Axis("seed", None, 0, lambda v: f"seed{v}", minimum=0, quiet_default=True,
         help="which draw of initial weights and data (every subject has it): 0 is the suite's historical seeds, "
              "N > 0 offsets each subject's base seed (parity.subjects.base.case_seed); `parity run --seed N / "
              "--seeds K`"),
    Axis("dp_reduce", ("average", "prescale", "predivide2", "comm_fp32", "comm_bf16"), "average", lambda v: f"dpred_{v}",
         quiet_default=True,
         help="DeepSpeed engine subjects: how the data-parallel gradient reduction is configured. average: the "
              "defaults; prescale: prescale_gradients (divide by the DP size before the all-reduce); predivide2: "
              "gradient_predivide_factor 2.0 (divide by 2 before, multiply by 2 / DP size after); comm_fp32: "
              "communication_data_type fp32; comm_bf16: communication_data_type bf16 (on an fp32 model: the reference "
              "is DDP with torch's bf16_compress_hook, references/trajectory.py). The others are DDP's average"),
    Axis("grad_accum", ("model", "fp32"), "model", lambda v: f"gacc_{v}", quiet_default=True,
         help="DeepSpeed engine subjects: data_types.grad_accum_dtype. model: the model dtype (DeepSpeed's "
              "default); fp32: float32 accumulation, which with bf16 and ZeRO 1 selects DeepSpeed's BF16_Optimizer"),
    Axis("autocast", ("off", "bf16", "fp16"), "off", lambda v: f"autocast_{v}", quiet_default=True,
         help="DeepSpeed engine subjects: the torch_autocast config section (enabled, dtype bfloat16 or float16) on an "
              "fp32 model; the reference is the user's plain AMP loop, the forward under torch.autocast, with fp16 "
              "torch.amp.GradScaler at its defaults as DeepSpeed builds it (references/trajectory.py). "
              "ds_fused_linear_ce: the call made inside the user's torch.autocast on fp32 "
              "inputs, against plain autocast's linear + CE (references/cross_entropy.py)"),
    Axis("autocast_modules", ("default", "head", "base"), "default", lambda v: f"acmods_{v}", quiet_default=True,
         help="DeepSpeed engine subjects with autocast on: torch_autocast.lower_precision_safe_modules, the module "
              "classes whose parameters ZeRO reduces (and ZeRO 3 gathers) in the autocast dtype. default: left out "
              "(DeepSpeed's list: nn.Linear, Conv1d/2d/3d); head: nn.Linear and the AutoTP class the head becomes "
              "(column_gathered, vocab_parallel, row_parallel); base: nn.Linear and AutoTP's base class of that kind "
              "(LinearLayer for the column heads, LinearAllreduce for the row head), whose instance the head is"),
    Axis("reverse", (False, True), False, _flag("kl_rev", "kl_fwd"),
         help="ds_vocab_kl: vocab_parallel_kl_div's reverse argument: False, KL(teacher || student); True, "
              "KL(student || teacher)"),
    Axis("kl_grad", ("student", "teacher", "both"), "both", lambda v: f"grad_{v}",
         help="ds_vocab_kl: which logits require grad (the other is a leaf without grad, as a detached teacher is)"),
    Axis("kl_shards", ("same", "shifted", "reversed"), "same", lambda v: f"tshard_{v}",
         help="ds_vocab_kl: the teacher's vocabulary layout against the student's: the same shards; every rank's "
              "bounds moved one column (same widths); or the shards in reverse rank order"),
    Axis("use_default_specs", ("false", "unset", "true"), "false", lambda v: f"defspecs_{v}", quiet_default=True,
         help="tensor_parallel.partition_config.use_default_specs: false (every engine case's own setting), left "
              "out (DeepSpeed's default, true), or true; no preset_model is set, so there are no built-in specs "
              "to merge and every value must give the same model (column_gathered only)"),
    Axis("grad_allreduce", (False, True), False, _flag("proj_gar", "proj_nogar"), quiet_default=True,
         help="partition_config grad_allreduce on proj's skip spec: DeepSpeed then sums proj's gradient over the TP "
              "group (meant for a replicated parameter fed sharded activations; proj's is already whole) "
              "(column_gathered only)"),
    Axis("dist_debug", ("off", "detail"), "off", lambda v: f"dbg_{v}", quiet_default=True,
         help="TORCH_DISTRIBUTED_DEBUG when DeepSpeed builds its TP/DP groups: unset, or DETAIL (DeepSpeed then "
              "builds them with new_group rank lists instead of a DeviceMesh split, and gloo checks every "
              "collective's shapes across ranks) (column_gathered, vocab_parallel)"),
    Axis("embedding_dim", ("unset", 0, 1), "unset", lambda v: "edim_unset" if v == "unset" else f"edim{v}",
         minimum=0, quiet_default=True,
         help="partition_config.embedding_partition_dim: left out (DeepSpeed's default, 1), 0 (the vocabulary "
              "rows: the embedding's lookup is then whole on every rank, so proj stays replicated) or 1 (hidden "
              "columns, the default spelled out) (embed_spec_untied only)"),
    Axis("save", ("none", "16bit", "consolidated"), "none", lambda v: f"save_{v}", quiet_default=True,
         help="DeepSpeed engine subjects (column_gathered, vocab_parallel, row_parallel and the tied heads): after the "
              "last step, what a user saves: none; 16bit, engine.save_16bit_model read back with torch.load; "
              "consolidated, engine._consolidated_16bit_state_dict() (accelerate's path for an AutoTP engine). Global "
              "rank 0's copy must hold every key of the unsharded model's state_dict, each equal bitwise to the TP "
              "shards concatenated (and so within the weight bound of the reference's final weights)"),
    Axis("save_tp", None, 2, lambda v: f"from_tp{v}",
         help="universal-checkpoint subjects (uc_*): the TP size the checkpoint was trained and saved at (the world "
              "tp x dp stays; its other factor is data parallelism); tp and dp are the resumed run's"),
    Axis("optimizer", ("adamw", "sgd"), "adamw", str,
         help="universal-checkpoint subjects (uc_*): the torch optimizer the user trains with: adamw (the "
              "reference is torch.optim.AdamW, references/adamw_trajectory.py) or sgd (plain torch.optim.SGD)"),
    Axis("keep_on_host", (False, True), False, _flag("host", "nohost"), quiet_default=True,
         help="tensor_parallel.keep_module_on_host: AutoTP creates the head's shards on the host instead of the "
              "accelerator (layers.py move()); training must still compute on the case's device, which each rank "
              "records (column_gathered, vocab_parallel)"),
    Axis("overlap", (False, True), False, _flag("ovl", "noovl"), quiet_default=True,
         help="tensor_parallel.tp_overlap_comm: column layers (the gathered and the vocabulary-parallel head) run "
              "AsyncColumnParallel, whose backward all-reduces the input gradient asynchronously and sums the bias "
              "gradient over dim 0 only (autograd sums the rest) (column_gathered, vocab_parallel)"),
    Axis("immediate_grad", (False, True), False, _flag("igu", "noigu"), quiet_default=True,
         help="bf16.immediate_grad_update: BF16_Optimizer (bf16, ZeRO 1, grad_accum fp32) moves each micro-batch's "
              "bf16 gradient into its float32 buffer in a grad hook instead of after backward (column_gathered, "
              "vocab_parallel)"),
    Axis("overflow_check", (True, False), True, _flag("ovfchk", "noovfchk"), quiet_default=True,
         help="bf16.check_grad_overflow: false lets the ZeRO 1/2 optimizer step without its inf/nan scan of the "
              "gradients (a skipped step on overflow is DeepSpeed's, not torch's) (column_gathered, vocab_parallel)"),
    Axis("loss_scale", ("static", "dyn19_h1", "dyn19_h1_w2", "dyn19", "dyn10_w1"), "static", lambda v: f"ls_{v}", quiet_default=True,
         help="fp16 loss scaling (parity/subjects/loss_scaling.py): static, a scale of 1 (every other fp16 case); "
              "dyn19_h1, dynamic from 2**19 with hysteresis 1 (the first step overflows and is skipped); dyn19_h1_w2, "
              "the same with loss_scale_window 2 (the scale grows back inside the run); dyn19, DeepSpeed's default "
              "hysteresis 2; dyn10_w1, from 2**10 with window 1 (grows on clean steps, never overflows). Numbers held to torch.amp.GradScaler (references/grad_scaler.py) (column_gathered, "
              "vocab_parallel; fp16 at vocab 34, hidden 32, mean only)"),
    Axis("bf16_master", (False, True), False, _flag("bf16master", "fp32master"), quiet_default=True,
         help="bf16.bf16_master_weights_and_grads with bf16_optimizer_states (the one pairing DeepSpeed accepts for a "
              "torch optimizer without offload): the ZeRO 1/2 optimizer keeps bf16 masters and gradients, so the "
              "reference is torch.optim.SGD on the bf16 parameters themselves (column_gathered, vocab_parallel)"),
    Axis("allreduce", ("torch", "shm"), "torch", lambda v: f"ar_{v}", quiet_default=True,
         help="inference_head: how inference_all_reduce sums the partial logits on CPU: torch, DeepSpeed's shm op not "
              "built (torch.distributed.all_reduce over gloo); shm, the op built and set up as deepspeed.init_distributed "
              "does under DeepSpeed's launcher (LOCAL_SIZE = world), which DeepSpeed then takes for fp32 on AVX2 CPUs "
              "and for bf16/fp16 on AVX-512BW ones"),
    Axis("model_config", ("none", "heads4", "kv3", "kv1", "text_kv3"), "none", lambda v: f"cfg_{v}",
         quiet_default=True,
         help="the HF-style config the user's model carries as model.config (references/model_config.py): none, or "
              "one naming attention head counts, which DeepSpeed's AutoTP reads (tp_shard.AutoTPMeta): heads4 "
              "(num_attention_heads 4), kv3 (6 query heads, num_key_value_heads 3), kv1 (4 query heads, one kv head), "
              "text_kv3 (16 vision heads outside, kv3 in text_config) (vocab_parallel, tied_vocab_parallel)"),
    Axis("model_init", ("plain", "tp_model_init", "zero_init", "zero_init_dtype"), "plain", lambda v: f"init_{v}", quiet_default=True,
         help="how the user's model reaches deepspeed.initialize: plain (built, then handed over with the config's "
              "autotp_size); tp_model_init (deepspeed.tp_model_init(model, tp_size, dtype) without tp_group, and a "
              "config whose tensor_parallel section leaves autotp_size out for DeepSpeed's merge to fill); zero_init "
              "(zero = 3 only: built under deepspeed.zero.Init, the pretrained weights loaded under "
              "GatheredParameters(modifier_rank=0), as from_pretrained does); zero_init_dtype (as zero_init, with the case's "
              "dtype also passed to zero.Init(dtype=)) (column_gathered, vocab_parallel, "
              "tied_vocab_parallel; plain and tp_model_init on hf_plan_column and hf_plan_tied, whose config then has "
              "no tensor_parallel section at all)"),
    Axis("prior_tp", (0, 2, 3, 4), 0, lambda v: f"after_inf_tp{v}", quiet_default=True,
         help="inference_head: the tensor_parallel.tp_size of an init_inference the user ran before, in the same "
              "process (0: none); the ranks are the larger of the two sizes, the case's tp a divisor of them, every "
              "rank fed the same input"),
    Axis("second_head", ("none", "mtp.lm_head"), "none", lambda v: f"second_{v.replace('.', '_')}", quiet_default=True,
         help="tied_plan_head: a second output head tied to the embedding, as a multi-token-prediction module's own "
              "lm_head (mtp.lm_head: no bias, used by no forward of the suite's), which the plan's lm_head pattern "
              "also matches"),
    Axis("tp_source", ("tp_size", "mpu"), "tp_size", lambda v: f"tpsrc_{v}", quiet_default=True,
         help="inference_head: how init_inference learns its TP group: tensor_parallel.tp_size (the engine makes the "
              "group), or tensor_parallel.mpu, a Megatron-style mpu handing over a group of the same members"),
    Axis("embed_scale", ("none", "gemma3"), "none", lambda v: f"escale_{v}", quiet_default=True,
         help="the embedding handed to DeepSpeed is an nn.Embedding (none) or transformers' "
              "Gemma3TextScaledWordEmbedding with embed_scale sqrt(hidden) (gemma3), whose lookups the reference "
              "multiplies by that scale cast to the weight dtype, as HF's forward does (vocab_parallel_embedding, "
              "tied_vocab_parallel, tied_row_parallel)"),
    Axis("grad_freq", (False, True), False, _flag("sgbf", "nosgbf"), quiet_default=True,
         help="tied_row_parallel, embed_spec_untied: the embedding's scale_grad_by_freq (each lookup's gradient "
              "divided by its id's count in the micro-batch, torch's nn.Embedding semantics), which "
              "HiddenParallelEmbedding keeps"),
    Axis("max_norm", (0.0, 1.0), 0.0, lambda v: "nomaxn" if v == 0 else f"maxn{v:g}", quiet_default=True,
         help="embed_spec_untied: the embedding's max_norm (0 = off): each lookup renormalises, in place, every "
              "looked-up row whose L2 norm exceeds it (torch's nn.Embedding semantics)"),
    Axis("inf_rows", ("none", "all", "masked"), "none", lambda v: f"inf_{v}", quiet_default=True,
         help="ds_vocab_ce, ds_vocab_logprobs, ds_vocab_entropy: two rows of logits that are all -inf (a fully "
              "masked position; one with its target ignored under scattered ignores), where torch gives nan; "
              "ds_vocab_kl: all (a student row, a teacher row and a row of both all -inf) or masked (some ids -inf: "
              "the teacher's, both's, the student's; references/kl_div.py _mask)"),
    Axis("topk", (0, 2, 4, 8), 0, lambda v: f"top{v}", quiet_default=True,
         help="ds_vocab_logprobs: 0 asks for one id per token (the target); k > 0 for k ids per token, an index "
              "[..., k] as a teacher's top-k (references/cross_entropy.py topk_index), held to "
              "log_softmax(full logits).gather(-1, index)"),
    Axis("labels", ("labels", "shift_labels"), "labels", lambda v: {"labels": "lbl", "shift_labels": "shiftlbl"}[v],
         quiet_default=True,
         help="how the model hands its targets to its loss_function: labels (the loss shifts them), or shift_labels "
              "beside them, pre-shifted with a real target at the last position (references/loss.py "
              "continued_shift_labels), which transformers' ForCausalLMLoss scores as given (vocab_parallel, "
              "column_gathered; mean)"),
    Axis("targets", ("valid", "out_of_range", "minus100"), "valid",
         lambda v: {"valid": "tgt_ok", "out_of_range": "tgt_oob", "minus100": "tgt_m100"}[v],
         help="loss-only subjects: one non-ignored target set to the vocabulary size (belongs to no shard), or "
              "(minus100, with another ignore_index) to -100, HF's usual ignore id, which is then an ordinary, "
              "out-of-range target: torch's F.cross_entropy(ignore_index=k) raises for it",
         quiet_default=True),
    Axis("arch", ARCHITECTURES, "llama", lambda v: f"arch_{v}",
         help="zoo subjects: the transformers model_type built tiny from its own config class (references/zoo.py, "
              "docs/zoo-census.md), trained with its own forward and loss"),
    Axis("arch_config", ("",), "", lambda v: f"cfg_{v}", quiet_default=True, pattern=r"[a-z0-9_]+_[0-9a-f]{8}",
         help="zoo subjects: a user's config.json of the arch (`parity check --arch FILE`), by the name "
              "references.zoo.store_config gave it (its file name and content hash), shrunk keeping its structure; "
              "empty: the config class's defaults"),
]}
