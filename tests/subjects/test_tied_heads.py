"""The tied subjects' claims and the reference's padding_idx support (no rank processes)."""
from pathlib import Path

import numpy as np
import pytest
import torch

from parity.matrix.cases import load, load_file, subject_axes
from parity.checks.compare import _take
from parity.observe.partition import shard_sizes, shard_slice
from parity.subjects import SUBJECTS
from parity.subjects.values import resolve
from references.tiny_lm import ModelSpec, build_model
from references.trajectory import TrainingSpec
from tests.conftest import skip_or_fail

CASES = Path(__file__).resolve().parents[2] / "cases"
TIED_FILE = CASES / "deepspeed_tied_heads.toml"
BASE = {"dtype": "fp32", "reduction": "mean", "vocab": 35, "hidden": 35, "bias": True, "head": "lm_head",
        "ignore": "scattered", "zero": 0, "gas": 2, "tp": 2, "device": "cpu", "backend": "torch",
        "padding": "none", "embed_spec": "none"}


def values_of(name: str, **changes):
    """BASE and ``changes`` as subject ``name``'s case values: the axes of BASE it declares, the rest at defaults."""
    subject = SUBJECTS[name]
    return resolve(subject, {**{a: v for a, v in BASE.items() if a in subject_axes(subject)}, **changes})


@pytest.mark.parametrize("hidden,tp,widths", [(32, 2, [16, 16]), (35, 2, [18, 17]), (35, 3, [12, 12, 11])])
def test_tied_row_claims_one_parameter_sharded_along_hidden(hidden, tp, widths):
    subject = SUBJECTS["tied_row_parallel"]
    values = values_of("tied_row_parallel", hidden=hidden, tp=tp)
    claims = subject.claims(values)
    assert claims.module_types == {"lm_head": "LinearAllreduceWithReplicatedInput", "proj": "Linear",
                                   "embed_tokens": "HiddenParallelEmbedding"}
    assert claims.param_shards == {"embed_tokens.weight": 1, "lm_head.bias": None}
    assert claims.shared_params == (("lm_head.weight", "embed_tokens.weight"),)
    assert claims.micro_records["logits"] is None and claims.loss_backend is None
    specs = subject.tensor_parallel_config(values)["partition_config"]["layer_specs"]
    assert {"patterns": [r"lm_head\.weight$"], "partition_type": "row"} in specs

    # The reference names the shared weight once, under the embedding; the claimed dim covers it.
    model = build_model(subject.model_spec(values), seed=0, dtype=torch.float32)
    assert model.lm_head.weight is model.embed_tokens.weight
    names = [n for n, _ in model.named_parameters()]
    assert "lm_head.weight" not in names and set(claims.param_shards) <= set(names)
    weight = model.embed_tokens.weight.detach().double().numpy()
    shards = [_take(weight, 1, hidden, tp, r) for r in range(tp)]
    assert [s.shape[1] for s in shards] == widths == shard_sizes(hidden, tp)
    for r, s in enumerate(shards):
        np.testing.assert_array_equal(s, weight[:, shard_slice(hidden, tp, r)])


@pytest.mark.parametrize("vocab,tp,widths", [(34, 2, [17, 17]), (35, 2, [18, 17]), (35, 3, [12, 12, 11])])
def test_tied_vocab_claims_one_parameter_sharded_along_vocab(vocab, tp, widths):
    subject = SUBJECTS["tied_vocab_parallel"]
    values = values_of("tied_vocab_parallel", vocab=vocab, tp=tp)
    claims = subject.claims(values)
    assert claims.module_types == {"lm_head": "VocabParallelLinear", "proj": "Linear",
                                   "embed_tokens": "VocabParallelEmbedding",
                                   "loss_function": "VocabParallelCausalLMLoss"}
    assert claims.param_shards == {"embed_tokens.weight": 0, "lm_head.bias": 0}
    assert claims.shared_params == (("lm_head.weight", "embed_tokens.weight"),)
    assert claims.micro_records == {"logits": -1, "loss": None, "head_input_grad": None}
    assert claims.loss_backend == "torch"
    config = subject.tensor_parallel_config(values)
    assert config["vocab_parallel_lm_head"] is True
    model = build_model(subject.model_spec(values), seed=0, dtype=torch.float32)
    assert model.lm_head.weight is model.embed_tokens.weight
    assert [_take(model.embed_tokens.weight.detach().numpy(), 0, vocab, tp, r).shape[0]
            for r in range(tp)] == widths == shard_sizes(vocab, tp)


