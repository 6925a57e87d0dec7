//! The deterministic persistent partition of the backward `dq_dk_dv` work (spec `ck_fmha_bwd.md` §4).
//!
//! A work unit is one K tile of `n0` key rows of one (batch, kv head); it loops over the query heads
//! of its kv head, so dK/dV are reduced over the GQA group inside the unit. In deterministic mode
//! exactly `num_cus` workgroups run; each walks a fixed list of units, and every dQ contribution goes
//! to a split slot `dq_acc[b][kv head][split]` that only that workgroup writes, in order, so the fp32
//! sums are reproducible; `convert_dq` then adds the splits in index order. This module computes those
//! lists on the host; `hip/bwd/schedule.h` walks them on the device and `hip/bwd/prepare_workspace.h`
//! builds the group-mode table by the same arithmetic (the tests compare all three).
//!
//! All arithmetic is i64: total work positions exceed i32 for long varlen batches with many heads.
//!
//! Glossary (CK's names, kept so the code can be read next to CK's):
//! - *job*: a work unit; `jph` jobs per head (`ceil(sk / n0)` K tiles), `jpw` jobs per worker;
//! - *chunk* `c`: a K tile of one (batch, kv head) in group mode; `nc` chunks per kv head;
//! - `sqw`: a chunk's work weight in q rows ([`chunk_weight`]; CK's is `sq` rounded up to `m0`);
//! - `hw`: work per kv head, `nc * sqw`; `pb`: the work position where batch `b` starts;
//! - `w`, `[w_lo, w_hi)`: positions on the global work line, and a workgroup's range of it;
//! - `ibatch`, `head_start`, `c_start`, `isplit`: where a workgroup starts (batch, kv head, chunk,
//!   split slot); *split*: a dq_acc slot of one (batch, kv head) written by one workgroup only.

mod records;

pub use records::{BatchState, CuState};

use crate::error::{ensure, Error, Result};

/// `ceil(a / b)` for `b > 0` and any sign of `a` (`i64::div_ceil` is not stable for signed integers).
pub fn ceil_div(a: i64, b: i64) -> i64 {
    let q = a / b;
    if a % b > 0 {
        q + 1
    } else {
        q
    }
}

/// `a` rounded up to a multiple of `m > 0`.
pub fn round_up(a: i64, m: i64) -> i64 {
    ceil_div(a, m) * m
}

/// The K tile processed at position `t` of a head with `n` tiles when a mask is present: alternate
/// between the two ends (0, n-1, 1, n-2, …) so that every run of consecutive positions mixes cheap
/// (mostly masked) and expensive tiles, which balances the per-workgroup cost of a causal mask.
pub fn interleaved_tile(t: i64, n: i64) -> i64 {
    if t % 2 == 0 {
        t / 2
    } else {
        n - 1 - t / 2
    }
}

/// One (batch, q-head, K tile) unit, with the dq_acc split slot its dQ contribution goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WorkUnit {
    pub batch: i64,
    pub head: i64,
    /// Already interleaved when the schedule was asked for a masked kernel.
    pub k_tile: i64,
    pub split: i64,
    /// The first unit its workgroup runs in this split slot (deterministic schedules): it writes every
    /// row of the slot, storing its dQ partial and zeros where it has none, so that the slot needs no
    /// zeroing beforehand; the workgroup's later units in the slot add to it.
    pub first_in_slot: bool,
}

/// `a * b`, or `InvalidArgument` naming `field` when the product does not fit.
fn mul(a: i64, b: i64, field: &str) -> Result<i64> {
    a.checked_mul(b).ok_or_else(|| Error::invalid(field, format!("{a} * {b} overflows 64-bit arithmetic")))
}

/// Fails unless `value >= min`.
fn at_least(value: i64, min: i64, field: &str) -> Result<()> {
    ensure(value >= min, field, || format!("{value} must be >= {min}"))
}

/// Batch-mode persistent schedule (§4.1): `total_jobs = batch * nhead_k * jobs_per_head` units in
/// (batch, head, tile) order are cut into `workers` contiguous runs of `jobs_per_worker`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BatchPersistent {
    pub batch: i64,
    pub nhead_k: i64,
    /// `ceil(seqlen_k / n0)`.
    pub jobs_per_head: i64,
    pub total_jobs: i64,
    /// `ceil(total_jobs / workers)`; 0 when there is no work.
    pub jobs_per_worker: i64,
    /// Split slots per (batch, head): at least one more than the largest split id any worker uses
    /// (exactly, when `jobs_per_head` and `jobs_per_worker` divide one another).
    pub nsplits: i64,
    pub workers: i64,
}

