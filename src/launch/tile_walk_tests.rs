//! The warp-specialized dense forward's grid (`hip/fwd/sm90/tile_walk.h`, compiled for the CPU) against
//! the order its comments promise, computed here with plain division on random calls; and the
//! multiply-shift division it runs (`hip/common/fast_divide.h`) against Rust's.

use super::abi::FwdParams;
use super::cpu_twin::{dense_grid, fast_divide};
use crate::test_rng::Rng;
use std::collections::HashSet;

/// The tiles in the promised order: (q block, pair) per tile.
fn promised_order(p: &FwdParams, sms: i64) -> (i64, bool, Vec<(i64, i64)>) {
    let m_blocks = (i64::from(p.max_seqlen_q) + 127) / 128;
    let pairs = i64::from(p.nhead_q) * i64::from(p.batch);
    let tiles = m_blocks * pairs;
    let masked = p.masked != 0;
    let counted = p.tile_counter != 0 && masked && tiles > sms && tiles <= i64::from(i32::MAX) - sms;
    let persistent = counted || (p.group_mode == 0 && (!masked || m_blocks <= 4)) || tiles > i64::from(i32::MAX);
    let ctas = if persistent && tiles > sms { sms } else { tiles };
    let heaviest = |block: i64| if masked { m_blocks - 1 - block } else { block };
    if !(masked && ctas < tiles) {
        return (ctas, counted, (0..tiles).map(|t| (heaviest(t % m_blocks), t / m_blocks)).collect());
    }
    // Sections of `width` pairs whose K and V fit in 16 MiB (a power of two of kv heads times the
    // group), one section of all pairs without a counter.
    let width = if counted {
        let rows =
            if p.group_mode != 0 { i64::from(p.seqlen_k) / i64::from(p.batch.max(1)) } else { i64::from(p.seqlen_k) };
        let head_bytes = rows.max(1) * i64::from(p.hdim_q + p.hdim_v) * 2;
        let mut kv_heads = 1;
        while kv_heads * 2 * head_bytes <= 16 << 20 {
            kv_heads *= 2;
        }
        (kv_heads * i64::from(p.nhead_q / p.nhead_k)).min(pairs)
    } else {
        pairs
    };
    let mut order = Vec::new();
    for first in (0..pairs).step_by(width as usize) {
        let here = width.min(pairs - first);
        for block in 0..m_blocks {
            order.extend((0..here).map(|y| (heaviest(block), first + y)));
        }
    }
    (ctas, counted, order)
}

#[test]
fn dense_grid_walks_every_tile_once_in_the_promised_order() {
    let mut rng = Rng::fresh();
    let seed = rng.0;
    for case in 0..4000 {
        let nhead_k = rng.range(1, 4) as i32;
        let batch = rng.range(0, 5) as i32;
        let group_mode = rng.range(0, 1) as i32;
        let any_length = rng.range(1, 1500);
        let max_seqlen_q = rng.pick(&[1, 127, 128, 129, 512, any_length]) as i32;
        let p = FwdParams {
            batch,
            nhead_q: nhead_k * rng.pick(&[1, 2, 3, 8]),
            nhead_k,
            hdim_q: rng.pick(&[64, 128, 192, 256]),
            hdim_v: rng.pick(&[64, 128, 256]),
            seqlen_q: max_seqlen_q * if group_mode != 0 { batch.max(1) } else { 1 },
            seqlen_k: rng.pick(&[1, 1000, 16384, 65536, 1 << 20]) * if group_mode != 0 { batch.max(1) } else { 1 },
            max_seqlen_q,
            group_mode,
            masked: rng.range(0, 1) as i32,
            tile_counter: rng.pick(&[0, 0x1000]),
            ..FwdParams::default()
        };
        let any_sms = rng.range(1, 300);
        let sms = rng.pick(&[1, 7, 132, any_sms]);
        let grid = dense_grid(&p, sms);
        let (ctas, counted, order) = promised_order(&p, sms);
        let what = format!("seed {seed} case {case}: {p:?} on {sms} SMs");
        assert_eq!((grid.ctas, grid.counted), (ctas, counted), "{what}");
        assert_eq!(grid.tiles, order, "{what}");
        let distinct: HashSet<_> = grid.tiles.iter().collect();
        assert_eq!(distinct.len(), grid.tiles.len(), "{what}: a tile twice");
    }
}

#[test]
fn fast_divide_divides_exactly() {
    let mut rng = Rng::fresh();
    let seed = rng.0;
    let mut divisors: Vec<i64> = (1..=300).collect();
    for l in 1..40 {
        divisors.extend([(1i64 << l) - 1, 1 << l, (1 << l) + 1]);
    }
    divisors.extend((0..300).map(|_| rng.range(1, i64::from(u32::MAX))));
    for d in divisors {
        let k = i64::from(i32::MAX) / d;
        let mut dividends =
            vec![0, 1, d - 1, d, d + 1, k * d, k * d - 1, i64::from(i32::MAX), 1 << 31, 1 << 40, -1, -d - 3];
        dividends.extend((0..200).map(|_| rng.range(0, i64::from(i32::MAX))));
        dividends.extend((0..20).map(|_| rng.range(0, 1 << 50)));
        for n in dividends {
            assert_eq!(fast_divide(d, n), (n / d, n % d), "seed {seed}: {n} / {d}");
        }
    }
}
