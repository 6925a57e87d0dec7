//! The C++ workspace prepare (`hip/bwd/prepare_workspace.h`, run by the device-side prepare kernel)
//! against the Rust one: byte-identical regions for random valid inputs in every mode, an all-zero
//! region with the same status wherever the Rust prepare fails, and the stream-ordered
//! `launch::prepare_workspace` path end to end.

use super::abi::PrepareParams;
use super::cpu_twin;
use crate::host_buffer::AlignedBytes;
use crate::runtime::DevicePtr;
use crate::runtime::{current, BackendKind, CopyKind, ACTIVE_BACKEND};
use crate::schedule::XcdRemap;
use crate::workspace::{prepare_metadata, WorkspaceLayout, WorkspaceParams};
use crate::Status;

use crate::test_rng::{starts, Rng};

/// One of `special` values, or (as often as any one of them) any value in `lo..=hi`.
fn pick_or_range(rng: &mut Rng, special: &[i64], lo: i64, hi: i64) -> i64 {
    let any = rng.range(lo, hi);
    let i = rng.range(0, special.len() as i64) as usize;
    special.get(i).copied().unwrap_or(any)
}

/// One prepare input: params and, in group mode, the seqstarts.
struct Case {
    params: WorkspaceParams,
    seqstart_q: Vec<i32>,
    seqstart_k: Vec<i32>,
}

impl Case {
    fn seqstarts(&self) -> (Option<&[i32]>, Option<&[i32]>) {
        if self.params.group_mode {
            (Some(&self.seqstart_q), Some(&self.seqstart_k))
        } else {
            (None, None)
        }
    }
}

/// A valid random case of the given mode (every parameter range of the task: batch 1–64, lengths
/// 0–20000 with zeros and key-less batches, heads 1–64, hdim 8–256, tiles 16–128, 1–320 CUs, both remaps).
fn random_case(rng: &mut Rng, group_mode: bool, deterministic: bool) -> Case {
    let batch = pick_or_range(rng, &[1, 2, 3, 8, 64], 1, 64);
    let zeros = rng.range(0, 4);
    let q_lengths = rng.mixed_lengths(batch as usize, zeros);
    let zeros = rng.range(0, 4);
    let no_keys = rng.range(0, 15) == 0;
    let k_lengths = if no_keys { vec![0; batch as usize] } else { rng.mixed_lengths(batch as usize, zeros) };
    let (seqstart_q, seqstart_k) = (starts(&q_lengths), starts(&k_lengths));
    let longest_k = i64::from(*k_lengths.iter().max().unwrap());
    let slack = if rng.range(0, 1) == 0 { 0 } else { rng.range(0, 3000) };
    let (seqlen_q, seqlen_k, max_seqlen_k) = if group_mode {
        (i64::from(seqstart_q[batch as usize]), i64::from(seqstart_k[batch as usize]), longest_k + slack)
    } else {
        let (sq, sk) = (rng.mixed_lengths(1, 2)[0], rng.mixed_lengths(1, 2)[0]);
        (i64::from(sq), i64::from(sk), i64::from(sk) + slack)
    };
    let params = WorkspaceParams {
        group_mode,
        deterministic,
        batch,
        nhead_k: pick_or_range(rng, &[1, 2, 3, 8, 16, 64], 1, 64),
        row_elements: pick_or_range(rng, &[8, 64, 128, 256], 8, 256),
        seqlen_q,
        seqlen_k,
        max_seqlen_k,
        m0: rng.pick(&[16, 32, 64, 128]),
        n0: rng.pick(&[16, 32, 64, 128]),
        num_cus: pick_or_range(rng, &[1, 2, 7, 8, 9, 80, 104, 132, 256, 304, 320], 1, 320),
        remap: rng.pick(&[XcdRemap::None, XcdRemap::Xcd8]),
        masked: rng.range(0, 1) == 1,
        ordered_dq: deterministic && rng.range(0, 1) == 1,
        nhead_q: 0,
    };
    let params = WorkspaceParams { nhead_q: params.nhead_k * rng.range(1, 4), ..params };
    Case { params, seqstart_q, seqstart_k }
}

