//! Exact overlap tests for strided tensors: do two tensor arguments share a byte, and does one tensor
//! cover a byte twice?
//!
//! Comparing byte ranges is not enough: flash-attn's packed layouts interleave tensors. `dq`, `dk`, `dv`
//! as views of one `[batch, seq, 3, heads, dim]` buffer have equal strides and bases `heads * dim`
//! elements apart, so their ranges `[base, base + extent)` intersect although no element belongs to two
//! of them. A range test would reject them; this module answers the exact question.
//!
//! The model: a [`Region`] is the set of byte intervals `base + Σ_k i_k * stride_k + [0, run)` with
//! `0 <= i_k < count_k`. Regions `a` and `b` share a byte exactly when integers `i`, `j` in their boxes put
//! `(base_a + Σ i_k sa_k) - (base_b + Σ j_k sb_k)` in the open interval `(-run_a, run_b)`: a bounded
//! integer feasibility problem in one linear form over at most six variables. The solver
//! 1. shifts every variable to start at 0, drops the ones that cannot move (count 1, stride 0), merges
//!    terms of equal stride (`i*s - j*s = u*s` with `u` in a range) and divides by the strides' gcd;
//! 2. searches depth first in decreasing stride order: at each level the values of the current variable
//!    that can still reach the target, given the least and the most the later terms add, form one range
//!    (floor/ceil division), and a level whose target holds no multiple of the later strides' gcd is cut;
//! 3. solves the last two variables exactly in `O(log stride)` steps (a Euclid-like recursion for the
//!    least `y` with `(a*y) mod m` in a window), so only the levels above them are enumerated.
//!
//! For the layouts attention uses (BSHD, BHSD, packed qkv/dqkv, GQA, padded rows) a test visits a
//! handful of nodes: microseconds. Guarantees: [`Overlap::Disjoint`] and [`Overlap::Overlapping`] are
//! always exact. [`Overlap::Unknown`] comes back only when
//! - at least three distinct strides remain after merging, and enumerating all but the two smallest
//!   visits more than [`NODE_LIMIT`] nodes; with at most two (a group-mode [`self_overlap`], say) the
//!   search never gives up; or
//! - a quantity leaves the solver's arithmetic (a region reaching beyond 2^96 bytes, strides of 2^63
//!   bytes and more), where checked arithmetic gives up instead of overflowing; regions below 2^63 bytes
//!   never get there.
//!
//! A caller should accept on `Unknown`, as PyTorch's overlap checks accept `TOO_HARD`: the search cost
//! stays bounded, and only adversarial layouts get there.

use crate::error::{ensure, ensure_field, Error, Result};
use crate::problem::{Mode, Tensor};

/// Most search nodes one [`overlap`] or [`self_overlap`] visits before it answers [`Overlap::Unknown`].
/// A node costs about 100 ns (i128 bookkeeping, a few divisions), so a call that gives up has spent about
/// a millisecond of host time; the layouts attention uses need at most a handful of nodes.
pub const NODE_LIMIT: u64 = 10_000;

/// One dimension of a [`Region`]: `count` intervals, `stride` bytes apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Dim {
    pub count: u64,
    pub stride: u64,
}

impl Dim {
    /// A dimension that does not repeat (count 1), for unused slots.
    pub const ONE: Dim = Dim { count: 1, stride: 0 };
}

/// The bytes a strided tensor covers: the intervals `base + Σ_k i_k * dims[k].stride + [0, run)` for
/// `0 <= i_k < dims[k].count`. The order of `dims` does not matter; a region with a count of 0 or a run
/// of 0 is empty and overlaps nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Region {
    /// Byte address of the first interval.
    pub base: u64,
    pub dims: [Dim; 3],
    /// Bytes of one contiguous interval (a row: columns times the element size).
    pub run: u64,
}

impl Region {
    /// The bytes of `tensor` with the given extents and element size (2 for fp16/bf16, 4 for the fp32
    /// LSE and D tensors). The dims are `[batch, head, row]`; in group mode the batch dimension is absent
    /// (rows are physical rows, `batch` and `batch_stride` are ignored). Errors name `field` (the C
    /// argument) for a negative stride or extent, or a stride or row whose bytes overflow 64 bits; a base
    /// plus extent beyond the address space is the caller's check ([`Tensor::extent`]).
    pub fn of_tensor(
        field: &str,
        tensor: &Tensor,
        mode: Mode,
        (batch, heads, rows, columns): (i64, i64, i64, i64),
        element_bytes: u64,
    ) -> Result<Region> {
        let (batch, batch_stride) = match mode {
            Mode::Batch => (batch, tensor.batch_stride),
            Mode::Group => (1, 0),
        };
        for (name, extent) in [("batch", batch), ("heads", heads), ("rows", rows), ("columns", columns)] {
            ensure(extent >= 0, field, || format!("{extent} {name} is negative"))?;
        }
        let bytes = |name: &str, elements: i64| -> Result<u64> {
            let named = || format!("{field}.{name}");
            ensure_field(elements >= 0, named, || format!("{elements} is negative"))?;
            (elements as u64)
                .checked_mul(element_bytes)
                .ok_or_else(|| Error::invalid(&named(), format!("{elements} elements overflow 64-bit byte offsets")))
        };
        // A dimension of one element never steps by its stride, so only its sign is checked.
        let dim = |name: &str, count: i64, stride: i64| -> Result<Dim> {
            ensure_field(stride >= 0, || format!("{field}.{name}"), || format!("{stride} is negative"))?;
            Ok(Dim { count: count as u64, stride: if count > 1 { bytes(name, stride)? } else { 0 } })
        };
        Ok(Region {
            base: tensor.ptr.0 as u64,
            dims: [
                dim("batch_stride", batch, batch_stride)?,
                dim("head_stride", heads, tensor.head_stride)?,
                dim("row_stride", rows, tensor.row_stride)?,
            ],
            run: bytes("columns", columns)?,
        })
    }

    /// Whether the region covers no byte.
    pub fn is_empty(&self) -> bool {
        self.run == 0 || self.dims.iter().any(|d| d.count == 0)
    }

    /// `[first byte, one past the last byte)` of a non-empty region.
    fn bounds(&self) -> Search<(i128, i128)> {
        let mut end = i128::from(self.base) + i128::from(self.run);
        for d in &self.dims {
            let span = (i128::from(d.count) - 1).checked_mul(i128::from(d.stride));
            end = bounded(span.and_then(|s| s.checked_add(end)))?;
        }
        Ok((i128::from(self.base), end))
    }
}

