//! The layering of `src/` (docs/architecture.md), checked on the `crate::` paths every source file
//! names: each top-level module may use only the modules listed for it below, which makes the module
//! graph acyclic, keeps the runtime at the bottom (it knows nothing of operations, kernels or the launch
//! layer), and keeps operations independent of each other.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top-level module → the top-level modules it may use (besides itself).
const ALLOWED: &[(&str, &[&str])] = &[
    ("abi_values", &[]),
    ("error", &["abi_values"]),
    ("test_rng", &[]),
    ("host_buffer", &["error"]),
    ("runtime", &["abi_values", "error"]),
    ("pinned", &["error", "runtime"]),
    ("schedule", &["error"]),
    ("problem", &["abi_values", "error", "runtime"]),
    ("registry", &["error", "problem", "runtime"]),
    ("workspace", &["error", "host_buffer", "schedule"]),
    ("launch", &["error", "host_buffer", "problem", "registry", "runtime", "schedule", "workspace"]),
    ("fwd", &["error", "launch", "problem", "registry", "runtime", "workspace"]),
    (
        "bwd",
        &[
            "abi_values",
            "error",
            "host_buffer",
            "launch",
            "pinned",
            "problem",
            "registry",
            "runtime",
            "schedule",
            "workspace",
        ],
    ),
    ("kvcache", &["error", "launch", "problem", "registry", "runtime", "workspace"]),
    ("merge", &["error", "launch", "problem", "runtime"]),
    ("reference", &["error", "problem"]),
    (
        "ffi",
        &[
            "abi_values",
            "bwd",
            "error",
            "fwd",
            "kvcache",
            "launch",
            "merge",
            "pinned",
            "problem",
            "registry",
            "runtime",
            "VERSION_NUMBER",
        ],
    ),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules `source` names through `crate::` paths (in `use` lines and inline paths,
/// `crate::{a, b}` groups included).
fn crate_paths(source: &str) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    for (at, _) in source.match_indices("crate::") {
        let rest = &source[at + "crate::".len()..];
        let names: Vec<&str> = if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            group.split(',').map(|item| item.trim().split("::").next().unwrap_or("").trim()).collect()
        } else {
            vec![rest.split(|c: char| !(c.is_alphanumeric() || c == '_')).next().unwrap_or("")]
        };
        used.extend(names.into_iter().filter(|n| !n.is_empty()).map(str::to_string));
    }
    used
}

#[test]
fn modules_use_only_the_layers_below_them() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let allowed: BTreeMap<&str, BTreeSet<&str>> =
        ALLOWED.iter().map(|(m, deps)| (*m, deps.iter().copied().collect())).collect();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut violations = Vec::new();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let relative = file.strip_prefix(&src).unwrap();
        let module = relative.components().next().unwrap().as_os_str().to_string_lossy();
        let module = module.trim_end_matches(".rs").to_string();
        if module == "lib" {
            continue;
        }
        let Some(permitted) = allowed.get(module.as_str()) else {
            violations.push(format!("src/{}: module `{module}` has no entry in ALLOWED", relative.display()));
            continue;
        };
        // Crate-wide re-exports of the error type (`crate::Result`, `crate::Status`) count as `error`.
        for used in crate_paths(&std::fs::read_to_string(file).unwrap()) {
            let used = match used.as_str() {
                "Error" | "Result" | "Status" => "error".to_string(),
                _ => used,
            };
            // The tests' RNG may be used anywhere; the float64 reference by test files (`*_tests.rs`).
            if used == module
                || used == "test_rng"
                || (used == "reference" && relative.to_string_lossy().ends_with("_tests.rs"))
            {
                continue;
            }
            graph.entry(module.clone()).or_default().insert(used.clone());
            if !permitted.contains(used.as_str()) {
                violations.push(format!("src/{}: `{module}` uses `crate::{used}`", relative.display()));
            }
        }
    }
    assert!(violations.is_empty(), "layering violations:\n{}", violations.join("\n"));
    // No cycle among the modules actually used (implied by a consistent ALLOWED; checked anyway).
    fn visit(m: &str, graph: &BTreeMap<String, BTreeSet<String>>, path: &mut Vec<String>, done: &mut BTreeSet<String>) {
        if done.contains(m) {
            return;
        }
        assert!(!path.iter().any(|p| p == m), "module cycle: {} -> {m}", path.join(" -> "));
        path.push(m.to_string());
        for next in graph.get(m).into_iter().flatten() {
            visit(next, graph, path, done);
        }
        path.pop();
        done.insert(m.to_string());
    }
    let mut done = BTreeSet::new();
    for m in graph.keys() {
        visit(m, &graph, &mut Vec::new(), &mut done);
    }
    // The runtime is the bottom layer; operations do not use each other.
    for (module, forbidden) in [
        ("runtime", &["fwd", "bwd", "kvcache", "launch"][..]),
        ("fwd", &["bwd", "kvcache"]),
        ("bwd", &["fwd", "kvcache"]),
        ("kvcache", &["fwd", "bwd"]),
    ] {
        let uses = graph.get(module).cloned().unwrap_or_default();
        for f in forbidden {
            assert!(!uses.contains(*f), "`{module}` must not use `{f}`");
        }
    }
}