impl BatchPersistent {
    /// The schedule for `batch × nhead_k` heads of `seqlen_k` keys on `num_workers` workgroups.
    /// `seqlen_k == 0` (or no heads) gives no jobs and `nsplits = 1`, where CK would divide by zero.
    pub fn new(batch: i64, nhead_k: i64, seqlen_k: i64, n0: i64, num_workers: i64) -> Result<Self> {
        at_least(batch, 0, "batch")?;
        at_least(nhead_k, 1, "nhead_k")?;
        at_least(seqlen_k, 0, "seqlen_k")?;
        at_least(n0, 1, "n0")?;
        at_least(num_workers, 1, "num_cus")?;
        let jph = ceil_div(seqlen_k, n0);
        let total = mul(mul(batch, nhead_k, "batch")?, jph, "seqlen_k")?;
        let jpw = ceil_div(total, num_workers);
        let nsplits = if total == 0 {
            1
        } else if jph % jpw == 0 {
            jph / jpw
        } else if jpw % jph == 0 {
            1
        } else {
            1 + ceil_div(jph - 1, jpw)
        };
        Ok(BatchPersistent {
            batch,
            nhead_k,
            jobs_per_head: jph,
            total_jobs: total,
            jobs_per_worker: jpw,
            nsplits,
            workers: num_workers,
        })
    }

    /// The units of workgroup `worker`, in the order the device loop runs them. The worker starting
    /// inside a head at offset `o` uses split `ceil(o / jpw)`: workers starting inside one head are
    /// exactly `jpw` apart, so their ids differ; the worker that covers a head's first job uses 0.
    pub fn jobs(&self, worker: i64, masked: bool) -> impl Iterator<Item = WorkUnit> {
        let s = *self;
        let begin = if worker < 0 { s.total_jobs } else { worker.saturating_mul(s.jobs_per_worker) };
        let end = begin.saturating_add(s.jobs_per_worker).min(s.total_jobs);
        // A non-empty range implies jobs_per_head >= 1.
        let (first_head, first_split) = if begin < end {
            (begin / s.jobs_per_head, ceil_div(begin % s.jobs_per_head, s.jobs_per_worker))
        } else {
            (0, 0)
        };
        (begin..end).map(move |job| {
            let (flat_head, t) = (job / s.jobs_per_head, job % s.jobs_per_head);
            let split = if flat_head == first_head { first_split } else { 0 };
            WorkUnit {
                batch: flat_head / s.nhead_k,
                head: flat_head % s.nhead_k,
                k_tile: if masked { interleaved_tile(t, s.jobs_per_head) } else { t },
                split,
                first_in_slot: job == begin || t == 0,
            }
        })
    }

    /// How many split slots of head `flat_head` (`batch * nhead_k + head`) some worker writes: the
    /// worker covering the head's first job uses split 0, and each worker starting inside the head
    /// the next id (their offsets are `jpw` apart, the first in `(0, jpw]`), so the written slots are
    /// exactly `0..splits_used`. The others may hold anything; convert_dq sums only these.
    pub fn splits_used(&self, flat_head: i64) -> i64 {
        let first = flat_head.saturating_mul(self.jobs_per_head);
        let end = first.saturating_add(self.jobs_per_head).min(self.total_jobs);
        if first >= end {
            return 0;
        }
        (end - 1) / self.jobs_per_worker - first / self.jobs_per_worker + 1
    }
}

/// Whether logical workgroup ids are permuted so that each XCD runs a contiguous range of them.
/// Hardware dispatches workgroup `blockIdx.x` to XCD `blockIdx.x mod 8` on 8-XCD AMD parts (MI300,
/// MI350); contiguous logical ranges keep one batch's K/V in one XCD's L2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum XcdRemap {
    /// Identity (NVIDIA, single-die parts, the host backend by default).
    None,
    /// 8 XCDs: the first `ncu mod 8` XCDs (all 8 when divisible) hold `ceil(ncu/8)` logical ids each,
    /// the others one fewer.
    Xcd8,
}

impl XcdRemap {
    /// The value the kernels' parameter blocks and the workspace fingerprint use (0 none, 1 Xcd8).
    pub fn code(self) -> i64 {
        match self {
            XcdRemap::None => 0,
            XcdRemap::Xcd8 => 1,
        }
    }

    /// The workgroup id (`blockIdx.x`) that runs logical CU `l` of `ncu`.
    pub fn logical_to_output(self, l: i64, ncu: i64) -> i64 {
        match self {
            XcdRemap::None => l,
            XcdRemap::Xcd8 => {
                let (ids, tall) = xcd_shape(ncu);
                let (x, lane) = if l < tall * ids {
                    (l / ids, l % ids)
                } else {
                    let short = (ids - 1).max(1);
                    let r = l - tall * ids;
                    (tall + r / short, r % short)
                };
                lane * 8 + x
            }
        }
    }

    /// The logical CU run by workgroup `o` of `ncu`; inverse of [`XcdRemap::logical_to_output`].
    pub fn output_to_logical(self, o: i64, ncu: i64) -> i64 {
        match self {
            XcdRemap::None => o,
            XcdRemap::Xcd8 => {
                let (ids, tall) = xcd_shape(ncu);
                let (x, lane) = (o % 8, o / 8);
                if x < tall {
                    x * ids + lane
                } else {
                    tall * ids + (x - tall) * (ids - 1) + lane
                }
            }
        }
    }
}

