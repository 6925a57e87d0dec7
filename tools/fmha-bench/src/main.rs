//! `fmha-bench`: times fmha's operations on the build's backend through the C ABI, over shape
//! matrices, with the kernel identity of every row (the plan's instance), optional verification
//! against the float64 reference, and CSV/JSON output. What CK's tile engine gives its users, for
//! whatever GPU the user has.
//!
//! ```sh
//! cargo run --release -p fmha-bench -- --matrix smoke --verify            # host backend
//! cargo run --release -p fmha-bench --features cuda -- --matrix full --csv full.csv --json full.json
//! fmha-bench --list --filter op=fwd                                       # the compiled instances
//! ```

mod data;
mod device;
mod matrix;
mod ops;
mod report;
mod verify;

use anyhow::{bail, Context, Result};
use clap::Parser;
use fmha::runtime::{self, Stream};
use fmha::test_rng::Rng;
use indicatif::{ProgressBar, ProgressStyle};
use matrix::{Case, Filter};
use report::{Report, Row};
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(version, about = "Benchmarks fmha's forward, backward and kv-cache attention through its C ABI")]
struct Cli {
    /// A built-in matrix (smoke, full, nightly) or a TOML file of groups (see python/fmha/matrices/smoke.toml).
    #[arg(long, default_value = "smoke")]
    matrix: String,
    /// Keep only cases (and instances) whose FIELD equals VALUE (FIELD=VALUE) or contains TEXT
    /// (FIELD~TEXT); case fields (op, dtype, batch, nhead_q, nhead_k, hdim_q, hdim_v, seqlen_q,
    /// seqlen_k, mask, varlen, deterministic, dq_scheme, page_size, table) and instance fields (instance,
    /// pipeline, arch, m0, n0, ...). Repeatable; all must hold.
    #[arg(long)]
    filter: Vec<Filter>,
    /// List the build's compiled kernel instances for this device (the registry) and exit.
    #[arg(long)]
    list: bool,
    /// Check each case's outputs against the float64 reference (sampled rows for big forwards).
    #[arg(long)]
    verify: bool,
    /// Calls before timing.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Timed calls; the report gives their median and minimum.
    #[arg(long, default_value_t = 10)]
    repeat: usize,
    /// Write the rows as CSV.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Write the run (device, matrix, rows) as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Seed of the random inputs (default: from the clock; the report records it).
    #[arg(long)]
    seed: Option<u64>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

fn main() {
    match run(Cli::parse()) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("fmha-bench: {e:#}");
            std::process::exit(2);
        }
    }
}

/// Returns whether every case ran and verified.
fn run(cli: Cli) -> Result<bool> {
    if cli.repeat == 0 {
        bail!("--repeat: must be at least 1");
    }
    let registry = ops::json_out(|b, l, r| fmha::ffi::attention::fmha_registry_json(b, l, r), "fmha_registry_json")?;
    let instances: Vec<BTreeMap<String, serde_json::Value>> = serde_json::from_str(&registry)?;
    if cli.list {
        report::print_instances(&instances, &cli.filter);
        return Ok(true);
    }
    let cases = matrix::load(&cli.matrix)?;
    let case_fields = cases.first().map(Case::fields).unwrap_or_default();
    for f in &cli.filter {
        if !case_fields.contains_key(f.field.as_str()) && !report::INSTANCE_FIELDS.contains(&f.field.as_str()) {
            bail!("--filter: {:?} is neither a case field nor an instance field", f.field);
        }
    }
    let cases: Vec<Case> =
        cases.into_iter().filter(|c| cli.filter.iter().all(|f| f.test(&c.fields()) != Some(false))).collect();
    let seed = cli.seed.unwrap_or_else(|| Rng::fresh().0);
    let mut report = Report::new(&cli.matrix, seed, cli.warmup, cli.repeat)?;

    let bar = if cli.quiet { ProgressBar::hidden() } else { ProgressBar::new(cases.len() as u64) };
    bar.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len} {elapsed_precise} {msg}")?);
    let mut ok = true;
    for (n, case) in cases.iter().enumerate() {
        bar.set_message(report::case_label(case));
        let mut rng = Rng(seed ^ (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let row = bench_case(case, &cli, &mut rng);
        if let Some(row) = row {
            ok &= row.passed();
            if bar.is_hidden() {
                println!("{}", row.line());
            } else {
                bar.println(row.line());
            }
            report.rows.push(row);
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    println!("{}", report.summary());
    if let Some(path) = &cli.csv {
        report.write_csv(path).with_context(|| format!("--csv {}", path.display()))?;
    }
    if let Some(path) = &cli.json {
        report.write_json(path).with_context(|| format!("--json {}", path.display()))?;
    }
    Ok(ok)
}

/// One case's row, or None when an instance filter leaves it out.
fn bench_case(case: &Case, cli: &Cli, rng: &mut Rng) -> Option<Row> {
    let mut row = Row::new(case);
    let mut bench = match ops::create(case, rng) {
        Ok(b) => b,
        Err(e) => {
            row.set_error(&e);
            return Some(row);
        }
    };
    let outcome = (|| -> Result<bool> {
        let plan = bench.plan_json()?;
        row.set_plan(&plan)?;
        if !cli.filter.iter().all(|f| f.test(&row.instance_map()) != Some(false)) {
            return Ok(false);
        }
        let work = bench.work();
        row.set_work(work.flops, work.bytes);
        if cli.verify {
            row.set_verdict(bench.verify()?);
        }
        let times = time(bench.as_mut(), cli.warmup, cli.repeat)?;
        row.set_times(&times);
        Ok(true)
    })();
    match outcome {
        Ok(true) => Some(row),
        Ok(false) => None,
        Err(e) => {
            row.set_error(&e);
            Some(row)
        }
    }
}

/// Milliseconds of each timed call, from device events around it.
fn time(bench: &mut dyn ops::Bench, warmup: usize, repeat: usize) -> Result<Vec<f64>> {
    let rt = runtime::current().map_err(|e| anyhow::anyhow!("{}", e.message))?;
    let err = |e: fmha::Error| anyhow::anyhow!("{}", e.message);
    for _ in 0..warmup {
        bench.launch()?;
    }
    let (start, end) = (rt.event_create().map_err(err)?, rt.event_create().map_err(err)?);
    let mut times = Vec::with_capacity(repeat);
    let result = (|| -> Result<()> {
        for _ in 0..repeat {
            rt.event_record(start, Stream(0)).map_err(err)?;
            bench.launch()?;
            rt.event_record(end, Stream(0)).map_err(err)?;
            rt.event_synchronize(end).map_err(err)?;
            times.push(f64::from(rt.event_elapsed_ms(start, end).map_err(err)?));
        }
        Ok(())
    })();
    let _ = rt.event_destroy(start);
    let _ = rt.event_destroy(end);
    result.map(|()| times)
}
