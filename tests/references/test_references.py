"""The references are independent of the subjects, and correct on their own terms."""
import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from references.loss import causal_lm_loss
from references.tiny_lm import ModelSpec, build_model
from references.trajectory import TrainingSpec, train_reference
from tests.conftest import skip_or_fail

REFERENCES = Path(__file__).resolve().parents[2] / "references"
FORBIDDEN = ("deepspeed", "liger_kernel", "parity")


def test_references_import_no_subject_code():
    for path in REFERENCES.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            for name in names:
                assert name.split(".")[0] not in FORBIDDEN, f"{path} imports {name}"


def test_running_a_reference_loads_no_subject_module():
    code = ("import sys; from references.trajectory import *; from references.tiny_lm import ModelSpec;"
            "train_reference(ModelSpec(34, 32), TrainingSpec(steps=1), __import__('torch').float32);"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('deepspeed', 'liger_kernel', 'triton')];"
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REFERENCES.parent)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_loss_matches_torch_cross_entropy(reduction):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 7, 35, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 35, (2, 7), generator=gen)
    labels[0, 3] = labels[1, 5] = -100
    want = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 35), labels[:, 1:].reshape(-1),
                                             reduction=reduction)
    got = causal_lm_loss(logits, labels, reduction=reduction)
    torch.testing.assert_close(got.reshape(want.shape), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_label_smoothing_is_torchs(reduction):
    # torch's semantics (a/V on every class), not NeMo's/Megatron's a/(V-1) on the others; and it changes the loss.
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 7, 36, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 36, (2, 7), generator=gen)
    labels[0, 3] = labels[1, 5] = -100
    want = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 36), labels[:, 1:].reshape(-1),
                                             reduction=reduction, label_smoothing=0.1)
    got = causal_lm_loss(logits, labels, reduction=reduction, label_smoothing=0.1)
    torch.testing.assert_close(got.reshape(want.shape), want, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(causal_lm_loss(logits, labels, reduction=reduction), got)
    model = build_model(ModelSpec(vocab=36, hidden=8, label_smoothing=0.1), seed=0, dtype=torch.float64)
    ids = labels.clamp_min(0)  # the model's own CE reads the spec's smoothing
    plain = build_model(ModelSpec(vocab=36, hidden=8), seed=0, dtype=torch.float64)
    assert model(ids, labels)[0].sum() != plain(ids, labels)[0].sum()


def test_num_items_divides_the_sum():
    logits = torch.randn(1, 5, 11, dtype=torch.float64)
    labels = torch.randint(0, 11, (1, 5))
    assert torch.equal(causal_lm_loss(logits, labels, "num_items", num_items_in_batch=7),
                       causal_lm_loss(logits, labels, "sum") / 7)


@pytest.mark.parametrize("reduction", ["mean", "num_items"])
def test_all_ignored_is_nan_with_zero_gradient_as_in_torch(reduction):
    # torch's F.cross_entropy mean (HF's ForCausalLMLoss) and transformers' fixed_cross_entropy with
    # num_items_in_batch 0 both give 0/0 = nan and a zero gradient; DeepSpeed's 0 is a divergence.
    logits = torch.randn(1, 4, 9, requires_grad=True)
    labels = torch.full((1, 4), -100)
    loss = causal_lm_loss(logits, labels, reduction, num_items_in_batch=0)
    loss.backward()
    flat, shifted = logits.detach()[:, :-1].reshape(-1, 9).requires_grad_(), labels[:, 1:].reshape(-1)
    plain = (torch.nn.functional.cross_entropy(flat, shifted) if reduction == "mean"
             else torch.nn.functional.cross_entropy(flat, shifted, reduction="sum") / torch.tensor(0))
    plain.backward()
    assert torch.isnan(loss) and torch.isnan(plain)
    assert torch.equal(logits.grad, torch.zeros_like(logits)) and torch.equal(flat.grad, torch.zeros_like(flat))


def test_num_items_step_gradient_is_the_global_token_mean_over_data_parallel_ranks():
    # What the HF Trainer gives by default (average_tokens_across_devices): every token of the step,
    # on every data-parallel rank, weighs 1/N with N counted over all of them; computed here with
    # torch's own cross entropy over the concatenated batches, in float64.
    spec, train = ModelSpec(34, 32, reduction="num_items"), TrainingSpec(steps=1, dp=2, micro_batches=2)
    traj = train_reference(spec, train, torch.float32, torch.float64)
    model = build_model(spec, train.seed, torch.float32).double()
    logits, labels = [], []
    for dp_rank in range(train.dp):
        for batch in train.batches(0, dp_rank, spec.vocab, spec.ignore_index):
            _, out = model(batch["input_ids"])
            logits.append(out[:, :-1].reshape(-1, spec.vocab))
            labels.append(batch["labels"][:, 1:].reshape(-1))
    labels = torch.cat(labels)
    loss = torch.nn.functional.cross_entropy(torch.cat(logits), labels, reduction="sum") / (labels != -100).sum()
    loss.backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(traj.get("grad", 0, None, None, name), p.grad, rtol=1e-12, atol=1e-12)


def test_tied_model_shares_one_parameter():
    model = build_model(ModelSpec(34, 32, tied=True), seed=1, dtype=torch.float32)
    assert model.lm_head.weight is model.embed_tokens.weight
    assert "lm_head.weight" not in dict(model.named_parameters())


def test_sgd_moves_weights_and_oracle_tracks_fp32():
    spec, train = ModelSpec(34, 32), TrainingSpec(steps=2)
    ref = train_reference(spec, train, torch.float32)
    oracle = train_reference(spec, train, torch.float32, torch.float64)
    w0, w2 = ref.get("weight", -1, None, None, "proj.weight"), ref.get("weight", 1, None, None, "proj.weight")
    assert not torch.equal(w0, w2)
    assert torch.allclose(w2, oracle.get("weight", 1, None, None, "proj.weight"), rtol=0, atol=1e-6)


def test_a_padding_token_is_looked_up_in_every_micro_batch_and_leaves_other_data_alone():
    """A padding_idx case proves something only where its token is an input (at seed 3 of the default
    matrix token 33 never was, and DeepSpeed's dropped padding_idx went unseen)."""
    from parity.subjects import SUBJECTS
    from parity.subjects.values import resolve
    from references.data import make_batch

    for seed in range(20):
        for step in range(5):
            kw = dict(batch=2, seq=6, vocab=34, ignore="scattered")
            plain, padded = make_batch(seed, step, 0, 0, **kw), make_batch(seed, step, 0, 0, **kw, pad_token=33)
            assert (padded["input_ids"] == 33).any()
            assert torch.equal(plain["labels"], padded["labels"])
            differ = plain["input_ids"] != padded["input_ids"]
            assert int(differ.sum()) <= 1
    embedding = SUBJECTS["vocab_parallel_embedding"]  # Subject.training_spec, with a padding axis

    def spec_of(**values):
        return embedding.training_spec(resolve(embedding, values))

    spec = spec_of(vocab=34, padding="last")
    assert spec.pad_token == 33 and all((b["input_ids"] == 33).any() for b in spec.batches(0, 0, 34, -100))
    assert spec_of(vocab=34).pad_token is None


def test_without_master_a_bf16_model_is_stepped_as_torch_optim_sgd_steps_it():
    """TrainingSpec.master False (a user asking for bf16 master weights): no float32 copy, the step gradient is
    p.grad in bf16, and each update is torch.optim.SGD's own on the bf16 parameter, which a float32 master
    (the default) would not give: it carries sub-unit updates across steps."""
    spec = ModelSpec(35, 32)
    plain = train_reference(spec, TrainingSpec(steps=3, master=False), torch.bfloat16)
    mixed = train_reference(spec, TrainingSpec(steps=3), torch.bfloat16)
    assert not [k for k in plain.records if k[0] == "master_weight"]
    assert [k for k in mixed.records if k[0] == "master_weight"]
    model = build_model(spec, TrainingSpec.seed, torch.bfloat16)
    differs = False
    for step in range(3):
        for name, p in model.named_parameters():
            grad = plain.get("grad", step, None, None, name)
            assert plain.layouts[("grad", step, None, None, name)][0] == "bfloat16"
            prev = plain.get("weight", step - 1, None, None, name).to(torch.bfloat16)
            param = torch.nn.Parameter(prev.clone())
            param.grad = grad.to(torch.bfloat16)
            torch.optim.SGD([param], lr=TrainingSpec.lr).step()
            assert torch.equal(param.detach().double(), plain.get("weight", step, None, None, name))
            differs |= not torch.equal(plain.get("weight", step, None, None, name),
                                       mixed.get("weight", step, None, None, name))
    assert differs


def test_autocast_reference_is_a_plain_amp_loop_with_bf16_floors():
    # What a user's fp32 model under torch.autocast("cpu", bf16) gives: bf16 logits (nn.Linear autocasts),
    # an fp32 loss (cross_entropy upcasts), fp32 gradients whose nn.Linear weight entries are bf16 values
    # (the weight-gradient GEMM ran in bf16), fp32 weights; the oracle is the same float64 run as without it.
    spec, train = ModelSpec(34, 32), TrainingSpec(steps=2, micro_batches=1)  # one micro-batch: its own gradient
    amp = train_reference(spec, train, torch.float32, autocast=torch.bfloat16)
    plain = train_reference(spec, train, torch.float32)
    assert amp.layouts[("logits", 0, 0, 0, None)][0] == "bfloat16"
    assert amp.layouts[("loss", 0, 0, 0, None)][0] == "float32"
    assert amp.layouts[("grad", 0, None, None, "proj.weight")][0] == "float32"
    assert amp.layouts[("weight", 1, None, None, "lm_head.weight")][0] == "float32"
    g = amp.get("grad", 0, None, None, "proj.weight").float()
    assert torch.equal(g, g.bfloat16().float())
    assert not torch.equal(amp.get("logits", 0, 0, 0, None), plain.get("logits", 0, 0, 0, None))
    assert {amp.floor_dtypes[k] for k in ("logits", "loss", "grad")} == {torch.bfloat16}
    assert "weight" not in amp.floor_dtypes and not plain.floor_dtypes
    oracle = train_reference(spec, train, torch.float32, torch.float64, autocast=torch.bfloat16)
    exact = train_reference(spec, train, torch.float32, torch.float64)
    assert torch.equal(oracle.get("weight", 1, None, None, "proj.weight"), exact.get("weight", 1, None, None, "proj.weight"))
    # bf16-bounded, not fp32-bounded: the logits' error is a few bf16 units of their size, far above fp32's
    err = (amp.get("logits", 0, 0, 0, None) - exact.get("logits", 0, 0, 0, None)).abs().max()
    size = exact.get("logits", 0, 0, 0, None).abs().max()
    assert 2**-24 * size < err <= 4 * 2**-8 * size


@pytest.mark.parametrize("reduction,gathered", [("none", False), ("none", True), ("mean", False)])
def test_sequence_chunks_are_the_whole_sequences_records_split_by_rows(reduction, gathered):
    from references.cross_entropy import ce_reference

    whole = ce_reference(7, 24, 10, "scattered", torch.float32, reduction=reduction)
    split = ce_reference(7, 24, 10, "scattered", torch.float32, reduction=reduction, sequence_parts=3,
                         gathered=gathered)
    for kind in ("loss", "logits_grad", "logits_after"):
        want = whole.get(kind, 0, 0, 0, None)
        chunks = [split.get(kind, 0, 0, part, None) for part in range(3)]
        if want.dim() == 0 or (kind == "loss" and gathered):  # a scalar, or the gathered loss: whole on every rank
            assert all(torch.equal(chunk, want) for chunk in chunks)
        else:
            assert all(chunk.shape[0] == 8 for chunk in chunks) and torch.equal(torch.cat(chunks), want)


def test_linear_sequence_chunks_keep_the_head_gradients_whole():
    from references.cross_entropy import linear_ce_reference

    whole = linear_ce_reference(7, 40, 10, 4, True, "scattered", torch.float32)
    split = linear_ce_reference(7, 40, 10, 4, True, "scattered", torch.float32, sequence_parts=2)
    for part in range(2):
        for kind in ("loss", "weight_grad", "bias_grad"):
            assert torch.equal(split.get(kind, 0, 0, part, None), whole.get(kind, 0, 0, 0, None))
    assert torch.equal(torch.cat([split.get("hidden_grad", 0, 0, p, None) for p in range(2)]),
                       whole.get("hidden_grad", 0, 0, 0, None))


def test_topk_logprobs_are_log_softmax_gathered_with_ignored_ids_zero():
    """The top-k reference is what a user writes: log_softmax of the full logits gathered at the k ids; a
    repeated id counts twice in the gradient, and an ignored id gives 0 with no gradient."""
    from references.cross_entropy import topk_index, upstream_objective
    from references.loss import token_logprobs

    logits = torch.randn(6, 9, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([8, -100, 3, 3, 0, 5])
    index = topk_index(7, targets, 9, 4)
    assert index.shape == (6, 4) and (index[1] == -100).all() and (index[:, 0][targets != -100] == targets[targets != -100]).all()
    index[2, 1:3] = 3  # a repeated id
    got = token_logprobs(logits, index, -100)
    safe = index.clamp_min(0)
    want = torch.where(index != -100, torch.log_softmax(logits, -1).gather(-1, safe), torch.zeros(()))
    torch.testing.assert_close(got, want)
    upstream = torch.rand(6, dtype=torch.float64) + 0.5
    (grad,) = torch.autograd.grad(upstream_objective(got, upstream, "none"), logits)
    (want_grad,) = torch.autograd.grad(upstream_objective(want, upstream, "none"), logits)
    torch.testing.assert_close(grad, want_grad)
    assert (grad[1] == 0).all()


def test_shift_labels_are_scored_as_transformers_for_causal_lm_loss_scores_them():
    # references/loss.py writes ForCausalLMLoss out (transformers must stay optional for the references).
    from importlib.util import find_spec

    if find_spec("transformers") is None:
        skip_or_fail("transformers is not installed (pip install -e '.[hf]'); requirements-cpu.txt pins it")
    import transformers.loss.loss_utils as transformers_loss
    from references.loss import causal_lm_loss, continued_shift_labels

    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 6, 11, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 11, (2, 6), generator=gen)
    labels[0, 2] = labels[1, 0] = -100
    shift = continued_shift_labels(labels)
    assert shift[1, -1] == -100 and shift[0, -1] == labels[0, 0]
    want = transformers_loss.ForCausalLMLoss(logits, labels, 11, shift_labels=shift)
    torch.testing.assert_close(causal_lm_loss(logits, labels, shift_labels=shift), want.double(), rtol=1e-6, atol=1e-6)
    # without shift_labels the two agree as before (HF pads the last position with the ignore id)
    torch.testing.assert_close(causal_lm_loss(logits, labels), transformers_loss.ForCausalLMLoss(logits, labels, 11).double(),
                               rtol=1e-6, atol=1e-6)


def test_bf16_communication_is_ddps_bf16_compress_hook():
    # The rule references/trajectory.py states, as torch writes it (the hook itself needs a process group).
    import inspect

    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from references.trajectory import trainer_objective

    assert "_compress_hook(torch.bfloat16," in inspect.getsource(default_hooks.bf16_compress_hook)
    assert "buffer.to(dtype).div_(world_size)" in inspect.getsource(default_hooks._compress_hook)
    spec, train = ModelSpec(vocab=11, hidden=8), TrainingSpec(steps=1, dp=2)
    bf16_train = dataclasses.replace(train, comm_dtype=torch.bfloat16)
    plain, compressed = train_reference(spec, train, torch.float32), train_reference(spec, bf16_train, torch.float32)
    model = build_model(spec, train.seed, torch.float32)
    replicas = []  # each replica's accumulated gradient, before DDP's all-reduce
    for dp_rank in range(2):
        model.zero_grad(set_to_none=True)
        for batch in train.batches(0, dp_rank, spec.vocab, spec.ignore_index):
            trainer_objective(model(**batch)[0], train, spec.reduction).backward()
        replicas.append({name: p.grad.clone() for name, p in model.named_parameters()})
    for name in replicas[0]:
        parts = [r[name].to(torch.bfloat16).div_(2) for r in replicas]
        got = compressed.get("grad", 0, None, None, name)
        assert torch.equal(got, (parts[0] + parts[1]).double())
        assert not torch.equal(got, plain.get("grad", 0, None, None, name))  # bf16-rounded, unlike DDP's fp32 average
    oracle = train_reference(spec, bf16_train, torch.float32, torch.float64)
    exact = train_reference(spec, train, torch.float32, torch.float64)
    assert all(torch.equal(v, exact.records[k]) for k, v in oracle.records.items())  # no compression in the oracle


def test_fused_linear_ce_autocast_reference_is_plain_autocast_with_bf16_gradient_floors():
    from references.cross_entropy import linear_ce_reference

    args = (4321, 40, 35, 16, True, "scattered", torch.float32)
    plain = linear_ce_reference(*args, reduction="mean")
    amp = linear_ce_reference(*args, reduction="mean", autocast=torch.bfloat16)
    oracle = linear_ce_reference(*args, torch.float64, reduction="mean", autocast=torch.bfloat16)
    # float32 records, bf16 arithmetic: the loss moves by about bf16's rounding of the logits, not float32's.
    assert amp.layouts[("loss", 0, 0, 0, None)][0] == "float32"
    assert amp.layouts[("weight_grad", 0, 0, 0, None)][0] == "float32"
    shift = abs(float(amp.get("loss", 0, 0, 0, None)) - float(plain.get("loss", 0, 0, 0, None)))
    assert 1e-6 < shift < 1e-2
    assert amp.floor_dtypes["weight_grad"] == torch.bfloat16 and "loss" in amp.floor_dtypes
    # The oracle takes no autocast.
    assert "weight_grad" not in oracle.floor_dtypes
