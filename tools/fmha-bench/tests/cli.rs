//! The command line as CI and users run it: the smoke matrix verified on the build's backend, the
//! CSV/JSON schema, `--list`, and clear errors for bad arguments.

use std::path::PathBuf;
use std::process::{Command, Output};

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fmha-bench")).args(args).output().expect("fmha-bench runs")
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("fmha-bench-{}-{name}", std::process::id()))
}

/// The columns every row has, in order: the case, the outcome, the kernel's identity, the numbers,
/// the verification, the plan.
const COLUMNS: &str = "op,dtype,batch,nhead_q,nhead_k,hdim_q,hdim_v,seqlen_q,seqlen_k,mask,varlen,deterministic,\
dq_scheme,page_size,table,splits,status,message,arch,instance,m0,n0,pipeline,stages,latency_ms,latency_min_ms,tflops,gb_per_s,\
flops,bytes,verify,verify_max_error,verify_bound,verify_detail,plan";

#[test]
fn smoke_matrix_verifies_and_writes_the_schema() {
    let (csv_path, json_path) = (temp("smoke.csv"), temp("smoke.json"));
    let out = bench(&[
        "--matrix",
        "smoke",
        "--verify",
        "--quiet",
        "--warmup",
        "1",
        "--repeat",
        "2",
        "--csv",
        csv_path.to_str().unwrap(),
        "--json",
        json_path.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));

    let csv = std::fs::read_to_string(&csv_path).unwrap();
    assert_eq!(csv.lines().next().unwrap(), COLUMNS);
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    for key in ["tool", "fmha_version", "backend", "cu_count", "matrix", "seed", "warmup", "repeat", "unix_time"] {
        assert!(!json[key].is_null(), "JSON lacks {key}");
    }
    let rows = json["rows"].as_array().unwrap();
    let records = csv::Reader::from_path(&csv_path).unwrap().records().count();
    assert_eq!(rows.len(), records);
    let columns: Vec<&str> = COLUMNS.split(',').collect();
    let mut ops = std::collections::BTreeSet::new();
    for row in rows {
        let keys: Vec<&str> = row.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys.len(), columns.len(), "{row}");
        assert!(columns.iter().all(|c| keys.contains(c)), "{row}");
        ops.insert(row["op"].as_str().unwrap().to_string());
        if row["status"] == "unsupported" {
            continue; // a GPU build without that kernel
        }
        assert_eq!(row["status"], "ok", "{row}");
        assert_eq!(row["verify"], "pass", "{row}");
        assert!(row["latency_ms"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["tflops"].as_f64().unwrap() > 0.0, "{row}");
        // The kernel's identity: the plan's attention instance, its tile, every stage.
        assert!(row["instance"].as_str().unwrap().starts_with("fmha_"), "{row}");
        assert!(row["m0"].as_i64().unwrap() > 0 && row["n0"].as_i64().unwrap() > 0, "{row}");
        let stages = row["stages"].as_str().unwrap();
        match row["op"].as_str().unwrap() {
            "fwd" => assert_eq!(stages, "fwd"),
            "bwd" => assert!(stages.starts_with("dot_do_o+") && stages.ends_with("dq_dk_dv+convert_dq"), "{stages}"),
            _ => assert!(stages.starts_with("kvcache_fwd"), "{stages}"),
        }
    }
    assert_eq!(ops.into_iter().collect::<Vec<_>>(), ["bwd", "fwd", "kvcache"]);
    assert!(stdout.contains("verify") && stdout.contains("0 fail"), "{stdout}");
    let _ = std::fs::remove_file(csv_path);
    let _ = std::fs::remove_file(json_path);
}

#[test]
fn filters_select_cases_and_instances() {
    let out = bench(&[
        "--matrix",
        "smoke",
        "--quiet",
        "--repeat",
        "1",
        "--warmup",
        "0",
        "--filter",
        "op=kvcache",
        "--filter",
        "table=csr",
        "--filter",
        "dtype=fp8",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let rows: Vec<&str> = stdout.lines().filter(|l| l.starts_with("kvcache")).collect();
    assert!(!rows.is_empty() && rows.iter().all(|l| l.contains(" csr") && l.contains("fp8")), "{stdout}");
    assert!(!stdout.lines().any(|l| l.starts_with("fwd") || l.starts_with("bwd")), "{stdout}");

    let out = bench(&["--list", "--filter", "operation=bwd"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && !stdout.is_empty());
    assert!(stdout.lines().all(|l| l.starts_with("fmha_bwd_")), "{stdout}");
}

#[test]
fn bad_arguments_name_what_is_wrong() {
    let err = |args: &[&str], text: &str| {
        let out = bench(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(text), "{args:?}: {stderr}");
    };
    err(&["--filter", "colour=red"], "colour");
    err(&["--filter", "op"], "FIELD=VALUE");
    err(&["--matrix", "/nonexistent.toml"], "--matrix");
    err(&["--repeat", "0"], "--repeat");
    let bad = temp("bad.toml");
    std::fs::write(
        &bad,
        "[[group]]\nop=[\"fwd\"]\ndtype=[\"int4\"]\nheads=[\"8\"]\nhdim=[\"64\"]\nseqlen=[\"64\"]\nbatch=[1]\n",
    )
    .unwrap();
    err(&["--matrix", bad.to_str().unwrap()], "dtype");
    let _ = std::fs::remove_file(bad);
}
