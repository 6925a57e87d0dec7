//! Build script: generates the C header with cbindgen, sets the shared library's soname, compiles the
//! workspace prepare of `hip/bwd/` for the host CPU (every backend), and for the GPU backends compiles
//! the HIP sources in `hip/` into a static archive linked into the crate.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let cuda = env::var_os("CARGO_FEATURE_CUDA").is_some();
    let rocm = env::var_os("CARGO_FEATURE_ROCM").is_some();
    if cuda && rocm {
        panic!("fmha: features `cuda` and `rocm` are mutually exclusive; enable one GPU backend per build");
    }

    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    println!("cargo:rerun-if-changed=cbindgen-kernels.toml");
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=hip");
    for var in ["ROCM_PATH", "FMHA_HIP_ARCHS", "FMHA_HIP_CXX", "CUDA_HOME", "FMHA_CUDA_ARCHS"] {
        println!("cargo:rerun-if-env-changed={var}");
    }

    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    generate_header(&out_dir);
    generate_kernel_header(&out_dir);
    build_cpu_twins();

    // The soname carries the ABI major version: only an ABI break bumps it.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libfmha.so.0");

    if cuda {
        build_cuda();
    } else if rocm {
        build_rocm();
    }
}

fn generate_header(out_dir: &Path) {
    let crate_dir = env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let mut config =
        cbindgen::Config::from_file(Path::new(&crate_dir).join("cbindgen.toml")).expect("cbindgen.toml is readable");
    let major = env::var("CARGO_PKG_VERSION_MAJOR").unwrap();
    let minor = env::var("CARGO_PKG_VERSION_MINOR").unwrap();
    let patch = env::var("CARGO_PKG_VERSION_PATCH").unwrap();
    config.after_includes = Some(format!(
        "\n#define FMHA_VERSION_MAJOR {major}\n#define FMHA_VERSION_MINOR {minor}\n#define FMHA_VERSION_PATCH {patch}\n\
         #define FMHA_VERSION_STRING \"{major}.{minor}.{patch}\"\n\
         #define FMHA_VERSION_NUMBER (FMHA_VERSION_MAJOR * 10000 + FMHA_VERSION_MINOR * 100 + FMHA_VERSION_PATCH)\n"
    ));
    // Only `src/ffi/` and the ABI's values (`src/abi_values.rs`) are the ABI: cbindgen starts at
    // ffi's mod.rs and follows its submodules, so internal public items never leak into the header.
    cbindgen::Builder::new()
        .with_config(config)
        .with_src(Path::new(&crate_dir).join("src/ffi/mod.rs"))
        .with_src(Path::new(&crate_dir).join("src/abi_values.rs"))
        .generate()
        .expect("cbindgen generates the header")
        .write_to_file(out_dir.join("fmha.h"));
}

/// The kernels' C ABI (`hip/launch.h`: parameter blocks, metadata records, C++ entry points), from
/// `src/launch/abi.rs` and `src/schedule/records.rs`, into `OUT_DIR/launch.h`. The kernels compile
/// against the committed `hip/launch.h`; `tests/kernel_abi.rs` checks that it equals this one.
fn generate_kernel_header(out_dir: &Path) {
    let crate_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen-kernels.toml"))
        .expect("cbindgen-kernels.toml is readable");
    cbindgen::Builder::new()
        .with_config(config)
        .with_src(crate_dir.join("src/launch/abi.rs"))
        .with_src(crate_dir.join("src/schedule/records.rs"))
        .generate()
        .expect("cbindgen generates the kernel header")
        .write_to_file(out_dir.join("launch.h"));
}

/// The C++ the GPU kernels run, compiled for the host CPU into its own archive in every backend: the
/// workspace prepare (`hip/bwd/prepare_workspace.h`) and the deterministic walkers
/// (`hip/bwd/schedule.h`). The tests compare them with the Rust code, so CI checks the device code
/// paths without a GPU. Plain C++17 without the standard library or exceptions, so nothing beyond libc
/// is linked. (`hip/` is watched by rerun-if-changed.)
fn build_cpu_twins() {
    cc::Build::new()
        .cpp(true)
        .cpp_link_stdlib(None)
        .std("c++17")
        .opt_level(2)
        .flag("-fno-exceptions")
        .flag("-fno-rtti")
        .include("hip")
        .file("hip/bwd/prepare_workspace_cpu.cpp")
        .file("hip/bwd/schedule_cpu.cpp")
        .file("hip/kvcache/prepare_cpu.cpp")
        .file("hip/fwd/sm90/tile_walk_cpu.cpp")
        .compile("fmha_cpu_twins");
}

