#!/usr/bin/env bash
# fmha's whole test suite, as CI runs it (.ci/run). On a fresh Debian 12 machine with only Rust it
# installs its toolchains first (scripts/setup-toolchains.sh). Stages:
#
#   toolchains    scripts/setup-toolchains.sh (idempotent)
#   fmt           cargo fmt --all --check; bash -n on every script (some run only on the GPU machine)
#   clippy        cargo clippy --release --workspace --all-targets -- -D warnings (the library and tools/)
#   cargo test    cargo test --release (Rust tests through the C ABI; include/fmha.h drift test)
#   valgrind      the async-prepare lifetime tests and the releaser tests under valgrind
#   AMD kernels   the gfx942/gfx950 forward, kv-cache and backward kernel sources run on the CPU
#                 (tests/hip_emulation)
#   quickstart    cargo run --release --example quickstart
#   fmha-bench    cargo test --release -p fmha-bench: the smoke matrix through the CLI with --verify
#                 (float64 reference), the CSV/JSON schema, filters, --list, bad arguments
#   install       scripts/install.sh build/prefix; include/fmha.h == generated header; exports/soname
#   C examples    c_examples/ via find_package(fmha), linked shared and static, run by ctest; and a
#                 pkg-config build of 00_version.c (shared and static)
#   C tests       tests/c/ (static + shared, C + C++, valgrind), ctest
#   fuzz          tests/fuzz/: fork-per-case fuzz of the C ABI with guard-paged buffers (targeted
#                 forbidden inputs, valid layouts, random mutations), exit under load, a 16-thread
#                 soak, and a valgrind sample (about 2.5 minutes; FMHA_FUZZ_SEED=N reproduces a run)
#   Go            bindings/go/fmha (the Go module: cgo, pkg-config), go vet + go test
#   CMake superbuild  tests/cmake/: fmha through the root CMakeLists.txt by add_subdirectory and by
#                 FetchContent, 00_version.c linked to fmha::shared, fmha::static and fmha::fmha
#   Python wheel  pip wheel . (setuptools-rust, libfmha inside), installed into a fresh venv under build/;
#                 there, without FMHA_LIBRARY and without PyTorch: the package finds its library,
#                 version and backend, the flash-attn signature tests, and python -m fmha.bench's
#                 matrices (shipped in the wheel) and counts
#   Python with PyTorch  the same wheel in a venv with PyTorch 2.11.0 (PyPI's, with its CUDA libraries;
#                 kept under build/): the whole tests/python suite on the host backend; the C++ autograd
#                 operator built against that PyTorch (-Werror), its plan-table tests (its autograd
#                 tests need a GPU: scripts/gpu-check.sh)
#   cuda build    --features cuda into target/cuda: clippy, install into build/prefix-cuda, artifact
#                 checks (sm_90a cubin, exports, soname), C examples and tests/c against it (no GPU here:
#                 the device tests are skipped, the no-device paths are tested)
#   rocm build    --features rocm into target/rocm: clippy, install into build/prefix-rocm, artifact
#                 checks (gfx942 + gfx950 code objects, no scratch use per kernel, exports, soname)
#
# Usage: scripts/test.sh [--skip-setup] [--skip-gpu]
#   --skip-setup  do not run scripts/setup-toolchains.sh (the tools are known to be installed)
#   --skip-gpu    skip the cuda and rocm builds (quick local iteration; CI runs everything)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

skip_setup=0
skip_gpu=0
for arg in "$@"; do
    case "$arg" in
        --skip-setup) skip_setup=1 ;;
        --skip-gpu) skip_gpu=1 ;;
        -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "test.sh: unknown argument $arg" >&2; exit 2 ;;
    esac
done

build=$repo/build
jobs=$(nproc 2>/dev/null || echo 2)
toolchains=${FMHA_TOOLCHAINS:-$repo/.toolchains}
cuda_home_default=$toolchains/cuda/nvidia/cu13
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}

