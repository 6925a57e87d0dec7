//! Attention mask semantics (spec `ck_fmha_bwd.md` §1.6): which (query row, key column) pairs are kept.
//!
//! A mask is given by a kind and a window `(left, right)` where `-1` means unbounded. The window is
//! resolved per batch, because the bottom-right corner and the meaning of "unbounded" depend on that
//! batch's `(sq, sk)`. Every kernel, the host executor and the reference ask the same [`ResolvedMask`]
//! so that they cannot disagree on a boundary.

use crate::abi_values::{abi_enum, FMHA_MASK_BOTTOM_RIGHT, FMHA_MASK_NONE, FMHA_MASK_TOP_LEFT};
use crate::error::{ensure, Error, Result};

abi_enum! {
    /// Which corner the mask window is anchored to (`FMHA_MASK_*`, CK's `mask_enum`).
    pub enum MaskType {
        /// Every key column `j < sk` is kept.
        None = FMHA_MASK_NONE => "none",
        /// The diagonal starts at the top-left corner: causal keeps `j <= i`.
        TopLeft = FMHA_MASK_TOP_LEFT => "top-left",
        /// The diagonal ends at the bottom-right corner: causal keeps `j <= i + sk - sq`.
        BottomRight = FMHA_MASK_BOTTOM_RIGHT => "bottom-right",
    }
}

impl MaskType {
    /// The mask type with this ABI value.
    ///
    /// CK's value 3 (`window_generic`) is refused: its backward kernel interprets the coordinates as a
    /// bottom-right window while CK's reference uses top-left, so there is no single meaning to port.
    pub fn from_i32(value: i32) -> Result<MaskType> {
        match MaskType::parse(value) {
            Some(mask) => Ok(mask),
            None if value == 3 => Err(Error::unsupported(
                "mask_type: 3 (window_generic, generic-coordinate masks) is not supported; use \
                 top-left (1) or bottom-right (2) with window_size_left/window_size_right",
            )),
            None => Err(Error::invalid("mask_type", format!("{value} is not a mask type ({})", MaskType::choices()))),
        }
    }
}

/// A mask as the caller describes it: kind plus window (`-1` = unbounded on that side).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mask {
    pub kind: MaskType,
    /// How many columns left of the diagonal are kept; `-1` = all.
    pub left: i32,
    /// How many columns right of the diagonal are kept; `-1` = all.
    pub right: i32,
}

impl Mask {
    /// No masking.
    pub const NONE: Mask = Mask { kind: MaskType::None, left: -1, right: -1 };

    /// Whether the mask keeps every key of every row when no sequence has more than `max_seqlen_q`
    /// query rows: none, or a bottom-right mask with no left bound and right ≥ 0 over one row (decode's
    /// causal: the row is the last position, every key is at or before it).
    pub fn keeps_every_key(&self, max_seqlen_q: i64) -> bool {
        match self.kind {
            MaskType::None => true,
            MaskType::BottomRight => self.left < 0 && self.right >= 0 && max_seqlen_q <= 1,
            MaskType::TopLeft => false,
        }
    }

    /// Causal attention anchored at `kind`'s corner (`left = -1, right = 0`).
    pub fn causal(kind: MaskType) -> Mask {
        Mask { kind, left: -1, right: 0 }
    }

    /// Whether elements can be masked beyond the `j < sk` bound (selects masked kernel instances).
    pub fn is_masked(&self) -> bool {
        self.kind != MaskType::None
    }

    /// Checks the window: each side is `-1` or a non-negative count, and an unmasked kind carries no
    /// window (a window with `MaskType::None` would be silently ignored, so it is refused).
    pub fn validate(&self) -> Result<()> {
        ensure(self.left >= -1, "window_size_left", || format!("{} must be >= -1 (-1 = unbounded)", self.left))?;
        ensure(self.right >= -1, "window_size_right", || format!("{} must be >= -1 (-1 = unbounded)", self.right))?;
        if self.kind == MaskType::None {
            ensure(self.left == -1, "window_size_left", || {
                format!("{} given with mask_type none: must be -1 when there is no mask", self.left)
            })?;
            ensure(self.right == -1, "window_size_right", || {
                format!("{} given with mask_type none: must be -1 when there is no mask", self.right)
            })?;
        }
        Ok(())
    }

    /// The mask for one batch with `sq` query rows and `sk` key columns (CK's per-batch conversion).
    /// Any negative side (not only `-1`) is treated as unbounded, as CK does.
    pub fn resolve(&self, sq: i64, sk: i64) -> ResolvedMask {
        let top_left = self.kind == MaskType::TopLeft;
        // "Unbounded" = reach the far edge of the batch from the anchoring corner.
        let side = |w: i32, top_left_all: i64, bottom_right_all: i64| match w {
            w if w < 0 && top_left => top_left_all,
            w if w < 0 => bottom_right_all,
            w => i64::from(w),
        };
        let left = side(self.left, sq - 1, sk - 1);
        let right = side(self.right, sk - 1, sq - 1);
        let off = if top_left { 0 } else { sk - sq };
        ResolvedMask { sq, sk, masked: self.is_masked(), left, right, off }
    }
}