/// (logical ids per full XCD, number of full XCDs).
fn xcd_shape(ncu: i64) -> (i64, i64) {
    let tall = if ncu % 8 == 0 { 8 } else { ncu % 8 };
    (ceil_div(ncu, 8), tall)
}

/// Where [`build_group_table`] writes; every slice must have exactly the stated length.
#[derive(Debug)]
pub struct GroupTableOut<'a> {
    /// `[batch]`: split slots per (batch, head).
    pub nsplits: &'a mut [i32],
    /// `[batch + 1]`: element offset of each batch's dq_acc block; the last is the total.
    pub offsets: &'a mut [i64],
    /// `[num_cus]`, indexed by workgroup id (already remapped).
    pub cu_state: &'a mut [CuState],
    /// `[batch]`.
    pub batch_state: &'a mut [BatchState],
}

/// Checks a `[batch + 1]` cumulative offset array: starts at 0 and never decreases.
pub fn check_seqstart(field: &str, seqstart: &[i32], batch: i64) -> Result<()> {
    ensure(seqstart.len() as i64 == batch + 1, field, || {
        format!("has {} entries, expected batch + 1 = {}", seqstart.len(), batch + 1)
    })?;
    ensure(seqstart[0] == 0, field, || format!("[0] = {}, must be 0", seqstart[0]))?;
    match seqstart.windows(2).position(|w| w[1] < w[0]) {
        Some(b) => Err(Error::invalid(
            field,
            format!("decreases at batch {b}: [{b}] = {} > [{}] = {}", seqstart[b], b + 1, seqstart[b + 1]),
        )),
        None => Ok(()),
    }
}

/// Per-batch work shape in group mode.
struct BatchWork {
    /// Physical q rows (dq_acc rows).
    sq: i64,
    /// Chunk weight, see [`BatchState::sq`].
    sqw: i64,
    nc: i64,
    /// Work per head, `nc * sqw`.
    hw: i64,
}

/// The work weight of one chunk (K tile) of a batch with `sq` q rows and `sk` keys, in q rows: the rows
/// its K tile keeps, rounded up to `m0`, plus `m0` for the unit's own cost (its K/V loads and dK/dV
/// stores); `m0` for a batch without q rows (its units store zero dK/dV). Unmasked, a chunk keeps every
/// row; masked, the average over the head's `nc` K tiles of a bottom-right causal mask, whose
/// `sq · (2·sk − sq + 1) / 2` kept pairs (`sk · (sk + 1) / 2` when `sq > sk`) spread over `nc · n0` keys:
/// a cost estimate, not the mask (windows are run-time arguments), which only moves the CU ranges. CK
/// weighs every chunk `round_up(sq, m0)`, so that the CUs holding a varlen batch's short sequences got
/// up to 1.3-1.8× the mean work under a causal mask (the schedule model in `docs/perf.md`).
/// Exact in i64, in 2⁻²⁰ fixed point where the pair count could overflow: `hip/bwd/prepare_workspace.h`
/// computes the same.
pub fn chunk_weight(sq: i64, sk: i64, nc: i64, m0: i64, n0: i64, masked: bool) -> i64 {
    if sq == 0 {
        return m0;
    }
    let kept = if !masked || nc == 0 {
        sq
    } else if sq > sk {
        ceil_div(sk * (sk + 1) / 2, nc * n0)
    } else {
        // The kept fraction (2·sk − sq + 1) / (2·nc·n0) <= 1 in 2⁻²⁰ units, then times sq (< 2⁵¹).
        let fraction = ((2 * sk - sq + 1) << 20) / (2 * nc * n0);
        (sq * fraction + (1 << 20) - 1) >> 20
    };
    round_up(kept.max(1), m0) + m0
}

fn batch_work(seqstart_q: &[i32], seqstart_k: &[i32], b: usize, m0: i64, n0: i64, masked: bool) -> Result<BatchWork> {
    let sq = i64::from(seqstart_q[b + 1]) - i64::from(seqstart_q[b]);
    let sk = i64::from(seqstart_k[b + 1]) - i64::from(seqstart_k[b]);
    let nc = ceil_div(sk, n0);
    let sqw = chunk_weight(sq, sk, nc, m0, n0, masked);
    ensure(sqw <= i64::from(i32::MAX), "seqstart_q", || {
        format!("batch {b}: {sq} rows weigh {sqw} per chunk, beyond the 32-bit work table")
    })?;
    Ok(BatchWork { sq, sqw, nc, hw: nc * sqw })
}

