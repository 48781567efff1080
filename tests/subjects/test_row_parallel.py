"""The row_parallel subject's claims, read through the suite's own partition formula (no ranks)."""
from pathlib import Path

import numpy as np
import pytest

from parity.matrix.cases import load_file
from parity.checks.compare import _take
from parity.observe.partition import shard_sizes, shard_slice
from parity.subjects import SUBJECTS
from parity.subjects.values import resolve

ROW_FILE = Path(__file__).resolve().parents[2] / "cases" / "deepspeed_row_head.toml"


@pytest.mark.parametrize("head", ["lm_head", "embed_out"])
@pytest.mark.parametrize("hidden,tp,widths", [(32, 2, [16, 16]), (35, 2, [18, 17]), (32, 3, [11, 11, 10]),
                                              (35, 3, [12, 12, 11])])
def test_claims_shard_weight_along_hidden_and_replicate_bias(head, hidden, tp, widths):
    subject = SUBJECTS["row_parallel"]
    values = resolve(subject, {"head": head})
    claims = subject.claims(values)
    assert claims.param_shards == {f"{head}.weight": 1, f"{head}.bias": None}
    assert claims.micro_records["logits"] is None and claims.loss_backend is None
    assert claims.module_types[head] == "LinearAllreduceWithReplicatedInput"
    specs = subject.tensor_parallel_config(values)["partition_config"]["layer_specs"]
    assert {"patterns": [rf"{head}\.weight$"], "partition_type": "row"} in specs

    vocab = 35
    weight = np.arange(vocab * hidden, dtype=np.float64).reshape(vocab, hidden)
    bias = np.arange(vocab, dtype=np.float64)
    assert shard_sizes(hidden, tp) == widths
    shards = [_take(weight, claims.param_shards[f"{head}.weight"], hidden, tp, r) for r in range(tp)]
    assert [s.shape for s in shards] == [(vocab, w) for w in widths]
    for r, s in enumerate(shards):
        np.testing.assert_array_equal(s, weight[:, shard_slice(hidden, tp, r)])
    np.testing.assert_array_equal(np.concatenate(shards, axis=1), weight)
    for r in range(tp):  # the bias is compared whole on every rank
        np.testing.assert_array_equal(_take(bias, claims.param_shards[f"{head}.bias"], 0, tp, r), bias)


def test_row_case_file_covers_uneven_hidden_at_tp2_and_tp3():
    cases = load_file(ROW_FILE)
    assert 0 < len(cases) <= 170  # a size guard for CI time, not a coverage limit
    assert {c.subject for c in cases} == {"row_parallel"}
    seen = {(c.values["tp"], c.values["hidden"]) for c in cases}
    assert {(2, 32), (2, 35), (3, 32), (3, 35)} <= seen
    assert {c.values["reduction"] for c in cases} == {"none", "sum", "mean", "num_items"}
    # 4: tp 2 x dp 2, the empty row shard's ZeRO 3 cases (a ValueError with a bias there)
    assert {c.world_size for c in cases} == {2, 3, 4}


def test_flat_head_input_reaches_the_head_flattened_and_changes_nothing_else():
    import torch

    from references.tiny_lm import ModelSpec, build_model, capture_head_input_and_grad

    ids = torch.randint(0, 35, (2, 5), generator=torch.Generator().manual_seed(0))
    labels = ids.roll(-1, dims=1)
    out = {}
    for layout in ("sequence", "flat"):
        model = build_model(ModelSpec(35, 32, reduction="sum", head_input=layout), seed=3, dtype=torch.float64)
        seen, sink = [], {}
        model.head.register_forward_pre_hook(lambda m, args: seen.append(tuple(args[0].shape)))
        capture_head_input_and_grad(model, sink)
        loss, logits = model(ids, labels=labels)
        loss.backward()
        out[layout] = (loss.detach(), logits.detach(), sink["h"])
        assert seen == [(2, 5, 32)] if layout == "sequence" else seen == [(10, 32)]
        assert logits.shape == (2, 5, 35)
    torch.testing.assert_close(out["flat"][0], out["sequence"][0], rtol=0, atol=1e-12)
    torch.testing.assert_close(out["flat"][1], out["sequence"][1], rtol=0, atol=1e-12)
    torch.testing.assert_close(out["flat"][2].reshape(2, 5, 32), out["sequence"][2], rtol=0, atol=1e-12)
