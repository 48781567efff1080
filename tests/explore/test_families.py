"""`parity explore --strategy`: each family draws cases a case file makes, knows every key or argument of the
installed DeepSpeed it could draw (or says why not), and finds a planted bug of its kind and shrinks it.

The planted runs are subprocesses (PARITY_MUTANT must not leak into this process or its rank groups); the configs
family's bug is registered by tests/explore/planted.py, the others are catalog mutants only a user's input reaches."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from parity.explore import families as F
from parity.explore.domains import entry_toml, explored_case, not_a_case
from parity.matrix.cases import load_file

ROOT = Path(__file__).resolve().parents[2]


def test_every_schema_field_is_drawn_or_says_why_not():
    census = F.configs_census()
    assert not [k for k, why in census.items() if not why], census
    assert census["DeepSpeedZeroConfig.stage"] == "drawn: zero_optimization.stage"
    assert census["TPConfig.tp_grain_size"].startswith("drawn")


def test_every_entry_point_parameter_is_drawn_or_says_why_not():
    census = F.calls_census()
    assert not [k for k, why in census.items() if not why], census
    for e in F.ENTRY_POINTS:  # an axis a parameter names is one its subject declares
        for p, axes in e.params.items():
            for axis in (axes if isinstance(axes, tuple) else ()):
                assert axis in F.SUBJECTS[e.subject].axes, (e.target, p, axis)


def test_schema_values_come_from_the_installed_models():
    assert F.schema_values(f"{F.ZERO}.stage") == (0, 1, 2, 3)
    assert F.schema_values(f"{F.TP_CONFIG}:TPTrainingConfig.vocab_parallel_ce_backend") == ("torch", "liger")
    assert F.schema_values(f"{F.TP_CONFIG}:TPTrainingConfig.vocab_parallel_lm_head") == (False, True, None)
    grains = F.schema_values(f"{F.TP_CONFIG}:TPConfig.tp_grain_size", F.GRAIN_POINTS)
    assert grains[0] == 0 and 1 in grains and 64 in grains  # 0: no bound in the schema, a value no axis carries


@pytest.mark.parametrize("name", [n for n in F.FAMILIES if n != "axes"])
def test_a_family_draws_cases_its_printed_entry_makes(name, tmp_path_factory):
    family = F.FAMILIES[name]

    @settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(family.points(list(family.subjects), family.max_world))
    def check(point):
        subject, values, drawn = point
        if not_a_case(subject, values, family.max_world):
            return
        case = explored_case(subject, values)
        if name == "topologies":
            assert case.world_size > values["tp"], case.id
        if name == "configs":  # the config drawn names the tp it runs at
            assert drawn["config"]["tensor_parallel"]["autotp_size"] == values["tp"]
        path = tmp_path_factory.mktemp("entry") / "one.toml"
        path.write_text(entry_toml(subject, values, "round trip"))
        (again,) = load_file(path)
        assert again.id == case.id

    check()


def test_a_key_left_out_is_drawn_first_and_is_deepspeeds_default():
    # Shrinking moves towards the first alternative: the key left out. gradient_clipping left out is DeepSpeed's
    # default 1.0, which only column_gathered's clip_key axis carries (elsewhere the key is always written).
    groups = {g.keys: g for g in F.config_groups()}
    clip = groups[("gradient_clipping",)]
    assert clip.alternatives[0] == (F.ABSENT, {"clip": 0.0, "clip_key": "unset"})
    left_out = clip.alternatives[0][1]
    assert F._fits("column_gathered", left_out) and not F._fits("vocab_parallel", left_out)

    @settings(max_examples=20, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(F.config_points(["vocab_parallel"], 4, list(groups.values())))
    def check(point):
        subject, values, drawn = point
        assert subject == "vocab_parallel" and "clip_key" not in values
        assert ("gradient_clipping" in drawn["config"]) == (values["clip"] != 0.0) or values["clip"] == 0.0

    check()


def _explore(tmp_path, strategy, mutant, subject, max_world=2, examples=4, seed=0, modules=None):
    env = {k: v for k, v in os.environ.items() if k not in ("PARITY_MUTANT", "PARITY_SUBJECT_MODULES")}
    env["PARITY_MUTANT"] = mutant
    if modules:
        env["PARITY_SUBJECT_MODULES"] = modules
    report = tmp_path / strategy
    cmd = [sys.executable, "-m", "parity.cli", "explore", "--strategy", strategy, "--subject", subject,
           "--max-world", str(max_world), "--max-examples", str(examples), "--seed", str(seed), "--budget", "300",
           "--report", str(report)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = json.loads((report / "explore.json").read_text())
    assert summary["strategy"] == strategy and summary["stopped_by"] == "failure"
    assert f"--strategy {strategy}" in (report / "explore-failure.toml").read_text()
    return proc, summary["failure"]


def test_configs_finds_a_config_key_bug_and_shrinks_it(tmp_path):
    # A gradient_clipping the user wrote, read as half: the key left out (DeepSpeed's default) is unaffected, so the
    # shrunk case writes the key, at its smallest binding value, at the smallest sizes.
    proc, failure = _explore(tmp_path, "configs", "config_clip_written_halved", "column_gathered",
                             modules="tests.explore.planted")
    axes = failure["axes"]
    assert axes["clip"] > 0 and axes["clip_key"] == "set" and axes["tp"] == 2, failure
    assert axes["vocab"] <= 4 and axes["hidden"] <= 4, failure
    assert failure["drawn_as"]["config"]["gradient_clipping"] == axes["clip"]
    assert "drawn by --strategy configs as" in proc.stdout


def test_calls_finds_an_optional_argument_bug_and_shrinks_it(tmp_path):
    # Each chunk's targets read from row 0: only a chunk_size given, and smaller than the tokens, reaches it.
    _, failure = _explore(tmp_path, "calls", "fused_ce_chunk_targets_from_row0", "ds_fused_linear_ce")
    axes = failure["axes"]
    assert 1 <= axes["chunk"] <= 12 and axes["tp"] == 2 and axes["vocab"] <= 8, failure


def test_structures_finds_a_tie_bug_and_shrinks_it(tmp_path):
    # AutoTP's tie fallback unties the replicated head from the embedding: every tied structure reaches it.
    _, failure = _explore(tmp_path, "structures", "tie_fallback_unties", "tied_column_gathered")
    axes = failure["axes"]
    assert axes["tp"] == 2 and axes["vocab"] <= 4 and axes["hidden"] <= 4, failure


def test_topologies_finds_a_world_group_bug_and_shrinks_it(tmp_path):
    # The column backward all-reduces over the world instead of the TP group: invisible at dp 1 (the world is the
    # TP group), which the topologies family never draws.
    _, failure = _explore(tmp_path, "topologies", "column_backward_world_group", "column_gathered", max_world=4)
    axes = failure["axes"]
    assert axes["tp"] == 2 and axes["dp"] == 2 and axes["vocab"] <= 4, failure


def test_a_subject_the_strategy_does_not_draw_is_a_one_line_usage_error():
    proc = subprocess.run([sys.executable, "-m", "parity.cli", "explore", "--strategy", "topologies", "--subject",
                           "ds_vocab_logprobs", "--budget", "1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "topologies" in line]
    assert len(lines) == 1 and "--subject ds_vocab_logprobs" in lines[0] and "does not draw it" in lines[0]
    assert "ds_vocab_logprobs" in F.no_wider_world()