/// Builds the group-mode persistent table (§4.2, CK gen C's scratch-free routine) and returns the
/// dq_acc bytes used (`4 * offsets[batch]`).
///
/// The total work `Σ_b nhead_k * nc_b * sqw_b` ([`chunk_weight`]: under a mask, `masked`, a chunk
/// weighs the rows it keeps) is cut into `num_cus` ranges of `target` positions;
/// each logical CU starts at the first whole chunk at or after its raw start. Ranges chain
/// (`w_hi` of logical CU `c` = `w_lo` of `c + 1`), so they partition all chunk positions. A CU that
/// starts at raw offset `wc > 0` inside a head uses split `ceil(wc / max(sqw, target))`, clamped to
/// `nc - 1`, which keeps `ceil(max_seqlen_k / n0)` a valid bound on `nsplits`.
#[allow(clippy::too_many_arguments)] // mirrors the device prepare kernel's argument list
pub fn build_group_table(
    seqstart_q: &[i32],
    seqstart_k: &[i32],
    nhead_k: i64,
    row_elements: i64,
    m0: i64,
    n0: i64,
    masked: bool,
    num_cus: i64,
    remap: XcdRemap,
    out: &mut GroupTableOut<'_>,
) -> Result<i64> {
    ensure(!seqstart_q.is_empty(), "seqstart_q", || "must have batch + 1 >= 1 entries".into())?;
    let nb = seqstart_q.len() - 1;
    let batch = nb as i64;
    ensure(batch <= i64::from(i32::MAX), "batch", || format!("{batch} exceeds the 32-bit work table"))?;
    check_seqstart("seqstart_q", seqstart_q, batch)?;
    check_seqstart("seqstart_k", seqstart_k, batch)?;
    ensure((1..=i64::from(i32::MAX)).contains(&nhead_k), "nhead_k", || format!("{nhead_k} out of range"))?;
    at_least(row_elements, 1, "row_elements")?;
    at_least(m0, 1, "m0")?;
    at_least(n0, 1, "n0")?;
    at_least(num_cus, 1, "num_cus")?;
    let ncu = num_cus as usize;
    for (field, len, want) in [
        ("nsplits", out.nsplits.len(), nb),
        ("dq_acc_offsets", out.offsets.len(), nb + 1),
        ("cu_state", out.cu_state.len(), ncu),
        ("batch_state", out.batch_state.len(), nb),
    ] {
        ensure(len == want, field, || format!("table slice has {len} entries, expected {want}"))?;
    }

    if seqstart_k[nb] == 0 {
        // No K anywhere: no units, no dq_acc (every dQ is zero and convert_dq must write it so).
        out.nsplits.fill(1);
        out.offsets.fill(0);
        out.batch_state.fill(BatchState { sq: 0, nc: 0, nsplits: 1, pad: 0 });
        out.cu_state.fill(CuState { ibatch: nb as i32, ..CuState::default() });
        return Ok(0);
    }

    let mut total_w = 0i64;
    for b in 0..nb {
        let w = batch_work(seqstart_q, seqstart_k, b, m0, n0, masked)?;
        total_w = total_w
            .checked_add(mul(nhead_k, w.hw, "nhead_k")?)
            .ok_or_else(|| Error::invalid("seqstart_k", "total work overflows 64-bit arithmetic"))?;
    }
    // Some batch has sk > 0, so total_w >= nhead_k * m0 >= 1.
    let target = ceil_div(total_w, num_cus);

    // Writes CU `c`'s state at its workgroup id and closes the previous CU's range at its start.
    let mut prev: Option<usize> = None;
    let cu_state = &mut *out.cu_state;
    let mut emit = |c: i64, st: CuState| {
        let o = remap.logical_to_output(c, num_cus) as usize;
        cu_state[o] = st;
        if let Some(p) = prev {
            cu_state[p].w_hi = st.w_lo;
        }
        prev = Some(o);
    };

    let (mut cu_lo, mut pb) = (0i64, 0i64);
    out.offsets[0] = 0;
    for b in 0..nb {
        let w = batch_work(seqstart_q, seqstart_k, b, m0, n0, masked)?;
        let pb_next = pb + nhead_k * w.hw;
        let cu_hi = num_cus.min(ceil_div(pb_next, target));
        let mut ns = 1i64;
        // The logical CUs whose raw start c * target lies in this batch. The range is empty when the
        // batch has no work (hw == 0), so hw > 0 below.
        for c in cu_lo..cu_hi {
            let wl = c * target;
            let head = ((wl - pb) / w.hw).max(0);
            let wc = (wl - (pb + head * w.hw)).max(0);
            let (c0, isp) = if wc > 0 {
                let isp = ceil_div(wc, w.sqw.max(target)).min((w.nc - 1).max(0));
                (ceil_div(wc, w.sqw), isp)
            } else {
                (0, 0)
            };
            if c0 < w.nc {
                // A CU whose start rounds past the head's last chunk runs nothing in this head.
                ns = ns.max(isp + 1);
            }
            emit(
                c,
                CuState {
                    w_lo: pb + head * w.hw + c0 * w.sqw,
                    w_hi: 0, // set by the next emit, or below for the last one
                    ibatch: b as i32,
                    isplit: isp as i32,
                    head_start: head as i32,
                    c_start: c0 as i32,
                },
            );
        }
        cu_lo = cu_hi;
        out.nsplits[b] = ns as i32;
        out.batch_state[b] = BatchState { sq: w.sqw as i32, nc: w.nc as i32, nsplits: ns as i32, pad: 0 };
        // dq_acc holds physical rows (sq), not the rounded work weight.
        let block = mul(mul(mul(nhead_k, ns, "nhead_k")?, w.sq, "seqstart_q")?, row_elements, "row_elements")?;
        out.offsets[b + 1] = out.offsets[b]
            .checked_add(block)
            .ok_or_else(|| Error::invalid("seqstart_q", "dq_acc size overflows 64-bit arithmetic"))?;
        pb = pb_next;
    }
    for c in cu_lo..num_cus {
        emit(c, CuState { w_lo: total_w, w_hi: total_w, ibatch: nb as i32, ..CuState::default() });
    }
    if let Some(p) = prev {
        cu_state[p].w_hi = total_w;
    }
    mul(out.offsets[nb], 4, "seqstart_q")
}

