//! The ordered deterministic dQ (the NVIDIA kernel's scheme, FlashAttention-3's): every unit (one K tile
//! of one (batch, kv head)) adds its dQ partial of a q tile into the one dq_acc, each q tile's writers
//! taking turns in a fixed order, counted by a semaphore per (batch, query head, q tile). Unmasked, the
//! turn of K tile `n` is `n`; under a mask it is the K tiles counted down from the last one that reaches
//! the tile's rows, so that the diagonal tile, whose unit starts on that q tile, goes first (the kernel
//! launches masked K tiles last to first, so every unit waits only for units launched before it).
//! Unmasked units that all fit the device at once walk their q tiles rotated, unit `n` from step `n`,
//! and take their turns in the order they reach a tile ([`rotated_write_turn`]), so that the writers of a
//! tile do not queue behind each other. `hip/bwd/dq_order.h` is the twin.

use crate::problem::ResolvedMask;
use crate::schedule::ceil_div;

/// Whether the unmasked units of one (batch, kv head), `k_tiles` of them (those with keys), each walking
/// `steps` q tiles, start their walks rotated: unit `n` at step `n`, wrapping around. A unit may then
/// wait for units launched after it, so all of them must be resident at once (one per CU): at most half
/// the device's CUs, a margin for a device shared with other processes (MPS), whose count it still
/// reports.
pub fn rotated_walks(masked: bool, k_tiles: i64, steps: i64, num_cus: i64) -> bool {
    !masked && k_tiles <= steps && k_tiles <= num_cus / 2
}

/// Rotated walks: the turn of K tile `k_tile` at `step` of the unrotated walk (the tile's index among
/// the unit's q tiles, query head major), which unit `n` reaches at its step `(step - n) mod steps`.
pub fn rotated_write_turn(k_tiles: i64, k_tile: i64, step: i64) -> i64 {
    if k_tile > step {
        step + k_tiles - k_tile
    } else {
        step.min(k_tiles - 1) - k_tile
    }
}

/// The turn of K tile `k_tile` (keys `k_tile * n0..`) among the units that add to q tile `q_tile`
/// (rows `q_tile * m0..`) of one (batch, query head) under `mask` (its `sq`, `sk`), where the walks are
/// not rotated. Only meaningful where the unit visits the tile (the mask keeps some pair of its rows
/// and keys).
pub fn dq_write_turn(mask: &ResolvedMask, masked: bool, m0: i64, n0: i64, k_tile: i64, q_tile: i64) -> i64 {
    if !masked {
        return k_tile;
    }
    let rows_end = ((q_tile + 1) * m0).min(mask.sq);
    let (_, keys_end) = mask.key_range(q_tile * m0, rows_end);
    ceil_div(keys_end, n0) - 1 - k_tile
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{Mask, MaskType};
    use crate::test_rng::Rng;

    /// On random lengths, tiles and masks: the units that visit a q tile (as the kernels and the host
    /// executor walk them: the q tiles of `query_range` of the unit's keys) have the turns 0, 1, ... in
    /// launch order, with no gap or repeat.
    #[test]
    fn turns_count_each_tiles_writers_in_launch_order() {
        let mut rng = Rng::fresh();
        eprintln!("seed {}", rng.0);
        for _ in 0..3000 {
            let (sq, sk) = (rng.range(0, 300), rng.range(0, 300));
            let (m0, n0) = (1 << rng.range(0, 6), 1 << rng.range(0, 7));
            let mask = match rng.range(0, 4) {
                0 => Mask::NONE,
                1 => Mask::causal(MaskType::BottomRight),
                2 => Mask::causal(MaskType::TopLeft),
                k => Mask {
                    kind: if k == 3 { MaskType::BottomRight } else { MaskType::TopLeft },
                    left: rng.range(-1, 200) as i32,
                    right: rng.range(-1, 200) as i32,
                },
            };
            let masked = mask.is_masked();
            let resolved = mask.resolve(sq, sk);
            let (q_tiles, k_tiles) = (ceil_div(sq, m0), ceil_div(sk, n0));
            for t in 0..q_tiles {
                // Launch order: K tiles first to last unmasked, last to first masked.
                let order: Vec<i64> = if masked { (0..k_tiles).rev().collect() } else { (0..k_tiles).collect() };
                let mut next = 0;
                for n in order {
                    let (lo, hi) = if masked { resolved.query_range(n * n0, (n + 1) * n0) } else { (0, sq) };
                    let visits = lo < hi && lo / m0 * m0 <= t * m0 && t * m0 < hi;
                    if visits {
                        let turn = dq_write_turn(&resolved, masked, m0, n0, n, t);
                        assert_eq!(turn, next, "{mask:?} sq {sq} sk {sk} m0 {m0} n0 {n0}: K tile {n}, q tile {t}");
                        next += 1;
                    }
                }
            }
        }
    }

    /// Rotated walks in lockstep (every unit one step a tick): at each tile, the units arrive in their
    /// turns' order, and the turns are 0, 1, ... with no gap or repeat.
    #[test]
    fn rotated_turns_follow_the_arrival_order() {
        for steps in 1..40 {
            for k_tiles in 1..=steps {
                let mut next = vec![0; steps as usize];
                for tick in 0..steps {
                    for n in 0..k_tiles {
                        let step = (tick + n) % steps;
                        assert_eq!(
                            rotated_write_turn(k_tiles, n, step),
                            next[step as usize],
                            "{k_tiles} units, {steps} steps"
                        );
                        next[step as usize] += 1;
                    }
                }
            }
        }
        assert!(rotated_walks(false, 16, 32, 132) && !rotated_walks(true, 16, 32, 132));
        assert!(!rotated_walks(false, 33, 32, 132) && !rotated_walks(false, 16, 32, 31));
    }
}