/// A mask resolved for one batch: row `i` keeps columns `i + off - left ..= i + off + right`
/// (intersected with `0..sk`), or all of `0..sk` when unmasked.
///
/// Ranges are half-open `(start, end)`; an empty range is always returned as `(0, 0)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResolvedMask {
    pub sq: i64,
    pub sk: i64,
    masked: bool,
    left: i64,
    right: i64,
    off: i64,
}

impl ResolvedMask {
    /// Whether element `(i, j)` takes part in the softmax.
    pub fn is_kept(&self, i: i64, j: i64) -> bool {
        let inside = (0..self.sq).contains(&i) && (0..self.sk).contains(&j);
        inside && (!self.masked || (i + self.off - self.left <= j && j <= i + self.off + self.right))
    }

    /// Key columns kept by at least one row of `i0..i1`. One row keeps an interval of the same width
    /// shifted by one per row, so the union over consecutive rows is itself an interval.
    pub fn key_range(&self, i0: i64, i1: i64) -> (i64, i64) {
        let (i0, i1) = (i0.max(0), i1.min(self.sq));
        if i0 >= i1 {
            return (0, 0);
        }
        let (start, end) = if self.masked {
            // Lowest column of the first row, one past the highest column of the last row.
            (i0 + self.off - self.left, i1 - 1 + self.off + self.right + 1)
        } else {
            (0, self.sk)
        };
        nonempty(start.max(0), end.min(self.sk))
    }

    /// Query rows that keep at least one column of `j0..j1` (column `j` is kept by rows
    /// `j - off - right ..= j - off + left`).
    pub fn query_range(&self, j0: i64, j1: i64) -> (i64, i64) {
        let (j0, j1) = (j0.max(0), j1.min(self.sk));
        if j0 >= j1 {
            return (0, 0);
        }
        let (start, end) = if self.masked {
            // First row keeping column j0, one past the last row keeping column j1 - 1.
            (j0 - self.off - self.right, j1 - 1 - self.off + self.left + 1)
        } else {
            (0, self.sq)
        };
        nonempty(start.max(0), end.min(self.sq))
    }

    /// Whether some element of the tile `i0..i1 × j0..j1` is not kept, i.e. the kernel must test
    /// elements one by one. `false` means every element is kept (or the tile is empty), so interior
    /// tiles can skip the per-element test. Elements outside `0..sq × 0..sk` count as not kept.
    pub fn tile_needs_mask(&self, i0: i64, i1: i64, j0: i64, j1: i64) -> bool {
        if i0 >= i1 || j0 >= j1 {
            return false;
        }
        if i0 < 0 || j0 < 0 || i1 > self.sq || j1 > self.sk {
            return true;
        }
        // The lowest kept column grows with the row, the highest too: the bottom row bounds the
        // left edge of the tile and the top row its right edge.
        let fully_kept = i1 - 1 + self.off - self.left <= j0 && j1 - 1 <= i0 + self.off + self.right;
        self.masked && !fully_kept
    }
}

fn nonempty(start: i64, end: i64) -> (i64, i64) {
    if start < end {
        (start, end)
    } else {
        (0, 0)
    }
}