/// The Rust prepare's region, or its error.
fn rust_region(layout: &WorkspaceLayout, q: Option<&[i32]>, k: Option<&[i32]>) -> crate::Result<Vec<u8>> {
    let mut buffer = AlignedBytes::new(layout.metadata_bytes, 0x3C, "metadata")?;
    prepare_metadata(layout, q, k, buffer.as_mut_slice())?;
    Ok(buffer.as_slice().to_vec())
}

/// Where two regions first differ, named by section, for failure messages.
fn first_difference(layout: &WorkspaceLayout, a: &[u8], b: &[u8]) -> String {
    let Some(at) = a.iter().zip(b).position(|(x, y)| x != y) else {
        return format!("lengths {} and {}", a.len(), b.len());
    };
    let sections = [
        ("nsplits", layout.nsplits),
        ("dq_acc_offsets", layout.dq_acc_offsets),
        ("cu_state", layout.cu_state),
        ("batch_state", layout.batch_state),
    ];
    let name = sections.iter().rev().find(|(_, s)| at >= s.offset).map_or("header", |(n, s)| {
        if at < s.offset + s.bytes {
            n
        } else {
            "padding"
        }
    });
    format!("first difference at byte {at} ({name}): C++ {:#04x}, Rust {:#04x}", a[at], b[at])
}

/// Thousands of random valid inputs, all four modes: the C++ bytes are the Rust bytes.
#[test]
fn cpu_prepare_matches_rust_bytes() {
    let mut rng = Rng::fresh();
    let seed = rng.0;
    let started = std::time::Instant::now();
    let mut per_mode = [0usize; 4];
    for case_index in 0..20000 {
        let mode = case_index % 4;
        let case = random_case(&mut rng, mode & 2 != 0, mode & 1 != 0);
        let p = &case.params;
        let ctx = format!(
            "seed {seed} case {case_index}: {p:?} seqstart_q {:?} seqstart_k {:?}",
            case.seqstart_q, case.seqstart_k
        );
        let layout = WorkspaceLayout::new(p).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        let (q, k) = case.seqstarts();
        let rust = rust_region(&layout, q, k).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        let (status, cpp) = cpu_twin::prepare_workspace(&layout, q, k);
        assert_eq!(status, 0, "{ctx}");
        assert!(cpp == rust, "{ctx}: {}", first_difference(&layout, &cpp, &rust));
        per_mode[mode] += 1;
    }
    eprintln!("seed {seed}: {per_mode:?} cases per mode, {:?}", started.elapsed());
}

/// A random invalid group-mode input: (what is wrong, case). Each makes the Rust prepare fail.
fn corrupt(rng: &mut Rng, case: &mut Case) -> &'static str {
    let b = case.params.batch as usize;
    let (q, k) = (&mut case.seqstart_q, &mut case.seqstart_k);
    let target = if rng.range(0, 1) == 0 { q } else { k };
    match rng.range(0, 2) {
        0 => {
            // Non-monotone: one entry below its predecessor.
            let i = rng.range(1, b as i64) as usize;
            target[i] = target[i - 1] - rng.range(1, 50) as i32;
            "non-monotone"
        }
        1 => {
            // Total over the bound: the last entry exceeds seqlen_q / seqlen_k (a smaller total is
            // valid: the launcher's totals are bounds).
            target[b] += rng.pick(&[1, 7]);
            "total over the bound"
        }
        2 => {
            // Does not start at 0 (every entry shifted, so the lengths are unchanged).
            let shift = rng.range(1, 9) as i32;
            target.iter_mut().for_each(|s| *s += shift);
            "nonzero start"
        }
        _ => unreachable!(),
    }
}

