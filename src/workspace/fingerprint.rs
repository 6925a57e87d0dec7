//! The workspace header's fingerprint: what a workspace was prepared for.

use super::layout::{WorkspaceParams, FORMAT_VERSION};

/// Folds one 64-bit word into the fingerprint state: `mix((h ^ word) + 0x9E3779B97F4A7C15)` with `mix`
/// the splitmix64 finaliser (a bijection with full avalanche; the added constant keeps a zero state
/// from absorbing zero words unchanged).
fn absorb(h: u64, word: u64) -> u64 {
    let mut z = (h ^ word).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Identifies what a workspace was prepared for: every field of `params` and the seqstart arrays.
///
/// Definition (reproducible on a device): start from `FORMAT_VERSION` and absorb, as 64-bit words,
/// `group_mode, deterministic, batch, nhead_k, row_elements, seqlen_q, seqlen_k, max_seqlen_k, m0, n0,
/// num_cus, remap (0 none, 1 xcd8), masked, ordered_dq, nhead_q`, then for each of seqstart_q, seqstart_k: `u64::MAX` when absent,
/// else its length followed by every entry sign-extended to 64 bits. Not a cryptographic hash: it
/// catches accidental reuse, not forgery.
pub fn fingerprint(params: &WorkspaceParams, seqstart_q: Option<&[i32]>, seqstart_k: Option<&[i32]>) -> u64 {
    let mut h = fingerprint_of_params(params);
    for seqstart in [seqstart_q, seqstart_k] {
        h = match seqstart {
            None => absorb(h, u64::MAX),
            Some(s) => s.iter().fold(absorb(h, s.len() as u64), |h, &v| absorb(h, i64::from(v) as u64)),
        };
    }
    h
}

/// The [`fingerprint`] state after the params words, before the seqstarts: the GPU kernels absorb the
/// device seqstarts of a run into it and compare with the header.
pub fn fingerprint_of_params(params: &WorkspaceParams) -> u64 {
    let p = params;
    let words = [
        i64::from(p.group_mode),
        i64::from(p.deterministic),
        p.batch,
        p.nhead_k,
        p.row_elements,
        p.seqlen_q,
        p.seqlen_k,
        p.max_seqlen_k,
        p.m0,
        p.n0,
        p.num_cus,
        p.remap.code(),
        i64::from(p.masked),
        i64::from(p.ordered_dq),
        p.nhead_q,
    ];
    words.iter().fold(u64::from(FORMAT_VERSION), |h, &w| absorb(h, w as u64))
}
