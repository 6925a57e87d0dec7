#!/usr/bin/env bash
# Builds fmha's C++ autograd operator (python/fmha/csrc/native_autograd.cpp, see python/fmha/_native.py)
# against one PyTorch, into OUT_DIR/native_autograd-<torch version>.so (default OUT_DIR: python/fmha, where
# the package looks for it).
#
#   scripts/build-native-autograd.sh [OUT_DIR]
#   scripts/build-native-autograd.sh --check     compiles only (headers are enough: CI's check)
#
# The PyTorch is the one `python3` (or $PYTHON) imports, or the installed package folder TORCH_DIR (…/site-packages/
# torch) when set: headers and libraries are all it needs, so it can build for a PyTorch that does not
# import here (e.g. a CUDA wheel unpacked on a machine without the CUDA libraries). No Python C API and no
# CUDA headers: the file depends on the PyTorch version only. CXX (default g++) compiles it, with the
# C++11 string ABI that PyTorch's wheels use since 2.7.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
check=0
if [[ ${1:-} == --check ]]; then
    check=1
    shift
fi
out_dir=${1:-$repo/python/fmha}

if [[ -z ${TORCH_DIR:-} ]]; then
    TORCH_DIR=$("${PYTHON:-python3}" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
fi
version=$(sed -n "s/^__version__ = '\([^+']*\).*/\1/p" "$TORCH_DIR/version.py")
if [[ -z $version ]]; then
    echo "build-native-autograd: no __version__ in $TORCH_DIR/version.py (is TORCH_DIR a torch package?)" >&2
    exit 1
fi

compile=("${CXX:-g++}" -std=c++17 -O2 -fPIC -Wall -Wextra -Werror -D_GLIBCXX_USE_CXX11_ABI=1 -I"$repo/include"
    -isystem "$TORCH_DIR/include" -isystem "$TORCH_DIR/include/torch/csrc/api/include"
    "$repo/python/fmha/csrc/native_autograd.cpp")
if ((check)); then
    "${compile[@]}" -c -o /dev/null
    echo "native_autograd.cpp compiles against torch $version"
    exit 0
fi
mkdir -p "$out_dir"
target=$out_dir/native_autograd-$version.so
"${compile[@]}" -shared -L"$TORCH_DIR/lib" -Wl,--no-as-needed -lc10 -ltorch_cpu -ltorch -Wl,--as-needed -o "$target"
echo "$target"
