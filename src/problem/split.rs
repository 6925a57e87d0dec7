//! Split-KV (spec/inference.md §3): a sequence's key tiles cut into chunks, each attended on its own
//! into a partial state (O normalised over the chunk's keys, LSE), the states combined in chunk order.
//! These are the rules every backend follows; the C++ twin is `hip/kvcache/split.h`, compared with
//! this file on random cases by `launch/kvcache_prepare_tests.rs`.

/// `a / b` rounded up, for `a ≥ 0`, `b > 0`.
pub fn ceil_div(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}

/// How a launcher splits: at most `max_splits` chunks per sequence; `split_tiles > 0`: chunks of that
/// many key tiles, so that a sequence's chunks depend on its own length only (batch invariance);
/// `split_tiles == 0`: the chunk length the prepare chose for the call (`adaptive_tiles`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitPolicy {
    pub max_splits: i64,
    pub split_tiles: i64,
}

impl SplitPolicy {
    pub const UNSPLIT: SplitPolicy = SplitPolicy { max_splits: 1, split_tiles: 0 };

    pub fn splits(&self) -> bool {
        self.max_splits > 1
    }
}

/// One sequence's chunks: `count` chunks of `tiles` key tiles each (the last may be shorter); chunk
/// `c` holds keys `c·tiles·n0 .. (c + 1)·tiles·n0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunks {
    pub count: i64,
    pub tiles: i64,
}

/// The chunks of a sequence of `kv_len` keys in tiles of `n0`. `planned_tiles` is the prepare's chunk
/// length (≤ 0 when no prepare wrote a plan: then the sequence is not split, which is as correct).
pub fn chunks(kv_len: i64, n0: i64, policy: SplitPolicy, planned_tiles: i64) -> Chunks {
    let n = ceil_div(kv_len.max(0), n0);
    if !policy.splits() || n <= 1 {
        return Chunks { count: 1, tiles: n.max(1) };
    }
    let want = if policy.split_tiles > 0 {
        policy.split_tiles
    } else if planned_tiles > 0 {
        planned_tiles
    } else {
        n
    };
    let tiles = want.max(ceil_div(n, policy.max_splits));
    Chunks { count: ceil_div(n, tiles), tiles }
}

/// The adaptive chunk length (FA3's dynamic rule): the call's work, in (query tile, key tile, head)
/// units, spread over the CUs with 10 % slack, is what one chunk may hold.
pub fn adaptive_tiles(work_units: i64, cu_count: i64) -> i64 {
    ceil_div(work_units.min(i64::MAX / 16) * 11, 10 * cu_count.max(1)).max(1)
}

/// One sequence's share of `adaptive_tiles`' work: the tiles of its `rows` tile rows (query rows, or
/// with packed GQA (query row, query head) pairs) times its key tiles, per tile head.
pub fn work_units(rows: i64, kv_len: i64, m0: i64, n0: i64) -> i64 {
    ceil_div(rows.max(0), m0) * ceil_div(kv_len.max(0), n0)
}

/// The most sequences the prepare orders longest-first (its one workgroup scans the keys once per
/// class); larger calls run in sequence order.
pub const MAX_ORDERED_BATCH: i64 = 8192;

/// The longest-first order's class of a sequence of `work` units (`work_units`): 0 for none, else
/// 1 + 4·⌊log2 work⌋ + the two bits below the leading one (quarter octaves, 1..=252).
pub fn order_key(work: i64) -> u8 {
    if work <= 0 {
        return 0;
    }
    let e = 63 - work.leading_zeros() as i64;
    let below = if e >= 2 { work >> (e - 2) } else { work << (2 - e) };
    (1 + 4 * e + (below & 3)) as u8
}

/// The sequences in longest-first order: classes descending, sequence order within a class. The grid's
/// z-th sequence is `order[z]`, so that long sequences start first and short ones fill the tail of the
/// launch (FA3 sorts its batches too); results do not depend on the order.
pub fn longest_first(keys: &[u8]) -> Vec<i32> {
    let mut order: Vec<i32> = (0..keys.len() as i32).collect();
    order.sort_by_key(|&b| std::cmp::Reverse(keys[b as usize])); // stable
    order
}