/// The answer of an overlap test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Overlap {
    /// No byte is shared (exact).
    Disjoint,
    /// Some byte is shared (exact).
    Overlapping,
    /// The search gave up (see the module documentation for when); callers accept.
    Unknown,
}

/// Whether `a` and `b` share a byte. Each region may overlap itself; that is [`self_overlap`]'s question.
pub fn overlap(a: &Region, b: &Region) -> Overlap {
    overlap_counted(a, b).0
}

/// Whether two different index tuples of `a` share a byte: an output written twice in one place. A zero
/// stride on a dimension of count above 1 overlaps at once.
pub fn self_overlap(a: &Region) -> Overlap {
    self_overlap_counted(a).0
}

/// [`overlap`] with the number of search nodes it visited (0 when the byte ranges are disjoint), for
/// tests and cost measurements.
pub fn overlap_counted(a: &Region, b: &Region) -> (Overlap, u64) {
    if a.is_empty() || b.is_empty() {
        return (Overlap::Disjoint, 0);
    }
    let mut visited = 0;
    let found = search_overlap(a, b, &mut visited);
    (answer(found), visited)
}

fn search_overlap(a: &Region, b: &Region, visited: &mut u64) -> Search<bool> {
    let ((a_first, a_end), (b_first, b_end)) = (a.bounds()?, b.bounds()?);
    if a_end <= b_first || b_end <= a_first {
        return Ok(false);
    }
    let mut form = LinearForm::default();
    for d in &a.dims {
        form.add(d.stride, 0, i128::from(d.count) - 1)?;
    }
    for d in &b.dims {
        form.add(d.stride, 1 - i128::from(d.count), 0)?;
    }
    // An interval of `a` starting at p meets one of `b` starting at q iff p - q is in (-run_a, run_b).
    let shift = i128::from(a.base) - i128::from(b.base);
    feasible(&form, 1 - i128::from(a.run) - shift, i128::from(b.run) - 1 - shift, visited)
}

/// [`self_overlap`] with the number of search nodes it visited, for tests and cost measurements.
pub fn self_overlap_counted(a: &Region) -> (Overlap, u64) {
    if a.is_empty() {
        return (Overlap::Disjoint, 0);
    }
    // Dimensions of count 1 have a single index; two index tuples differ in the others.
    let mut moving = [Dim::ONE; 3];
    let mut len = 0;
    for d in a.dims.iter().filter(|d| d.count > 1) {
        moving[len] = *d;
        len += 1;
    }
    let moving = &mut moving[..len];
    moving.sort_unstable_by_key(|d| std::cmp::Reverse(d.stride));
    // A zero stride repeats an interval; two equal strides reach one offset as (1, 0) and as (0, 1).
    if moving.iter().any(|d| d.stride == 0) || moving.windows(2).any(|w| w[0].stride == w[1].stride) {
        return (Overlap::Overlapping, 0);
    }
    let mut visited = 0;
    let found = search_self_overlap(moving, a.run, &mut visited);
    (answer(found), visited)
}

/// `moving`: the dimensions of count above 1, distinct nonzero strides.
fn search_self_overlap(moving: &[Dim], run: u64, visited: &mut u64) -> Search<bool> {
    // Two tuples overlap iff their difference u != 0 puts |Σ u_k s_k| below run. As -u works when u
    // does, ask for each k whether a u whose first nonzero entry is u_k > 0 does.
    let run = i128::from(run);
    for (k, d) in moving.iter().enumerate() {
        let mut form = LinearForm::default();
        form.add(d.stride, 1, i128::from(d.count) - 1)?;
        for later in &moving[k + 1..] {
            let reach = i128::from(later.count) - 1;
            form.add(later.stride, -reach, reach)?;
        }
        if feasible(&form, 1 - run, run - 1, visited)? {
            return Ok(true);
        }
    }
    Ok(false)
}

fn answer(found: Search<bool>) -> Overlap {
    match found {
        Ok(true) => Overlap::Overlapping,
        Ok(false) => Overlap::Disjoint,
        Err(GaveUp) => Overlap::Unknown,
    }
}

/// The search gave up: it ran out of nodes, or a quantity left [`MAGNITUDE`].
#[derive(Debug)]
struct GaveUp;

type Search<T> = std::result::Result<T, GaveUp>;

/// Bound on every quantity the solver starts from. Byte quantities of 64-bit regions stay far below it,
/// and sums and products of a few of them stay far below `i128::MAX`, so the search itself needs no
/// overflow checks beyond the ones that build its inputs (and the Euclid recursion's products).
const MAGNITUDE: i128 = 1 << 96;

fn bounded(value: Option<i128>) -> Search<i128> {
    value.filter(|v| (-MAGNITUDE..=MAGNITUDE).contains(v)).ok_or(GaveUp)
}

/// Most terms of one problem: three dimensions per region, two regions.
const MAX_TERMS: usize = 6;

/// `coef * x` with `x` in `0..=max`; `coef > 0`, `max > 0`.
#[derive(Debug, Clone, Copy, Default)]
struct Term {
    coef: i128,
    max: i128,
}

/// `offset + Σ coef_k * x_k`, built term by term: every variable shifted to start at 0, variables that
/// cannot move dropped, equal coefficients merged (the sum of two ranges is one range).
#[derive(Debug, Default)]
struct LinearForm {
    terms: [Term; MAX_TERMS],
    len: usize,
    offset: i128,
}

impl LinearForm {
    /// Adds `coef * x` with `x` in `lo..=hi` (`lo <= hi`).
    fn add(&mut self, coef: u64, lo: i128, hi: i128) -> Search<()> {
        let coef = i128::from(coef);
        self.offset = bounded(coef.checked_mul(lo).and_then(|v| v.checked_add(self.offset)))?;
        let span = hi - lo;
        if coef == 0 || span == 0 {
            return Ok(());
        }
        if let Some(t) = self.terms[..self.len].iter_mut().find(|t| t.coef == coef) {
            t.max = bounded(t.max.checked_add(span))?;
        } else {
            *self.terms.get_mut(self.len).ok_or(GaveUp)? = Term { coef, max: span };
            self.len += 1;
        }
        Ok(())
    }
}

