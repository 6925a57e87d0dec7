//! Shape matrices: TOML files of groups whose lists expand to their cartesian product of cases.
//!
//! ```toml
//! [[group]]
//! op = ["fwd", "bwd"]          # fwd | bwd | kvcache
//! dtype = ["bf16"]             # fp16 | bf16 | fp8 (OCP e4m3fn) | fp8fnuz
//! heads = ["16", "32/8"]       # nhead_q or nhead_q/nhead_k
//! hdim = ["128", "192/128"]    # hdim_q or hdim_q/hdim_v
//! seqlen = ["1024", "1/4096"]  # seqlen_q or seqlen_q/seqlen_k
//! batch = [2]                  # or tokens = [16384]: batch = tokens / seqlen_q
//! mask = ["0", "b", "b:128,0"] # CK's mask syntax (none, causal top-left t / bottom-right b, windows)
//! varlen = [false, true]       # group mode: sequence i of the batch has lengths scaled by (i+1)/batch
//! deterministic = [false]      # bwd
//! dq_scheme = ["auto"]           # bwd, deterministic: auto | split | ordered (FMHA_DQ_SCHEME_*)
//! page_size = [16]             # kvcache: tokens per page
//! table = ["block"]            # kvcache: block | csr
//! splits = [0]                 # kvcache: max_splits of the launcher (0: the library's heuristic)
//! ```

use anyhow::{bail, Context, Result};
use fmha::problem::mask::{self, Mask};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

/// The matrices shipped with the tool (`--matrix NAME`); any other value is a path.
pub const BUILT_IN: [(&str, &str); 3] = [
    ("smoke", include_str!("../../../python/fmha/matrices/smoke.toml")),
    ("full", include_str!("../../../python/fmha/matrices/full.toml")),
    ("nightly", include_str!("../../../python/fmha/matrices/nightly.toml")),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Fwd,
    Bwd,
    Kvcache,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Fwd => "fwd",
            Op::Bwd => "bwd",
            Op::Kvcache => "kvcache",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DtypeName {
    Fp16,
    Bf16,
    Fp8,
    Fp8fnuz,
}

impl DtypeName {
    pub fn name(self) -> &'static str {
        match self {
            DtypeName::Fp16 => "fp16",
            DtypeName::Bf16 => "bf16",
            DtypeName::Fp8 => "fp8",
            DtypeName::Fp8fnuz => "fp8fnuz",
        }
    }

    pub fn bytes(self) -> usize {
        match self {
            DtypeName::Fp16 | DtypeName::Bf16 => 2,
            DtypeName::Fp8 | DtypeName::Fp8fnuz => 1,
        }
    }

    pub fn is_fp8(self) -> bool {
        self.bytes() == 1
    }
}

/// One benchmark case.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    pub op: Op,
    pub dtype: DtypeName,
    pub batch: usize,
    pub nhead_q: usize,
    pub nhead_k: usize,
    pub hdim_q: usize,
    pub hdim_v: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    /// As written in the matrix (CK's syntax) and parsed.
    pub mask_text: String,
    pub mask: Mask,
    pub varlen: bool,
    pub deterministic: bool,
    /// Deterministic backward: `auto`, `split` or `ordered` (`auto` elsewhere).
    pub dq_scheme: String,
    pub page_size: usize,
    pub table: String,
    /// kvcache: the launcher's `max_splits` (0: the library's heuristic).
    pub splits: usize,
}

impl Case {
    /// `(seqlen_q, seqlen_k)` of each sequence: all equal in batch mode; in group mode sequence `i`
    /// has `⌈len · (i + 1) / batch⌉` of each (a spread of lengths up to the given ones).
    pub fn seqlens(&self) -> Vec<(usize, usize)> {
        (0..self.batch)
            .map(|i| {
                if self.varlen {
                    let part = |len: usize| (len * (i + 1)).div_ceil(self.batch);
                    (part(self.seqlen_q), part(self.seqlen_k))
                } else {
                    (self.seqlen_q, self.seqlen_k)
                }
            })
            .collect()
    }

    /// Kept (query, key) pairs over every sequence: the attention's work.
    pub fn kept_pairs(&self) -> f64 {
        self.seqlens()
            .iter()
            .map(|&(sq, sk)| {
                let m = self.mask.resolve(sq as i64, sk as i64);
                (0..sq as i64).map(|i| m.key_range(i, i + 1)).map(|(a, b)| (b - a) as f64).sum::<f64>()
            })
            .sum()
    }

