"""`parity check`: a user's architecture and DeepSpeed config -> one zoo case, run as `parity run` runs it.

Three architectures under user-written configs (tests/cli/check_configs/), each run end to end; every bad input a
one-line error naming its file and key, exit 2, before anything runs."""
from __future__ import annotations

import json
from importlib.util import find_spec
from pathlib import Path

import pytest

from parity.cli import main
from parity.matrix.user_config import KEYS, UserConfigError, leaves, resolve_arch, translate
from tests.conftest import skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "tests" / "cli" / "check_configs"
LLAMA = str(CONFIGS / "llama_zero0.json")

# (architecture, config, the case it must become, the verdict it gets here)
RUNS = [
    ("llama", "llama_zero0.json", "zoo_hf_plan-arch_llama-v125-fp32-zero0-gas2-tp2-clip1-cpu", "passed"),
    ("qwen2", "qwen2_bf16_zero2_vocab.json", "zoo_vocab_parallel-arch_qwen2-v125-bf16-zero2-gas1-tp2-clip1-cpu",
     "passed"),
    ("cohere", "cohere_zero2.json", "zoo_hf_plan-arch_cohere-v125-fp32-zero2-gas1-tp2-clip1-cpu", "passed"),
]


def needs_transformers():
    if find_spec("transformers") is None:
        skip_or_fail("transformers is not installed (pip install -e '.[hf]'): the zoo cannot build a model")


def one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def _write(tmp_path, config, name="ds.json") -> str:
    path = tmp_path / name
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    return str(path)


@pytest.mark.parametrize("arch, config, case_id, verdict", RUNS)
def test_each_config_becomes_its_case(arch, config, case_id, verdict):
    path = str(CONFIGS / config)
    assert translate(json.loads(Path(path).read_text()), path, arch).case.id == case_id


def test_an_absent_gradient_clipping_runs_deepspeeds_default_and_says_so():
    translated = translate({"zero_optimization": {"stage": 0}}, "ds.json", "llama")
    assert translated.case.values["clip"] == 1.0
    assert any("deepspeed_default_gradient_clipping" in n for n in translated.notes)


def test_a_case_the_case_files_hold_takes_their_marks():
    # bf16 at ZeRO 0, gas 2, clip 0: cases/zoo.toml's case, marked zero0_grad_dtype there.
    translated = translate({"bf16": {"enabled": True}, "gradient_clipping": 0.0}, "ds.json", "llama")
    assert translated.case.source.startswith("cases/zoo.toml")
    assert translated.case.divergence is not None


def test_every_honoured_key_is_in_the_table_once():
    assert all(k.count(".") <= 2 for k in KEYS)
    assert [k for k, _ in leaves({"a": {"b": 1, "c": {}}, "d": 2})] == ["a.b", "a.c", "d"]


@pytest.mark.parametrize("config, says", [
    ({"optimizer": {"type": "AdamW", "params": {"betas": [0.9, 0.95]}}}, "key 'optimizer.type' cannot be honoured"),
    ({"scheduler": {"type": "WarmupLR"}}, "key 'scheduler.type' cannot be honoured"),
    ({"zero_optimization": {"stage": 2, "overlap_comm": True}}, "key 'zero_optimization.overlap_comm' cannot"),
    ({"train_micro_batch_size_per_gpu": "auto"}, "key 'train_micro_batch_size_per_gpu' = 'auto' cannot"),
    ({"train_micro_batch_size_per_gpu": 8}, "key 'train_micro_batch_size_per_gpu' = 8 cannot be honoured: the check "
                                            "runs 2"),
    ({"train_batch_size": 16, "gradient_accumulation_steps": 2}, "key 'train_batch_size' = 16 cannot be honoured"),
    ({"zero_optimization": {"stage": 3}}, "key 'zero_optimization.stage' = 3 cannot be honoured: zoo_hf_plan runs "
                                          "0, 2"),
    ({"gradient_accumulation_steps": 3}, "key 'gradient_accumulation_steps' = 3 cannot be honoured"),
    ({"gradient_clipping": 0.5}, "key 'gradient_clipping' = 0.5 cannot be honoured"),
    ({"fp16": {"enabled": True}}, "key 'fp16.enabled' = 'fp16' cannot be honoured: zoo_hf_plan runs 'fp32', 'bf16'"),
    ({"bf16": {"enabled": True}, "fp16": {"enabled": True}}, "two precision sections enabled"),
    ({"bf16": {"enabled": True, "immediate_grad_update": True}}, "key 'bf16.immediate_grad_update' cannot"),
    ({"tensor_parallel": {"autotp_size": 3}}, "key 'tensor_parallel.autotp_size' = 3 cannot be honoured: zoo_hf_plan "
                                              "runs 2"),
    ({"tensor_parallel": {"autotp_size": 2, "tp_size": 4}}, "key 'tensor_parallel.tp_size' = 4 differs"),
    ({"tensor_parallel": {"autotp_size": 2, "vocab_parallel_lm_head": False}},
     "key 'tensor_parallel.vocab_parallel_lm_head' = False cannot be honoured"),
    ({"tensor_parallel": {"autotp_size": 2, "tp_overlap_comm": True}}, "key 'tensor_parallel.tp_overlap_comm' = True"),
    ([1, 2], "not a JSON object"),
    ("{", "not JSON"),
])
def test_a_config_it_cannot_honour_is_one_line_naming_the_key(capsys, tmp_path, config, says):
    path = _write(tmp_path, config)
    err = one_line_error(capsys, ["check", "--arch", "llama", "--ds-config", path])
    assert f"--ds-config {path}: " in err and says in err, err


