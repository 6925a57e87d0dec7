//! The workspace layout, prepare and view against their documented bytes and random cases.

use super::*;
use crate::schedule::{group_jobs, XcdRemap};
use crate::Status;

use crate::test_rng::{starts, Rng};

/// A zeroed buffer of `len` bytes starting 16-byte aligned (plus `skew` bytes), in safe code.
fn aligned(len: usize, skew: usize) -> (Vec<u8>, usize) {
    let v = vec![0u8; len + 32];
    let start = (16 - v.as_ptr() as usize % 16) % 16 + skew;
    (v, start)
}

fn params(group_mode: bool, deterministic: bool) -> WorkspaceParams {
    WorkspaceParams {
        group_mode,
        deterministic,
        batch: 2,
        nhead_k: 4,
        row_elements: 64,
        seqlen_q: if group_mode { 250 } else { 100 },
        seqlen_k: if group_mode { 320 } else { 300 },
        max_seqlen_k: 300,
        m0: 64,
        n0: 128,
        num_cus: 16,
        remap: XcdRemap::None,
        masked: false,
        ordered_dq: false,
        nhead_q: 8,
    }
}

const SQ: [i32; 3] = [0, 100, 250];
const SK: [i32; 3] = [0, 300, 320];

fn seqstarts(p: &WorkspaceParams) -> (Option<&'static [i32]>, Option<&'static [i32]>) {
    if p.group_mode {
        (Some(&SQ), Some(&SK))
    } else {
        (None, None)
    }
}

#[test]
fn sizes_by_scenario() {
    // (group, det) -> (metadata bytes, dq_acc upper bound, needs zero)
    let cases = [
        // 4 * Hq 4 * F 1 * (B 2 * Sq 100) * Dq 64
        ((false, false), 4096, 204_800, true),
        // F = persistent nsplits: jph 3, total 24, jpw ceil(24/16) = 2 -> 1 + ceil(2/2) = 2
        ((false, true), 4096, 409_600, false),
        // 4 * 4 * 1 * total_q 250 * 64
        ((true, false), 4096, 256_000, true),
        // F = ceil(300/128) = 3; sections 16 + 16 + 32 + 16*32 + 2*16 = 608 -> 4096
        ((true, true), 4096, 768_000, false),
    ];
    for ((group, det), meta, upper, zero) in cases {
        let p = params(group, det);
        let l = WorkspaceLayout::new(&p).unwrap();
        assert_eq!((l.metadata_bytes, l.upper_bound_dq_acc_bytes(), l.needs_zero_dq_acc()), (meta, upper, zero));
        assert_eq!(l.workspace_size(), meta + upper);
        assert_eq!(workspace_size_upper_bound(&p), Ok(meta + upper));
        let (q, k) = seqstarts(&p);
        let (mut buf, at) = aligned(l.workspace_size(), 0);
        let info = prepare_metadata(&l, q, k, &mut buf[at..]).unwrap();
        assert!(info.dq_acc_bytes <= upper);
        let view = MetadataView::new(&l, &buf[at..]).unwrap();
        let exact = match (group, det) {
            (false, false) => 204_800,
            (false, true) => 409_600,
            (true, false) => 256_000,
            // Chunk weights 192/256 (rows rounded up to 64, plus 64), nc 3/1, total_w 3328, target
            // 208. Head 1 of batch 0 spans 576..1152: CU 2 (raw 416, past head 0's last chunk start)
            // begins there with split 0, CU 3 (raw 624) runs chunk 1 with split ceil(48/208) = 1, CU 4
            // (raw 832) chunk 2 with split ceil(256/208) = 2. nsplits = [3, 1]: 4 * 4 * 64 * (3*100 + 1*150).
            (true, true) => {
                assert_eq!((view.nsplits(0), view.nsplits(1)), (3, 1));
                460_800
            }
        };
        assert_eq!(info.dq_acc_bytes, exact);
        let zero_elems = if group && det { exact / 4 } else { 0 };
        assert_eq!(l.zero_dq_acc_elements(&view), zero_elems);
    }
    let p = params(true, true);
    let l = WorkspaceLayout::new(&p).unwrap();
    let offs: Vec<usize> =
        [l.header, l.nsplits, l.dq_acc_offsets, l.cu_state, l.batch_state].iter().map(|s| s.offset).collect();
    assert_eq!(offs, [0, 16, 32, 64, 576]);
}

#[test]
fn large_metadata_rounds_to_pages() {
    let p = WorkspaceParams { batch: 1000, num_cus: 304, ..params(true, true) };
    let l = WorkspaceLayout::new(&p).unwrap();
    // 16 + 4000 + up(8008, 16) + 304*32 + 1000*16 = 37760 -> 10 pages
    assert_eq!(l.batch_state.offset + l.batch_state.bytes, 37_760);
    assert_eq!(l.metadata_bytes, 40_960);
    for s in [l.header, l.nsplits, l.dq_acc_offsets, l.cu_state, l.batch_state] {
        assert_eq!((s.offset % 16, s.bytes % 16), (0, 0));
    }
}