fn assert_refused(layout: &WorkspaceLayout, q: Option<&[i32]>, k: Option<&[i32]>, ctx: &str) {
    let rust = rust_region(layout, q, k).expect_err(ctx);
    let (status, cpp) = cpu_twin::prepare_workspace(layout, q, k);
    assert_eq!(status, rust.status as i32, "{ctx}: Rust says {rust}");
    assert!(cpp.iter().all(|&b| b == 0), "{ctx}: C++ left a non-zero region ({rust})");
    assert_eq!(cpu_twin::prepare_workspace(layout, q, k).1, cpp, "{ctx}");
}

/// Invalid seqstarts: the Rust prepare fails, the C++ one writes all zeros and the same status.
#[test]
fn cpu_prepare_refuses_invalid_seqstarts_with_zeros() {
    let mut rng = Rng::fresh();
    let seed = rng.0;
    for case_index in 0..1500 {
        let deterministic = rng.range(0, 1) == 1;
        let mut case = random_case(&mut rng, true, deterministic);
        let what = match rng.range(0, 9) {
            0 => {
                // A batch longer in k than max_seqlen_k.
                let longest = case.seqstart_k.windows(2).map(|w| w[1] - w[0]).max().unwrap();
                if longest == 0 {
                    continue;
                }
                case.params.max_seqlen_k = i64::from(longest) - rng.range(1, i64::from(longest));
                "batch longer than max_seqlen_k"
            }
            1 => {
                let which = if rng.range(0, 1) == 0 { &mut case.seqstart_q } else { &mut case.seqstart_k };
                if rng.range(0, 1) == 0 {
                    which.pop();
                } else {
                    which.push(*which.last().unwrap());
                }
                "wrong length"
            }
            _ => corrupt(&mut rng, &mut case),
        };
        let p = case.params;
        let ctx = format!(
            "seed {seed} case {case_index} ({what}): {p:?} seqstart_q {:?} seqstart_k {:?}",
            case.seqstart_q, case.seqstart_k
        );
        let layout = WorkspaceLayout::new(&p).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        let (q, k) = (Some(&case.seqstart_q[..]), Some(&case.seqstart_k[..]));
        assert_refused(&layout, q, k, &ctx);
    }
}

/// Seqstarts missing in group mode (NullPointer) or present in batch mode (InvalidArgument).
#[test]
fn cpu_prepare_refuses_seqstarts_of_the_wrong_mode() {
    let mut rng = Rng::fresh();
    let seed = rng.0;
    for case_index in 0..200 {
        let deterministic = rng.range(0, 1) == 1;
        let group = random_case(&mut rng, true, deterministic);
        let ctx = format!("seed {seed} case {case_index}: {:?}", group.params);
        let layout = WorkspaceLayout::new(&group.params).unwrap();
        let (q, k) = group.seqstarts();
        assert_refused(&layout, None, k, &ctx);
        assert_refused(&layout, q, None, &ctx);
        assert_refused(&layout, None, None, &ctx);
        let batch = random_case(&mut rng, false, deterministic);
        let layout = WorkspaceLayout::new(&batch.params).unwrap();
        let entries = batch.params.batch as usize + 1;
        let zeros = vec![0i32; entries];
        assert_refused(&layout, Some(&zeros), None, &ctx);
        assert_refused(&layout, None, Some(&zeros), &ctx);
    }
}