/// Most splits a launcher allows when the caller leaves it to the library (FA3's static rule, on the
/// launcher's bounds: its batch bound stands for the batch, as FA3 plans each call with its batch): none
/// when the tiles of every sequence and head already fill 80 % of the CUs or a sequence has at most 4
/// key tiles; otherwise the smallest count whose wave efficiency is within 85 % of the best count's.
pub fn heuristic_max_splits(
    batch: i64,
    heads: i64,
    max_seqlen_q: i64,
    max_seqlen_k: i64,
    m0: i64,
    n0: i64,
    cu_count: i64,
) -> i64 {
    let cus = cu_count.max(1);
    let total = batch.max(1) * heads * ceil_div(max_seqlen_q.max(1), m0);
    let n_blocks = ceil_div(max_seqlen_k, n0);
    if 5 * total >= 4 * cus || n_blocks <= 4 {
        return 1;
    }
    let efficiency = |s: i64| {
        let waves = (total * s) as f64 / cus as f64;
        waves / waves.ceil()
    };
    let most = 128.min(cus).min(n_blocks);
    let best = (1..=most).map(efficiency).fold(0.0, f64::max);
    (1..=most).find(|&s| efficiency(s) >= 0.85 * best).unwrap_or(1)
}

/// CTAs per CU the decode kernel (the packed-GQA tile) needs in flight to stream K/V near the memory's
/// rate: on an H200 (docs/perf.md, 2026-11-26) 128 CTAs of 32k keys each reached 1.9 TB/s and 512 of the
/// same length 3.5 TB/s.
pub const DECODE_CTAS_PER_CU: i64 = 3;

/// The shortest chunk `decode_split` makes, in keys (32 tiles of 64, 16 of 128): shorter chunks cost
/// more in each CTA's start and in partial results than their parallelism gains.
pub const DECODE_MIN_CHUNK_KEYS: i64 = 2048;