/// Every `.hip` translation unit under `hip/` (headers are included from them).
fn hip_sources() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir).expect("hip/ is readable").flatten().collect();
        entries.sort_by_key(|e| e.path());
        for entry in entries {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "hip") {
                out.push(path);
            }
        }
    }
    let mut sources = Vec::new();
    walk(Path::new("hip"), &mut sources);
    sources
}

fn arch_list(var: &str, default: &str) -> Vec<String> {
    env::var(var)
        .unwrap_or_else(|_| default.to_string())
        .split(',')
        .map(|a| a.trim().to_string())
        .filter(|a| !a.is_empty())
        .collect()
}

fn build_cuda() {
    let cuda_home = env::var("CUDA_HOME").ok().map(PathBuf::from).or_else(|| {
        // nvcc on PATH: CUDA_HOME is its parent directory.
        let out = Command::new("sh").args(["-c", "command -v nvcc"]).output().ok()?;
        let nvcc = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
        nvcc.parent()?.parent().map(Path::to_path_buf)
    });
    let cuda_home = cuda_home.unwrap_or_else(|| {
        panic!("fmha (feature cuda): nvcc not found; set CUDA_HOME or put nvcc on PATH (scripts/setup-toolchains.sh installs CUDA 13.0)")
    });
    let nvcc = cuda_home.join("bin/nvcc");
    let mut build = cc::Build::new();
    build
        .compiler(&nvcc)
        // cc's own flags are for gcc/clang (and debug builds would add -G): set every flag here.
        .no_default_flags(true)
        .flag("-x")
        .flag("cu")
        .flag("-Xcompiler=-fPIC")
        .flag("-std=c++17")
        .flag("-O3")
        .flag("-Xptxas=-warn-spills")
        .include("hip")
        .warnings(false);
    for arch in arch_list("FMHA_CUDA_ARCHS", "90a") {
        build.flag(format!("-gencode=arch=compute_{arch},code=sm_{arch}"));
    }
    build.files(hip_sources());
    // Whole archive: kernels reached only through launch stubs (or only by tests) must still land in
    // the shared library with their device code.
    build.link_lib_modifier("+whole-archive");
    build.compile("fmha_kernels");
    println!("cargo:rustc-link-search=native={}", cuda_home.join("lib").display());
    println!("cargo:rustc-link-search=native={}", cuda_home.join("lib64").display());
    println!("cargo:rustc-link-lib=static=cudart_static");
    // cudart_static and the kernels' host code are C++ (static-init guards, exception personality).
    for lib in ["stdc++", "dl", "rt", "pthread"] {
        println!("cargo:rustc-link-lib=dylib={lib}");
    }
}

fn build_rocm() {
    let rocm_path = env::var("ROCM_PATH").ok().map(PathBuf::from);
    let compiler = env::var("FMHA_HIP_CXX").map(PathBuf::from).unwrap_or_else(|_| match &rocm_path {
        Some(root) if root.join("llvm/bin/clang++").exists() => root.join("llvm/bin/clang++"),
        _ => PathBuf::from("clang++-22"),
    });
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .compiler(&compiler)
        .no_default_flags(true)
        .flag("-fPIC")
        .flag("-x")
        .flag("hip")
        .flag("-nogpulib")
        .flag("-nogpuinc")
        .flag("-mcode-object-version=5")
        .flag("-std=c++17")
        .flag("-O3")
        .include("hip")
        .warnings(false);
    for arch in arch_list("FMHA_HIP_ARCHS", "gfx942,gfx950") {
        build.flag(format!("--offload-arch={arch}"));
    }
    build.files(hip_sources());
    // Whole archive: kernels reached only through launch stubs (or only by tests) must still land in
    // the shared library with their device code.
    build.link_lib_modifier("+whole-archive");
    build.compile("fmha_kernels");
    let lib_dir = rocm_path.map(|r| r.join("lib")).unwrap_or_else(|| PathBuf::from("/usr/lib/x86_64-linux-gnu"));
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=dylib=amdhip64");
    // The kernels' host-side code is C++.
    println!("cargo:rustc-link-lib=dylib=stdc++");
}