@pytest.mark.parametrize("argv, says", [
    (["--arch", "nosuch_arch", "--ds-config", LLAMA], "--arch nosuch_arch: neither a causal-LM model_type"),
    (["--arch", "llama", "--ds-config", "/nonexistent/ds.json"], "--ds-config /nonexistent/ds.json: cannot read it"),
    (["--arch", "llama", "--ds-config", LLAMA, "--tp", "two"], "--tp two: want a positive integer"),
    (["--arch", "llama", "--ds-config", LLAMA, "--tp", "0"], "--tp 0: want a positive integer"),
    (["--arch", "llama", "--ds-config", LLAMA, "--tp", "4"], "key 'tensor_parallel.autotp_size' = 2 differs from "
                                                             "--tp 4"),
    (["--arch", "llama", "--ds-config", str(CONFIGS / "qwen2_bf16_zero2_vocab.json"), "--dtype", "fp32"],
     "key 'bf16.enabled' asks for bf16, --dtype fp32"),
])
def test_bad_command_line_is_one_line(capsys, argv, says):
    assert says in one_line_error(capsys, ["check", *argv])


def test_tp_that_the_subject_does_not_run_is_refused(capsys, tmp_path):
    path = _write(tmp_path, {"zero_optimization": {"stage": 0}})
    assert "key '--tp' = 3 cannot be honoured: zoo_hf_plan runs 2 (its tp axis)" in one_line_error(
        capsys, ["check", "--arch", "llama", "--ds-config", path, "--tp", "3"])


def test_a_config_json_of_the_same_structure_is_its_model_type(tmp_path):
    needs_transformers()
    base = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
            "intermediate_size": 11008, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
            "vocab_size": 32000, "tie_word_embeddings": False, "max_position_embeddings": 4096}
    assert resolve_arch(_write(tmp_path, base, "config.json"))[0] == "llama"
    assert resolve_arch(str(tmp_path))[0] == "llama"  # the folder holding it
    gqa = _write(tmp_path, {**base, "num_key_value_heads": 8}, "gqa.json")
    with pytest.raises(UserConfigError, match="heads of this config shrunk is 8, of the zoo.s tiny llama 4"):
        resolve_arch(gqa)
    with pytest.raises(UserConfigError, match="key 'model_type' = 'nosuch'"):
        resolve_arch(_write(tmp_path, {**base, "model_type": "nosuch"}, "bad.json"))


@pytest.mark.parametrize("arch, config, case_id, verdict", RUNS)
def test_check_runs_the_case_and_reports(capsys, tmp_path, arch, config, case_id, verdict):
    needs_transformers()
    report = tmp_path / "report"
    status = main(["check", "--arch", arch, "--ds-config", str(CONFIGS / config), "--report", str(report)])
    out = capsys.readouterr().out
    assert f"verdict: {verdict}: {case_id}; report: {report}/summary.md" in out, out[-3000:]
    assert status == (1 if verdict == "failed" else 0)
    summary = json.loads((report / "summary.json").read_text())
    assert [(c["id"], c["verdict"]) for c in summary["cases"]] == [(case_id, verdict)]


def test_the_docs_page_names_every_honoured_key():
    text = (ROOT / "docs" / "check.md").read_text()
    assert [k for k in KEYS if f"`{k}`" not in text] == []


def test_the_case_file_it_writes_makes_the_same_case(tmp_path):
    from parity.matrix.cases import load_file
    from parity.matrix.user_config import case_toml

    case = translate({"gradient_accumulation_steps": 1, "gradient_clipping": 0.05}, "ds.json", "qwen2").case
    path = tmp_path / "check.toml"
    path.write_text(case_toml(case, "parity check --arch qwen2"))
    [again] = load_file(path)
    assert (again.id, again.values) == (case.id, case.values)
