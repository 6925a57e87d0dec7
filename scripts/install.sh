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
# CARGO_TARGET_DIR is honoured (use one per backend, e.g. target/cuda). The script is idempotent: it
# replaces a previous installation of fmha in PREFIX.
#
# How the static library's native dependencies are found: the library is built with
#   cargo rustc --release --lib --crate-type cdylib,staticlib -- --print native-static-libs
# rustc then prints the linker flags a static link of libfmha.a needs (e.g. for the host backend
# `-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc`; cuda adds `-ldl -lrt -lpthread`, rocm `-lamdhip64
# -lstdc++`). Cargo replays that note when the build is already fresh. The flags go into
# fmha::static's INTERFACE_LINK_LIBRARIES and fmha.pc's Libs.private. Directories of those libraries
# outside the linker's default paths (e.g. /opt/rocm/lib), taken from the build script's
# rustc-link-search lines, are added as -L flags.
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

mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd -P) # absolute, relative to the caller's directory
cd "$repo"

backend=host
case ",$features," in
    *,cuda,*) backend=cuda ;;
    *,rocm,*) backend=rocm ;;
esac

# The package version, from Cargo.toml's [package] section.
version=$(sed -n '/^\[package\]/,/^\[/s/^version *= *"\([^"]*\)".*/\1/p' Cargo.toml | head -n 1)
[[ -n "$version" ]] || { echo "install.sh: cannot read the version from Cargo.toml" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cargo_args=(--release --lib --color never)
[[ -n "$features" ]] && cargo_args+=(--features "$features")

echo "install.sh: building fmha $version ($backend backend${features:+, features $features})"
# stdout: JSON messages (artifacts, build script output); stderr: the rendered compiler messages,
# shown as they come and kept to find the native-static-libs note.
cargo rustc "${cargo_args[@]}" --crate-type cdylib,staticlib --message-format=json-render-diagnostics \
    -- --print native-static-libs 2>&1 >"$work/messages.json" | tee "$work/stderr.log" >&2

json_strings() { # json_strings KEY FILE: the string values of a "KEY":[...] array on matching lines
    grep -o "\"$1\":\[[^]]*\]" "$2" | sed "s/^\"$1\":\[//; s/\]\$//" | tr ',' '\n' | sed 's/^"//; s/"$//' | sed '/^$/d'
}

shared_lib=$(grep '"reason":"compiler-artifact"' "$work/messages.json" | grep -o '"[^"]*/libfmha\.so"' | tail -n 1 | tr -d '"')
static_lib=$(grep '"reason":"compiler-artifact"' "$work/messages.json" | grep -o '"[^"]*/libfmha\.a"' | tail -n 1 | tr -d '"')
grep '"reason":"build-script-executed"' "$work/messages.json" | grep '/build/fmha-' >"$work/build-script.json" || true
out_dir=$(grep -o '"out_dir":"[^"]*"' "$work/build-script.json" | tail -n 1 | sed 's/^"out_dir":"//; s/"$//')
header="$out_dir/fmha.h"
native_libs=$(sed -n 's/.*native-static-libs: //p' "$work/stderr.log" | tail -n 1)

for what in shared_lib static_lib out_dir native_libs; do
    if [[ -z "${!what}" ]]; then
        echo "install.sh: could not determine $what from cargo's output" >&2
        exit 1
    fi
done
[[ -f "$header" ]] || { echo "install.sh: the generated header $header is missing" >&2; exit 1; }
if [[ -f include/fmha.h ]] && ! cmp -s "$header" include/fmha.h; then
    echo "install.sh: warning: include/fmha.h differs from the generated header; installing the generated one" >&2
    echo "            (refresh it: cp '$header' include/fmha.h)" >&2
fi

soname=$(readelf -d "$shared_lib" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
[[ "$soname" == libfmha.so.* ]] || { echo "install.sh: unexpected soname '$soname' of $shared_lib" >&2; exit 1; }

# -L for the directories (from the build script's link-search lines) that hold a library named by
# native_libs and are not a default linker path nor a build directory.
target_dir=$(dirname "$(dirname "$shared_lib")")
dep_dirs=()
while IFS= read -r path; do
    path=${path#*=}
    case "$path" in
        "$target_dir"/* | /lib | /lib64 | /usr/lib | /usr/lib64 | /lib/x86_64-linux-gnu | /usr/lib/x86_64-linux-gnu) continue ;;
    esac
    for flag in $native_libs; do
        if [[ "$flag" == -l* ]] && compgen -G "$path/lib${flag#-l}.so*" >/dev/null; then
            dep_dirs+=("$path")
            break
        fi
    done
done < <(json_strings linked_paths "$work/build-script.json")

static_flags=()
for dir in "${dep_dirs[@]}"; do static_flags+=("-L$dir"); done
for flag in $native_libs; do static_flags+=("$flag"); done
static_text="${static_flags[*]}"
static_cmake=$(IFS=';'; echo "${static_flags[*]}")
dep_dirs_cmake=$(IFS=';'; echo "${dep_dirs[*]}")

render() { # render TEMPLATE OUTPUT
    sed -e "s|@PREFIX@|$prefix|g" \
        -e "s|@FMHA_VERSION@|$version|g" \
        -e "s|@FMHA_BACKEND@|$backend|g" \
        -e "s|@FMHA_FEATURES@|$features|g" \
        -e "s|@FMHA_SONAME@|$soname|g" \
        -e "s|@FMHA_STATIC_LIBS_TEXT@|$static_text|g" \
        -e "s|@FMHA_STATIC_LIBS_CMAKE@|$static_cmake|g" \
        -e "s|@FMHA_DEP_LIB_DIRS_CMAKE@|$dep_dirs_cmake|g" \
        "$1" >"$2.tmp"
    if grep -n '@[A-Z_]*@' "$2.tmp" >&2; then
        echo "install.sh: unsubstituted placeholders in $2" >&2
        exit 1
    fi
    mv "$2.tmp" "$2"
    chmod 0644 "$2"
}

install -d "$prefix/include" "$prefix/lib/cmake/fmha" "$prefix/lib/pkgconfig"
rm -f "$prefix"/lib/libfmha.so "$prefix"/lib/libfmha.so.* "$prefix/lib/libfmha.a"
install -m 0755 "$shared_lib" "$prefix/lib/libfmha.so.$version"
ln -sfn "libfmha.so.$version" "$prefix/lib/$soname"
ln -sfn "$soname" "$prefix/lib/libfmha.so"
install -m 0644 "$static_lib" "$prefix/lib/libfmha.a"
install -m 0644 "$header" "$prefix/include/fmha.h"
render "$repo/cmake/fmhaConfig.cmake.in" "$prefix/lib/cmake/fmha/fmhaConfig.cmake"
render "$repo/cmake/fmhaConfigVersion.cmake.in" "$prefix/lib/cmake/fmha/fmhaConfigVersion.cmake"
render "$repo/cmake/fmha.pc.in" "$prefix/lib/pkgconfig/fmha.pc"

cat <<EOF
install.sh: installed fmha $version ($backend backend) into $prefix
  library   lib/libfmha.so.$version (soname $soname), lib/libfmha.a
  static    links with: $static_text
  CMake     -DCMAKE_PREFIX_PATH=$prefix   then find_package(fmha CONFIG REQUIRED)
  pkg-config PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs fmha
  run time  LD_LIBRARY_PATH=$prefix/lib (or an rpath) for programs linked to the shared library
EOF
