"""transformers 5.24: two from_pretrained calls in two threads of one process leave process globals replaced.

from_pretrained builds the model under save-and-restore context managers that swap process-wide state
(modeling_utils.get_init_context): local_torch_dtype (torch.set_default_dtype), initialization.no_tie_weights
(PreTrainedModel.tie_weights = a no-op) and others. Interleaved in two threads, the second to enter saves the
first's replacement as "the original" and puts it back on exit: PreTrainedModel.tie_weights stays a no-op, or
the default dtype stays another load's, for the rest of the process. Every later load of a tied model then
reports its head MISSING and gives it fresh random weights apart from the embedding; the load only prints a
report. A user who loads two models at once (a server, an evaluation thread beside training) meets it.

Run (CPU, one process, about a minute at most): python ci/repro/transformers_from_pretrained_threads_leave_globals.py
Exit status 1 while a later, sequential load is left untied or the globals stay replaced; 0 once they are
restored.

Finding: findings/transformers_from_pretrained_threads_leave_globals.toml
"""
import sys
import tempfile
import threading

import torch
from transformers import AutoModelForCausalLM, LlamaConfig
from transformers.modeling_utils import PreTrainedModel

TIE_WEIGHTS = PreTrainedModel.tie_weights


def checkpoint(directory: str) -> None:
    config = LlamaConfig(vocab_size=125, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)


def load(directory: str, dtype: torch.dtype):
    return AutoModelForCausalLM.from_pretrained(directory, dtype=dtype)


def tied(model) -> bool:
    return model.get_output_embeddings().weight is model.get_input_embeddings().weight


def main() -> int:
    with tempfile.TemporaryDirectory() as directory:
        checkpoint(directory)
        alone = load(directory, torch.float32)  # one load at a time: tied, globals put back
        print(f"one load at a time: head tied {tied(alone)}, default dtype {torch.get_default_dtype()}")
        for attempt in range(1, 21):  # rounds of two threads at once, until a round leaves the globals replaced
            threads = [threading.Thread(target=lambda d=dtype: [load(directory, d) for _ in range(2)])
                       for dtype in (torch.bfloat16, torch.float32)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if PreTrainedModel.tie_weights is not TIE_WEIGHTS or torch.get_default_dtype() != torch.float32:
                break
        left = {"PreTrainedModel.tie_weights": PreTrainedModel.tie_weights.__qualname__,
                "default dtype": str(torch.get_default_dtype())}
        print(f"after {attempt} rounds of loads in two threads: {left}")
        later = load(directory, torch.float32)  # one load, nothing else running
        wrong = [n for n, p in later.named_parameters() if p.dtype != torch.float32]
        print(f"a later load alone: head tied {tied(later)}, parameters not float32: {len(wrong)}")
    return 1 if not tied(later) or wrong or left["default dtype"] != "torch.float32" else 0


if __name__ == "__main__":
    sys.exit(main())
