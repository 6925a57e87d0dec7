#!/usr/bin/env bash
# Builds fmha (release) and installs it into a prefix, for C/C++ (CMake, pkg-config), Go and Julia users:
#
#   PREFIX/include/fmha.h
#   PREFIX/lib/libfmha.so.X.Y.Z, libfmha.so.0 -> libfmha.so.X.Y.Z, libfmha.so -> libfmha.so.0
#   PREFIX/lib/libfmha.a
#   PREFIX/lib/cmake/fmha/fmhaConfig.cmake, fmhaConfigVersion.cmake   (fmha::shared, fmha::static, fmha::fmha)
#   PREFIX/lib/pkgconfig/fmha.pc
#
# Usage: scripts/install.sh PREFIX [--features cuda|rocm]
#
#   --features LIST  cargo features of the build (a GPU backend: cuda or rocm; default: host backend).
#                    The GPU builds read CUDA_HOME / FMHA_CUDA_ARCHS, ROCM_PATH / FMHA_HIP_ARCHS /
#                    FMHA_HIP_CXX like `cargo build` does (see README.md).
#
# CARGO_TARGET_DIR is honoured (use one per backend, e.g. target/cuda; default: target/). The script
# is idempotent: it replaces a previous installation of fmha in PREFIX.
#
# A wrapper around the root CMakeLists.txt (CMake 3.19 or newer): configure (Release, FMHA_BACKEND
# from --features), build (cargo), `cmake --install --prefix PREFIX`, in a temporary build
# directory. How the static library's native dependencies (fmha::static's link interface, fmha.pc's
# Libs.private) are found: cmake/cargo-build.cmake.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
    exit "${1:-0}"
}

prefix=""
features=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h | --help) usage 0 ;;
        --features) [[ $# -ge 2 ]] || usage 2; features=$2; shift 2 ;;
        --features=*) features=${1#--features=}; shift ;;
        -*) echo "install.sh: unknown option $1" >&2; usage 2 ;;
        *) [[ -z "$prefix" ]] || { echo "install.sh: more than one PREFIX" >&2; usage 2; }; prefix=$1; shift ;;
    esac
done
[[ -n "$prefix" ]] || { echo "install.sh: PREFIX is required" >&2; usage 2; }

# fmha's only features are its backends (FMHA_BACKEND of the CMake project).
backend=host
IFS=',' read -r -a feature_list <<<"$features"
for feature in "${feature_list[@]}"; do
    case "$feature" in
        "") ;;
        cuda | rocm)
            [[ "$backend" == host || "$backend" == "$feature" ]] ||
                { echo "install.sh: --features cuda and rocm are mutually exclusive" >&2; exit 2; }
            backend=$feature ;;
        *) echo "install.sh: unknown feature '$feature' in --features (fmha has cuda and rocm)" >&2; exit 2 ;;
    esac
done

mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd -P) # absolute, relative to the caller's directory

# Cargo's default, and a relative CARGO_TARGET_DIR is relative to the repository as cargo run there
# takes it: the stages of scripts/test.sh and earlier installs share their builds.
target_dir=${CARGO_TARGET_DIR:-target}
[[ "$target_dir" == /* ]] || target_dir=$repo/$target_dir

build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT

echo "install.sh: building fmha ($backend backend${features:+, features $features})"
cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DFMHA_BACKEND="$backend" \
    -DFMHA_CARGO_TARGET_DIR="$target_dir"
cmake --build "$build"
rm -f "$prefix"/lib/libfmha.so "$prefix"/lib/libfmha.so.* "$prefix/lib/libfmha.a"
cmake --install "$build" --prefix "$prefix"

pc=$prefix/lib/pkgconfig/fmha.pc
version=$(sed -n 's/^Version: //p' "$pc")
cat <<EOT
install.sh: installed fmha $version ($backend backend) into $prefix
  library   lib/libfmha.so.$version (soname $(readlink "$prefix/lib/libfmha.so")), lib/libfmha.a
  static    links with: $(sed -n 's/^Libs.private: //p' "$pc")
  CMake     -DCMAKE_PREFIX_PATH=$prefix   then find_package(fmha CONFIG REQUIRED)
  pkg-config PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs fmha
  run time  LD_LIBRARY_PATH=$prefix/lib (or an rpath) for programs linked to the shared library
EOT
