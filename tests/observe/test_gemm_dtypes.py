"""parity/observe/gemm_dtypes.py sees the precision the matrix products of a call really took."""
import torch

from parity.observe import gemm_dtypes


def test_autocast_linear_forward_and_backward_are_seen_in_bf16():
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(6, 8, requires_grad=True)
    with gemm_dtypes.recording(torch.bfloat16) as seen:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = torch.nn.functional.linear(x, w)
        y.float().sum().backward()
    assert seen == {"bfloat16"}


def test_a_float32_product_is_float32_unless_its_values_are_the_expected_dtype():
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    with gemm_dtypes.recording(torch.bfloat16) as seen:
        a @ b
    assert seen == {"float32"}
    # Upcast bf16 values multiplied in float32 (DeepSpeed's fused CE without a mixed-dtype GEMM) count as bf16.
    with gemm_dtypes.recording(torch.bfloat16) as seen:
        torch.zeros(4, 3).addmm_(a.bfloat16().float(), b.bfloat16().float())
    assert seen == {"bfloat16"}


def test_fused_ce_claims_the_autocast_gemm_dtype_only_under_autocast():
    from parity.subjects import SUBJECTS
    from parity.subjects.values import resolve

    subject = SUBJECTS["ds_fused_linear_ce"]
    values = resolve(subject, {"dtype": "fp32", "reduction": "mean", "vocab": 35, "bias": True, "chunk": 0,
                               "ignore": "scattered", "tp": 2, "device": "cpu"})
    assert subject.claims(values).gemm_dtype is None
    on = values.replace(autocast="bf16")
    assert subject.claims(on).gemm_dtype == "bfloat16" and subject.claims(on).stage_local
    assert subject.invalid(on) is None
    assert subject.invalid(on.replace(dtype="bf16")) is not None