@pytest.mark.parametrize("name", ["tied_row_parallel", "tied_vocab_parallel"])
def test_embed_spec_is_listed_before_the_head_and_padding_reaches_the_model(name):
    subject = SUBJECTS[name]
    for kind in ("row", "column"):
        specs = subject.tensor_parallel_config(values_of(name, embed_spec=kind))["partition_config"]["layer_specs"]
        assert specs[0] == {"patterns": [r"embed_tokens\.weight$"], "partition_type": kind}
    specs = subject.tensor_parallel_config(values_of(name))["partition_config"]["layer_specs"]
    assert not any("embed_tokens" in p for s in specs for p in s["patterns"])
    for padding, want in (("none", None), ("first", 0), ("last", 34)):
        spec = subject.model_spec(values_of(name, padding=padding))
        assert spec.tied and spec.padding_idx == want


def test_new_axes_leave_other_subjects_ids_alone():
    for case in load([p for p in sorted(CASES.glob("*.toml")) if p != TIED_FILE]):
        # The tied heads (in other files too: cases/deepspeed_autocast.toml) and an untied embedding with its
        # own spec: these axes are their own.
        if "padding" in subject_axes(SUBJECTS[case.subject]) or case.subject == "embed_spec_untied":
            continue
        assert "padding" not in case.values and "embed_spec" not in case.values
        assert "espec_" not in case.id and "pad" not in case.id.split("-")[-1]
    assert ModelSpec(35, 32).padding_idx is None
    assert build_model(ModelSpec(35, 32), 0, torch.float32).embed_tokens.padding_idx is None


def _all_steps(vocab):
    train = TrainingSpec()
    batches = [b for step in range(train.steps) for b in train.batches(step, 0, vocab, -100)]
    return torch.cat([b["input_ids"] for b in batches]), torch.cat([b["labels"] for b in batches])


@pytest.mark.parametrize("vocab", [34, 35])
@pytest.mark.parametrize("padding", ["first", "last"])
def test_padding_token_occurs_in_the_training_data(vocab, padding):
    """Otherwise a subject that ignored padding_idx would pass the padding cases. Inputs are uniform
    over the vocabulary (references/data.py), so the token shows up in some steps, not all: each
    step's grad check covers the steps where it does."""
    index = 0 if padding == "first" else vocab - 1
    train = TrainingSpec()
    steps = [step for step in range(train.steps)
             if any((b["input_ids"] == index).any() for b in train.batches(step, 0, vocab, -100))]
    assert len(steps) >= 2, steps


@pytest.mark.parametrize("tied", [False, True])
def test_reference_padding_row_gets_no_lookup_gradient(tied):
    vocab, hidden, pad = 35, 32, 34
    ids, labels = _all_steps(vocab)
    assert (ids == pad).any()
    grads = {}
    for padding_idx in (pad, None):
        model = build_model(ModelSpec(vocab, hidden, tied=tied, padding_idx=pad), seed=3, dtype=torch.float64)
        assert torch.all(model.embed_tokens.weight[pad] == 0)  # nn.Embedding zeroes the padding row
        model.embed_tokens.padding_idx = padding_idx  # same weights, lookup gradient on or off
        loss, _ = model(ids, labels=labels)
        loss.backward()
        grads[padding_idx] = model.embed_tokens.weight.grad.clone()
    other = [r for r in range(vocab) if r != pad]
    torch.testing.assert_close(grads[pad][other], grads[None][other], rtol=0, atol=0)
    assert not torch.equal(grads[pad][pad], grads[None][pad])  # the token occurs: the lookup adds to its row
    if tied:  # the head's projection still reaches the padding row
        assert torch.any(grads[pad][pad] != 0)
    else:
        assert torch.all(grads[pad][pad] == 0)


