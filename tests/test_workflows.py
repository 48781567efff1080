"""The GitHub Actions workflows (ci/workflows/, or .github/workflows/ once enabled): valid YAML, valid
against GitHub's workflow schema, and true to the repo: files they run exist, every case file with
CPU cases has its CPU job, strict mode is on, and the CPU jobs run the GPU runner's pytest command."""
import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from parity.matrix.cases import default_files, load
from tests.conftest import skip_or_fail

ROOT = Path(__file__).resolve().parent.parent
LOCATIONS = (ROOT / ".github" / "workflows", ROOT / "ci" / "workflows")
REPO_FILE_SUFFIXES = (".py", ".sh", ".toml", ".txt", ".yml", ".yaml", ".cfg")
# Paths the jobs create: outputs, and the venv ci/setup.sh makes.
CREATED_PREFIXES = ("reports/", ".venv/")
EXPRESSION = re.compile(r"\$\{\{[^}]*\}\}")


def workflow_files() -> list[Path]:
    found = [d for d in LOCATIONS if d.is_dir() and list(d.glob("*.y*ml"))]
    assert len(found) == 1, f"workflows must live in exactly one of {[str(d) for d in LOCATIONS]}; found {found}"
    return sorted(found[0].glob("*.y*ml"))


def load_workflow(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    # YAML 1.1 (PyYAML) reads the key `on` as True.
    if True in data:
        data["on"] = data.pop(True)
    return data


def runs(workflow: dict):
    for job_id, job in workflow["jobs"].items():
        for step in job.get("steps", []):
            if "run" in step:
                yield job_id, step["run"]


def missing_repo_files(workflow: dict, root: Path = ROOT) -> list[str]:
    """Tokens of run: lines (and matrix paths) that name a repo file or directory that is not there."""
    problems = []
    named = [(job_id, token) for job_id, run in runs(workflow)
             for token in shlex.split(EXPRESSION.sub("", run), comments=True)]
    for job_id, job in workflow["jobs"].items():
        for entry in job.get("strategy", {}).get("matrix", {}).get("include", []):
            named.append((job_id, entry.get("path", "")))
    top_level = {p.name for p in root.iterdir() if p.is_dir()}
    for job_id, token in named:
        token = token.split("=", 1)[-1] if token.startswith("--") else token
        if not token or token.startswith(("-", "$")) or token.startswith(CREATED_PREFIXES):
            continue
        looks_like_file = token.endswith(REPO_FILE_SUFFIXES) and "/" in token
        under_repo_dir = "/" in token and token.split("/", 1)[0] in top_level
        if (looks_like_file or under_repo_dir or token in top_level) and not (root / token).exists():
            problems.append(f"job {job_id}: {token} does not exist")
    return problems


def expected_cpu_families(case_files) -> set[str]:
    """Case files with at least one CPU case; a file of cuda cases only is run by the gpu job alone."""
    return {Path(f).stem for f in case_files if any("gpu" not in c.markers for c in load([f]))}


def family_problems(workflow: dict, case_files) -> list[str]:
    entries = workflow["jobs"]["cpu"]["strategy"]["matrix"]["include"]
    listed = {Path(e["path"]).stem for e in entries if e["path"].startswith("cases/")}
    expected = expected_cpu_families(case_files)
    problems = [f"cases/{name}.toml has CPU cases but no entry in the cpu job's matrix" for name in sorted(expected - listed)]
    problems += [f"the cpu job's matrix lists {name}, which is not a case file with CPU cases"
                 for name in sorted(listed - expected)]
    if not any(e["path"] == "tests" for e in entries):
        problems.append("the cpu job's matrix has no self-tests entry (path: tests)")
    return problems


def strict_problems(workflow: dict) -> list[str]:
    problems = []
    for job_id, job in workflow["jobs"].items():
        env = {**workflow.get("env", {}), **job.get("env", {})}
        for _, run in runs({"jobs": {job_id: job}}):
            tokens = shlex.split(EXPRESSION.sub("", run))
            if "pytest" in tokens:
                if str(env.get("PARITY_STRICT")) != "1":
                    problems.append(f"job {job_id}: pytest runs without PARITY_STRICT=1")
                if "-m" not in tokens[tokens.index("pytest") + 1:]:
                    problems.append(f"job {job_id}: pytest without -m (cuda cases would fail strict CPU runs)")
    return problems


def _workflow() -> dict:
    (path,) = [p for p in workflow_files() if p.stem == "parity"]
    return load_workflow(path)


def _modal_runner():
    spec = importlib.util.spec_from_file_location("modal_runner", ROOT / "ci" / "modal_runner.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_workflows_parse_and_have_jobs():
    for path in workflow_files():
        data = load_workflow(path)
        assert data["on"] and data["jobs"], path


def test_workflows_match_githubs_schema(tmp_path):
    if importlib.util.find_spec("check_jsonschema") is None:
        skip_or_fail("check-jsonschema is not installed (requirements-cpu.txt pins it)")
    cmd = [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows"]
    proc = subprocess.run(cmd + [str(p) for p in workflow_files()], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The validator can fail: a misspelt key in a job is rejected.
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    stepz: []\n")
    proc = subprocess.run(cmd + [str(bad)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "stepz" in proc.stdout, proc.stdout + proc.stderr


def test_run_lines_name_existing_files():
    for path in workflow_files():
        assert missing_repo_files(load_workflow(path)) == [], path
    broken = {"jobs": {"x": {"steps": [{"run": "bash ci/setup.sh && python ci/no_such_runner.py --json reports/a.json"}],
                             "strategy": {"matrix": {"include": [{"path": "cases/no_such.toml"}]}}}}}
    assert missing_repo_files(broken) == ["job x: ci/no_such_runner.py does not exist",
                                          "job x: cases/no_such.toml does not exist"]


def test_every_case_file_has_a_job(tmp_path):
    workflow = _workflow()
    assert family_problems(workflow, default_files()) == []
    # A new case file with CPU cases and no matrix entry fails.
    new = tmp_path / "cases" / "new_family.toml"
    new.parent.mkdir()
    new.write_text((ROOT / "cases" / "deepspeed_rejects.toml").read_text())
    assert family_problems(workflow, [*default_files(), new]) == [
        "cases/new_family.toml has CPU cases but no entry in the cpu job's matrix"]
    # Files of cuda cases only run in the gpu job, which selects -m gpu over every case file.
    assert "gpu" not in expected_cpu_families(default_files())
    assert any("ci/modal_runner.py" in run for _, run in runs({"jobs": {"gpu": workflow["jobs"]["gpu"]}}))


def test_strict_mode_is_on():
    workflow = _workflow()
    assert strict_problems(workflow) == []
    assert _modal_runner().ENV["PARITY_STRICT"] == "1"
    lax = {"jobs": {"cpu": {"steps": [{"run": "python -m pytest -n 2 tests"}]}}}
    assert strict_problems(lax) == ["job cpu: pytest runs without PARITY_STRICT=1",
                                    "job cpu: pytest without -m (cuda cases would fail strict CPU runs)"]


def test_cpu_jobs_run_the_gpu_runners_command():
    (run,) = [r for _, r in runs({"jobs": {"cpu": _workflow()["jobs"]["cpu"]}}) if "pytest" in r]
    cpu = shlex.split(run.replace("${{ matrix.path }}", "PATH"))
    gpu = _modal_runner().pytest_command(".venv/bin/python", "reports", "2", ["PATH"])
    assert cpu == [("not gpu" if token == "gpu" else token) for token in gpu]


def test_artifacts_upload_even_when_tests_fail():
    jobs = _workflow()["jobs"]
    for job_id in ("cpu", "mutation", "explore", "gpu"):
        uploads = [s for s in jobs[job_id]["steps"] if s.get("uses", "").startswith("actions/upload-artifact@")]
        assert uploads and all("always()" in s.get("if", "") for s in uploads), job_id
    assert any("kill_matrix.json" in s.get("with", {}).get("path", "") for s in jobs["mutation"]["steps"])


@pytest.mark.parametrize("secret", ["MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET"])
def test_gpu_job_says_why_it_skips(secret):
    job = _workflow()["jobs"]["gpu"]
    assert job["env"][secret] == "${{ secrets.%s }}" % secret
    check, *rest = job["steps"]
    assert "::notice" in check["run"] and "GITHUB_STEP_SUMMARY" in check["run"] and secret in check["run"]
    assert all("steps.token.outputs.present == 'true'" in s.get("if", "") for s in rest)


# The current major version of each action the workflow uses (looked up December 2026: checkout 7,
# setup-python 7, upload-artifact 7). An older major runs on a deprecated Node runtime.
CURRENT_MAJORS = {"actions/checkout": 7, "actions/setup-python": 7, "actions/upload-artifact": 7}
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
GPU_LABEL = "gpu"


def action_version_problems(workflow: dict) -> list[str]:
    problems = []
    for job_id, job in workflow["jobs"].items():
        for step in job.get("steps", []):
            if "uses" not in step or step["uses"].startswith("./"):
                continue
            name, _, ref = step["uses"].partition("@")
            major = re.fullmatch(r"v(\d+)(\.\d+)*", ref)
            if name not in CURRENT_MAJORS:
                problems.append(f"job {job_id}: {name} has no known current major (add it to CURRENT_MAJORS)")
            elif not major or int(major.group(1)) < CURRENT_MAJORS[name]:
                problems.append(f"job {job_id}: {name}@{ref} is older than v{CURRENT_MAJORS[name]}")
    return problems


def cpu_torch_problems(workflow: dict) -> list[str]:
    """Every job that installs the suite first installs torch from PyTorch's CPU index, alone."""
    problems = []
    for job_id, job in workflow["jobs"].items():
        runs_in_order = [step["run"] for step in job.get("steps", []) if "run" in step]
        setup = next((i for i, run in enumerate(runs_in_order) if "ci/setup.sh" in run), None)
        if setup is None:
            continue
        torch_first = [run for run in runs_in_order[:setup] if re.search(r"pip install\b.*\btorch\s*$", run, re.M)]
        if not torch_first:
            problems.append(f"job {job_id}: installs the suite without installing torch first")
        elif not all(f"--index-url {CPU_TORCH_INDEX}" in run for run in torch_first):
            problems.append(f"job {job_id}: torch is not installed from {CPU_TORCH_INDEX}")
    return problems


def gpu_gate_problems(workflow: dict) -> list[str]:
    problems = []
    gate = str(workflow["jobs"]["gpu"].get("if", ""))
    if f"contains(github.event.pull_request.labels.*.name, '{GPU_LABEL}')" not in gate \
            or "github.event_name != 'pull_request'" not in gate:
        problems.append(f"job gpu: runs on every pull request (no `{GPU_LABEL}` label gate): {gate!r}")
    if "labeled" not in (workflow["on"].get("pull_request") or {}).get("types", []):
        problems.append("pull_request does not trigger on `labeled`: adding the label would start nothing")
    for job_id in ("cpu", "mutation"):
        if "github.event.action != 'labeled'" not in str(workflow["jobs"][job_id].get("if", "")):
            problems.append(f"job {job_id}: reruns when a label is added")
    if "labeled" not in str(workflow.get("concurrency", {}).get("group", "")):
        problems.append("concurrency: a label event would cancel the running CPU jobs")
    return problems


def test_actions_are_at_their_current_major():
    assert action_version_problems(_workflow()) == []
    old = {"jobs": {"x": {"steps": [{"uses": "actions/checkout@v4"}, {"uses": "actions/cache@v9"},
                                    {"uses": "actions/setup-python@v7.1"}, {"uses": "./local-action"}]}}}
    assert action_version_problems(old) == [
        "job x: actions/checkout@v4 is older than v7",
        "job x: actions/cache has no known current major (add it to CURRENT_MAJORS)"]


def test_torch_comes_from_pytorchs_cpu_index():
    assert cpu_torch_problems(_workflow()) == []
    pypi = {"jobs": {"x": {"steps": [{"run": "python3 -m venv .venv\n.venv/bin/pip install torch"},
                                     {"run": "bash ci/setup.sh"}]},
                     "y": {"steps": [{"run": "bash ci/setup.sh"}]}}}
    assert cpu_torch_problems(pypi) == [f"job x: torch is not installed from {CPU_TORCH_INDEX}",
                                        "job y: installs the suite without installing torch first"]


def test_the_paid_gpu_job_needs_a_label_on_pull_requests():
    assert gpu_gate_problems(_workflow()) == []
    ungated = {"on": {"pull_request": None}, "concurrency": {"group": "parity-${{ github.ref }}"},
               "jobs": {"gpu": {}, "cpu": {}, "mutation": {"if": "github.event.action != 'labeled'"}}}
    assert gpu_gate_problems(ungated) == [
        "job gpu: runs on every pull request (no `gpu` label gate): ''",
        "pull_request does not trigger on `labeled`: adding the label would start nothing",
        "job cpu: reruns when a label is added",
        "concurrency: a label event would cancel the running CPU jobs"]


def schedule_problems(workflow: dict) -> list[str]:
    """The nightly schedule runs `parity explore` (budget, seed, report) and nothing else."""
    problems = []
    if not workflow["on"].get("schedule"):
        problems.append("no schedule trigger: the nightly explore job never runs")
    job = workflow["jobs"].get("explore")
    if job is None:
        return problems + ["no explore job"]
    if "github.event_name == 'schedule'" not in str(job.get("if", "")):
        problems.append("job explore: does not run on the schedule")
    commands = [shlex.split(EXPRESSION.sub("N", run)) for _, run in runs({"jobs": {"explore": job}})]
    explore = [c for c in commands if c[:2] == [".venv/bin/parity", "explore"]]
    if not explore or not {"--budget", "--seed", "--report"} <= set(explore[0]):
        problems.append("job explore: does not run `parity explore --budget S --seed N --report DIR`")
    for job_id in (j for j in workflow["jobs"] if j != "explore"):
        if "github.event_name != 'schedule'" not in str(workflow["jobs"][job_id].get("if", "")):
            problems.append(f"job {job_id}: runs on the nightly schedule too")
    return problems


def test_nightly_schedule_runs_explore_alone():
    assert schedule_problems(_workflow()) == []
    bare = {"on": {"push": None}, "jobs": {"cpu": {}, "explore": {"steps": [{"run": ".venv/bin/parity explore"}]}}}
    assert schedule_problems(bare) == [
        "no schedule trigger: the nightly explore job never runs",
        "job explore: does not run on the schedule",
        "job explore: does not run `parity explore --budget S --seed N --report DIR`",
        "job cpu: runs on the nightly schedule too"]