/// The units of one workgroup in group mode, in the order the device loop runs them (§4.2): walk
/// chunks from (`ibatch`, `head_start`, `c_start`) while the position is below `w_hi`; a new head
/// restarts at split 0.
///
/// Units whose K tile starts at or beyond the batch's logical `Sk` (`Sk <= k_tile * n0`, possible
/// with padded seqstarts) are still listed: the kernel skips them. Units of a batch with `Sq == 0`
/// are real: they store zero dK/dV.
pub fn group_jobs<'a>(
    cu: &CuState,
    batch_state: &'a [BatchState],
    nhead_k: i64,
    masked: bool,
) -> impl Iterator<Item = WorkUnit> + 'a {
    let (mut w, w_hi) = (cu.w_lo, cu.w_hi);
    let (mut b, mut h, mut c, mut split) =
        (cu.ibatch as usize, i64::from(cu.head_start), i64::from(cu.c_start), i64::from(cu.isplit));
    let mut first_in_slot = true;
    std::iter::from_fn(move || loop {
        if b >= batch_state.len() || w >= w_hi {
            return None;
        }
        if h >= nhead_k {
            h = 0;
            b += 1;
            continue;
        }
        let bs = batch_state[b];
        let nc = i64::from(bs.nc);
        if c < nc {
            let k_tile = if masked { interleaved_tile(c, nc) } else { c };
            let unit = WorkUnit { batch: b as i64, head: h, k_tile, split, first_in_slot };
            w += i64::from(bs.sq);
            c += 1;
            first_in_slot = false;
            return Some(unit);
        }
        c = 0;
        split = 0;
        h += 1;
        first_in_slot = true;
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_rng::{starts, Rng};

    #[test]
    fn interleave_order() {
        let order: Vec<i64> = (0..6).map(|t| interleaved_tile(t, 6)).collect();
        assert_eq!(order, [0, 5, 1, 4, 2, 3]);
        for n in 1..50 {
            let mut seen: Vec<i64> = (0..n).map(|t| interleaved_tile(t, n)).collect();
            seen.sort();
            assert_eq!(seen, (0..n).collect::<Vec<_>>(), "n = {n}");
        }
    }

    #[test]
    fn ceil_div_signs() {
        assert_eq!((ceil_div(7, 2), ceil_div(6, 2), ceil_div(0, 5), ceil_div(-7, 2)), (4, 3, 0, -3));
        assert_eq!(round_up(65, 64), 128);
    }

    #[test]
    fn xcd_remap_is_a_bijection() {
        for ncu in 1..=400 {
            for remap in [XcdRemap::None, XcdRemap::Xcd8] {
                let mut hit = vec![false; ncu as usize];
                for l in 0..ncu {
                    let o = remap.logical_to_output(l, ncu);
                    assert!((0..ncu).contains(&o), "{remap:?} ncu {ncu}: {l} -> {o}");
                    assert!(!hit[o as usize], "{remap:?} ncu {ncu}: {o} hit twice");
                    hit[o as usize] = true;
                    assert_eq!(remap.output_to_logical(o, ncu), l, "{remap:?} ncu {ncu}");
                }
            }
        }
        // Each XCD (o mod 8) runs a contiguous range of logical ids.
        for ncu in [9, 80, 304, 256, 13] {
            for x in 0..8 {
                let ls: Vec<i64> =
                    (0..ncu).filter(|o| o % 8 == x).map(|o| XcdRemap::Xcd8.output_to_logical(o, ncu)).collect();
                assert!(ls.windows(2).all(|w| w[1] == w[0] + 1), "ncu {ncu} xcd {x}: {ls:?}");
            }
        }
    }

    /// Checks every schedule invariant over the units each worker runs. `nc[b]` = K tiles per head,
    /// `ns[b]` = split slots, `bound` = the allocation bound on splits.
    fn check_units(
        ctx: &str,
        per_worker: &[Vec<WorkUnit>],
        nhead: i64,
        nc: &[i64],
        ns: &[i64],
        bound: i64,
        masked: bool,
    ) {
        let base: Vec<usize> = nc
            .iter()
            .scan(0, |acc, &n| {
                let b = *acc;
                *acc += (nhead * n) as usize;
                Some(b)
            })
            .collect();
        let total: usize = nc.iter().map(|&n| (nhead * n) as usize).sum();
        let slot_base: Vec<usize> = ns
            .iter()
            .scan(0, |acc, &n| {
                let b = *acc;
                *acc += (nhead * n) as usize;
                Some(b)
            })
            .collect();
        let slots: usize = ns.iter().map(|&n| (nhead * n) as usize).sum();
        let mut done = vec![false; total];
        let mut owner = vec![usize::MAX; slots];
        for (wk, units) in per_worker.iter().enumerate() {
            let mut last: Option<WorkUnit> = None;
            for u in units {
                let b = u.batch as usize;
                assert!(u.head >= 0 && u.head < nhead && u.k_tile >= 0 && u.k_tile < nc[b], "{ctx}: bad unit {u:?}");
                assert!(u.split >= 0 && u.split < ns[b], "{ctx}: split of {u:?} >= nsplits {}", ns[b]);
                assert!(ns[b] <= bound.max(1), "{ctx}: nsplits {} above bound {bound}", ns[b]);
                let i = base[b] + (u.head * nc[b] + u.k_tile) as usize;
                assert!(!done[i], "{ctx}: unit {u:?} run twice (worker {wk})");
                done[i] = true;
                let s = slot_base[b] + (u.head * ns[b] + u.split) as usize;
                assert!(
                    owner[s] == usize::MAX || owner[s] == wk,
                    "{ctx}: slot of {u:?} shared by workers {} and {wk}",
                    owner[s]
                );
                assert_eq!(u.first_in_slot, owner[s] == usize::MAX, "{ctx}: first_in_slot of {u:?} (worker {wk})");
                owner[s] = wk;
                if let Some(p) = last {
                    if (p.batch, p.head) == (u.batch, u.head) {
                        assert_eq!(p.split, u.split, "{ctx}: worker {wk} changes split inside a head");
                        if !masked {
                            assert_eq!(p.k_tile + 1, u.k_tile, "{ctx}: worker {wk} skips a tile");
                        }
                    }
                }
                last = Some(*u);
            }
        }
        if let Some(i) = done.iter().position(|d| !d) {
            panic!("{ctx}: unit #{i} never run");
        }
    }

    #[test]
    fn batch_persistent_properties() {
        let mut rng = Rng::fresh();
        let seed = rng.0;
        for case in 0..3000 {
            let (batch, nhead) = (rng.range(1, 64), rng.range(1, 64));
            let n0 = rng.pick(&[16, 64, 128]);
            let sk = match rng.range(0, 3) {
                0 => 0,
                1 => rng.range(1, 300),
                _ => rng.range(1, 20000),
            };
            let workers = rng.range(1, 320);
            let masked = rng.range(0, 1) == 1;
            let sched = BatchPersistent::new(batch, nhead, sk, n0, workers).unwrap();
            if sched.total_jobs > 150_000 {
                continue;
            }
            let ctx = format!("seed {seed} case {case}: {sched:?}");
            let per_worker: Vec<Vec<WorkUnit>> = (0..workers).map(|w| sched.jobs(w, masked).collect()).collect();
            assert_eq!(sched.jobs(workers, masked).count() + sched.jobs(-1, masked).count(), 0, "{ctx}");
            let nc = vec![sched.jobs_per_head; batch as usize];
            let ns = vec![sched.nsplits; batch as usize];
            check_units(&ctx, &per_worker, nhead, &nc, &ns, ceil_div(sk, n0), masked);
            // The formula bounds the largest split id, exactly when jph and jpw divide one another.
            let max_split = per_worker.iter().flatten().map(|u| u.split).max().unwrap_or(0);
            let (jph, jpw) = (sched.jobs_per_head, sched.jobs_per_worker);
            assert!(max_split < sched.nsplits, "{ctx}");
            if jpw > 0 && (jph % jpw == 0 || jpw % jph == 0) {
                assert_eq!(max_split + 1, sched.nsplits, "{ctx}");
            }
            // The slots some worker writes are exactly 0..splits_used of each head.
            let mut used = vec![Vec::new(); (batch * nhead) as usize];
            for u in per_worker.iter().flatten() {
                used[(u.batch * nhead + u.head) as usize].push(u.split);
            }
            for (flat_head, splits) in used.iter_mut().enumerate() {
                splits.sort();
                splits.dedup();
                let expect: Vec<i64> = (0..sched.splits_used(flat_head as i64)).collect();
                assert_eq!(*splits, expect, "{ctx}: head {flat_head}");
            }
        }
    }

    #[test]
    fn batch_persistent_empty() {
        let s = BatchPersistent::new(4, 8, 0, 128, 304).unwrap();
        assert_eq!((s.total_jobs, s.jobs_per_worker, s.nsplits), (0, 0, 1));
        assert_eq!(s.jobs(0, true).count(), 0);
        let s = BatchPersistent::new(0, 8, 100, 128, 304).unwrap();
        assert_eq!((s.total_jobs, s.nsplits), (0, 1));
        assert!(BatchPersistent::new(1, 1, 1, 128, 0).unwrap_err().message.starts_with("num_cus"));
        assert!(BatchPersistent::new(1, 0, 1, 128, 8).unwrap_err().message.starts_with("nhead_k"));
    }

    /// Owned storage for one group table.
    struct Table {
        nsplits: Vec<i32>,
        offsets: Vec<i64>,
        cu_state: Vec<CuState>,
        batch_state: Vec<BatchState>,
    }

    #[allow(clippy::too_many_arguments)] // build_group_table's, with lengths for seqstarts
    fn build(
        sq: &[i32],
        sk: &[i32],
        nhead: i64,
        hdim: i64,
        (m0, n0): (i64, i64),
        masked: bool,
        ncu: i64,
        remap: XcdRemap,
    ) -> (Table, i64) {
        let (qs, ks) = (starts(sq), starts(sk));
        let nb = sq.len();
        let mut t = Table {
            nsplits: vec![-7; nb],
            offsets: vec![-7; nb + 1],
            cu_state: vec![CuState { w_lo: -7, ..CuState::default() }; ncu as usize],
            batch_state: vec![BatchState { sq: -7, ..BatchState::default() }; nb],
        };
        let mut out = GroupTableOut {
            nsplits: &mut t.nsplits,
            offsets: &mut t.offsets,
            cu_state: &mut t.cu_state,
            batch_state: &mut t.batch_state,
        };
        let bytes = build_group_table(&qs, &ks, nhead, hdim, m0, n0, masked, ncu, remap, &mut out).unwrap();
        (t, bytes)
    }

    #[test]
    fn group_persistent_properties() {
        let mut rng = Rng::fresh();
        let seed = rng.0;
        let mut cases = 0;
        while cases < 3000 {
            let nb = rng.range(1, 64) as usize;
            let zeros = rng.range(0, 4);
            let sq = rng.mixed_lengths(nb, zeros);
            let zeros = rng.range(0, 4);
            let sk = if rng.range(0, 20) == 0 { vec![0; nb] } else { rng.mixed_lengths(nb, zeros) };
            let any_nhead = rng.range(1, 64);
            let nhead = rng.pick(&[1, 1, 2, 3, 8, 16, 64, any_nhead]);
            let (m0, n0) = (rng.pick(&[16, 32, 64, 128]), rng.pick(&[16, 64, 128]));
            let any_ncu = rng.range(1, 320);
            let ncu = rng.pick(&[1, 2, 7, 8, 9, 64, 80, 104, 132, 256, 304, 320, any_ncu]);
            let remap = rng.pick(&[XcdRemap::None, XcdRemap::Xcd8]);
            let hdim = rng.pick(&[32, 64, 128]);
            let masked = rng.range(0, 1) == 1;
            let nc: Vec<i64> = sk.iter().map(|&s| ceil_div(s as i64, n0)).collect();
            if nhead * nc.iter().sum::<i64>() > 150_000 {
                continue;
            }
            cases += 1;
            let (t, bytes) = build(&sq, &sk, nhead, hdim, (m0, n0), masked, ncu, remap);
            let ctx = format!(
                "seed {seed} case {cases}: sq {sq:?} sk {sk:?} nhead {nhead} m0 {m0} n0 {n0} ncu {ncu} {remap:?}"
            );
            let per_worker: Vec<Vec<WorkUnit>> =
                t.cu_state.iter().map(|cu| group_jobs(cu, &t.batch_state, nhead, masked).collect()).collect();
            let ns: Vec<i64> = t.nsplits.iter().map(|&n| n as i64).collect();
            let max_sk = *sk.iter().max().unwrap() as i64;
            check_units(&ctx, &per_worker, nhead, &nc, &ns, ceil_div(max_sk, n0), masked);
            // The ranges chain in logical order and cover [0, total_w).
            let logical: Vec<CuState> =
                (0..ncu).map(|l| t.cu_state[remap.logical_to_output(l, ncu) as usize]).collect();
            assert_eq!(logical[0].w_lo, 0, "{ctx}");
            assert!(logical.windows(2).all(|w| w[0].w_hi == w[1].w_lo && w[0].w_lo <= w[0].w_hi), "{ctx}");
            for (b, bs) in t.batch_state.iter().enumerate() {
                assert_eq!((bs.nc as i64, bs.nsplits), (nc[b], t.nsplits[b]), "{ctx}");
            }
            assert_eq!(t.offsets[0], 0, "{ctx}");
            for b in 0..nb {
                let expect = if max_sk == 0 { 0 } else { nhead * ns[b] * sq[b] as i64 * hdim };
                assert_eq!(t.offsets[b + 1] - t.offsets[b], expect, "{ctx}: offsets at {b}");
            }
            assert_eq!(t.offsets[nb] * 4, bytes, "{ctx}");
            let total_q: i64 = sq.iter().map(|&s| s as i64).sum();
            assert!(bytes <= 4 * nhead * ceil_div(max_sk, n0) * total_q * hdim, "{ctx}: above upper bound");
        }
    }

    #[test]
    fn group_no_keys_is_all_idle() {
        let (t, bytes) = build(&[5, 0, 7], &[0, 0, 0], 4, 64, (64, 128), true, 16, XcdRemap::Xcd8);
        assert_eq!(bytes, 0);
        assert_eq!(t.nsplits, [1, 1, 1]);
        assert_eq!(t.offsets, [0, 0, 0, 0]);
        assert!(t.batch_state.iter().all(|b| *b == BatchState { sq: 0, nc: 0, nsplits: 1, pad: 0 }));
        assert!(t.cu_state.iter().all(|c| *c == CuState { ibatch: 3, ..CuState::default() }));
        assert!(t.cu_state.iter().all(|c| group_jobs(c, &t.batch_state, 4, false).next().is_none()));
    }

    #[test]
    fn group_hand_example() {
        // One batch, sq 100 (chunk weight 128 + 64 with m0 64, unmasked), sk 512 (nc 4 with n0 128),
        // 2 heads, 4 CUs: total_w = 2 * 4 * 192 = 1536, target 384: every CU gets two chunks of one head.
        let (t, bytes) = build(&[100], &[512], 2, 8, (64, 128), false, 4, XcdRemap::None);
        let st: Vec<(i64, i64, i32, i32, i32)> =
            t.cu_state.iter().map(|c| (c.w_lo, c.w_hi, c.isplit, c.head_start, c.c_start)).collect();
        assert_eq!(st, [(0, 384, 0, 0, 0), (384, 768, 1, 0, 2), (768, 1152, 0, 1, 0), (1152, 1536, 1, 1, 2)]);
        assert_eq!(t.nsplits, [2]);
        assert_eq!(t.batch_state[0], BatchState { sq: 192, nc: 4, nsplits: 2, pad: 0 });
        assert_eq!(t.offsets, [0, 2 * 2 * 100 * 8]);
        assert_eq!(bytes, 4 * 3200);
        let units: Vec<WorkUnit> = group_jobs(&t.cu_state[1], &t.batch_state, 2, true).collect();
        assert_eq!(
            units,
            [
                WorkUnit { batch: 0, head: 0, k_tile: 1, split: 1, first_in_slot: true },
                WorkUnit { batch: 0, head: 0, k_tile: 2, split: 1, first_in_slot: false },
            ]
        );
    }

    #[test]
    fn chunk_weights_by_hand() {
        // Unmasked: the rows rounded up to m0, plus m0; no rows: m0.
        assert_eq!(chunk_weight(1024, 1024, 8, 64, 128, false), 1024 + 64);
        assert_eq!(chunk_weight(100, 512, 4, 64, 128, false), 128 + 64);
        assert_eq!(chunk_weight(0, 512, 4, 64, 128, true), 64);
        // Causal, sq = sk = 1024: 1024 * 1025 / 2 pairs over 8 * 128 keys = 512.5 rows -> 576 + 64.
        assert_eq!(chunk_weight(1024, 1024, 8, 64, 128, true), 576 + 64);
        // sq > sk: 300 * 301 / 2 pairs over 3 * 128 keys = 117.6 rows -> 128 + 64.
        assert_eq!(chunk_weight(1000, 300, 3, 64, 128, true), 128 + 64);
        // The longest sequences the table takes, masked: no overflow, at most the unmasked weight.
        let max = i64::from(i32::MAX);
        assert_eq!(chunk_weight(max - 64, max, ceil_div(max, 128), 64, 128, true), (1 << 30) + 64); // about half
        assert!(chunk_weight(4, max, ceil_div(max, 128), 1, 128, true) <= chunk_weight(4, max, 1, 1, 128, false));
    }

    #[test]
    fn group_table_errors_name_fields() {
        let mut t = Table {
            nsplits: vec![0; 1],
            offsets: vec![0; 2],
            cu_state: vec![CuState::default(); 4],
            batch_state: vec![BatchState::default(); 1],
        };
        let mut out = GroupTableOut {
            nsplits: &mut t.nsplits,
            offsets: &mut t.offsets,
            cu_state: &mut t.cu_state,
            batch_state: &mut t.batch_state,
        };
        let mut run = |q: &[i32], k: &[i32], ncu: i64| {
            build_group_table(q, k, 1, 8, 64, 128, false, ncu, XcdRemap::None, &mut out).unwrap_err().message
        };
        assert!(run(&[0, 5], &[0, 3, 4], 4).starts_with("seqstart_k"));
        assert!(run(&[1, 5], &[0, 3], 4).starts_with("seqstart_q"));
        assert!(run(&[0, 5], &[0, 3], 3).starts_with("cu_state"));
        assert!(run(&[0, 5], &[0, 3], 0).starts_with("num_cus"));
        let msg = check_seqstart("seqstart_k", &[0, 4, 2, 9], 3).unwrap_err().message;
        assert!(msg.starts_with("seqstart_k") && msg.contains("batch 1"), "{msg}");
    }
}
