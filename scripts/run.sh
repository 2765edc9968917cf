#!/usr/bin/env bash
# Quick start command 1: installs what is missing and builds gpumem (scripts/setup.sh), then
# replays the PyTorch allocator trace shipped in traces/ (ResNet-50 training on an H200, PyTorch
# 2.11 default allocator) through gpumem's engine and the models of PyTorch's allocator, printed
# side by side.
#
#   scripts/run.sh [extra `gpumem replay` options, e.g. --json or --policy pytorch:expandable]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${GPUMEM_BUILD_DIR:-$root/build}

"$root/scripts/setup.sh" "$build"
exec "$build/cli/gpumem" replay "$root/traces/resnet50.native.trace.csv.gz" "$@"