def test_tied_case_file_covers_the_brief():
    cases = load_file(TIED_FILE)  # the brief's axes, at least: explore's findings add entries beside them
    # the upper end a size guard for CI time; 180 since the save axis (10 cases of about 2 s), the kv-head and
    # model_init entries and the bf16 switches (about 20 cases of 1-3 s)
    assert 60 <= len(cases) <= 180
    assert {c.subject for c in cases} == {"tied_row_parallel", "tied_vocab_parallel", "vocab_parallel_embedding",
                                          "tied_column_gathered"}
    for name in ("tied_row_parallel", "tied_vocab_parallel"):
        mine = [c.values for c in cases if c.subject == name]
        assert {"fp32", "bf16"} <= {v["dtype"] for v in mine}
        assert {0, 2} <= {v["zero"] for v in mine}
        assert {2, 3} <= {v["tp"] for v in mine}
        assert {"none", "first", "last"} <= {v["padding"] for v in mine}
        assert {"none", "row", "column"} <= {v["embed_spec"] for v in mine}
    row = [c.values for c in cases if c.subject == "tied_row_parallel"]
    assert {32, 35} <= {v["hidden"] for v in row}
    vocab = [c.values for c in cases if c.subject == "tied_vocab_parallel"]
    assert {34, 35} <= {v["vocab"] for v in vocab}


def test_tied_column_gathered_claims_both_replicated_and_still_tied():
    # AutoTP's tie fallback (auto_tp.py:808-864): a gathered column spec on a tied head shards nothing.
    cases = [c for c in load_file(TIED_FILE) if c.subject == "tied_column_gathered"]
    assert {2, 3} <= {c["tp"] for c in cases} and {0, 2} <= {c["zero"] for c in cases}
    assert {"lm_head", "model.lm_head", "output"} <= {c["head"] for c in cases}
    assert {"none", "row", "column"} <= {c["embed_spec"] for c in cases}
    # Those that train (not the BF16_Optimizer crash on a model left nothing TP-parallel) count no head collective.
    assert all(not c.expect.is_error and dict(c.collectives) == {"all_reduce": 0, "all_gather_into_tensor": 0}
               for c in cases if not (c.divergence and c.divergence.raises))
    subject = SUBJECTS["tied_column_gathered"]
    for case in cases:
        head, claims = case["head"], subject.claims(case.values)
        assert claims.module_types[head] == "Linear" and claims.module_types["embed_tokens"] == "Embedding"
        assert set(claims.param_shards.values()) == {None}
        assert claims.shared_params == ((f"{head}.weight", "embed_tokens.weight"),)
        specs = subject.tensor_parallel_config(case.values)["partition_config"]["layer_specs"]
        assert {"partition_type": "column", "gather_output": True}.items() <= specs[-1].items()
        assert subject.model_spec(case.values).tied


def test_tied_plan_head_is_vocab_parallel_only_for_the_hard_coded_names():
    # engine.py:1116-1125: vocab_parallel_lm_head unset turns the vocabulary-parallel head on for a tied lm_head /
    # embed_out only; any other name (or false) gets the gathered-column tie fallback.
    cases = [c for c in load_file(CASES / "hf_tp_plan.toml")
             if c.subject == "tied_plan_head" and c.values.optional("second_head", "none") == "none"]
    assert {(c["head"], c["vocab_parallel_lm_head"]) for c in cases} == {
        ("output", "unset"), ("output", "false"), ("lm_head", "unset"), ("lm_head", "false")}
    subject = SUBJECTS["tied_plan_head"]
    for case in cases:
        head, claims = case["head"], subject.claims(case.values)
        auto = head == "lm_head" and case["vocab_parallel_lm_head"] == "unset"
        assert claims.module_types[head] == ("VocabParallelLinear" if auto else "Linear"), case.id
        assert claims.param_shards["embed_tokens.weight"] == (0 if auto else None), case.id
        assert claims.shared_params == ((f"{head}.weight", "embed_tokens.weight"),)
        config = subject.tensor_parallel_config(case.values)
        assert "partition_config" not in config  # any partition_config takes the engine off the plan
        assert config.get("vocab_parallel_lm_head") is (None if case["vocab_parallel_lm_head"] == "unset" else False)
    model = subject.build(cases[0].values, torch.float32)
    assert model._tp_plan == {"embed_tokens": "embedding_rowwise", cases[0]["head"]: "colwise_gather_output"}