#[test]
fn overflow_and_ranges_are_invalid_arguments() {
    let p = WorkspaceParams {
        nhead_k: i32::MAX as i64,
        row_elements: i32::MAX as i64,
        seqlen_q: i32::MAX as i64,
        ..params(true, true)
    };
    let e = WorkspaceLayout::new(&p).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.starts_with("workspace_size") && e.message.contains("nhead_k=2147483647"), "{}", e.message);
    for (p, field) in [
        (WorkspaceParams { num_cus: 0, ..params(false, true) }, "num_cus"),
        (WorkspaceParams { nhead_k: 0, ..params(false, true) }, "nhead_k"),
        (WorkspaceParams { seqlen_q: -1, ..params(false, true) }, "seqlen_q"),
        (WorkspaceParams { n0: 0, ..params(true, true) }, "n0"),
    ] {
        let e = WorkspaceLayout::new(&p).unwrap_err();
        assert!(e.message.starts_with(field), "{field}: {}", e.message);
    }
}

#[test]
fn prepare_validation_names_fields() {
    let l = WorkspaceLayout::new(&params(true, true)).unwrap();
    let (mut buf, at) = aligned(l.metadata_bytes, 0);
    let mut run = |q: Option<&[i32]>, k: Option<&[i32]>| prepare_metadata(&l, q, k, &mut buf[at..]).unwrap_err();
    type Case<'a> = (Option<&'a [i32]>, Option<&'a [i32]>, &'a str, &'a str);
    let cases: [Case; 8] = [
        (None, Some(&SK), "seqstart_q", "null"),
        (Some(&SQ), None, "seqstart_k", "null"),
        (Some(&[0, 100]), Some(&SK), "seqstart_q", "3"),
        (Some(&[1, 100, 250]), Some(&SK), "seqstart_q", "[0] = 1"),
        (Some(&[0, 100, 90]), Some(&SK), "seqstart_q", "batch 1"),
        (Some(&[0, 100, 251]), Some(&SK), "seqstart_q", "seqlen_q"),
        (Some(&SQ), Some(&[0, 10, 320]), "max_seqlen_k", "batch 1 has 310"),
        (Some(&SQ), Some(&[0, 300, 321]), "seqstart_k", "seqlen_k"),
    ];
    for (q, k, field, detail) in cases {
        let e = run(q, k);
        assert!(e.message.starts_with(field) && e.message.contains(detail), "{field}: {}", e.message);
    }
    let lb = WorkspaceLayout::new(&params(false, false)).unwrap();
    let e = prepare_metadata(&lb, Some(&SQ), None, &mut buf[at..]).unwrap_err();
    assert!(e.message.starts_with("seqstart_q") && e.message.contains("batch mode"), "{}", e.message);
    // Too small, misaligned.
    let e = prepare_metadata(&lb, None, None, &mut buf[at..at + 100]).unwrap_err();
    assert_eq!(e.status, Status::WorkspaceTooSmall);
    let (mut skewed, at) = aligned(lb.metadata_bytes, 4);
    let e = prepare_metadata(&lb, None, None, &mut skewed[at..]).unwrap_err();
    assert!(e.status == Status::InvalidArgument && e.message.starts_with("workspace"), "{}", e.message);
}

#[test]
fn view_refuses_unprepared_and_foreign_workspaces() {
    let p = params(true, true);
    let l = WorkspaceLayout::new(&p).unwrap();
    let (mut buf, at) = aligned(l.metadata_bytes, 0);
    assert_eq!(MetadataView::new(&l, &buf[at..]).unwrap_err().status, Status::WorkspaceNotPrepared);
    let info = prepare_metadata(&l, Some(&SQ), Some(&SK), &mut buf[at..]).unwrap();
    let view = MetadataView::new(&l, &buf[at..]).unwrap();
    assert_eq!(view.fingerprint(), info.fingerprint);
    assert!(view.check_prepared_for(fingerprint(&p, Some(&SQ), Some(&SK))).is_ok());
    let other = fingerprint(&p, Some(&[0, 101, 250]), Some(&SK));
    assert_eq!(view.check_prepared_for(other).unwrap_err().status, Status::WorkspaceNotPrepared);
    let p2 = WorkspaceParams { num_cus: 17, ..p };
    assert_ne!(fingerprint(&p2, Some(&SQ), Some(&SK)), info.fingerprint);
    assert_ne!(fingerprint(&p, Some(&SK), Some(&SQ)), info.fingerprint);
    assert_ne!(fingerprint(&p, None, None), fingerprint(&p, Some(&[]), Some(&[])));
}