# --- stage bookkeeping ----------------------------------------------------------------------------
stage_names=()
stage_seconds=()
current_stage=""
stage_started=0
suite_started=$(date +%s)

finish_stage() {
    if [[ -n "$current_stage" ]]; then
        stage_names+=("$current_stage")
        stage_seconds+=("$(($(date +%s) - stage_started))")
        current_stage=""
    fi
}

begin() { # begin NAME: starts a stage (and ends the previous one)
    finish_stage
    current_stage=$1
    stage_started=$(date +%s)
    printf '\n==============================================================================\n'
    printf '==> %s\n' "$1"
    printf '==============================================================================\n'
}

summary() {
    local status=$? i
    local failed_stage=$current_stage
    finish_stage
    printf '\n------------------------------------------------------------------------------\n'
    printf 'test.sh: stage timings\n'
    for i in "${!stage_names[@]}"; do
        printf '  %-34s %5ss\n' "${stage_names[$i]}" "${stage_seconds[$i]}"
    done
    printf '  %-34s %5ss\n' "total" "$(($(date +%s) - suite_started))"
    if [[ $status -eq 0 ]]; then
        printf 'test.sh: all stages passed\n'
    else
        printf 'test.sh: FAILED in stage "%s" (exit status %d)\n' "$failed_stage" "$status"
    fi
}
trap summary EXIT

note() { printf -- '--- %s\n' "$*"; }

# --- helpers --------------------------------------------------------------------------------------