/// Whether some `x` puts `form` in `lo..=hi`. `visited` counts the nodes of every call that shares one
/// budget.
fn feasible(form: &LinearForm, lo: i128, hi: i128, visited: &mut u64) -> Search<bool> {
    let (lo, hi) = (bounded(lo.checked_sub(form.offset))?, bounded(hi.checked_sub(form.offset))?);
    let len = form.len;
    let mut terms = form.terms;
    terms[..len].sort_unstable_by_key(|t| std::cmp::Reverse(t.coef));
    // Σ coef_k x_k is a multiple of g: only the multiples of g in [lo, hi] can be reached.
    let g = terms[..len].iter().fold(0, |g, t| gcd(g, t.coef));
    let (lo, hi) = if g > 1 { (ceil_div(lo, g), floor_div(hi, g)) } else { (lo, hi) };
    let mut suffix_max = [0; MAX_TERMS + 1];
    let mut suffix_gcd = [0; MAX_TERMS + 1];
    for k in (0..len).rev() {
        terms[k].coef = floor_div(terms[k].coef, g);
        let most = terms[k].coef.checked_mul(terms[k].max).and_then(|m| m.checked_add(suffix_max[k + 1]));
        suffix_max[k] = bounded(most)?;
        suffix_gcd[k] = gcd(suffix_gcd[k + 1], terms[k].coef);
    }
    let mut solver = Solver { terms, len, suffix_max, suffix_gcd, visited: *visited };
    let found = solver.search(0, lo, hi);
    *visited = solver.visited;
    found
}

/// The depth-first search over normalized terms: coefficients strictly decreasing with gcd 1.
struct Solver {
    terms: [Term; MAX_TERMS],
    len: usize,
    /// `suffix_max[k]`: the most terms `k..` add (they add at least 0).
    suffix_max: [i128; MAX_TERMS + 1],
    /// `suffix_gcd[k]`: the gcd of the coefficients of terms `k..` (0 for none).
    suffix_gcd: [i128; MAX_TERMS + 1],
    visited: u64,
}

impl Solver {
    fn visit(&mut self) -> Search<()> {
        self.visited += 1;
        if self.visited > NODE_LIMIT {
            return Err(GaveUp);
        }
        Ok(())
    }

    /// Whether terms `k..` can sum to a value in `lo..=hi`.
    fn search(&mut self, k: usize, lo: i128, hi: i128) -> Search<bool> {
        self.visit()?;
        let (lo, hi) = (lo.max(0), hi.min(self.suffix_max[k]));
        if lo > hi {
            return Ok(false);
        }
        if k == self.len {
            return Ok(true); // lo = hi = 0
        }
        let g = self.suffix_gcd[k];
        if ceil_div(lo, g) > floor_div(hi, g) {
            return Ok(false);
        }
        match self.len - k {
            // A multiple of coef lies in [lo, hi], inside [0, coef * max].
            1 => Ok(true),
            2 => self.last_two(k, lo, hi),
            _ => {
                let Term { coef, max } = self.terms[k];
                let first = ceil_div(lo - self.suffix_max[k + 1], coef).max(0);
                let last = floor_div(hi, coef).min(max);
                for x in first..=last {
                    if self.search(k + 1, lo - coef * x, hi - coef * x)? {
                        return Ok(true);
                    }
                }
                Ok(false)
            }
        }
    }

    /// Whether `c1 * x + c2 * y` lies in `lo..=hi` for some `x` in `0..=max1`, `y` in `0..=max2`, where
    /// `c1 > c2` are terms `k` and `k + 1` and `[lo, hi]` lies inside `[0, c1 max1 + c2 max2]`.
    fn last_two(&mut self, k: usize, lo: i128, hi: i128) -> Search<bool> {
        let g = self.suffix_gcd[k];
        let (Term { coef: c1, max: max1 }, Term { coef: c2, max: max2 }) = (self.terms[k], self.terms[k + 1]);
        let (c1, c2, lo, hi) = (floor_div(c1, g), floor_div(c2, g), ceil_div(lo, g), floor_div(hi, g));
        let span2 = c2 * max2;
        // The x whose window [lo - c1 x, hi - c1 x] meets [0, span2].
        let first = ceil_div(lo - span2, c1).max(0);
        let last = floor_div(hi, c1).min(max1);
        if first > last {
            return Ok(false);
        }
        // c2 consecutive values hold a multiple of c2, and a window clipped by [0, span2] holds 0 or span2.
        let width = hi - lo;
        if width + 1 >= c2 {
            return Ok(true);
        }
        // The x whose window lies inside [0, span2]: there y exists iff the window holds a multiple of c2.
        // Since width < c2 < c1, at most one x on each side of them has a clipped window.
        let inner_first = ceil_div(hi - span2, c1).max(first);
        let inner_last = floor_div(lo, c1).min(last);
        let clipped = |x: i128| {
            let (a, b) = ((lo - c1 * x).max(0), (hi - c1 * x).min(span2));
            a <= b && ceil_div(a, c2) <= floor_div(b, c2)
        };
        if inner_first > inner_last {
            for x in first..=last {
                self.visit()?;
                if clipped(x) {
                    return Ok(true);
                }
            }
            return Ok(false);
        }
        for x in (first..inner_first).chain(inner_last + 1..=last) {
            self.visit()?;
            if clipped(x) {
                return Ok(true);
            }
        }
        // [lo - c1 x, hi - c1 x] holds a multiple of c2 iff (c1 x - lo) mod c2 <= width. With
        // x = inner_first + y: (a y + b) mod c2 in [0, width], i.e. (a y) mod c2 in the cyclic window
        // [-b, width - b]; one that wraps holds 0, so y = 0.
        let a = modulo(c1, c2);
        let b = modulo(c1 * inner_first - lo, c2);
        let (from, to) = (modulo(-b, c2), modulo(width - b, c2));
        let y = if from > to { Some(0) } else { first_in_window(a, c2, from, to)? };
        Ok(y.is_some_and(|y| y <= inner_last - inner_first))
    }
}