def test_two_tied_plan_heads_claim_both_replicated_and_tied():
    # Two qualifying tied heads: engine.py:1163-1177 catches _resolve_vocab_parallel_lm_head's ValueError on the auto
    # path and keeps them replicated; false never tries. Either way both heads stay nn.Linear on the embedding's weight.
    cases = [c for c in load_file(CASES / "hf_tp_plan.toml") if c.values.optional("second_head", "none") != "none"]
    assert {(c["vocab_parallel_lm_head"], c["dtype"]) for c in cases} == {("unset", "fp32"), ("false", "fp32"),
                                                                        ("unset", "bf16")}
    subject = SUBJECTS["tied_plan_head"]
    for case in cases:
        claims = subject.claims(case.values)
        assert claims.module_types["lm_head"] == claims.module_types["mtp.lm_head"] == "Linear", case.id
        assert claims.module_types["embed_tokens"] == "Embedding" and claims.param_shards["embed_tokens.weight"] is None
        assert set(claims.shared_params) == {("lm_head.weight", "embed_tokens.weight"),
                                             ("mtp.lm_head.weight", "embed_tokens.weight")}
    model = subject.build(cases[0].values, torch.float32)
    assert model.mtp.lm_head.weight is model.embed_tokens.weight is model.lm_head.weight
    assert model.mtp.lm_head.bias is None  # no parameter the reference lacks
    assert subject.invalid(cases[0].values.replace(head="output"))


@pytest.mark.parametrize("fact,passes", [(True, True), (False, False), (None, False)])
def test_a_broken_or_unobserved_tie_fails_the_shared_param_claim(fact, passes):
    from parity.checks.compare import Comparison
    from parity.observe.observations import RankObservations

    subject, values = SUBJECTS["tied_row_parallel"], values_of("tied_row_parallel")
    obs = {}
    for rank in range(2):
        o = RankObservations(rank, rank, 0)
        o.facts["module_types"] = dict(subject.claims(values).module_types)
        o.facts["state_at_start"] = subject.clean_state
        if fact is not None:
            o.facts["shared_params"] = {"lm_head.weight=embed_tokens.weight": fact}
        obs[rank] = o
    comparison = Comparison(subject, values, obs, reference=None, oracle=None)
    comparison.check_claims()
    shared = [c for c in comparison.checks if c.name.startswith("shared_param[")]
    assert len(shared) == 2 and all(c.passed == passes for c in shared)
    # rank_decisions needs what DeepSpeed decided on each rank, which these hand-made observations do not
    # carry (an unrecorded decision fails, by design: tests/checks/test_rank_decisions.py).
    others = [c.name for c in comparison.checks if not c.passed and not c.name.startswith("shared_param[")]
    assert others == ["rank_decisions"] * 2


