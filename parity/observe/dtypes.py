"""The case file's dtype names and the torch dtypes they stand for, shared by subjects and checks."""
import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
