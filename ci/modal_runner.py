"""GPU job: the CPU CI's pytest command restricted to the cuda cases (-m gpu), strict, on Modal or here.

    python ci/modal_runner.py [--gpu L40S:2] [--workers N] [--report-dir DIR] [-- PYTEST_ARGS...]
    modal run ci/modal_runner.py [--gpu H100:2] [--workers N] [--report-dir DIR] [--extra "PYTEST_ARGS"]
    python ci/modal_runner.py --local [--workers N] [--report-dir DIR] [-- PYTEST_ARGS...]

Modal mode builds an image with this tree's dependencies (pyproject.toml: the torch range, deepspeed
0.19.8, liger-kernel 0.8.5, transformers; a CUDA torch from PyPI), adds the candidate tree at
/repo, runs the command there on the GPU spec (--gpu, else $PARITY_MODAL_GPU, else DEFAULT_GPU;
"TYPE:COUNT", see Modal's GPU docs), streams its output, copies the report directory back and
exits with pytest's exit code. Needs `pip install modal` and a Modal token (MODAL_TOKEN_ID /
MODAL_TOKEN_SECRET). --local runs the same command here (any GPU machine with the suite
installed). Strict mode (PARITY_STRICT=1) makes a skipped case, or a Liger case that fell back to
torch, fail the job: a GPU job must not pass by skipping, so on a machine without a GPU every
case fails with "needs a CUDA device". Two GPUs give NCCL mode (one rank per GPU) for 2-rank
cases; the 4-rank cases share a GPU over gloo.

`modal` is imported only for the Modal path: without it this module imports and --local works.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REMOTE_ROOT = "/repo"
DEFAULT_GPU = "L40S:2"
GPU_ENV = "PARITY_MODAL_GPU"
DEFAULT_WORKERS = "2"  # as the CPU jobs: two xdist workers, each with its own rank groups
DEFAULT_REPORT_DIR = "reports/gpu"
TIMEOUT_S = 2 * 60 * 60  # the Modal function's limit; pytest gets this minus a margin to send results back
RESULT_MARGIN_S = 5 * 60
# Strict: a skip is a failure. Unbuffered: output streams line by line. NVLS off: NCCL's NVLink
# multicast needs a fabric manager that shared GPU hosts may not run.
ENV = {"PARITY_STRICT": "1", "PYTHONUNBUFFERED": "1", "NCCL_NVLS_ENABLE": "0"}
IGNORE = [".git", ".venv", "**/__pycache__", "reports", ".whl"]


def pytest_command(python: str, report_dir: str = DEFAULT_REPORT_DIR, workers: str = DEFAULT_WORKERS,
                   extra: list[str] | tuple = ()) -> list[str]:
    """The one command both modes run; the CPU jobs of ci/workflows/parity.yml run it with -m "not gpu"."""
    return [python, "-m", "pytest", "-n", str(workers), "-m", "gpu", f"--junitxml={report_dir}/junit.xml",
            "--parity-report", f"{report_dir}/parity", *extra]


def run_streaming(argv: list[str], cwd: str | Path, timeout_s: float) -> int:
    """Run argv with ENV, output straight to ours; pytest's exit code, 124 if it ran past timeout_s."""
    proc = subprocess.Popen(argv, cwd=cwd, env={**os.environ, **ENV}, start_new_session=True)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        # The whole session: xdist workers and their rank processes too.
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        print(f"modal_runner: pytest ran past {timeout_s:.0f} s and was killed", file=sys.stderr, flush=True)
        return 124
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise


def run_local(workers: str, report_dir: str, extra: list[str], timeout_s: float = TIMEOUT_S) -> int:
    return run_streaming(pytest_command(sys.executable, report_dir, workers, extra), ROOT, timeout_s)


def gpu_spec(cli_value: str | None) -> str:
    spec = cli_value or os.environ.get(GPU_ENV) or DEFAULT_GPU
    kind, _, count = spec.partition(":")
    if not kind or (count and not count.isdigit()):
        raise ValueError(f"GPU spec {spec!r}: expected TYPE or TYPE:COUNT (e.g. L40S:2, H100:2), "
                         f"from --gpu or ${GPU_ENV}")
    return spec