/// The 64-bit overflow checks: inputs whose layout is valid but whose table does not fit fail on both
/// sides; the largest that fit give identical bytes.
#[test]
fn cpu_prepare_overflows_like_rust() {
    let base = WorkspaceParams {
        group_mode: true,
        deterministic: true,
        batch: 1,
        nhead_k: 1,
        row_elements: 8,
        seqlen_q: 0,
        seqlen_k: 0,
        max_seqlen_k: 0,
        m0: 128,
        n0: 128,
        num_cus: 13,
        remap: XcdRemap::Xcd8,
        masked: false,
        ordered_dq: false,
        nhead_q: 1,
    };
    let max = i64::from(i32::MAX);
    let group = |p: WorkspaceParams, sq: i32, sk: i32| {
        let p = WorkspaceParams { seqlen_q: i64::from(sq), seqlen_k: i64::from(sk), max_seqlen_k: i64::from(sk), ..p };
        (p, vec![0, sq], vec![0, sk])
    };
    // (what, params, seqstart_q, seqstart_k, Rust succeeds)
    let cases = [
        // A chunk weighs sq rounded up to m0, plus m0 (schedule::chunk_weight).
        ("a chunk weight past i32::MAX", group(WorkspaceParams { m0: 2, ..base }, i32::MAX - 1, 1), false),
        ("a chunk weight of exactly i32::MAX", group(WorkspaceParams { m0: 1, ..base }, i32::MAX - 1, 1), true),
        ("sq rounded up to a multiple of 128", group(base, i32::MAX - 255, 1), true),
        // offsets[1] = 2^20 * (2^31 - 256) * hdim; times 4 passes i64::MAX with hdim 1025, not with 1023.
        (
            "4 * dq_acc offsets overflow",
            group(WorkspaceParams { nhead_k: 1 << 20, row_elements: 1025, ..base }, i32::MAX - 255, 1),
            false,
        ),
        (
            "4 * dq_acc offsets just fit",
            group(WorkspaceParams { nhead_k: 1 << 20, row_elements: 1023, ..base }, i32::MAX - 255, 1),
            true,
        ),
        // nhead * nc * sqw = (2^31 - 1)^3 with n0 = 1 and sqw = m0 (no q rows, so dq_acc is empty).
        ("total work overflows", group(WorkspaceParams { nhead_k: max, n0: 1, m0: max, ..base }, 0, i32::MAX), false),
    ];
    for (what, (p, q, k), ok) in cases {
        let layout = WorkspaceLayout::new(&p).unwrap_or_else(|e| panic!("{what}: {e}"));
        let (q, k) = (Some(&q[..]), Some(&k[..]));
        if ok {
            let rust = rust_region(&layout, q, k).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(cpu_twin::prepare_workspace(&layout, q, k).1 == rust, "{what}");
        } else {
            assert_refused(&layout, q, k, what);
        }
    }
    // Batch mode: 4 * batch * nhead * nsplits * seqlen_q * hdim overflows 64 bits while the layout's
    // bound, 4 * nhead * nsplits * (batch * seqlen_q) * hdim, is 0 (seqlen_q = 0). nsplits = 2 needs an
    // odd jobs-per-worker with 2 jobs per head.
    let total_jobs = max * max * 2;
    let num_cus = (3..1000).find(|&n| crate::schedule::ceil_div(total_jobs, n) % 2 == 1).unwrap();
    let p = WorkspaceParams {
        group_mode: false,
        batch: max,
        nhead_k: max,
        seqlen_k: 2,
        max_seqlen_k: 2,
        n0: 1,
        num_cus,
        ..base
    };
    let layout = WorkspaceLayout::new(&p).unwrap();
    assert_refused(&layout, None, None, "batch-mode dq_acc size overflows");
}

/// The prepare's parameter block carries the layout's sections.
#[test]
fn prepare_params_carry_the_layout() {
    let p = WorkspaceParams {
        group_mode: true,
        deterministic: true,
        batch: 3,
        nhead_k: 4,
        row_elements: 64,
        seqlen_q: 10,
        seqlen_k: 20,
        max_seqlen_k: 9,
        m0: 64,
        n0: 128,
        num_cus: 5,
        remap: XcdRemap::Xcd8,
        masked: true,
        ordered_dq: false,
        nhead_q: 8,
    };
    let l = WorkspaceLayout::new(&p).unwrap();
    let pp = PrepareParams::new(&l);
    assert_eq!(
        [pp.group_mode, pp.deterministic, pp.batch, pp.num_cus, pp.remap, pp.metadata_bytes],
        [1, 1, 3, 5, 1, 4096]
    );
    // header 16, nsplits 3 * 4 -> 16, offsets 4 * 8 = 32, cu_state 5 * 32 = 160, batch_state 3 * 16
    assert_eq!(
        [pp.nsplits_offset, pp.dq_acc_offsets_offset, pp.cu_state_offset, pp.batch_state_offset],
        [16, 32, 64, 224]
    );
    assert_eq!([pp.nsplits_count, pp.dq_acc_offsets_count, pp.cu_state_count, pp.batch_state_count], [3, 4, 5, 3]);
}

