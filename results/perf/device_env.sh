# Sourced by the device-tool scripts beside it (h200-16-cores-r6/run.sh, -r7/run.sh) with $out and $label
# set: installs the wheels carried in .whl/ once per machine (no network there), puts them and the repo on
# PYTHONPATH, and writes the machine and versions to $out/env-$label.txt.
[ -d /tmp/site/deepspeed ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ date -u; lscpu | grep -E "Model name|^CPU\(s\)"; nproc
  python3 -c "import sys,torch,numpy,triton,deepspeed; print('python', sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__, 'triton', triton.__version__, 'deepspeed', deepspeed.__version__)"
} > "$out/env-$label.txt" 2>&1
