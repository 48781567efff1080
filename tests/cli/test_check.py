"""`parity check`: a user's architecture and DeepSpeed config -> one zoo case, run as `parity run` runs it.

Three architectures under user-written configs (tests/cli/check_configs/), each run end to end; every bad input a
one-line error naming its file and key, exit 2, before anything runs."""
from __future__ import annotations

import json
from importlib.util import find_spec
from dataclasses import replace
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
    ({"tensor_parallel": {"autotp_size": 4}}, "key 'tensor_parallel.autotp_size' = 4 cannot be honoured: zoo_hf_plan "
                                              "runs 2, 3"),
    ({"tensor_parallel": {"autotp_size": 2, "tp_size": 4}}, "key 'tensor_parallel.tp_size' = 4 differs"),
    ({"tensor_parallel": {"autotp_size": 2, "vocab_parallel_lm_head": "yes"}},
     "key 'tensor_parallel.vocab_parallel_lm_head' = 'yes': want true or false"),
    ({"tensor_parallel": {"preset_model": "qwen2"}}, "key 'tensor_parallel.preset_model' = 'qwen2' cannot be honoured: "
                                                    "llama's preset is 'llama'"),
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
    assert "key '--tp' = 4 cannot be honoured: zoo_hf_plan runs 2, 3 (its tp axis)" in one_line_error(
        capsys, ["check", "--arch", "llama", "--ds-config", path, "--tp", "4"])


@pytest.mark.parametrize("arch, tensor_parallel, case_id", [
    # preset_model: the arch's own family -> zoo_preset, vocab_parallel_lm_head its axis (false when left out)
    ("llama", {"preset_model": "llama"}, "zoo_preset-arch_llama-v125-fp32-zero0-gas2-tp3-clip1-cpu-vplm_false"),
    ("qwen2", {"preset_model": "qwen2", "vocab_parallel_lm_head": True},
     "zoo_preset-arch_qwen2-v125-fp32-zero0-gas2-tp3-clip1-cpu-vplm_true"),
    # no HF plan (gpt2): where DeepSpeed sends it, the heuristic parser
    ("gpt2", {}, "zoo_heuristic-arch_gpt2-v125-fp32-zero0-gas2-tp3-clip1-cpu-vplm_false"),
    ("gpt2", {"vocab_parallel_lm_head": True}, "zoo_heuristic-arch_gpt2-v125-fp32-zero0-gas2-tp3-clip1-cpu-vplm_true"),
    # a plan: true is the vocab-parallel subject; false where the plan's own choice is already false is the plan path
    ("llama", {"vocab_parallel_lm_head": True}, "zoo_vocab_parallel-arch_llama-v125-fp32-zero0-gas2-tp3-clip1-cpu"),
    ("llama", {"vocab_parallel_lm_head": False}, "zoo_hf_plan-arch_llama-v125-fp32-zero0-gas2-tp3-clip1-cpu"),
])
def test_the_tensor_parallel_section_picks_the_path(arch, tensor_parallel, case_id):
    needs_transformers()
    config = {"tensor_parallel": {"autotp_size": 3, **tensor_parallel}, "zero_optimization": {"stage": 0}}
    assert translate(config, "ds.json", arch).case.id == case_id


@pytest.mark.parametrize("arch, tensor_parallel, says", [
    ("mistral", {"preset_model": "llama"}, "= 'llama' cannot be honoured: mistral is no AutoTP preset family"),
    ("phi3", {"preset_model": "llama"}, "= 'llama' cannot be honoured: phi3's preset is 'phi3'"),
    # cohere's plan (tied, embedding_rowwise) is vocabulary-parallel on DeepSpeed's own: false would change it
    ("cohere", {"vocab_parallel_lm_head": False}, "= False cannot be honoured: cohere's plan"),
])
def test_a_tensor_parallel_path_that_cannot_be_honoured_names_its_key(arch, tensor_parallel, says):
    needs_transformers()
    with pytest.raises(UserConfigError, match=f"key 'tensor_parallel.{next(iter(tensor_parallel))}' "):
        try:
            translate({"tensor_parallel": tensor_parallel}, "ds.json", arch)
        except UserConfigError as exc:
            assert says in str(exc) and "\n" not in str(exc), exc
            raise


# A Llama-3-style config.json: GQA (32 heads over 8 kv heads), untied, a 128256 vocabulary and its own token ids.
LLAMA3 = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
          "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
          "vocab_size": 128256, "tie_word_embeddings": False, "max_position_embeddings": 8192,
          "rope_theta": 500000.0, "bos_token_id": 128000, "eos_token_id": 128001, "rms_norm_eps": 1e-5}


@pytest.fixture
def store(tmp_path, monkeypatch):
    """The arch_config store in a temporary folder (the ranks inherit the variable)."""
    monkeypatch.setenv("PARITY_ARCH_CONFIGS", str(tmp_path / "store"))
    return tmp_path / "store"