/// How the library splits a decode call when the caller leaves it to it (the packed-GQA tile; one tile
/// row set per sequence and kv head): a grid of fewer than `DECODE_CTAS_PER_CU` CTAs per CU is cut into
/// fixed chunks of the longest sequence's key tiles, as many as bring it there (at most 128, and none
/// shorter than `DECODE_MIN_CHUNK_KEYS`). Fixed chunks depend on a sequence's own length only, so results do not depend
/// on the rest of the batch.
pub fn decode_split(batch: i64, heads: i64, max_seqlen_k: i64, n0: i64, cu_count: i64) -> SplitPolicy {
    let tiles = batch.max(1) * heads.max(1);
    let n_blocks = ceil_div(max_seqlen_k.max(0), n0);
    let target = DECODE_CTAS_PER_CU * cu_count.max(1);
    let most = (n_blocks / ceil_div(DECODE_MIN_CHUNK_KEYS, n0.max(1))).min(128);
    if most < 2 || tiles >= target {
        return SplitPolicy::UNSPLIT;
    }
    let splits = ceil_div(target, tiles).min(most);
    let split_tiles = ceil_div(n_blocks, splits);
    SplitPolicy { max_splits: ceil_div(n_blocks, split_tiles), split_tiles }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_keys_grow_with_work_by_quarter_octaves() {
        assert_eq!(order_key(0), 0);
        assert_eq!(order_key(-3), 0);
        assert_eq!((order_key(1), order_key(2), order_key(3), order_key(4), order_key(5)), (1, 5, 7, 9, 10));
        assert_eq!(order_key(i64::MAX), 252);
        let mut last = 0;
        for w in 1..5000i64 {
            let k = order_key(w);
            assert!(k >= last && k <= 252, "{w}: {k} after {last}");
            assert!(order_key(w * 2) == k + 4 || w * 2 > 5000, "{w}");
            last = k;
        }
    }

    #[test]
    fn longest_first_is_a_stable_descending_permutation() {
        let keys = [3u8, 0, 9, 3, 252, 9, 1];
        assert_eq!(longest_first(&keys), vec![4, 2, 5, 0, 3, 6, 1]);
        assert!(longest_first(&[]).is_empty());
    }

    #[test]
    fn chunks_cover_every_tile_once_within_the_bound() {
        for kv_len in [0i64, 1, 127, 128, 129, 1000, 20000] {
            for max_splits in [1i64, 2, 3, 16, 256] {
                for split_tiles in [0i64, 1, 2, 7] {
                    for planned in [-1i64, 0, 1, 3, 100] {
                        let policy = SplitPolicy { max_splits, split_tiles };
                        let c = chunks(kv_len, 128, policy, planned);
                        let n = ceil_div(kv_len, 128);
                        assert!(c.count >= 1 && c.count <= max_splits.max(1), "{kv_len} {policy:?} {planned}: {c:?}");
                        assert!(c.count == 1 || (c.count - 1) * c.tiles < n && c.count * c.tiles >= n, "{c:?} {n}");
                    }
                }
            }
        }
    }

    #[test]
    fn fixed_chunks_depend_on_the_length_only() {
        let policy = SplitPolicy { max_splits: 40, split_tiles: 2 };
        assert_eq!(chunks(1000, 128, policy, 1), chunks(1000, 128, policy, 50));
        assert_eq!(chunks(1000, 128, policy, 9), Chunks { count: 4, tiles: 2 });
    }

    #[test]
    fn the_heuristic_splits_long_sparse_calls_only() {
        // Prefill: 32 heads × 32 query tiles fill the GPU.
        assert_eq!(heuristic_max_splits(1, 32, 4096, 8192, 128, 128, 132), 1);
        // Short keys: at most 4 tiles.
        assert_eq!(heuristic_max_splits(1, 32, 1, 512, 128, 128, 132), 1);
        // Decode of one long sequence: 32 heads on 132 SMs want 4 chunks (97 % of a wave), 8 packed
        // kv heads 15.
        assert_eq!(heuristic_max_splits(1, 32, 1, 32768, 128, 128, 132), 4);
        assert_eq!(heuristic_max_splits(1, 8, 1, 32768, 64, 64, 132), 15);
        // A batch of 64 sequences' kv heads fills the GPU unsplit.
        assert_eq!(heuristic_max_splits(64, 8, 1, 32768, 64, 64, 132), 1);
    }

    #[test]
    fn decode_splits_until_the_grid_has_three_ctas_per_cu() {
        // 64 sequences × 8 kv heads = 512 CTAs ≥ 3 × 132: unsplit (the B64 decode rows).
        assert_eq!(decode_split(64, 8, 32768, 64, 132), SplitPolicy::UNSPLIT);
        // 16 × 8 = 128 CTAs: 4 chunks of 128 tiles (8k keys), 512 CTAs.
        assert_eq!(decode_split(16, 8, 32768, 64, 132), SplitPolicy { max_splits: 4, split_tiles: 128 });
        // 4 × 8 = 32 CTAs: 13 chunks of 40 tiles, 416 CTAs.
        assert_eq!(decode_split(4, 8, 32768, 64, 132), SplitPolicy { max_splits: 13, split_tiles: 40 });
        // One sequence: chunks no shorter than 32 tiles, 16 of them, 128 CTAs.
        assert_eq!(decode_split(1, 8, 32768, 64, 132), SplitPolicy { max_splits: 16, split_tiles: 32 });
        // Keys for fewer than two shortest chunks, and the 128-chunk bound.
        assert_eq!(decode_split(1, 1, 63 * 64, 64, 132), SplitPolicy::UNSPLIT);
        assert_eq!(decode_split(1, 1, 64 * 64, 64, 132), SplitPolicy { max_splits: 2, split_tiles: 32 });
        assert_eq!(decode_split(1, 1, 1 << 20, 64, 132).max_splits, 128);
        // 128-key tiles: the same shortest chunk in keys.
        assert_eq!(decode_split(1, 8, 32768, 128, 132), SplitPolicy { max_splits: 16, split_tiles: 16 });
        assert_eq!(decode_split(1, 1, 31 * 128, 128, 132), SplitPolicy::UNSPLIT);
        // Every chunking covers the longest sequence within max_splits.
        for (b, h, k) in [(1, 1, 1000), (3, 8, 5000), (20, 4, 100000), (130, 1, 9000)] {
            let p = decode_split(b, h, k, 64, 132);
            assert!(
                ceil_div(ceil_div(k, 64), p.split_tiles.max(1)) <= p.max_splits || !p.splits(),
                "{b} {h} {k} {p:?}"
            );
        }
    }

    #[test]
    fn adaptive_chunks_shrink_with_the_work() {
        assert_eq!(adaptive_tiles(256 * 32, 132), 69);
        assert_eq!(adaptive_tiles(0, 132), 1);
    }
}