# valgrind_tests CARGO_TEST_TARGET_ARGS -- FILTERS...: the release test executable of the target, under
# valgrind, one test at a time, only the tests matching the filters.
valgrind_tests() {
    local target=() exe
    while [[ $1 != -- ]]; do target+=("$1"); shift; done
    shift
    exe=$(cargo test --release "${target[@]}" --no-run --message-format=json 2>/dev/null |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
    valgrind --error-exitcode=99 --leak-check=no -q "$exe" --test-threads=1 "$@"
}

# run_ctest DIR [allow-skips]: ctest with output on failure; skipped tests (exit 77) are failures
# unless allowed (GPU builds without a GPU).
run_ctest() {
    local dir=$1 allow_skips=${2:-}
    local log=$dir/ctest.log
    ctest --test-dir "$dir" --output-on-failure --no-tests=error -j "$jobs" 2>&1 | tee "$log"
    if [[ -z "$allow_skips" ]] && grep -q 'Skipped\|Not Run' "$log"; then
        echo "test.sh: tests were skipped in $dir; on this backend every test must run" >&2
        return 1
    fi
}

# cmake_project SOURCE BUILD PREFIX [cmake args...]: fresh configure against an installed prefix,
# build.
cmake_project() {
    local source=$1 dir=$2 prefix=$3
    shift 3
    rm -rf "$dir"
    cmake -S "$source" -B "$dir" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
    cmake --build "$dir" -j "$jobs"
}

# consumers PREFIX BUILD_DIR [allow-skips]: the C examples (shared and static) and the C tests.
consumers() {
    local prefix=$1 dir=$2 allow_skips=${3:-}
    note "C examples, shared library"
    cmake_project c_examples "$dir/c_examples" "$prefix"
    run_ctest "$dir/c_examples" "$allow_skips"
    note "C examples, static library"
    cmake_project c_examples "$dir/c_examples_static" "$prefix" -DFMHA_EXAMPLES_STATIC=ON
    run_ctest "$dir/c_examples_static" "$allow_skips"
    note "C tests (static + shared, C + C++)"
    cmake_project tests/c "$dir/tests_c" "$prefix"
    run_ctest "$dir/tests_c" "$allow_skips"
}

# pkg_config_consumer PREFIX BUILD_DIR: 00_version.c built with pkg-config, shared and static.
pkg_config_consumer() {
    local prefix=$1 dir=$2 cc=${CC:-cc}
    mkdir -p "$dir"
    export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
    note "pkg-config: $(pkg-config --modversion fmha), backend $(pkg-config --variable=backend fmha)"
    note "pkg-config, shared: $cc ... $(pkg-config --cflags --libs fmha)"
    # shellcheck disable=SC2046 # pkg-config output is a list of flags
    "$cc" -std=c99 -Wall -Wextra -Werror c_examples/00_version.c $(pkg-config --cflags --libs fmha) \
        -Wl,-rpath,"$(pkg-config --variable=libdir fmha)" -o "$dir/version_pkgconfig_shared"
    "$dir/version_pkgconfig_shared"
    # Static: the same flags with --static (Libs.private), and libfmha.a named explicitly.
    local static_flags
    static_flags=$(pkg-config --static --libs fmha | sed 's/-lfmha\b/-l:libfmha.a/')
    note "pkg-config, static: $cc ... $static_flags"
    # shellcheck disable=SC2086
    "$cc" -std=c99 -Wall -Wextra -Werror c_examples/00_version.c $(pkg-config --cflags fmha) $static_flags \
        -o "$dir/version_pkgconfig_static"
    "$dir/version_pkgconfig_static"
    if readelf -d "$dir/version_pkgconfig_static" | grep -q 'libfmha\.so'; then
        echo "test.sh: the static pkg-config build depends on libfmha.so" >&2
        return 1
    fi
    unset PKG_CONFIG_PATH
}

# header_drift PREFIX: the committed header is what cbindgen generates (the Rust drift test checks
# the same; this names the files when it fails).
header_drift() {
    if [[ ! -f include/fmha.h ]]; then
        echo "test.sh: include/fmha.h is missing; copy it from the generated header: cp $1/include/fmha.h include/" >&2
        return 1
    fi
    if ! diff -u include/fmha.h "$1/include/fmha.h"; then
        echo "test.sh: include/fmha.h differs from the generated header; refresh it: cp $1/include/fmha.h include/" >&2
        return 1
    fi
    note "include/fmha.h matches the generated header"
}

# gpu_backend NAME CONSUMERS ENV...: clippy, install, artifact checks of one GPU backend, and with
# CONSUMERS=yes the C examples and tests against it (no GPU here: they test the no-device paths).
gpu_backend() {
    local backend=$1 run_consumers=$2
    shift 2
    local prefix=$build/prefix-$backend
    note "clippy --features $backend"
    env "$@" CARGO_TARGET_DIR="$repo/target/$backend" \
        cargo clippy --release --all-targets --features "$backend" -- -D warnings
    note "build + install into $prefix"
    env "$@" CARGO_TARGET_DIR="$repo/target/$backend" scripts/install.sh "$prefix" --features "$backend"
    note "artifact checks"
    env "$@" scripts/check-artifacts.sh "$backend" "$prefix/lib/libfmha.so"
    if [[ "$run_consumers" == yes ]]; then
        consumers "$prefix" "$build/$backend" allow-skips
    fi
}

# --- stages ---------------------------------------------------------------------------------------

if [[ $skip_setup -eq 0 ]]; then
    begin "toolchains"
    scripts/setup-toolchains.sh
fi

begin "fmt"
cargo fmt --all --check
# Scripts CI does not run (gpu-check.sh runs on the GPU machine) must still parse.
for script in scripts/*.sh .ci/run; do
    bash -n "$script"
done

begin "clippy"
cargo clippy --release --workspace --all-targets -- -D warnings

begin "cargo test"
cargo test --release

begin "valgrind (async prepare, releaser)"
# The lifetime tests (stream held by a gate, launcher destroyed while work is queued, failures inside
# host functions, the releaser under concurrency) run under valgrind: any invalid read or write fails.
valgrind_tests --test async_prepare -- gated launcher_destroyed failures caller_allocator releaser_c_api
valgrind_tests --test hardening -- releaser device_synchronize struct_size
valgrind_tests --lib -- pinned::

begin "AMD kernels (CPU emulation)"
# The AMD forward (hip/fwd/amd/), its kv-cache instance (hip/kvcache/amd/) and the backward's stages
# (dq_dk_dv in hip/bwd/amd/ with dot_do_o and convert_dq), unmodified, with every work-item a fiber and
# MFMA / buffer loads / lane exchange emulated from the documented register layouts, against a float64
# reference (no AMD GPU here); and the merge of attention states (hip/merge/merge.h).
mkdir -p "$build"
for mode in gfx942 gfx950; do
    define=$([[ $mode == gfx950 ]] && echo -DEMU_GFX950 || true)
    for kernel in forward backward kvcache merge; do
        clang++-22 -std=c++20 -O2 -Wno-psabi $define -Itests/hip_emulation -Ihip \
            "tests/hip_emulation/$kernel.cpp" -o "$build/emulate_${kernel}_$mode"
        "$build/emulate_${kernel}_$mode"
    done
done

begin "quickstart"
cargo run --release --example quickstart

begin "fmha-bench (host)"
cargo test --release -p fmha-bench

begin "install (host)"
scripts/install.sh "$build/prefix"
header_drift "$build/prefix"
scripts/check-artifacts.sh host "$build/prefix/lib/libfmha.so"

begin "C examples + pkg-config (host)"
cmake_project c_examples "$build/host/c_examples" "$build/prefix"
run_ctest "$build/host/c_examples"
cmake_project c_examples "$build/host/c_examples_static" "$build/prefix" -DFMHA_EXAMPLES_STATIC=ON
run_ctest "$build/host/c_examples_static"
pkg_config_consumer "$build/prefix" "$build/host/pkgconfig"

begin "C tests (host)"
cmake_project tests/c "$build/host/tests_c" "$build/prefix"
run_ctest "$build/host/tests_c"

begin "fuzz (host)"
# tests/fuzz/README.md. Every case runs in a forked child whose buffers and argument structs sit flush
# against PROT_NONE guard pages: a forbidden input must answer a non-OK status naming the field, a
# valid one must work, nothing may crash, read or write out of bounds, or hang. Then exit(0) under
# load, a 16-thread soak, and a smaller sample of the cases under valgrind. The seed is printed.
cmake_project tests/fuzz "$build/host/fuzz" "$build/prefix"
fuzz=$build/host/fuzz/fmha_fuzz
fuzz_seed=()
if [[ -n "${FMHA_FUZZ_SEED:-}" ]]; then fuzz_seed=(--seed "$FMHA_FUZZ_SEED"); fi
fuzz_failed=0
"$fuzz" all "${fuzz_seed[@]}" --seconds 60 --timeout 5 --soak-seconds 25 || fuzz_failed=1
note "the fuzz cases under valgrind (a sample)"
valgrind -q --error-exitcode=99 "$fuzz" cases "${fuzz_seed[@]}" --sample 240 --light --timeout 15 --seconds 60 ||
    fuzz_failed=1
if [[ $fuzz_failed -ne 0 ]]; then
    echo "test.sh: the fuzz stage failed (the failing cases and their repro commands are listed above)" >&2
    exit 1
fi

begin "Go (host)"
(
    cd bindings/go/fmha
    export PKG_CONFIG_PATH=$build/prefix/lib/pkgconfig
    export LD_LIBRARY_PATH=$build/prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export GOPROXY=off GOFLAGS=-mod=mod
    if [[ -z "${HOME:-}" && -z "${GOCACHE:-}" ]]; then
        export GOCACHE=$build/go/cache GOPATH=$build/go/path
    fi
    go vet ./...
    go test -count=1 -v ./...
)

begin "CMake superbuild (add_subdirectory, FetchContent)"
# The root CMakeLists.txt drives cargo in the target directory of the stages above (the library
# is fresh there); the static build must not need libfmha.so.
for mode in add_subdirectory fetchcontent; do
    note "$mode"
    cmake_project tests/cmake "$build/host/cmake_$mode" "" -DFMHA_TEST_MODE="$mode" \
        -DFMHA_CARGO_TARGET_DIR="$(realpath -m "${CARGO_TARGET_DIR:-target}")"
    run_ctest "$build/host/cmake_$mode"
    if readelf -d "$build/host/cmake_$mode/version_static" | grep -q 'libfmha\.so'; then
        echo "test.sh: the static build of tests/cmake ($mode) depends on libfmha.so" >&2
        exit 1
    fi
done

begin "Python wheel (host)"
# As a user installs it: the wheel built by pip (cargo builds libfmha into it) and installed into a fresh
# venv; the tests that need no PyTorch run against the installed package, outside the source tree.
wheel_dir=$build/python-wheel
rm -rf "$wheel_dir"
python3 -m venv "$wheel_dir/venv"
venv_python=$wheel_dir/venv/bin/python
"$venv_python" -m pip install --quiet --disable-pip-version-check pytest
"$venv_python" -m pip wheel --disable-pip-version-check --no-deps -w "$wheel_dir/dist" .
wheel=$(ls "$wheel_dir"/dist/*.whl)
if [[ $(basename "$wheel") != fmha-*-abi3-linux_*.whl ]]; then
    echo "test.sh: expected one fmha platform wheel (abi3, linux), got: $wheel" >&2
    exit 1
fi
note "$(basename "$wheel"):"
"$venv_python" -m zipfile -l "$wheel"
"$venv_python" -m pip install --quiet --disable-pip-version-check --no-deps "$wheel"
(
    cd "$wheel_dir"
    unset FMHA_LIBRARY
    export FMHA_TEST_INSTALLED=1
    "$venv_python" -c 'import fmha; assert fmha.backend_name() == "host", fmha.backend_name(); print(
        f"--- fmha {fmha.version()}, backend {fmha.backend_name()}, library {fmha.library_path()}")'
    "$venv_python" -m pytest -q -p no:cacheprovider "$repo/tests/python/test_package.py" \
        "$repo/tests/python/test_signatures.py" "$repo/tests/python/test_bench.py"
)

begin "Python with PyTorch (host)"
# The whole Python suite (tests/python) against the installed wheel on the host backend, with the PyTorch
# the GPU machine runs: its PyPI wheel imports without a GPU (with its CUDA libraries, ~5 GB installed;
# the venv is kept between runs). The C++ autograd operator is built (-Werror) against it by the installed
# package (`python -m fmha.native_build`) and loads;
# it serves GPU tensors only, so its autograd tests run on the GPU machine (scripts/gpu-check.sh) and here
# only the plan table's checks do.
torch_version=2.11.0
torch_env=$build/python-torch/venv
torch_python=$torch_env/bin/python
if ! "$torch_python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" \
        2>/dev/null; then
    rm -rf "$torch_env"
    python3 -m venv "$torch_env"
    "$torch_python" -m pip install --quiet --disable-pip-version-check "torch==$torch_version" numpy pytest
fi
"$torch_python" -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall "$wheel"
native_dir=$build/python-torch/native
rm -rf "$native_dir"
# (built as a user of the installed wheel builds it: from the sources the package carries)
(cd "$build/python-torch" && "$torch_python" -m fmha.native_build "$native_dir")
(
    cd "$build/python-torch"
    unset FMHA_LIBRARY
    export FMHA_TEST_INSTALLED=1 FMHA_NATIVE_AUTOGRAD=$native_dir/native_autograd-$torch_version.so
    "$torch_python" -m pytest -q -p no:cacheprovider "$repo/tests/python"
)

if [[ $skip_gpu -eq 0 ]]; then
    begin "cuda build (compile only)"
    gpu_backend cuda yes CUDA_HOME="${CUDA_HOME:-$cuda_home_default}"

    begin "rocm build (compile only)"
    # No C consumers: Debian's libamdhip64.so.5 (HIP 5.2) lacks hipLaunchHostFunc, so a library
    # linked against it cannot be loaded (it is bound at load time); real ROCm installs have it.
    gpu_backend rocm no HIP_PATH="${HIP_PATH:-/usr}"
else
    note "GPU builds skipped (--skip-gpu)"
fi