def modal_request(workers: str, report_dir: str, extra: list[str]) -> list[str]:
    """The command the Modal function runs in /repo: pytest_command with the image's python."""
    return pytest_command("python", report_dir, workers, extra)


def write_back(files: dict[str, bytes], report_dir: str) -> None:
    out = ROOT / report_dir
    for name, data in files.items():
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    print(f"modal_runner: {len(files)} report files in {out}", flush=True)


try:
    import modal
except ModuleNotFoundError:  # --local and the tests need no Modal
    modal = None

app = None
if modal is not None:
    image = (
        modal.Image.debian_slim(python_version=f"{sys.version_info.major}.{sys.version_info.minor}")
        # DeepSpeed's ops are JIT-built when needed; none is built at install (no CUDA toolkit here).
        # The tree is not pip-installed: /repo on the path, as `python -m pytest` in a checkout.
        .env({"DS_BUILD_OPS": "0", "PYTHONPATH": REMOTE_ROOT})
        .pip_install_from_pyproject(str(ROOT / "pyproject.toml"), optional_dependencies=["liger", "hf", "report", "test"])
        # Added at container start, not baked in: a changed tree needs no image rebuild.
        .add_local_dir(ROOT, remote_path=REMOTE_ROOT, ignore=IGNORE)
    )
    app = modal.App("tp-parity-gpu", image=image)

    @app.function(gpu=gpu_spec(None), timeout=TIMEOUT_S)
    def run_pytest(argv: list[str], report_dir: str) -> dict:
        import subprocess as sp

        sp.run(["nvidia-smi", "-L"], check=False)
        code = run_streaming(argv, REMOTE_ROOT, TIMEOUT_S - RESULT_MARGIN_S)
        out = Path(REMOTE_ROOT) / report_dir
        files = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
        return {"returncode": code, "files": files}

    def run_on_modal(gpu: str, workers: str, report_dir: str, extra: list[str]) -> int:
        """Inside a running app (modal run, or app.run() below)."""
        argv = modal_request(workers, report_dir, extra)
        print(f"modal_runner: on {gpu}: {' '.join(argv)}", flush=True)
        result = run_pytest.with_options(gpu=gpu).remote(argv, report_dir)
        write_back(result["files"], report_dir)
        return result["returncode"]

    @app.local_entrypoint()
    def modal_main(gpu: str = "", workers: str = DEFAULT_WORKERS, report_dir: str = DEFAULT_REPORT_DIR,
                   extra: str = ""):
        code = run_on_modal(gpu_spec(gpu), workers, report_dir, extra.split())
        if code:
            raise SystemExit(code)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--local", action="store_true", help="run here, without Modal")
    parser.add_argument("--gpu", help=f"Modal GPU spec TYPE[:COUNT] (default ${GPU_ENV} or {DEFAULT_GPU})")
    parser.add_argument("--workers", default=DEFAULT_WORKERS, help="pytest-xdist -n (default %(default)s)")
    parser.add_argument("--report-dir", default=DEFAULT_REPORT_DIR,
                        help="relative to the repo root: junit.xml and parity/ (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S - RESULT_MARGIN_S,
                        help="--local only: kill pytest after this many seconds (default %(default)s)")
    parser.add_argument("extra", nargs="*", help="after --: passed to pytest (e.g. -k EXPR, a path)")
    args = parser.parse_args(argv)
    if args.local and args.gpu:
        parser.error("--gpu selects a Modal GPU; --local runs on this machine's GPUs")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.local:
        return run_local(args.workers, args.report_dir, args.extra, args.timeout)
    try:
        gpu = gpu_spec(args.gpu)
    except ValueError as err:
        print(f"modal_runner: {err}", file=sys.stderr)
        return 2
    if modal is None:
        print("modal_runner: the Modal path needs `pip install modal` and a token (modal token set); "
              "--local runs the same command on this machine", file=sys.stderr)
        return 2
    with modal.enable_output(), app.run():
        return run_on_modal(gpu, args.workers, args.report_dir, args.extra)


if __name__ == "__main__":
    sys.exit(main())
