//! Rows, the terminal summary, CSV and JSON. A row carries everything that identifies the kernel
//! (the plan's instance: name, tile, pipeline, arch; every stage) next to the case and its numbers.

use crate::device::CallError;
use crate::matrix::{Case, Filter};
use crate::verify::Verdict;
use anyhow::Result;
use fmha::ffi::status::FMHA_ERR_UNSUPPORTED;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// One case's result. Flat, so that CSV and JSON share the columns.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub op: String,
    pub dtype: String,
    pub batch: usize,
    pub nhead_q: usize,
    pub nhead_k: usize,
    pub hdim_q: usize,
    pub hdim_v: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub mask: String,
    pub varlen: bool,
    pub deterministic: bool,
    pub dq_scheme: String,
    pub page_size: usize,
    pub table: String,
    pub splits: usize,
    /// `ok`, `unsupported` (this build has no kernel for it) or `error`.
    pub status: String,
    pub message: String,
    pub arch: String,
    pub instance: String,
    pub m0: Option<i64>,
    pub n0: Option<i64>,
    pub pipeline: String,
    /// The plan's kernels in launch order, `+`-separated.
    pub stages: String,
    pub latency_ms: Option<f64>,
    pub latency_min_ms: Option<f64>,
    pub tflops: Option<f64>,
    pub gb_per_s: Option<f64>,
    pub flops: Option<f64>,
    pub bytes: Option<f64>,
    pub verify: String,
    pub verify_max_error: Option<f64>,
    pub verify_bound: Option<f64>,
    pub verify_detail: String,
    /// The plan as `fmha_*_plan_json` wrote it.
    pub plan: String,
}

/// The fields of a row's kernel that `--filter` may name (besides the case's): the plan's attention
/// instance (`instance` is its name) and `stages`.
pub const INSTANCE_FIELDS: [&str; 8] = ["instance", "pipeline", "arch", "m0", "n0", "masked", "packed_gqa", "stages"];

impl Row {
    pub fn new(case: &Case) -> Row {
        Row {
            op: case.op.name().into(),
            dtype: case.dtype.name().into(),
            batch: case.batch,
            nhead_q: case.nhead_q,
            nhead_k: case.nhead_k,
            hdim_q: case.hdim_q,
            hdim_v: case.hdim_v,
            seqlen_q: case.seqlen_q,
            seqlen_k: case.seqlen_k,
            mask: case.mask_text.clone(),
            varlen: case.varlen,
            deterministic: case.deterministic,
            dq_scheme: case.dq_scheme.clone(),
            page_size: case.page_size,
            table: case.table.clone(),
            splits: case.splits,
            status: "ok".into(),
            message: String::new(),
            arch: String::new(),
            instance: String::new(),
            m0: None,
            n0: None,
            pipeline: String::new(),
            stages: String::new(),
            latency_ms: None,
            latency_min_ms: None,
            tflops: None,
            gb_per_s: None,
            flops: None,
            bytes: None,
            verify: "off".into(),
            verify_max_error: None,
            verify_bound: None,
            verify_detail: String::new(),
            plan: String::new(),
        }
    }

    pub fn set_error(&mut self, e: &anyhow::Error) {
        let unsupported = e.downcast_ref::<CallError>().is_some_and(|c| c.status == FMHA_ERR_UNSUPPORTED);
        self.status = if unsupported { "unsupported" } else { "error" }.into();
        self.message = format!("{e:#}");
    }

    pub fn set_plan(&mut self, json: &str) -> Result<()> {
        let plan: serde_json::Value = serde_json::from_str(json)?;
        self.arch = plan["arch"].as_str().unwrap_or_default().into();
        let stages = plan["stages"].as_array().cloned().unwrap_or_default();
        self.stages = stages.iter().filter_map(|s| s["kernel"].as_str()).collect::<Vec<_>>().join("+");
        if let Some(i) = stages.iter().find_map(|s| s["instance"].as_object()) {
            self.instance = i["name"].as_str().unwrap_or_default().into();
            self.pipeline = i["pipeline"].as_str().unwrap_or_default().into();
            self.m0 = i["m0"].as_i64();
            self.n0 = i["n0"].as_i64();
        }
        self.plan = json.into();
        Ok(())
    }

