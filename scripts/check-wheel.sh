#!/usr/bin/env bash
# Build the wheel and install it as a user whose machine already has torch would (a CUDA build on a cluster; the
# CPU wheel of .venv here): the wheel must carry the recipes, its metadata must not pin torch (pip installs no
# other torch), and `pretrieve run bow-msmarco --smoke` must run from the installed wheel, by the recipe's name,
# outside the checkout (no $PRETRIEVE_DATA: the smoke run generates its data). About two minutes; needs PyPI for
# `build` and the build backend. TORCH_ENV_PYTHON: the interpreter whose packages stand for "already installed"
# (default .venv/bin/python, made by scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
checkout=$PWD
torch_python=${TORCH_ENV_PYTHON:-$checkout/.venv/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== build (python -m build, in its own venv)"
python3 -m venv "$work/tools"
"$work/tools/bin/python" -m pip install -q build
"$work/tools/bin/python" -m build --wheel --outdir "$work/dist" . > "$work/build.log" || { cat "$work/build.log"; exit 1; }
wheel=$(ls "$work"/dist/pretrieve-*.whl)
echo "$wheel"

echo "== the wheel carries every recipe of configs/ and does not pin torch"
"$work/tools/bin/python" - "$wheel" configs <<'EOF'
import sys, zipfile
from email.parser import Parser
from pathlib import Path
wheel, configs = zipfile.ZipFile(sys.argv[1]), Path(sys.argv[2])
names = set(wheel.namelist())
missing = [p.name for p in configs.glob("*.yaml") if f"pretrieve/configs/{p.name}" not in names]
assert not missing, f"recipes missing from the wheel: {missing}"
metadata = Parser().parsestr(wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode())
torch = [r for r in metadata.get_all("Requires-Dist") if r.split(";")[0].replace(" ", "").startswith("torch")]
assert torch and not any("==" in r for r in torch), torch
print(f"{len(list(configs.glob('*.yaml')))} recipes in the wheel; {torch[0]}")
EOF

echo "== a fresh venv where torch is already installed (the packages of $torch_python)"
python3 -m venv "$work/venv"
purelib=$("$work/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
"$torch_python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > "$purelib/torch-present.pth"
"$work/venv/bin/python" -m pip install -q --dry-run --report "$work/report.json" "$wheel[faiss,models]"
"$work/venv/bin/python" - "$work/report.json" <<'EOF'
import json, sys
installs = [item["metadata"]["name"] for item in json.load(open(sys.argv[1]))["install"]]
print("pip would install:", ", ".join(installs))
assert "torch" not in installs, "the wheel pulls another torch"
EOF
"$work/venv/bin/python" -m pip install -q "$wheel[faiss,models]"

echo "== pretrieve run bow-msmarco --smoke, from the installed wheel, outside the checkout"
mkdir "$work/run"
cd "$work/run"
env -u PYTHONPATH -u PRETRIEVE_DATA "$work/venv/bin/python" -c \
  "import pretrieve, sys; assert pretrieve.__file__.startswith(sys.prefix), pretrieve.__file__; print(pretrieve.__file__)"
env -u PYTHONPATH -u PRETRIEVE_DATA "$work/venv/bin/pretrieve" run bow-msmarco --smoke --no-progress
echo "check-wheel: ok"