#[test]
fn header_bytes_are_documented_layout() {
    let p = params(false, true);
    let l = WorkspaceLayout::new(&p).unwrap();
    let (mut buf, at) = aligned(l.metadata_bytes, 0);
    buf.fill(0xAB);
    let info = prepare_metadata(&l, None, None, &mut buf[at..]).unwrap();
    let m = &buf[at..at + l.metadata_bytes];
    assert_eq!(&m[0..4], b"FMHW");
    assert_eq!(&m[4..8], &1u32.to_le_bytes());
    assert_eq!(&m[8..16], &info.fingerprint.to_le_bytes());
    assert_eq!(&m[16..20], &2i32.to_le_bytes()); // nsplits of `sizes_by_scenario`
    assert!(m[20..].iter().all(|&b| b == 0));
    assert!(buf[at + l.metadata_bytes..].iter().all(|&b| b == 0xAB), "wrote past the metadata region");
}

/// Random group/batch cases: bytes used within the bound, bytes a pure function of the inputs, the
/// view reads back what the builder computed, and dq_acc blocks tile the used prefix exactly.
#[test]
fn random_prepare_round_trip() {
    let mut rng = Rng::fresh();
    let seed = rng.0;
    for case in 0..400 {
        let group_mode = rng.range(0, 2) > 0;
        let deterministic = rng.range(0, 2) > 0;
        let batch = rng.range(1, 40);
        let sq = rng.lengths(batch as usize, 3000);
        let no_keys = rng.range(0, 10) == 0;
        let sk = if no_keys { vec![0; batch as usize] } else { rng.lengths(batch as usize, 3000) };
        let (qs, ks) = (starts(&sq), starts(&sk));
        let max_sk = *sk.iter().max().unwrap() as i64 + rng.range(0, 1) * rng.range(0, 500);
        let p = WorkspaceParams {
            group_mode,
            deterministic,
            batch,
            nhead_k: [1, 2, 8, 32][rng.range(0, 3) as usize],
            row_elements: [8, 64, 128][rng.range(0, 2) as usize],
            seqlen_q: if group_mode { qs[batch as usize] as i64 } else { rng.range(0, 3000) },
            seqlen_k: if group_mode { ks[batch as usize] as i64 } else { max_sk },
            max_seqlen_k: max_sk,
            m0: [16, 32, 64, 128][rng.range(0, 3) as usize],
            n0: [16, 64, 128][rng.range(0, 2) as usize],
            num_cus: rng.range(1, 320),
            remap: if rng.range(0, 1) == 0 { XcdRemap::None } else { XcdRemap::Xcd8 },
            masked: rng.range(0, 1) == 1,
            ordered_dq: deterministic && rng.range(0, 1) == 1,
            nhead_q: 0,
        };
        let p = WorkspaceParams { nhead_q: p.nhead_k * rng.range(1, 3), ..p };
        let ctx = format!("seed {seed} case {case}: {p:?} sq {sq:?} sk {sk:?}");
        let l = WorkspaceLayout::new(&p).unwrap();
        let (q, k) = if group_mode { (Some(&qs[..]), Some(&ks[..])) } else { (None, None) };
        let (mut a, at_a) = aligned(l.metadata_bytes, 0);
        let (mut b, at_b) = aligned(l.metadata_bytes + 64, 0);
        b.fill(0x5A);
        let info = prepare_metadata(&l, q, k, &mut a[at_a..]).unwrap();
        assert_eq!(prepare_metadata(&l, q, k, &mut b[at_b..]).unwrap(), info, "{ctx}");
        assert_eq!(&a[at_a..at_a + l.metadata_bytes], &b[at_b..at_b + l.metadata_bytes], "{ctx}: bytes differ");
        assert!(info.dq_acc_bytes <= l.upper_bound_dq_acc_bytes(), "{ctx}: {info:?} above bound");
        let view = MetadataView::new(&l, &a[at_a..]).unwrap();
        // Blocks are contiguous and end at the bytes used.
        let mut next = 0;
        for bi in 0..batch as usize {
            let blk = l.dq_acc_block(&view, q, bi).unwrap();
            let rows = if group_mode { (qs[bi + 1] - qs[bi]) as usize } else { p.seqlen_q as usize };
            let no_keys = group_mode && p.split_slots() && ks[batch as usize] == 0;
            assert_eq!(blk.rows, if no_keys { 0 } else { rows }, "{ctx}: batch {bi}");
            assert_eq!(blk.base, next, "{ctx}: batch {bi}");
            next = blk.base + p.nhead_k as usize * blk.nsplits * blk.rows * blk.hdim;
            if blk.rows > 0 {
                let last = blk.index(p.nhead_k as usize - 1, blk.nsplits - 1, blk.rows - 1, blk.hdim - 1);
                assert_eq!(last + 1, next, "{ctx}");
            }
        }
        assert_eq!(next * 4, info.dq_acc_bytes, "{ctx}");
        if group_mode && p.split_slots() {
            // Every unit's split fits the batch's slots, read back through the view.
            let states = view.batch_states();
            for i in 0..p.num_cus as usize {
                for u in group_jobs(&view.cu_state(i), &states, p.nhead_k, false) {
                    assert!(u.split < view.nsplits(u.batch as usize), "{ctx}");
                }
            }
            assert_eq!(l.zero_dq_acc_elements(&view) * 4, info.dq_acc_bytes, "{ctx}");
        }
    }
}