    /// The instance fields `--filter` tests.
    pub fn instance_map(&self) -> BTreeMap<&'static str, String> {
        let plan: serde_json::Value = serde_json::from_str(&self.plan).unwrap_or_default();
        let instance =
            plan["stages"].as_array().and_then(|s| s.iter().find_map(|s| s["instance"].as_object().cloned()));
        INSTANCE_FIELDS
            .into_iter()
            .map(|name| {
                let value = match name {
                    "instance" => self.instance.clone(),
                    "arch" => self.arch.clone(),
                    "stages" => self.stages.clone(),
                    _ => instance.as_ref().map(|i| text(&i[name])).unwrap_or_default(),
                };
                (name, value)
            })
            .collect()
    }

    pub fn set_work(&mut self, flops: f64, bytes: f64) {
        self.flops = Some(flops);
        self.bytes = Some(bytes);
    }

    pub fn set_verdict(&mut self, v: Verdict) {
        self.verify = v.status.clone();
        if v.status == "pass" || v.status == "fail" {
            self.verify_max_error = Some(v.max_error);
            self.verify_bound = Some(v.bound);
        }
        self.verify_detail = v.detail;
    }

    pub fn set_times(&mut self, times_ms: &[f64]) {
        let mut sorted = times_ms.to_vec();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[sorted.len() / 2];
        self.latency_ms = Some(median);
        self.latency_min_ms = sorted.first().copied();
        let seconds = median * 1e-3;
        if seconds > 0.0 {
            self.tflops = self.flops.map(|f| f / seconds / 1e12);
            self.gb_per_s = self.bytes.map(|b| b / seconds / 1e9);
        }
    }

    /// A verification that failed or a call that errored fails the run; an unsupported case does not.
    pub fn passed(&self) -> bool {
        self.status != "error" && self.verify != "fail"
    }

    /// One line for the terminal.
    pub fn line(&self) -> String {
        let label = format!(
            "{} {} b{} h{}/{} d{}/{} s{}/{} mask {}{}{}{}",
            self.op,
            self.dtype,
            self.batch,
            self.nhead_q,
            self.nhead_k,
            self.hdim_q,
            self.hdim_v,
            self.seqlen_q,
            self.seqlen_k,
            self.mask,
            if self.varlen { " varlen" } else { "" },
            if !self.deterministic {
                String::new()
            } else if self.dq_scheme == "auto" {
                " det".into()
            } else {
                format!(" det {}", self.dq_scheme)
            },
            if self.page_size > 0 {
                format!(
                    " page {} {}{}",
                    self.page_size,
                    self.table,
                    if self.splits > 0 { format!(" splits {}", self.splits) } else { String::new() }
                )
            } else {
                String::new()
            },
        );
        match (self.status.as_str(), self.latency_ms) {
            ("ok", Some(ms)) => format!(
                "{label}: {ms:.4} ms, {:.3} TFLOPS, {:.1} GB/s, verify {} [{}]",
                self.tflops.unwrap_or(0.0),
                self.gb_per_s.unwrap_or(0.0),
                self.verify,
                self.instance
            ),
            (status, _) => format!("{label}: {status}: {}", self.message),
        }
    }
}

fn text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The label of a case in the progress bar.
pub fn case_label(case: &Case) -> String {
    format!("{} {} s{}/{} d{}", case.op.name(), case.dtype.name(), case.seqlen_q, case.seqlen_k, case.hdim_q)
}

/// The run: where it ran and its rows.
#[derive(Debug, Serialize)]
pub struct Report {
    pub tool: &'static str,
    pub tool_version: &'static str,
    pub fmha_version: String,
    pub backend: String,
    pub cu_count: i64,
    pub matrix: String,
    pub seed: u64,
    pub warmup: usize,
    pub repeat: usize,
    pub unix_time: u64,
    pub rows: Vec<Row>,
}

impl Report {
    pub fn new(matrix: &str, seed: u64, warmup: usize, repeat: usize) -> Result<Report> {
        let backend = match fmha::ffi::version::fmha_backend() {
            fmha::ffi::version::FMHA_BACKEND_CUDA => "cuda",
            fmha::ffi::version::FMHA_BACKEND_ROCM => "rocm",
            _ => "host",
        };
        let rt = fmha::runtime::current().map_err(|e| anyhow::anyhow!("{}", e.message))?;
        Ok(Report {
            tool: "fmha-bench",
            tool_version: env!("CARGO_PKG_VERSION"),
            fmha_version: {
                let n = fmha::VERSION_NUMBER;
                format!("{}.{}.{}", n / 10000, n / 100 % 100, n % 100)
            },
            backend: backend.into(),
            cu_count: rt.cu_count().map_err(|e| anyhow::anyhow!("{}", e.message))?,
            matrix: matrix.into(),
            seed,
            warmup,
            repeat,
            unix_time: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
            rows: Vec::new(),
        })
    }

    pub fn summary(&self) -> String {
        let count = |f: &dyn Fn(&Row) -> bool| self.rows.iter().filter(|r| f(r)).count();
        format!(
            "fmha-bench: {} cases on {} ({} CUs, seed {}): {} ran, {} unsupported, {} errors; verify {} pass, {} fail, {} skipped",
            self.rows.len(),
            self.backend,
            self.cu_count,
            self.seed,
            count(&|r| r.status == "ok"),
            count(&|r| r.status == "unsupported"),
            count(&|r| r.status == "error"),
            count(&|r| r.verify == "pass"),
            count(&|r| r.verify == "fail"),
            count(&|r| r.verify == "skipped"),
        )
    }

    pub fn write_csv(&self, path: &Path) -> Result<()> {
        let mut w = csv::Writer::from_path(path)?;
        for row in &self.rows {
            w.serialize(row)?;
        }
        w.flush()?;
        Ok(())
    }

    pub fn write_json(&self, path: &Path) -> Result<()> {
        std::fs::write(path, serde_json::to_string_pretty(self)?)?;
        Ok(())
    }
}

/// `--list`: the registry's instances that pass the filters, one per line.
pub fn print_instances(instances: &[BTreeMap<String, serde_json::Value>], filters: &[Filter]) {
    for i in instances {
        let fields: BTreeMap<&str, String> =
            i.iter().map(|(k, v)| (if k == "name" { "instance" } else { k.as_str() }, text(v))).collect();
        if filters.iter().all(|f| f.test(&fields) != Some(false)) {
            println!(
                "{:<70} {:<8} {:<7} {:<9} d{}/{} masked={} deterministic={} packed_gqa={} tile {}x{} {}",
                fields["instance"],
                fields["operation"],
                fields["arch"],
                fields["dtype"],
                fields["hdim_q"],
                fields["hdim_v"],
                fields["masked"],
                fields["deterministic"],
                fields["packed_gqa"],
                fields["m0"],
                fields["n0"],
                fields["pipeline"]
            );
        }
    }
}