/// `launch::prepare_workspace` on a stream: the region is `prepare_metadata`'s, the dq_acc region after
/// it is untouched, and invalid seqstarts leave zeros (the host backend also reports the error at the
/// synchronize). Runs the GPU kernel in GPU builds with a device.
#[test]
fn device_prepare_on_a_stream() {
    let rt = match current() {
        Ok(rt) => rt,
        Err(e) if e.status == Status::NoDevice => {
            eprintln!("skipped: {}", e.message);
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let mut rng = Rng::fresh();
    let seed = rng.0;
    let stream = rt.stream_create().unwrap();
    for case_index in 0..60 {
        let mode = case_index % 4;
        let mut case = random_case(&mut rng, mode & 2 != 0, mode & 1 != 0);
        let invalid = case.params.group_mode && case_index % 3 == 0;
        if invalid {
            corrupt(&mut rng, &mut case);
        }
        let ctx = format!("seed {seed} case {case_index}: {:?} invalid {invalid}", case.params);
        let layout = WorkspaceLayout::new(&case.params).unwrap();
        let (q, k) = case.seqstarts();
        let expected = rust_region(&layout, q, k).unwrap_or_else(|_| vec![0; layout.metadata_bytes]);

        let guard = 256; // bytes after the region that must stay untouched
        let total = layout.metadata_bytes + guard;
        let workspace = rt.malloc(total).unwrap();
        rt.memset(workspace, 0xAB, total).unwrap();
        let upload = |s: Option<&[i32]>| {
            s.map_or(0, |s| {
                let dev = rt.malloc(s.len() * 4).unwrap();
                rt.memcpy(dev, s.as_ptr() as usize, s.len() * 4, CopyKind::HostToDevice).unwrap();
                dev
            })
        };
        let (q_dev, k_dev) = (upload(q), upload(k));
        super::prepare_workspace(
            &layout,
            DevicePtr::new(workspace),
            DevicePtr::new(q_dev),
            DevicePtr::new(k_dev),
            stream,
        )
        .unwrap();
        let synced = rt.stream_synchronize(stream);
        if invalid && ACTIVE_BACKEND == BackendKind::Host {
            assert_eq!(synced.unwrap_err().status, Status::InvalidArgument, "{ctx}");
        } else {
            synced.unwrap_or_else(|e| panic!("{ctx}: {e}"));
        }
        let mut back = vec![0u8; total];
        rt.memcpy(back.as_mut_ptr() as usize, workspace, total, CopyKind::DeviceToHost).unwrap();
        let region = &back[..layout.metadata_bytes];
        assert!(region == expected, "{ctx}: {}", first_difference(&layout, region, &expected));
        assert!(back[layout.metadata_bytes..].iter().all(|&b| b == 0xAB), "{ctx}: wrote past the region");
        for dev in [workspace, q_dev, k_dev].into_iter().filter(|&d| d != 0) {
            rt.free(dev).unwrap();
        }
    }
    // Bad arguments are refused before anything is queued.
    let layout = WorkspaceLayout::new(&random_case(&mut rng, false, true).params).unwrap();
    let no_seqstarts = DevicePtr::<i32>::NULL;
    let e = super::prepare_workspace(&layout, DevicePtr::NULL, no_seqstarts, no_seqstarts, stream).unwrap_err();
    assert_eq!(e.status, Status::NullPointer);
    let workspace = rt.malloc(layout.metadata_bytes + 16).unwrap();
    let e = super::prepare_workspace(&layout, DevicePtr::new(workspace + 4), no_seqstarts, no_seqstarts, stream)
        .unwrap_err();
    assert!(e.status == Status::InvalidArgument && e.message.starts_with("workspace"), "{e}");
    rt.free(workspace).unwrap();
    rt.stream_destroy(stream).unwrap();
}
