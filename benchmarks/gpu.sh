#!/usr/bin/env bash
# The GPU benchmark, on a machine with an NVIDIA GPU and a CUDA build of torch installed:
#   bash benchmarks/gpu.sh            # writes benchmarks/results/gpu.json and gpu.md
# Finishes within 10 minutes (three short training runs and a matmul peak measurement).
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
timeout 600 python -m benchmarks --gpu "$@"