/// The least `y >= 0` with `(a * y) mod m` in `l..=r`, if any; `0 <= a < m`, `0 <= l <= r < m`.
///
/// If `[l, r]` holds no multiple of `a`, every solution wraps: `a y = m z + t` with `z >= 1`, `t` in
/// `[l, r]`, and the least `y` goes with the least `z`, the least one whose `[m z + l, m z + r]` holds a
/// multiple of `a`: `(m z) mod a` in `[a - r % a, a - l % a]` (a window that does not wrap, since `l` and
/// `r` lie strictly between two multiples of `a`). `(a, m)` becomes `(m mod a, a)`: Euclid's steps.
fn first_in_window(a: i128, m: i128, l: i128, r: i128) -> Search<Option<i128>> {
    if l == 0 {
        return Ok(Some(0));
    }
    if a == 0 {
        return Ok(None);
    }
    let y = ceil_div(l, a);
    if a * y <= r {
        return Ok(Some(y));
    }
    let Some(z) = first_in_window(modulo(m, a), a, a - modulo(r, a), a - modulo(l, a))? else {
        return Ok(None);
    };
    // y = ceil((m z + l) / a), split so that the products stay below a * a.
    let (quotient, remainder) = div_mod(m, a);
    let whole = quotient.checked_mul(z).ok_or(GaveUp)?;
    let rest = remainder.checked_mul(z).and_then(|v| v.checked_add(l)).ok_or(GaveUp)?;
    whole.checked_add(ceil_div(rest, a)).map(Some).ok_or(GaveUp)
}

fn gcd(mut a: i128, mut b: i128) -> i128 {
    while b != 0 {
        (a, b) = (b, modulo(a, b));
    }
    a
}

/// `(floor(a / b), a mod b)` for `b > 0`. An i128 division is a library call of tens of nanoseconds and
/// the search divides at every node; the quantities nearly always fit in 64 bits, where it is one
/// instruction.
fn div_mod(a: i128, b: i128) -> (i128, i128) {
    match (i64::try_from(a), i64::try_from(b)) {
        (Ok(a), Ok(b)) => (i128::from(a.div_euclid(b)), i128::from(a.rem_euclid(b))),
        _ => (a.div_euclid(b), a.rem_euclid(b)),
    }
}

/// `floor(a / b)` for `b > 0`.
fn floor_div(a: i128, b: i128) -> i128 {
    div_mod(a, b).0
}

/// `a mod b` in `[0, b)` for `b > 0`.
fn modulo(a: i128, b: i128) -> i128 {
    div_mod(a, b).1
}

