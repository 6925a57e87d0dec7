#!/usr/bin/env bash
# Installs what fmha's tests and GPU builds need on Debian 12 (bookworm), idempotently:
#
#   apt:  clang-22 lld-22 llvm-22 (HIP device code for gfx942/gfx950), libamdhip64-dev (HIP host
#         runtime to link against), cmake, golang-go, pkg-config, valgrind; plus g++, binutils,
#         python3-pip, python3-venv when missing (C++ tests, artifact checks, the pip step below, the
#         Python wheel's venv)
#   pip:  the CUDA 13.0 compiler and runtime wheels (nvcc, cicc, ptxas, cudart, CCCL) and
#         cuobjdump and nvdisasm 13.2 (cuobjdump -sass: the kernels' SASS) into .toolchains/cuda
#         (git-ignored); no GPU and no system CUDA needed
#   rustup components rustfmt and clippy, when rustup manages the toolchain
#
# Work already done is skipped: a second run installs nothing and takes about a second. Runs as
# root directly, or through sudo for the apt step when not root.
#
# Usage: scripts/setup-toolchains.sh [--env]
#   --env   install nothing; print the environment variables for the GPU builds (for eval)
#
# Environment: FMHA_SETUP_SKIP_APT=1 skips the apt step (a non-Debian machine with the tools
# already installed); FMHA_TOOLCHAINS=DIR installs the pip parts there instead of .toolchains.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
toolchains=${FMHA_TOOLCHAINS:-$repo/.toolchains}
cuda_prefix=$toolchains/cuda
cuda_home=$cuda_prefix/nvidia/cu13

print_env() {
    cat <<EOF
export CUDA_HOME="$cuda_home"           # nvcc for --features cuda
export PATH="$cuda_home/bin:\$PATH"      # nvcc, cuobjdump, nvdisasm
export HIP_PATH=/usr                    # hip-runtime-sys finds Debian's HIP headers (--features rocm)
EOF
}

if [[ "${1:-}" == "--env" ]]; then
    print_env
    exit 0
elif [[ $# -gt 0 ]]; then
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
    [[ "$1" == "-h" || "$1" == "--help" ]] && exit 0
    exit 2
fi

log() { printf 'setup-toolchains: %s\n' "$*"; }

as_root() {
    if [[ $(id -u) -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        log "need root for: $*  (run as root, or install sudo)"
        exit 1
    fi
}

# --- apt -------------------------------------------------------------------------------------------
apt_packages=(clang-22 lld-22 llvm-22 libamdhip64-dev cmake golang-go pkg-config valgrind)
# Helpers, installed without their recommendations: a C++ compiler for the tests' C++ builds,
# binutils for the artifact checks, pip for the CUDA wheels, venv for the Python wheel's test.
helper_packages=(g++ binutils ca-certificates python3 python3-pip python3-venv)

missing_packages() { # prints the packages of "$@" that dpkg does not report as installed
    local p
    for p in "$@"; do
        if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]]; then
            echo "$p"
        fi
    done
}

if [[ "${FMHA_SETUP_SKIP_APT:-0}" == "1" ]]; then
    log "apt: skipped (FMHA_SETUP_SKIP_APT=1)"
elif ! command -v dpkg-query >/dev/null 2>&1; then
    log "apt: not a Debian system; install the equivalents of: ${apt_packages[*]} ${helper_packages[*]}"
else
    mapfile -t missing < <(missing_packages "${apt_packages[@]}")
    mapfile -t missing_helpers < <(missing_packages "${helper_packages[@]}")
    # A working pip from elsewhere (pyenv, a venv) is fine: no need for Debian's; nor for python3-venv
    # where venv can bootstrap pip (Debian's python3 has ensurepip only with python3-venv).
    if python3 -m pip --version >/dev/null 2>&1; then
        kept=()
        for p in "${missing_helpers[@]}"; do
            [[ "$p" == python3 || "$p" == python3-pip ]] && continue
            [[ "$p" == python3-venv ]] && python3 -c 'import ensurepip' >/dev/null 2>&1 && continue
            kept+=("$p")
        done
        missing_helpers=("${kept[@]}")
    fi
    if [[ ${#missing[@]} -eq 0 && ${#missing_helpers[@]} -eq 0 ]]; then
        log "apt: all packages present"
    else
        log "apt: installing ${missing[*]} ${missing_helpers[*]}"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
        if [[ ${#missing[@]} -gt 0 ]]; then
            as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
        fi
        if [[ ${#missing_helpers[@]} -gt 0 ]]; then
            as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing_helpers[@]}"
        fi
    fi
fi

# --- CUDA 13.0 wheels + cuobjdump and nvdisasm 13.2 ------------------------------------------------
# All wheels go into one fresh directory in one pip call (pip --target does not merge into an
# existing nvidia/ directory), which is then moved into place; a stamp records what is installed.
cuda_wheels=(
    "nvidia-cuda-nvcc==13.0.*" "nvidia-nvvm==13.0.*" "nvidia-cuda-runtime==13.0.*"
    "nvidia-cuda-crt==13.0.*" "nvidia-cuda-cccl==13.0.*" "nvidia-cuda-cuobjdump==13.2.*"
    "nvidia-cuda-nvdisasm==13.2.*"
)
stamp="$cuda_prefix/.fmha-installed"
if [[ -f "$stamp" && "$(cat "$stamp")" == "${cuda_wheels[*]}" && -x "$cuda_home/bin/nvcc" && -x "$cuda_home/bin/cuobjdump" && -x "$cuda_home/bin/nvdisasm" ]]; then
    log "cuda: present in $cuda_prefix"
else
    log "cuda: installing ${cuda_wheels[*]} into $cuda_prefix (about 100 MB)"
    mkdir -p "$toolchains"
    rm -rf "$cuda_prefix.partial"
    PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check --no-input --no-deps \
        --target "$cuda_prefix.partial" "${cuda_wheels[@]}"
    # Wheels do not keep the executable bit of the compiler's programs.
    chmod +x "$cuda_prefix.partial"/nvidia/cu13/bin/* "$cuda_prefix.partial"/nvidia/cu13/nvvm/bin/*
    printf '%s' "${cuda_wheels[*]}" >"$cuda_prefix.partial/.fmha-installed"
    rm -rf "$cuda_prefix"
    mv "$cuda_prefix.partial" "$cuda_prefix"
fi
"$cuda_home/bin/nvcc" --version | tail -n 2 | head -n 1 | sed 's/^/setup-toolchains: nvcc: /'

# --- Rust components -------------------------------------------------------------------------------
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
    if command -v rustup >/dev/null 2>&1; then
        log "rust: adding rustfmt and clippy"
        rustup component add rustfmt clippy
    else
        log "rust: cargo fmt / cargo clippy missing and no rustup to add them"
        exit 1
    fi
else
    log "rust: rustfmt and clippy present"
fi

log "done. Environment for the GPU builds (scripts/setup-toolchains.sh --env prints it again):"
print_env