def test_a_users_config_json_is_shrunk_keeping_its_structure_and_carried_into_the_case(tmp_path, store):
    needs_transformers()
    from references import zoo

    folder = tmp_path / "llama3"
    folder.mkdir()
    _write(folder, LLAMA3, "config.json")
    arch, name, notes = resolve_arch(str(folder))  # the folder holding it
    assert arch == "llama" and name.startswith("llama3_") and (store / f"{name}.json").is_file()
    assert resolve_arch(str(folder / "config.json"))[1] == name  # its content names it: stable
    small = zoo.tiny_config("llama", user=name)
    assert (small.num_attention_heads, small.num_key_value_heads, small.vocab_size) == (8, 2, zoo.VOCAB)
    assert zoo.structure(small) == zoo.structure(zoo.config_from_dict(LLAMA3))  # GQA4, untied
    assert "GQA4" in notes[0]
    case = translate({"zero_optimization": {"stage": 2}}, "ds.json", arch, user=name).case
    assert case.id == f"zoo_hf_plan-arch_llama-cfg_{name}-v125-fp32-zero2-gas2-tp2-clip1-cpu"
    assert case.values["arch_config"] == name
    assert translate({}, "ds.json", "llama").case.id == "zoo_hf_plan-arch_llama-v125-fp32-zero0-gas2-tp2-clip1-cpu"
    different = _write(tmp_path, {**LLAMA3, "num_key_value_heads": 32}, "mha.json")
    assert resolve_arch(different)[1] != name
    with pytest.raises(UserConfigError, match="key 'model_type' = 'nosuch'"):
        resolve_arch(_write(tmp_path, {**LLAMA3, "model_type": "nosuch"}, "bad.json"))
    with pytest.raises(UserConfigError, match="key 'vocab_size' = 100: the check runs a vocabulary of 125"):
        resolve_arch(_write(tmp_path, {**LLAMA3, "vocab_size": 100}, "small.json"))


def test_an_unmarked_failure_reads_diverged_only_where_an_admitting_mark_explains_every_failed_check():
    from parity.checks.compare import Check
    from parity.explore.known import Marks
    from parity.harness.runner import _admitted_verdict

    case = translate({"bf16": {"enabled": True}, "zero_optimization": {"stage": 0}, "gradient_clipping": 1.0,
                      "gradient_accumulation_steps": 1}, "ds.json", "llama").case
    assert case.source.startswith("--ds-config")  # no case file holds it
    marks = Marks().candidates(case)
    names = {m.divergence.name for m in marks}
    assert {"deepspeed_unfused_grad_norm_tp", "deepspeed_safe_get_full_grad_dtype"} <= names
    case = replace(case, admitted=tuple((m.source, m.divergence) for m in marks))
    ok = Check("loss", True, measured=0.0, bound=1.0)
    both = [ok, Check("contract[grad]", False), Check("sgd_update[lm_head.weight]", False, 0, measured=2.0, bound=1.0)]
    verdict = _admitted_verdict(case, both, strict=False)
    assert verdict.status == "diverged" and "mark of cases/zoo.toml" in verdict.reason
    assert _admitted_verdict(case, [ok, Check("module_type[lm_head]", False)], strict=False) is None
    fp32 = translate({"gradient_clipping": 1.0}, "ds.json", "llama").case
    assert not [m for m in Marks().candidates(fp32) if m.divergence.name == "deepspeed_unfused_grad_norm_tp"]


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


def test_check_runs_a_users_config_json_and_judges_it_by_the_marks_that_admit_it(capsys, tmp_path, store):
    # A user's Llama-3 config.json (GQA) in bf16 under ZeRO 0, clipped at 1.0, one micro-batch: no case file holds the
    # case; the marks whose scope admits it (unfused_grad_norm_tp, zero0_grad_dtype) explain every failed check.
    needs_transformers()
    arch = _write(tmp_path, LLAMA3, "llama3.json")
    report = tmp_path / "report"
    status = main(["check", "--arch", arch, "--ds-config", str(CONFIGS / "llama3_bf16_zero0_clip.json"),
                   "--report", str(report)])
    out = capsys.readouterr().out
    name = resolve_arch(arch)[1]
    case_id = f"zoo_hf_plan-arch_llama-cfg_{name}-v125-bf16-zero0-gas1-tp2-clip1-cpu"
    assert f"verdict: diverged: {case_id}; report: {report}/summary.md" in out, out[-3000:]
    assert status == 0
    [case] = json.loads((report / "summary.json").read_text())["cases"]
    assert case["findings"] == {"deepspeed_safe_get_full_grad_dtype": "present",
                                "deepspeed_unfused_grad_norm_tp": "present"}