def test_direct_embedding_claims_and_reference_padding():
    from references.embedding_lookup import train_lookup_reference

    subject = SUBJECTS["vocab_parallel_embedding"]
    values = resolve(subject, {"dtype": "fp32", "vocab": 35, "hidden": 32, "gas": 2, "tp": 2, "device": "cpu",
                               "padding": "last"})
    claims = subject.claims(values)
    assert claims.module_types == {"embedding": "VocabParallelEmbedding"}
    assert claims.param_shards == {"weight": 0}
    assert claims.micro_records == {"embedding": None, "loss": None}
    train = subject.training_spec(values)
    traj = train_lookup_reference(35, 32, 34, train, torch.float32, torch.float64)
    plain = train_lookup_reference(35, 32, None, train, torch.float32, torch.float64)
    assert torch.all(traj.get("weight", -1, None, None, "weight")[34] == 0)
    for step in range(train.steps):
        grad = traj.get("grad", step, None, None, "weight")
        assert torch.all(grad[34] == 0) and torch.any(grad[:34] != 0)
        assert torch.equal(traj.get("weight", step, None, None, "weight")[34], torch.zeros(32, dtype=torch.float64))
    # the padding token is looked up (rows 0..33 start equal; row 34 is zero only with padding_idx)
    assert not torch.equal(plain.get("grad", 0, None, None, "weight")[34], torch.zeros(32, dtype=torch.float64)) or \
        not torch.equal(plain.get("grad", 4, None, None, "weight")[34], torch.zeros(32, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemma3_embedding_is_the_references_twin_and_keeps_the_tie(dtype):
    """The subject hands DeepSpeed transformers' class; the reference writes its forward out. Same lookups (bf16:
    the scale rounded to bf16 first), same tied Parameter, and the scale matters (sqrt(35) is not 1)."""
    from importlib.util import find_spec

    if find_spec("transformers") is None:
        skip_or_fail("transformers is not installed (pip install -e '.[hf]'); requirements-cpu.txt pins it")
    from parity.subjects.deepspeed_tied import as_gemma3_embedding

    spec = ModelSpec(vocab=35, hidden=35, tied=True, padding_idx=34, embed_scale=True)
    reference = build_model(spec, 3, dtype)
    subject = as_gemma3_embedding(build_model(spec, 3, dtype))
    assert type(subject.embed_tokens).__name__ == "Gemma3TextScaledWordEmbedding"
    assert subject.embed_tokens.weight is subject.lm_head.weight
    assert subject.embed_tokens.padding_idx == 34 and subject.embed_tokens.embed_scale.dtype == dtype
    ids = torch.arange(35).view(5, 7)
    assert torch.equal(subject.embed_tokens(ids), reference.embed_tokens(ids))
    assert not torch.equal(reference.embed_tokens(ids), reference.embed_tokens.weight[ids])


def test_embedding_axes_reach_the_tied_models_spec():
    row, vocab = SUBJECTS["tied_row_parallel"], SUBJECTS["tied_vocab_parallel"]
    spec = row.model_spec(values_of("tied_row_parallel", grad_freq=True, embed_scale="gemma3"))
    assert spec.scale_grad_by_freq and spec.embed_scale and spec.tied
    assert build_model(spec, 1, torch.float32).embed_tokens.scale_grad_by_freq
    assert vocab.model_spec(values_of("tied_vocab_parallel", embed_scale="gemma3")).embed_scale
    assert "grad_freq" not in subject_axes(vocab)  # VocabParallelEmbedding refuses it (ds_reject tied_vocab_scale_grad)


def test_embedding_options_reach_the_spec_embeddings_model():
    # The options AutoTP's _slice_embedding must carry: they have to be on the user's model (and the reference's) for
    # their loss to show at all.
    subject = SUBJECTS["embed_spec_untied"]
    base = values_of("embed_spec_untied", embed_spec="row")
    plain = build_model(subject.model_spec(base), 1, torch.float32).embed_tokens
    assert not plain.scale_grad_by_freq and plain.max_norm is None
    spec = subject.model_spec(base.replace(grad_freq=True, max_norm=1.0))
    assert not spec.tied and spec.scale_grad_by_freq and spec.max_norm == 1.0
    embedding = build_model(spec, 1, torch.float32).embed_tokens
    assert embedding.scale_grad_by_freq and embedding.max_norm == 1.0
    ids = torch.tensor([[3, 3, 5]])
    assert embedding.weight[3].norm() > 1  # nn.Embedding's N(0, 1) rows: the lookup must renormalise them
    embedding(ids)
    assert torch.allclose(embedding.weight[3].norm(), torch.tensor(1.0)) and embedding.weight[4].norm() > 1