/// Parses CK's mask string syntax (`mask_info::decode`):
///
/// | string | kind | left | right |
/// |---|---|---|---|
/// | `0` | none | -1 | -1 |
/// | `1`, `t` | top-left | -1 | 0 |
/// | `2`, `b` | bottom-right | -1 | 0 |
/// | `t:l,r` / `b:l,r` (optional `,s` sink, must be 0) | top-left / bottom-right | l | r |
/// | `xt:w` / `xb:w` (xformers) | top-left / bottom-right | w>0: `w/2`, else -1 | w>0: `w-1-w/2`, else 0 |
///
/// `g:y,x` (generic coordinates) is refused as unsupported; anything else is an invalid `mask`.
pub fn parse(s: &str) -> Result<Mask> {
    let bad =
        || Error::invalid("mask", format!("cannot parse {s:?} (expected 0, 1, 2, t, b, t:l,r, b:l,r, xt:w or xb:w)"));
    let int = |text: &str| text.parse::<i32>().map_err(|_| bad());
    match s {
        "0" => return Ok(Mask::NONE),
        "1" | "t" => return Ok(Mask::causal(MaskType::TopLeft)),
        "2" | "b" => return Ok(Mask::causal(MaskType::BottomRight)),
        _ => {}
    }
    let (prefix, rest) = s.split_once(':').ok_or_else(bad)?;
    let corner = |c: &str| match c {
        "t" => Some(MaskType::TopLeft),
        "b" => Some(MaskType::BottomRight),
        _ => None,
    };
    if prefix == "g" {
        return Err(Error::unsupported(format!(
            "mask: {s:?} uses generic coordinates (g:y,x), which are not supported; use t:l,r or \
             b:l,r (top-left / bottom-right window)"
        )));
    }
    if let Some(kind) = prefix.strip_prefix('x').and_then(corner) {
        let w = int(rest)?;
        let (left, right) = if w > 0 { (w / 2, w - 1 - w / 2) } else { (-1, 0) };
        return Ok(Mask { kind, left, right });
    }
    let kind = corner(prefix).ok_or_else(bad)?;
    let values = rest.split(',').map(int).collect::<Result<Vec<i32>>>()?;
    let (left, right) = match values[..] {
        [left, right] | [left, right, 0] => (left, right),
        [_, _, sink] => {
            return Err(Error::unsupported(format!(
                "mask: {s:?} asks for {sink} sink tokens; sink tokens are not supported"
            )))
        }
        _ => return Err(bad()),
    };
    ensure(left >= -1 && right >= -1, "mask", || format!("{s:?}: window sizes must be >= -1 (-1 = unbounded)"))?;
    Ok(Mask { kind, left, right })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_row_bottom_right_causal_keeps_every_key() {
        let causal = Mask::causal(MaskType::BottomRight);
        assert!(causal.keeps_every_key(1) && causal.keeps_every_key(0));
        assert!(!causal.keeps_every_key(2));
        assert!(!Mask { left: 0, ..causal }.keeps_every_key(1));
        assert!(Mask { right: 5, ..causal }.keeps_every_key(1));
        assert!(!Mask::causal(MaskType::TopLeft).keeps_every_key(1));
        assert!(Mask::NONE.keeps_every_key(100));
    }
    use crate::error::Status;

    use crate::test_rng::Rng;

    fn random_mask(rng: &mut Rng) -> Mask {
        let kind = [MaskType::None, MaskType::TopLeft, MaskType::BottomRight][rng.range(0, 2) as usize];
        if kind == MaskType::None {
            return Mask::NONE;
        }
        Mask { kind, left: rng.range(-1, 12) as i32, right: rng.range(-1, 12) as i32 }
    }

    /// The kept set straight from the spec's generic-coordinate form (`x`, `y`), not from `is_kept`.
    fn spec_kept(m: &Mask, sq: i64, sk: i64, i: i64, j: i64) -> bool {
        if i < 0 || j < 0 || i >= sq || j >= sk {
            return false;
        }
        if m.kind == MaskType::None {
            return true;
        }
        let tl = m.kind == MaskType::TopLeft;
        let left = if m.left < 0 {
            if tl {
                sq - 1
            } else {
                sk - 1
            }
        } else {
            m.left as i64
        };
        let right = if m.right < 0 {
            if tl {
                sk - 1
            } else {
                sq - 1
            }
        } else {
            m.right as i64
        };
        let off = if tl { 0 } else { sk - sq };
        let (x, y) = (1 + right + off, 1 + left - off);
        i - y < j && j < (i + x).min(sk)
    }

    fn brute_range(cells: impl Iterator<Item = i64>) -> (i64, i64) {
        let v: Vec<i64> = cells.collect();
        match (v.iter().min(), v.iter().max()) {
            (Some(&lo), Some(&hi)) => {
                assert_eq!(v.len() as i64, hi - lo + 1, "kept set is not an interval: {v:?}");
                (lo, hi + 1)
            }
            _ => (0, 0),
        }
    }

    #[test]
    fn ranges_and_tiles_match_brute_force() {
        let mut rng = Rng::fresh();
        let seed = rng.0;
        for case in 0..20_000 {
            let m = random_mask(&mut rng);
            let (sq, sk) = (rng.range(0, 14), rng.range(0, 14));
            let r = m.resolve(sq, sk);
            let ctx = format!("seed {seed} case {case}: {m:?} sq {sq} sk {sk}");
            for i in -2..sq + 2 {
                for j in -2..sk + 2 {
                    assert_eq!(r.is_kept(i, j), spec_kept(&m, sq, sk, i, j), "{ctx} ({i},{j})");
                }
            }
            for _ in 0..20 {
                let i0 = rng.range(-3, sq + 3);
                let i1 = rng.range(-3, sq + 3);
                let expect = brute_range((0..sk).filter(|&j| (i0..i1).any(|i| r.is_kept(i, j))));
                assert_eq!(r.key_range(i0, i1), expect, "{ctx} key_range({i0},{i1})");
                let j0 = rng.range(-3, sk + 3);
                let j1 = rng.range(-3, sk + 3);
                let expect = brute_range((0..sq).filter(|&i| (j0..j1).any(|j| r.is_kept(i, j))));
                assert_eq!(r.query_range(j0, j1), expect, "{ctx} query_range({j0},{j1})");
                let any_masked = (i0..i1).any(|i| (j0..j1).any(|j| !r.is_kept(i, j)));
                assert_eq!(r.tile_needs_mask(i0, i1, j0, j1), any_masked, "{ctx} tile {i0}..{i1} x {j0}..{j1}");
            }
        }
    }

    #[test]
    fn causal_corners() {
        let tl = Mask::causal(MaskType::TopLeft).resolve(3, 5);
        assert!(tl.is_kept(0, 0) && !tl.is_kept(0, 1) && tl.is_kept(2, 2) && !tl.is_kept(2, 3));
        let br = Mask::causal(MaskType::BottomRight).resolve(3, 5);
        assert!(br.is_kept(0, 2) && !br.is_kept(0, 3) && br.is_kept(2, 4));
        // More queries than keys, bottom-right causal: the first rows see nothing.
        let br = Mask::causal(MaskType::BottomRight).resolve(5, 3);
        assert_eq!(br.key_range(0, 2), (0, 0));
        assert_eq!(br.key_range(2, 3), (0, 1));
        assert_eq!(br.query_range(0, 3), (2, 5));
        let none = Mask::NONE.resolve(4, 0);
        assert_eq!(none.key_range(0, 4), (0, 0));
        assert!(!none.is_kept(0, 0));
    }

    #[test]
    fn mask_type_values() {
        assert_eq!(MaskType::from_i32(0), Ok(MaskType::None));
        assert_eq!(MaskType::from_i32(1), Ok(MaskType::TopLeft));
        assert_eq!(MaskType::from_i32(2), Ok(MaskType::BottomRight));
        let e = MaskType::from_i32(3).unwrap_err();
        assert_eq!(e.status, Status::Unsupported);
        assert!(e.message.contains("generic") && e.message.contains("top-left"), "{}", e.message);
        for v in [-1, 4, i32::MAX] {
            let e = MaskType::from_i32(v).unwrap_err();
            assert_eq!(e.status, Status::InvalidArgument);
            assert!(e.message.starts_with("mask_type"), "{}", e.message);
        }
    }

    #[test]
    fn validate_names_fields() {
        assert!(Mask::NONE.validate().is_ok());
        assert!(Mask { kind: MaskType::TopLeft, left: 5, right: -1 }.validate().is_ok());
        let e = Mask { kind: MaskType::TopLeft, left: -2, right: 0 }.validate().unwrap_err();
        assert!(e.message.starts_with("window_size_left"), "{}", e.message);
        let e = Mask { kind: MaskType::BottomRight, left: 0, right: -7 }.validate().unwrap_err();
        assert!(e.message.starts_with("window_size_right"), "{}", e.message);
        let e = Mask { kind: MaskType::None, left: -1, right: 0 }.validate().unwrap_err();
        assert!(e.message.starts_with("window_size_right") && e.message.contains("no mask"), "{}", e.message);
        assert_eq!(e.status, Status::InvalidArgument);
    }

    #[test]
    fn parse_strings() {
        let m = |kind, left, right| Mask { kind, left, right };
        use MaskType::{BottomRight as B, None as N, TopLeft as T};
        let cases = [
            ("0", m(N, -1, -1)),
            ("1", m(T, -1, 0)),
            ("t", m(T, -1, 0)),
            ("2", m(B, -1, 0)),
            ("b", m(B, -1, 0)),
            ("t:128,30", m(T, 128, 30)),
            ("b:4,35", m(B, 4, 35)),
            ("b:-1,0", m(B, -1, 0)),
            ("t:50,64,0", m(T, 50, 64)),
            ("xt:5", m(T, 2, 2)),
            ("xb:4", m(B, 2, 1)),
            ("xb:1", m(B, 0, 0)),
            ("xt:0", m(T, -1, 0)),
            ("xb:-3", m(B, -1, 0)),
        ];
        for (s, expect) in cases {
            assert_eq!(parse(s), Ok(expect), "{s}");
            assert!(expect.validate().is_ok());
        }
        for s in ["g:3,4", "g:", "t:1,2,5"] {
            assert_eq!(parse(s).unwrap_err().status, Status::Unsupported, "{s}");
        }
        for s in ["", "3", "x", "t:", "t:1", "t:1,2,3,4", "t:a,b", "q:1,2", "xt:", "xq:3", "t:-2,0", " 1", "tt"] {
            let e = parse(s).unwrap_err();
            assert_eq!(e.status, Status::InvalidArgument, "{s}");
            assert!(e.message.starts_with("mask"), "{s}: {}", e.message);
        }
    }
}
