"""A tiny Triton kernel of the suite's own, run in Triton's interpreter by capabilities.py in a child
process (``python triton_probe.py``): if it fails, Liger's kernels would fail the same way on CPU, and
the Liger CPU cases are skips that say so rather than failures blamed on Liger.

It uses what Liger's vocabulary-parallel CE kernels use: scalar arguments (an int used as a loop
bound and an offset, a float), a data-dependent ``if`` on a loaded scalar, ``tl.arange`` with a
masked ``tl.load``, ``tl.max``/``tl.sum``/``tl.where``/``tl.exp`` and a loop over blocks ending in
``tl.store``. Triton 3.6's interpreter turns a scalar argument into a one-element array and
``int()``s it for ``range``, which numpy >= 2.4 refuses ("only 0-dimensional arrays can be
converted to Python scalars"): that is what this catches. Imports nothing from the suite.
"""
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: kernels are bound at definition

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _shifted_logsumexp(x_ptr, stride, target_ptr, out_ptr, n_cols, offset, scale, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_ptr += row * stride
    target = tl.load(target_ptr + row)
    m = float("-inf")
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        block = tl.load(x_ptr + cols, mask=cols < n_cols, other=float("-inf")).cast(tl.float32)
        m = tl.maximum(m, tl.max(block))
    total = 0.0
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        block = tl.load(x_ptr + cols, mask=mask, other=0.0).cast(tl.float32)
        total += tl.sum(tl.where(mask, tl.exp(block - m), 0.0))
    if target < 0:
        picked = 0.0
    else:
        picked = tl.load(x_ptr + target - offset).cast(tl.float32)
    tl.store(out_ptr + row, (m + tl.log(total) - picked) * scale)


def main() -> int:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 37, generator=gen)
    target = torch.tensor([5, -1, 36])
    out = torch.empty(3)
    _shifted_logsumexp[(3,)](x, x.stride(0), target, out, 37, 0, 0.5, BLOCK=16)
    xs = x.double().numpy()
    lse = np.log(np.exp(xs - xs.max(1, keepdims=True)).sum(1)) + xs.max(1)
    picked = np.array([xs[0, 5], 0.0, xs[2, 36]])
    expected = (lse - picked) * 0.5
    if not np.allclose(out.numpy(), expected, rtol=1e-5, atol=1e-5):
        print(f"wrong result: {out.tolist()} != {expected.tolist()}", file=sys.stderr)
        return 1
    print(f"ok triton {triton.__version__} numpy {np.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