    /// Operations of the forward's two matrix products over the kept pairs.
    pub fn attention_flops(&self) -> f64 {
        2.0 * self.kept_pairs() * (self.nhead_q * (self.hdim_q + self.hdim_v)) as f64
    }

    /// Bytes of q and of every sequence's k and v read, and of o written, once each.
    pub fn io_bytes(&self) -> f64 {
        let lens = self.seqlens();
        let tq = lens.iter().map(|s| s.0).sum::<usize>() as f64;
        let tk = lens.iter().map(|s| s.1).sum::<usize>() as f64;
        let e = self.dtype.bytes() as f64;
        tq * (self.nhead_q * self.hdim_q) as f64 * e
            + tk * (self.nhead_k * (self.hdim_q + self.hdim_v)) as f64 * e
            + tq * (self.nhead_q * self.hdim_v * self.dtype.output().bytes()) as f64
    }

    /// The case's fields by name, as `--filter` and the report see them.
    pub fn fields(&self) -> BTreeMap<&'static str, String> {
        BTreeMap::from([
            ("op", self.op.name().to_string()),
            ("dtype", self.dtype.name().to_string()),
            ("batch", self.batch.to_string()),
            ("nhead_q", self.nhead_q.to_string()),
            ("nhead_k", self.nhead_k.to_string()),
            ("hdim_q", self.hdim_q.to_string()),
            ("hdim_v", self.hdim_v.to_string()),
            ("seqlen_q", self.seqlen_q.to_string()),
            ("seqlen_k", self.seqlen_k.to_string()),
            ("mask", self.mask_text.clone()),
            ("varlen", self.varlen.to_string()),
            ("deterministic", self.deterministic.to_string()),
            ("dq_scheme", self.dq_scheme.clone()),
            ("page_size", self.page_size.to_string()),
            ("table", self.table.clone()),
            ("splits", self.splits.to_string()),
        ])
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    group: Vec<Group>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Group {
    op: Vec<String>,
    dtype: Vec<String>,
    heads: Vec<String>,
    hdim: Vec<String>,
    seqlen: Vec<String>,
    #[serde(default)]
    batch: Vec<usize>,
    #[serde(default)]
    tokens: Vec<usize>,
    #[serde(default = "default_mask")]
    mask: Vec<String>,
    #[serde(default = "default_false")]
    varlen: Vec<bool>,
    #[serde(default = "default_false")]
    deterministic: Vec<bool>,
    #[serde(default = "default_dq_scheme")]
    dq_scheme: Vec<String>,
    #[serde(default = "default_page")]
    page_size: Vec<usize>,
    #[serde(default = "default_table")]
    table: Vec<String>,
    #[serde(default = "default_splits")]
    splits: Vec<usize>,
}

fn default_mask() -> Vec<String> {
    vec!["0".into()]
}
fn default_dq_scheme() -> Vec<String> {
    vec!["auto".into()]
}
fn default_false() -> Vec<bool> {
    vec![false]
}
fn default_page() -> Vec<usize> {
    vec![16]
}
fn default_splits() -> Vec<usize> {
    vec![0]
}
fn default_table() -> Vec<String> {
    vec!["block".into()]
}

/// `"a"` → (a, a), `"a/b"` → (a, b).
fn pair(field: &str, text: &str) -> Result<(usize, usize)> {
    let parse = |s: &str| s.trim().parse::<usize>().with_context(|| format!("{field}: {text:?} is not N or N/M"));
    match text.split_once('/') {
        Some((a, b)) => Ok((parse(a)?, parse(b)?)),
        None => {
            let a = parse(text)?;
            Ok((a, a))
        }
    }
}

fn op(text: &str) -> Result<Op> {
    Ok(match text {
        "fwd" => Op::Fwd,
        "bwd" => Op::Bwd,
        "kvcache" => Op::Kvcache,
        _ => bail!("op: {text:?} is not fwd, bwd or kvcache"),
    })
}

fn dtype(text: &str) -> Result<DtypeName> {
    Ok(match text {
        "fp16" => DtypeName::Fp16,
        "bf16" => DtypeName::Bf16,
        "fp8" => DtypeName::Fp8,
        "fp8fnuz" => DtypeName::Fp8fnuz,
        _ => bail!("dtype: {text:?} is not fp16, bf16, fp8 or fp8fnuz"),
    })
}

/// Reads a matrix: a built-in name or a TOML file.
pub fn load(name_or_path: &str) -> Result<Vec<Case>> {
    let text = match BUILT_IN.iter().find(|(name, _)| *name == name_or_path) {
        Some((_, text)) => text.to_string(),
        None => std::fs::read_to_string(Path::new(name_or_path)).with_context(|| {
            format!(
                "--matrix: {name_or_path:?} is neither a built-in matrix (smoke, full, nightly) nor a readable file"
            )
        })?,
    };
    let file: File = toml::from_str(&text).with_context(|| format!("matrix {name_or_path}"))?;
    let mut cases = Vec::new();
    for (g, group) in file.group.iter().enumerate() {
        expand(group, &mut cases).with_context(|| format!("matrix {name_or_path}, group {}", g + 1))?;
    }
    Ok(cases)
}

/// `cases` × `values`, each copy updated by `set` (the product's order: earlier fields vary slowest).
fn times<T>(cases: Vec<Case>, values: &[T], set: impl Fn(&mut Case, &T) -> Result<()>) -> Result<Vec<Case>> {
    let mut out = Vec::with_capacity(cases.len() * values.len());
    for case in cases {
        for value in values {
            let mut c = case.clone();
            set(&mut c, value)?;
            out.push(c);
        }
    }
    Ok(out)
}

fn expand(g: &Group, out: &mut Vec<Case>) -> Result<()> {
    if g.batch.is_empty() == g.tokens.is_empty() {
        bail!("give exactly one of batch and tokens");
    }
    let start = Case {
        op: Op::Fwd,
        dtype: DtypeName::Bf16,
        batch: 0,
        nhead_q: 0,
        nhead_k: 0,
        hdim_q: 0,
        hdim_v: 0,
        seqlen_q: 0,
        seqlen_k: 0,
        mask_text: String::new(),
        mask: Mask::NONE,
        varlen: false,
        deterministic: false,
        dq_scheme: "auto".into(),
        page_size: 0,
        table: String::new(),
        splits: 0,
    };
    let mut cases = times(vec![start], &g.op, |c, t| {
        c.op = op(t)?;
        Ok(())
    })?;
    cases = times(cases, &g.dtype, |c, t| {
        c.dtype = dtype(t)?;
        Ok(())
    })?;
    cases = times(cases, &g.heads, |c, t| {
        (c.nhead_q, c.nhead_k) = pair("heads", t)?;
        Ok(())
    })?;
    cases = times(cases, &g.hdim, |c, t| {
        (c.hdim_q, c.hdim_v) = pair("hdim", t)?;
        Ok(())
    })?;
    cases = times(cases, &g.seqlen, |c, t| {
        (c.seqlen_q, c.seqlen_k) = pair("seqlen", t)?;
        Ok(())
    })?;
    cases = times(cases, &g.mask, |c, t| {
        c.mask = mask::parse(t).map_err(|e| anyhow::anyhow!("{}", e.message))?;
        c.mask_text = t.clone();
        Ok(())
    })?;
    cases = times(cases, &g.varlen, |c, &v| {
        c.varlen = v;
        Ok(())
    })?;
    // Fields of one operation only stay at their neutral value on the others.
    cases = times(cases, &g.deterministic, |c, &v| {
        c.deterministic = v && c.op == Op::Bwd;
        Ok(())
    })?;
    cases = times(cases, &g.dq_scheme, |c, t| {
        if !matches!(t.as_str(), "auto" | "split" | "ordered") {
            bail!("dq_scheme: {t:?} is not auto, split or ordered");
        }
        c.dq_scheme = if c.deterministic { t.clone() } else { "auto".into() };
        Ok(())
    })?;
    cases = times(cases, &g.page_size, |c, &v| {
        c.page_size = if c.op == Op::Kvcache { v } else { 0 };
        Ok(())
    })?;
    cases = times(cases, &g.table, |c, t| {
        if !matches!(t.as_str(), "block" | "csr") {
            bail!("table: {t:?} is not block or csr");
        }
        c.table = if c.op == Op::Kvcache { t.clone() } else { String::new() };
        Ok(())
    })?;
    cases = times(cases, &g.splits, |c, &v| {
        c.splits = if c.op == Op::Kvcache { v } else { 0 };
        Ok(())
    })?;
    for case in cases {
        let batches: Vec<usize> = if g.tokens.is_empty() {
            g.batch.clone()
        } else {
            g.tokens.iter().map(|t| (t / case.seqlen_q.max(1)).max(1)).collect()
        };
        for batch in batches {
            let case = Case { batch, ..case.clone() };
            if !out.contains(&case) {
                out.push(case);
            }
        }
    }
    Ok(())
}

/// One `--filter`: `field=value` (equal) or `field~text` (contains), on a case's or its kernel
/// instance's fields.
#[derive(Debug, Clone)]
pub struct Filter {
    pub field: String,
    pub value: String,
    pub contains: bool,
}

impl std::str::FromStr for Filter {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Filter, String> {
        let (at, contains) = match (s.find('='), s.find('~')) {
            (Some(e), Some(t)) => (e.min(t), t < e),
            (Some(e), None) => (e, false),
            (None, Some(t)) => (t, true),
            (None, None) => return Err(format!("{s:?} is not FIELD=VALUE or FIELD~TEXT")),
        };
        Ok(Filter { field: s[..at].to_string(), value: s[at + 1..].to_string(), contains })
    }
}

impl Filter {
    /// `Some(matches)` when `fields` has the filter's field, `None` when it does not.
    pub fn test(&self, fields: &BTreeMap<&str, String>) -> Option<bool> {
        let value = fields.get(self.field.as_str())?;
        Some(if self.contains { value.contains(&self.value) } else { *value == self.value })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_matrices_parse_and_expand() {
        for (name, _) in BUILT_IN {
            let cases = load(name).unwrap();
            assert!(!cases.is_empty(), "{name}");
        }
    }

    #[test]
    fn groups_expand_to_their_product() {
        let group: File = toml::from_str(
            r#"[[group]]
op = ["fwd", "bwd"]
dtype = ["bf16"]
heads = ["8/2"]
hdim = ["128", "192/128"]
seqlen = ["100", "1/300"]
tokens = [400]
mask = ["0", "b"]
"#,
        )
        .unwrap();
        let mut cases = Vec::new();
        expand(&group.group[0], &mut cases).unwrap();
        assert_eq!(cases.len(), 2 * 2 * 2 * 2);
        let c = cases.iter().find(|c| c.seqlen_q == 1 && c.hdim_q == 192).unwrap();
        assert_eq!((c.batch, c.seqlen_k, c.hdim_v, c.nhead_q, c.nhead_k), (400, 300, 128, 8, 2));
        assert_eq!(cases.iter().find(|c| c.seqlen_q == 100).unwrap().batch, 4);
    }

    #[test]
    fn bad_fields_are_named() {
        let bad = |text: &str, what: &str| {
            let file: std::result::Result<File, _> = toml::from_str(text);
            let err = match file {
                Err(e) => e.to_string(),
                Ok(f) => format!("{:#}", expand(&f.group[0], &mut Vec::new()).unwrap_err()),
            };
            assert!(err.contains(what), "{err}");
        };
        let base = "op=[\"fwd\"]\ndtype=[\"bf16\"]\nheads=[\"8\"]\nhdim=[\"64\"]\nseqlen=[\"64\"]\nbatch=[1]\n";
        bad(&format!("[[group]]\n{}", base.replace("fwd", "fwdx")), "op");
        bad(&format!("[[group]]\n{}", base.replace("\"8\"", "\"8/x\"")), "heads");
        bad(&format!("[[group]]\n{base}tokens=[5]\n"), "batch and tokens");
        bad(&format!("[[group]]\n{base}colour=[1]\n"), "colour");
    }

    #[test]
    fn varlen_spreads_lengths_up_to_the_given_ones() {
        let mut cases = load("smoke").unwrap();
        let c = cases.iter_mut().find(|c| c.varlen).unwrap();
        c.batch = 4;
        c.seqlen_q = 10;
        c.seqlen_k = 7;
        assert_eq!(c.seqlens(), vec![(3, 2), (5, 4), (8, 6), (10, 7)]);
    }

    #[test]
    fn filters_match_equal_or_contained() {
        let f: Filter = "pipeline~wgmma".parse().unwrap();
        let fields = BTreeMap::from([("pipeline", "wgmma_tma".to_string())]);
        assert_eq!(f.test(&fields), Some(true));
        assert_eq!("pipeline=wgmma".parse::<Filter>().unwrap().test(&fields), Some(false));
        assert_eq!("op=fwd".parse::<Filter>().unwrap().test(&fields), None);
        assert!("op".parse::<Filter>().is_err());
    }
}
