#!/usr/bin/env bash
# The GPU benchmark, on a machine with an NVIDIA GPU and a CUDA build of torch installed:
#   bash benchmarks/gpu.sh            # writes benchmarks/results/gpu.json and gpu.md
# Finishes within 8 minutes on one H200 (eight short training runs, a save and a resume, a matmul peak);
# `python -m benchmarks --gpu --dry-run` plans them all on any machine first. PYTHON names the
# interpreter that has torch (default python3). The exit status is 1 when a target is missed:
# the results are written either way, so copy them with `;`, not `&&`.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PYTHON" -m benchmarks --gpu --dry-run
timeout 540 "$PYTHON" -m benchmarks --gpu "$@"