/// `ceil(a / b)` for `b > 0`.
fn ceil_div(a: i128, b: i128) -> i128 {
    -floor_div(-a, b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_rng::Rng;

    /// A region from `(count, stride)` pairs (at most three; the rest count 1).
    fn region(base: u64, dims: &[(u64, u64)], run: u64) -> Region {
        let mut all = [Dim::ONE; 3];
        for (slot, &(count, stride)) in all.iter_mut().zip(dims) {
            *slot = Dim { count, stride };
        }
        Region { base, dims: all, run }
    }

    /// Every interval of `r` as `[start, end)`, one per index tuple (none when the run is 0).
    fn intervals(r: &Region) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let [d0, d1, d2] = r.dims;
        for i in 0..d0.count {
            for j in 0..d1.count {
                for k in 0..d2.count {
                    let start = r.base + i * d0.stride + j * d1.stride + k * d2.stride;
                    if r.run > 0 {
                        out.push((start, start + r.run));
                    }
                }
            }
        }
        out
    }

    fn meet((s, e): (u64, u64), (t, f): (u64, u64)) -> bool {
        s < f && t < e
    }

    fn brute_overlap(a: &Region, b: &Region) -> bool {
        let ib = intervals(b);
        intervals(a).iter().any(|&x| ib.iter().any(|&y| meet(x, y)))
    }

    fn brute_self_overlap(a: &Region) -> bool {
        let iv = intervals(a);
        (0..iv.len()).any(|x| (x + 1..iv.len()).any(|y| meet(iv[x], iv[y])))
    }

    fn exact(found: bool) -> Overlap {
        if found {
            Overlap::Overlapping
        } else {
            Overlap::Disjoint
        }
    }

    /// A small random region (counts 1..=5, strides 0..=40, runs 1..=16, bases 0..=200), with a count
    /// of 0 now and then; strides are often multiples of one pitch, as tensor strides are.
    fn random_region(rng: &mut Rng) -> Region {
        let pitch = rng.range(1, 8) as u64;
        let mut dims = [Dim::ONE; 3];
        for d in &mut dims {
            let count = if rng.range(0, 60) == 0 { 0 } else { rng.range(1, 5) as u64 };
            let stride = match rng.range(0, 2) {
                0 => rng.range(0, 40) as u64,
                _ => pitch * rng.range(0, 40 / pitch as i64) as u64,
            };
            *d = Dim { count, stride };
        }
        Region { base: rng.range(0, 200) as u64, dims, run: rng.range(1, 16) as u64 }
    }

    /// A second region for `a`: random, or `a`'s strides (permuted, some counts changed) at another base,
    /// the packed-layout case where ranges meet and elements may not.
    fn partner(rng: &mut Rng, a: &Region) -> Region {
        if rng.range(0, 1) == 0 {
            return random_region(rng);
        }
        let mut b = *a;
        b.dims.swap(0, rng.size(0, 2));
        for d in &mut b.dims {
            if rng.range(0, 3) == 0 {
                d.count = rng.range(1, 5) as u64;
            }
        }
        b.base = rng.range(0, 200) as u64;
        if rng.range(0, 1) == 0 {
            b.run = rng.range(1, 16) as u64;
        }
        b
    }

    #[test]
    fn overlap_matches_brute_force() {
        let mut rng = Rng::fresh();
        let seed = rng.0;
        let cases = 40_000;
        let (mut overlapping, mut searched, mut most_nodes) = (0, 0, 0);
        for case in 0..cases {
            let a = random_region(&mut rng);
            let b = partner(&mut rng, &a);
            let expect = exact(brute_overlap(&a, &b));
            let (got, nodes) = overlap_counted(&a, &b);
            assert_eq!(got, expect, "seed {seed} case {case}: {a:?} {b:?}");
            assert_eq!(overlap(&b, &a), expect, "seed {seed} case {case} swapped: {a:?} {b:?}");
            overlapping += usize::from(expect == Overlap::Overlapping);
            searched += usize::from(nodes > 0);
            most_nodes = most_nodes.max(nodes);
        }
        println!(
            "overlap: seed {seed}, {cases} cases, {overlapping} overlapping, {searched} searched, at most \
             {most_nodes} nodes"
        );
        assert!(overlapping > cases / 10 && overlapping < cases * 9 / 10, "seed {seed}: {overlapping}");
        assert!(searched > cases / 4, "seed {seed}: {searched}");
    }

    #[test]
    fn self_overlap_matches_brute_force() {
        let mut rng = Rng::fresh();
        let seed = rng.0;
        let cases = 40_000;
        let (mut overlapping, mut most_nodes) = (0, 0);
        for case in 0..cases {
            let mut a = random_region(&mut rng);
            if rng.range(0, 1) == 0 {
                // Strides that often nest (each above the span of the smaller ones) but not always.
                let order = [rng.size(0, 2), rng.size(0, 2), rng.size(0, 2)];
                let mut pitch = a.run.saturating_sub(rng.range(0, 2) as u64);
                for &k in &order {
                    a.dims[k].stride = pitch + rng.range(0, 3) as u64;
                    pitch = (a.dims[k].stride * a.dims[k].count).saturating_sub(rng.range(0, 2) as u64);
                }
            }
            let expect = exact(brute_self_overlap(&a));
            let (got, nodes) = self_overlap_counted(&a);
            assert_eq!(got, expect, "seed {seed} case {case}: {a:?}");
            overlapping += usize::from(expect == Overlap::Overlapping);
            most_nodes = most_nodes.max(nodes);
        }
        println!("self_overlap: seed {seed}, {cases} cases, {overlapping} overlapping, at most {most_nodes} nodes");
        assert!(overlapping > cases / 10 && overlapping < cases * 9 / 10, "seed {seed}: {overlapping}");
    }

    /// Whether `offset + Σ coef x` reaches `[lo, hi]`, enumerating every variable but the last.
    fn brute_feasible(terms: &[(u64, i128, i128)], offset: i128, lo: i128, hi: i128) -> bool {
        let Some((&(coef, first, last), rest)) = terms.split_last() else {
            return lo <= offset && offset <= hi;
        };
        let coef = i128::from(coef);
        let mut partial = vec![offset];
        for &(c, l, h) in rest {
            partial = partial.iter().flat_map(|p| (l..=h).map(move |x| p + i128::from(c) * x)).collect();
        }
        partial.iter().any(|p| {
            if coef == 0 {
                return lo <= *p && *p <= hi;
            }
            let (x_lo, x_hi) = (ceil_div(lo - p, coef).max(first), floor_div(hi - p, coef).min(last));
            x_lo <= x_hi
        })
    }

    /// The solver alone, on larger numbers than the regions above give: the modular step of the last
    /// two terms and the enumeration above them.
    #[test]
    fn solver_matches_brute_force() {
        let mut rng = Rng::fresh();
        let seed = rng.0;
        let cases = 20_000;
        let mut feasible_cases = 0;
        for case in 0..cases {
            let nterms = rng.size(1, 4);
            let reach: i64 = if nterms <= 2 { 400 } else { 12 };
            let factor = rng.range(1, 6) as u64;
            let largest = rng.pick(&[10, 100, 3000]);
            let terms: Vec<(u64, i128, i128)> = (0..nterms)
                .map(|_| {
                    let coef = factor * rng.range(0, largest) as u64;
                    let lo = rng.range(-reach, reach);
                    (coef, i128::from(lo), i128::from(rng.range(lo, reach)))
                })
                .collect();
            let least: i128 = terms.iter().map(|&(c, l, _)| i128::from(c) * l).sum();
            let most: i128 = terms.iter().map(|&(c, _, h)| i128::from(c) * h).sum();
            let centre = i128::from(rng.range(least as i64 - 100, most as i64 + 100));
            let (lo, hi) = (centre, centre + i128::from(rng.pick(&[0, 0, 1, 3, 50, 2000])));
            let mut form = LinearForm::default();
            for &(coef, l, h) in &terms {
                form.add(coef, l, h).unwrap();
            }
            let expect = brute_feasible(&terms, 0, lo, hi);
            let mut visited = 0;
            let got = feasible(&form, lo, hi, &mut visited).unwrap();
            assert_eq!(got, expect, "seed {seed} case {case}: {terms:?} in [{lo}, {hi}]");
            feasible_cases += usize::from(expect);
        }
        println!("solver: seed {seed}, {cases} cases, {feasible_cases} feasible");
        assert!(feasible_cases > cases / 20, "seed {seed}: {feasible_cases}");
    }

    #[test]
    fn first_in_window_matches_brute_force() {
        let mut rng = Rng::fresh();
        let seed = rng.0;
        for case in 0..20_000 {
            let m = rng.range(1, 400) as i128;
            let a = rng.range(0, m as i64 - 1) as i128;
            let l = rng.range(0, m as i64 - 1) as i128;
            let width = rng.pick(&[0, 1, 4, 400]);
            let r = rng.range(l as i64, (l as i64 + width).min(m as i64 - 1)) as i128;
            // (a y) mod m has period m.
            let expect = (0..m).find(|y| (l..=r).contains(&(a * y % m)));
            assert_eq!(first_in_window(a, m, l, r).unwrap(), expect, "seed {seed} case {case}: {a} {m} {l} {r}");
        }
    }

    const F16: u64 = 2;

    fn tensor(ptr: usize, batch_stride: i64, head_stride: i64, row_stride: i64) -> Tensor {
        Tensor { ptr: crate::runtime::DeviceAddr(ptr), batch_stride, head_stride, row_stride }
    }

    fn of(t: Tensor, mode: Mode, extents: (i64, i64, i64, i64), element_bytes: u64) -> Region {
        Region::of_tensor("t", &t, mode, extents, element_bytes).unwrap()
    }

    /// Views of one `[batch, seq, Σ heads, dim]` fp16 buffer at `ptr` (flash-attn's packed qkv / dqkv,
    /// and its GQA form `[batch, seq, hq + 2 hk, dim]`): group `g` has `heads[g]` heads and starts
    /// `Σ heads[..g] * dim` elements in. Group mode drops the batch dimension (`rows` physical rows).
    fn packed(ptr: usize, mode: Mode, (batch, rows, dim): (i64, i64, i64), heads: &[i64]) -> Vec<Region> {
        let row_stride = heads.iter().sum::<i64>() * dim;
        let mut first_head = 0;
        let mut views = Vec::new();
        for &h in heads {
            let t = tensor(ptr + (first_head * dim) as usize * 2, rows * row_stride, dim, row_stride);
            views.push(of(t, mode, (batch, h, rows, dim), F16));
            first_head += h;
        }
        views
    }

    /// Every answer about `outputs` (pairwise, with each input, with themselves), checked against
    /// `expect`: the number of questions and the most nodes one of them visited.
    fn check_outputs(outputs: &[Region], inputs: &[Region], expect: Overlap, ctx: &str) -> (usize, u64) {
        let (mut questions, mut most) = (0, 0);
        for (i, o) in outputs.iter().enumerate() {
            let (got, nodes) = self_overlap_counted(o);
            assert_eq!(got, Overlap::Disjoint, "{ctx}: output {i} with itself: {o:?}");
            most = most.max(nodes);
            for (j, other) in outputs[i + 1..].iter().chain(inputs).enumerate() {
                let (got, nodes) = overlap_counted(o, other);
                assert_eq!(got, expect, "{ctx}: output {i} with {j}: {o:?} {other:?}");
                most = most.max(nodes);
                questions += 1;
            }
            questions += 1;
        }
        (questions, most)
    }

    #[test]
    fn packed_dqkv_is_disjoint_and_matches_brute_force() {
        for (batch, rows, dim, heads) in [(1, 1, 1, 1), (2, 3, 4, 3), (3, 5, 2, 2), (2, 4, 3, 1), (1, 7, 8, 2)] {
            for mode in [Mode::Batch, Mode::Group] {
                let views = packed(64, mode, (batch, rows, dim), &[heads; 3]);
                let ctx = format!("{mode:?} batch {batch} rows {rows} dim {dim} heads {heads}");
                check_outputs(&views, &[], Overlap::Disjoint, &ctx);
                for (a, b) in [(0, 1), (0, 2), (1, 2)] {
                    assert!(!brute_overlap(&views[a], &views[b]), "{ctx}");
                }
                // One element closer, the views share the boundary element of every row.
                let mut shifted = views[1];
                shifted.base -= F16;
                assert_eq!(overlap(&views[0], &shifted), Overlap::Overlapping, "{ctx}");
                assert_eq!(overlap(&shifted, &views[2]), Overlap::Disjoint, "{ctx}");
            }
        }
    }

    #[test]
    fn identical_pointers_overlap_unless_empty() {
        let t = tensor(4096, 4 * 8 * 64, 64, 8 * 64);
        let a = of(t, Mode::Batch, (2, 8, 4, 64), F16);
        assert_eq!(overlap(&a, &a), Overlap::Overlapping);
        // Another layout from the same pointer (BHSD over BSHD) still shares the first row.
        let bhsd = of(tensor(4096, 8 * 4 * 64, 4 * 64, 64), Mode::Batch, (2, 8, 4, 64), F16);
        assert_eq!(overlap(&a, &bhsd), Overlap::Overlapping);
        for extents in [(0, 8, 4, 64), (2, 0, 4, 64), (2, 8, 0, 64), (2, 8, 4, 0)] {
            let empty = of(t, Mode::Batch, extents, F16);
            assert!(empty.is_empty());
            assert_eq!(overlap_counted(&empty, &a), (Overlap::Disjoint, 0), "{extents:?}");
            assert_eq!(overlap(&a, &empty), Overlap::Disjoint, "{extents:?}");
            assert_eq!(self_overlap(&empty), Overlap::Disjoint, "{extents:?}");
        }
    }

    #[test]
    fn bhsd_layouts() {
        let (batch, heads, rows, dim) = (2, 4, 6, 8);
        let elements = (batch * heads * rows * dim) as usize;
        let bhsd = |ptr: usize, padded_rows: i64| {
            let t = tensor(ptr, heads * padded_rows * dim, padded_rows * dim, dim);
            of(t, Mode::Batch, (batch, heads, rows, dim), F16)
        };
        // Separate allocations: the byte ranges alone decide, without a search.
        let (dq, dk) = (bhsd(1 << 20, rows), bhsd(2 << 20, rows));
        assert_eq!(overlap_counted(&dq, &dk), (Overlap::Disjoint, 0));
        // Consecutive in one allocation, exactly adjacent, and one element too close.
        let (dk, dv) = (bhsd((1 << 20) + 2 * elements, rows), bhsd((1 << 20) + 4 * elements, rows));
        check_outputs(&[dq, dk, dv], &[], Overlap::Disjoint, "consecutive");
        assert_eq!(overlap(&dq, &bhsd((1 << 20) + 2 * elements - 2, rows)), Overlap::Overlapping);
        // Rows padded to 9 per head; a second tensor living in the padding rows is disjoint.
        let (padded, in_padding) = (bhsd(1 << 20, 9), bhsd((1 << 20) + (rows * dim) as usize * 2, 9));
        assert_eq!(self_overlap(&padded), Overlap::Disjoint);
        let mut one_row = in_padding;
        one_row.dims[2].count = 3;
        assert_eq!(overlap(&padded, &one_row), Overlap::Disjoint);
        assert_eq!(overlap(&padded, &in_padding), Overlap::Overlapping); // 6 rows do not fit in 3
                                                                         // A BSHD view of the same bytes overlaps.
        let bshd = of(tensor(1 << 20, rows * heads * dim, dim, heads * dim), Mode::Batch, (2, 4, 6, 8), F16);
        assert_eq!(overlap(&dq, &bshd), Overlap::Overlapping);
    }

    #[test]
    fn one_row_shifts() {
        let (heads, rows, dim) = (3, 5, 16);
        let row = heads * dim;
        for batch in [1, 2] {
            let at = |ptr: usize| of(tensor(ptr, rows * row, dim, row), Mode::Batch, (batch, heads, rows, dim), F16);
            let dq = at(1024);
            assert_eq!(overlap(&dq, &at(1024 + 2 * row as usize)), Overlap::Overlapping, "batch {batch}");
            // A whole batch further: the first batch of one meets the second batch of the other.
            let next = at(1024 + 2 * (rows * row) as usize);
            assert_eq!(overlap(&dq, &next), exact(batch > 1), "batch {batch}");
            assert_eq!(overlap(&dq, &next), exact(brute_overlap(&dq, &next)), "batch {batch}");
        }
        // Rows interleaved: dq in the even row slots, dk in the odd ones.
        let interleaved = |ptr: usize| of(tensor(ptr, 0, dim, 2 * row), Mode::Group, (1, heads, rows, dim), F16);
        assert_eq!(overlap(&interleaved(1024), &interleaved(1024 + 2 * row as usize)), Overlap::Disjoint);
        assert_eq!(overlap(&interleaved(1024), &interleaved(1024 + 2 * row as usize - 2)), Overlap::Overlapping);
    }

    #[test]
    fn gqa_layouts() {
        for mode in [Mode::Batch, Mode::Group] {
            // [batch, seq, hq + 2 hk, dim]: dq, dk, dv in one buffer.
            let views = packed(256, mode, (3, 10, 32), &[8, 2, 2]);
            check_outputs(&views, &[], Overlap::Disjoint, &format!("{mode:?}"));
            // dk claiming 3 heads runs into dv's first head, not into dq.
            let mut dk3 = views[1];
            dk3.dims[1].count = 3;
            assert_eq!(overlap(&dk3, &views[2]), Overlap::Overlapping, "{mode:?}");
            assert_eq!(overlap(&dk3, &views[0]), Overlap::Disjoint, "{mode:?}");
            assert_eq!(self_overlap(&dk3), Overlap::Disjoint, "{mode:?}");
        }
        // Separate BSHD buffers with different head counts: ranges decide.
        let dq = of(tensor(1 << 20, 10 * 8 * 64, 64, 8 * 64), Mode::Batch, (2, 8, 10, 64), F16);
        let dk = of(tensor(2 << 20, 10 * 2 * 64, 64, 2 * 64), Mode::Batch, (2, 2, 10, 64), F16);
        assert_eq!(overlap_counted(&dq, &dk), (Overlap::Disjoint, 0));
    }

    #[test]
    fn zero_strides() {
        // An output whose heads all land on one row overlaps itself; with one head it does not.
        let broadcast = tensor(4096, 10 * 64, 0, 64);
        assert_eq!(self_overlap(&of(broadcast, Mode::Batch, (2, 4, 10, 64), F16)), Overlap::Overlapping);
        assert_eq!(self_overlap(&of(broadcast, Mode::Batch, (2, 1, 10, 64), F16)), Overlap::Disjoint);
        assert_eq!(self_overlap(&of(tensor(4096, 0, 640, 64), Mode::Batch, (2, 1, 10, 64), F16)), Overlap::Overlapping);
        // A broadcast input (k shared by every head) against outputs: the zero stride repeats an
        // interval, it neither creates nor hides an overlap.
        let k = of(tensor(4096, 10 * 64, 0, 64), Mode::Batch, (2, 8, 10, 64), F16);
        let dq_elsewhere = of(tensor(8192, 10 * 64, 0, 64), Mode::Batch, (2, 1, 10, 64), F16);
        assert_eq!(overlap(&dq_elsewhere, &k), Overlap::Disjoint);
        let dq_inside = of(tensor(4096 + 640 * 2 + 128, 0, 0, 64), Mode::Batch, (1, 1, 1, 64), F16);
        assert_eq!(overlap(&dq_inside, &k), Overlap::Overlapping);
        // Two equal strides reach one offset twice.
        let twice = region(0, &[(2, 128), (3, 128)], 16);
        assert_eq!(self_overlap_counted(&twice), (Overlap::Overlapping, 0));
    }

    #[test]
    fn colliding_and_padded_rows() {
        let rows = |row_stride: i64, columns: i64| {
            of(tensor(1 << 16, 0, 0, row_stride), Mode::Group, (1, 1, 12, columns), F16)
        };
        assert_eq!(self_overlap(&rows(63, 64)), Overlap::Overlapping);
        assert_eq!(self_overlap(&rows(64, 64)), Overlap::Disjoint);
        assert_eq!(self_overlap(&rows(72, 64)), Overlap::Disjoint);
        // A narrow tensor living in the 8-column padding of the padded one.
        let narrow = of(tensor((1 << 16) + 128, 0, 0, 72), Mode::Group, (1, 1, 12, 8), F16);
        assert_eq!(overlap(&rows(72, 64), &narrow), Overlap::Disjoint);
        assert_eq!(overlap(&rows(72, 65), &narrow), Overlap::Overlapping);
        // Odd pitches: rows of 4 heads padded by 3 elements; a 3-column tensor in that padding is
        // disjoint, a 4-column one reaches the next row.
        let pitch = 4 * 64 + 3;
        let odd = of(tensor(0x1000, 0, 64, pitch), Mode::Group, (1, 4, 9, 64), F16);
        assert_eq!(self_overlap(&odd), Overlap::Disjoint);
        let pad = |columns| of(tensor(0x1000 + 4 * 64 * 2, 0, 0, pitch), Mode::Group, (1, 1, 9, columns), F16);
        assert_eq!(overlap(&odd, &pad(3)), Overlap::Disjoint);
        assert_eq!(overlap(&odd, &pad(4)), Overlap::Overlapping);
        // Transposed: heads inside rows (BSHD) against rows inside heads (BHSD), odd pitches, every shift.
        let bshd = of(tensor(0x1000, 0, 67, 4 * 67 + 1), Mode::Group, (1, 4, 9, 64), F16);
        for shift in 0..2400 {
            let bhsd = of(tensor(0x1000 + shift, 0, 9 * 65 + 2, 65), Mode::Group, (1, 4, 9, 64), F16);
            assert_eq!(overlap(&bshd, &bhsd), exact(brute_overlap(&bshd, &bhsd)), "shift {shift}");
        }
    }

    #[test]
    fn fp32_lse_and_d() {
        let (batch, heads, rows) = (3, 4, 100);
        // [batch, heads, rows] fp32, one column, then D right behind it.
        let lse_at = |ptr: usize| of(tensor(ptr, heads * rows, rows, 1), Mode::Batch, (batch, heads, rows, 1), 4);
        let lse = lse_at(1 << 12);
        let d = lse_at((1 << 12) + (batch * heads * rows * 4) as usize);
        check_outputs(&[lse, d], &[], Overlap::Disjoint, "lse, d");
        assert_eq!(overlap(&lse, &lse_at((1 << 12) + 4 * 100)), Overlap::Overlapping);
        // An fp16 output sharing the last two bytes of the lse.
        let o =
            of(tensor((1 << 12) + (batch * heads * rows * 4) as usize - 2, 0, 0, 8), Mode::Group, (1, 1, 1, 8), F16);
        assert_eq!(overlap(&lse, &o), Overlap::Overlapping);
        assert_eq!(overlap(&d, &o), Overlap::Overlapping);
        // A broadcast lse row (row stride 0) writes one element per head many times.
        let broadcast = of(tensor(1 << 12, heads, 1, 0), Mode::Batch, (batch, heads, rows, 1), 4);
        assert_eq!(self_overlap(&broadcast), Overlap::Overlapping);
    }

    #[test]
    fn group_mode_ignores_the_batch() {
        // The batch and its stride are not used in group mode: not even an invalid stride is looked at.
        let t = tensor(1 << 12, -1, 64, 3 * 64);
        let r = of(t, Mode::Group, (1000, 3, 50, 64), F16);
        assert_eq!(r.dims[0], Dim::ONE);
        assert_eq!((r.dims[1], r.dims[2], r.run), (Dim { count: 3, stride: 128 }, Dim { count: 50, stride: 384 }, 128));
        assert!(Region::of_tensor("dq", &t, Mode::Batch, (2, 3, 50, 64), F16)
            .unwrap_err()
            .message
            .starts_with("dq.batch_stride"));
        // Varlen packed [total, 3, heads, dim]: disjoint; one head too many overlaps.
        let views = packed(1 << 20, Mode::Group, (7, 300, 64), &[5, 5, 5]);
        check_outputs(&views, &[], Overlap::Disjoint, "group");
        let mut wide = views[0];
        wide.dims[1].count = 6;
        assert_eq!(overlap(&wide, &views[1]), Overlap::Overlapping);
    }

    #[test]
    fn of_tensor_errors_name_the_field() {
        let t = tensor(1 << 12, 100, 10, 1);
        let err = |t: Tensor, extents| Region::of_tensor("dk", &t, Mode::Batch, extents, 4).unwrap_err().message;
        assert!(err(tensor(1 << 12, 100, -10, 1), (1, 1, 1, 1)).starts_with("dk.head_stride: -10 is negative"));
        assert!(err(t, (1, -2, 1, 1)).starts_with("dk: -2 heads is negative"));
        assert!(err(tensor(1 << 12, 100, 10, i64::MAX), (1, 1, 2, 1)).starts_with("dk.row_stride"));
        // One row never steps by the row stride, however large.
        assert!(Region::of_tensor("dk", &tensor(1 << 12, 100, 10, i64::MAX), Mode::Batch, (1, 1, 1, 1), 4).is_ok());
        assert!(err(t, (1, 1, 1, i64::MAX)).starts_with("dk.columns"));
    }

    #[test]
    fn huge_values_give_up_instead_of_overflowing() {
        let huge = region(u64::MAX - 1, &[(u64::MAX, u64::MAX), (u64::MAX, u64::MAX - 1), (2, 1 << 63)], u64::MAX);
        let small = region(0, &[(4, 16)], 8);
        assert_eq!(overlap(&huge, &small), Overlap::Unknown);
        assert_eq!(overlap(&small, &huge), Overlap::Unknown);
        assert_eq!(overlap(&huge, &huge), Overlap::Unknown);
        assert_eq!(self_overlap(&huge), Overlap::Unknown);
        // At the top of the address space with sane sizes, the answers stay exact.
        let top = region(u64::MAX - 4096, &[(16, 256)], 128);
        let next = region(u64::MAX - 4096 + 128, &[(16, 256)], 128);
        assert_eq!(overlap(&top, &next), Overlap::Disjoint);
        assert_eq!(self_overlap(&top), Overlap::Disjoint);
    }

    /// Six distinct strides that differ by little: the sums fall near multiples of 10^6, the target lies
    /// half way between, and the bounds of the later terms cannot see the gaps.
    #[test]
    fn adversarial_strides_give_up_at_the_limit() {
        let strides = |count: u64| {
            let a = region(0, &[(count, 1_000_000), (count, 999_999), (count, 999_998)], 1);
            let b = region(500_000, &[(count, 999_997), (count, 999_996), (count, 999_995)], 1);
            (a, b)
        };
        let (a, b) = strides(50);
        assert_eq!(overlap_counted(&a, &b), (Overlap::Unknown, NODE_LIMIT + 1));
        // With fewer rows the same problem is answered, exactly.
        let (a, b) = strides(6);
        assert_eq!(overlap(&a, &b), Overlap::Disjoint);
        assert!(!brute_overlap(&a, &b));
    }

    /// The layouts attention passes, at the largest sizes the library takes: every question is answered
    /// exactly in a few nodes.
    #[test]
    fn realistic_layouts_visit_few_nodes() {
        let (mut questions, mut most) = (0, 0);
        let mut check = |outputs: &[Region], inputs: &[Region], ctx: &str| {
            let (asked, nodes) = check_outputs(outputs, inputs, Overlap::Disjoint, ctx);
            questions += asked;
            most = most.max(nodes);
        };
        for batch in [1, 7, 1024] {
            for rows in [1, 129, 1 << 20] {
                for (hq, hk) in [(1, 1), (32, 32), (32, 4), (256, 256), (256, 1)] {
                    for dim in [64, 128, 256] {
                        let mode = if batch == 7 { Mode::Group } else { Mode::Batch };
                        let ctx = format!("batch {batch} rows {rows} heads {hq}/{hk} dim {dim}");
                        let groups = [hq, hk, hk];
                        let bytes = (batch * rows * (hq + 2 * hk) * dim * 2) as usize;
                        // Packed qkv in, packed dqkv out (plus o, BSHD, and the fp32 lse and D).
                        let qkv = packed(1 << 30, mode, (batch, rows, dim), &groups);
                        let dqkv = packed((1 << 30) + bytes, mode, (batch, rows, dim), &groups);
                        let o_at = (1 << 30) + 2 * bytes;
                        let o = of(tensor(o_at, rows * hq * dim, dim, hq * dim), mode, (batch, hq, rows, dim), F16);
                        let lse_at = o_at + (batch * rows * hq * dim * 2) as usize;
                        let lse_at = |k| lse_at + k * (batch * hq * rows * 4) as usize;
                        let lse = |k| of(tensor(lse_at(k), hq * rows, rows, 1), mode, (batch, hq, rows, 1), 4);
                        let (lse, d) = (lse(0), lse(1));
                        let mut inputs = qkv.clone();
                        inputs.extend([o, lse]);
                        let mut outputs = dqkv.clone();
                        outputs.push(d);
                        check(&outputs, &inputs, &ctx);
                        check(&[o, lse], &qkv, &ctx);
                        // BHSD, dq, dk, dv consecutive in one buffer.
                        let bhsd = |ptr: usize, heads: i64| {
                            let t = tensor(ptr, heads * rows * dim, rows * dim, dim);
                            of(t, mode, (batch, heads, rows, dim), F16)
                        };
                        let dq = bhsd(1 << 30, hq);
                        let dk = bhsd((1 << 30) + (batch * hq * rows * dim * 2) as usize, hk);
                        let dv = bhsd((1 << 30) + (batch * (hq + hk) * rows * dim * 2) as usize, hk);
                        check(&[dq, dk, dv], &[], &ctx);
                    }
                }
            }
        }
        println!("realistic layouts: {questions} questions, at most {most} nodes");
        assert!(most <= 8, "{most} nodes");
    }
}
