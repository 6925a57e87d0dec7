#!/usr/bin/env bash
# Builds fmha's C++ autograd operator (python/fmha/csrc/native_autograd.cpp, see python/fmha/_native.py)
# against one PyTorch, into OUT_DIR/native_autograd-<torch version>.so (default OUT_DIR: python/fmha, where
# the package looks for it). The build is python/fmha/native_build.py's (an installed fmha's
# `python -m fmha.native_build`), run here from the checkout.
#
#   scripts/build-native-autograd.sh [OUT_DIR]
#   scripts/build-native-autograd.sh --check     compiles only (headers are enough: CI's check)
#
# The PyTorch is the one `python3` (or $PYTHON) imports, or the installed package folder TORCH_DIR (…/site-packages/
# torch) when set, which need not import here; CXX (default g++) compiles.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ ${1:-} == --check ]]; then
    exec "${PYTHON:-python3}" "$repo/python/fmha/native_build.py" --check
fi
exec "${PYTHON:-python3}" "$repo/python/fmha/native_build.py" "${1:-$repo/python/fmha}"
