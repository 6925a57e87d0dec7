//! Backward end to end through the C ABI against the float64 reference, with the field's rule:
//! CK's smoke shapes × {fp16, bf16} × {batch, group} × {deterministic, not} × head dims, zero-length
//! batches in group mode, and bitwise determinism.

mod common;

use common::attention::{check_backward, check_backward_modes, Case, Dtype, PreparedLauncher, Rng};
use fmha::ffi::backward::{FMHA_DQ_SCHEME_ORDERED, FMHA_DQ_SCHEME_SPLIT_SLOTS};
use fmha::problem::mask::{Mask, MaskType};

/// CK's `smoke_test_bwd.sh` shapes: (batch, nhead_q, nhead_k, seqlen_q, seqlen_k, mask).
fn smoke_shapes() -> Vec<(usize, usize, usize, usize, usize, Mask)> {
    vec![
        (1, 4, 2, 259, 259, Mask::NONE),
        (2, 2, 2, 516, 253, Mask::NONE),
        (1, 4, 1, 500, 251, Mask::causal(MaskType::TopLeft)),
        (1, 2, 2, 900, 258, Mask::causal(MaskType::BottomRight)),
        (2, 1, 1, 987, 219, Mask { kind: MaskType::TopLeft, left: 128, right: 30 }),
        (2, 3, 1, 244, 499, Mask { kind: MaskType::BottomRight, left: 4, right: 35 }),
    ]
}

const HEAD_DIMS: [(usize, usize); 9] =
    [(32, 32), (64, 64), (128, 128), (256, 256), (40, 88), (120, 160), (256, 108), (192, 128), (160, 72)];

/// Group mode variant of a smoke shape: per-batch lengths around the shape's (CK's group runs use
/// varying lengths), some physical padding.
fn group_case(mut case: Case) -> Case {
    let b = case.seqlens.len();
    let (sq, sk) = case.seqlens[0];
    case.group = true;
    case.seqlens = (0..b).map(|i| (sq.saturating_sub(37 * i), sk + 11 * i)).collect();
    case.padding = (0..b).map(|i| (i * 5, (i * 3) % 4)).collect();
    case
}

fn smoke_grid(dtype: Dtype, group: bool) {
    let mut rng = Rng::fresh();
    eprintln!("seed {}", rng.0);
    for (b, h, hk, sq, sk, mask) in smoke_shapes() {
        for &dims in &HEAD_DIMS {
            let case = Case::batch_mode(dtype, b, h, hk, (sq, sk), dims, mask);
            let case = if group { group_case(case) } else { case };
            check_backward_modes(&case, &[false, true], &mut rng);
        }
    }
}

#[test]
fn smoke_grid_fp16_batch() {
    smoke_grid(Dtype::F16, false);
}

#[test]
fn smoke_grid_fp16_group() {
    smoke_grid(Dtype::F16, true);
}

#[test]
fn smoke_grid_bf16_batch() {
    smoke_grid(Dtype::Bf16, false);
}

#[test]
fn smoke_grid_bf16_group() {
    smoke_grid(Dtype::Bf16, true);
}

/// Group-mode batches with zero-length q or k, first, middle and last, every mask kind.
#[test]
fn group_mode_zero_length_batches() {
    let mut rng = Rng::fresh();
    eprintln!("seed {}", rng.0);
    let layouts: [Vec<(usize, usize)>; 4] = [
        vec![(0, 90), (70, 130), (45, 0)],
        vec![(50, 0), (0, 0), (128, 64)],
        vec![(33, 65), (0, 100), (17, 0), (80, 80)],
        vec![(0, 0), (0, 64)],
    ];
    for seqlens in layouts {
        for mask in [
            Mask::NONE,
            Mask::causal(MaskType::TopLeft),
            Mask::causal(MaskType::BottomRight),
            Mask { kind: MaskType::BottomRight, left: 10, right: 3 },
        ] {
            let mut case = Case::batch_mode(Dtype::Bf16, seqlens.len(), 4, 2, (1, 1), (64, 64), mask);
            case.group = true;
            case.padding = vec![(0, 0); seqlens.len()];
            case.seqlens = seqlens.clone();
            check_backward_modes(&case, &[false, true], &mut rng);
        }
    }
}

/// Repeated deterministic runs give identical bits (varlen, GQA, causal), with either dQ scheme; on the
/// host backend so do dK/dV across CU counts (each K tile's dK/dV is computed by one unit in a fixed
/// order whatever the CU count), and with the ordered scheme dQ too (its turns do not depend on the
/// workers). GPU builds run on the device's CU count, 20 times; AMD has split slots only.
#[test]
fn deterministic_backward_is_bitwise_reproducible() {
    let _serial = common::CU_COUNT_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let mut rng = Rng::fresh();
    eprintln!("seed {}", rng.0);
    let host = fmha::runtime::ACTIVE_BACKEND == fmha::runtime::BackendKind::Host;
    let rocm = fmha::runtime::ACTIVE_BACKEND == fmha::runtime::BackendKind::Rocm;
    let schemes: &[i32] =
        if rocm { &[FMHA_DQ_SCHEME_SPLIT_SLOTS] } else { &[FMHA_DQ_SCHEME_SPLIT_SLOTS, FMHA_DQ_SCHEME_ORDERED] };
    // D = 256 and 192/128 on sm_90a: two warpgroups over one K tile's keys, each its part of dK's and dV's
    // columns (another tile and walk than D = 64's).
    for (dq_scheme, dims) in schemes.iter().flat_map(|&s| [(s, (64, 64)), (s, (256, 256)), (s, (192, 128))]) {
        let mut case = Case::batch_mode(Dtype::Bf16, 3, 8, 2, (0, 0), dims, Mask::causal(MaskType::BottomRight));
        case.group = true;
        case.deterministic = true;
        case.dq_scheme = dq_scheme;
        case.seqlens = vec![(130, 260), (0, 77), (301, 190)];
        case.padding = vec![(0, 0); 3];
        let Some((fwd, bwd)) = check_backward(&case, &mut rng) else { return };
        let (cu_counts, repeats): (&[i32], usize) = if host { (&[1, 7, 80], 3) } else { (&[0], 20) };
        let mut per_cu_count = Vec::new();
        for &cus in cu_counts {
            if host {
                common::ok(fmha::ffi::runtime::fmha_host_set_cu_count(cus));
            }
            let launcher = PreparedLauncher::new(&case);
            launcher.run(&case, &fwd, &bwd);
            let first = bwd.bits();
            for _ in 0..repeats {
                bwd.poison(&case);
                launcher.run(&case, &fwd, &bwd);
                assert_eq!(
                    bwd.bits(),
                    first,
                    "deterministic backward (dq_scheme {dq_scheme}, D {dims:?}) changed between runs ({cus} CUs, 0 = the \
                     device's)"
                );
            }
            per_cu_count.push((cus, first));
        }
        let (_, reference) = &per_cu_count[0];
        for (cus, bits) in &per_cu_count[1..] {
            assert_eq!(bits.dk, reference.dk, "dK differs between 1 and {cus} CUs (dq_scheme {dq_scheme})");
            assert_eq!(bits.dv, reference.dv, "dV differs between 1 and {cus} CUs (dq_scheme {dq_scheme})");
            if dq_scheme == FMHA_DQ_SCHEME_ORDERED {
                assert_eq!(bits.dq, reference.dq, "ordered dQ differs between 1 and {cus} CUs");
            }
        }
    }
}

/// Deterministic batch mode, where no pass zeroes dq_acc: each worker's first unit in a split slot
/// must write all of it (under a mask it does not visit every row), and convert_dq must sum only the
/// slots some worker wrote. On the host backend with 4 CUs, 2 batches × 3 kv heads × 5 K tiles = 30
/// units make 8 per worker and 2 slots per head, of which heads 0 and 4 write only the first; the
/// workspace is garbage-filled, so a slot read unwritten would show.
#[test]
fn deterministic_batch_mode_writes_or_skips_every_slot() {
    let _serial = common::CU_COUNT_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let mut rng = Rng::fresh();
    eprintln!("seed {}", rng.0);
    if fmha::runtime::ACTIVE_BACKEND == fmha::runtime::BackendKind::Host {
        common::ok(fmha::ffi::runtime::fmha_host_set_cu_count(4));
    }
    for mask in [
        Mask::NONE,
        Mask::causal(MaskType::BottomRight),
        Mask::causal(MaskType::TopLeft),
        Mask { kind: MaskType::BottomRight, left: 70, right: 20 },
    ] {
        let case = Case::batch_mode(Dtype::Bf16, 2, 6, 3, (300, 600), (64, 64), mask);
        check_backward_modes(&case, &[true], &mut rng);
    }
}

/// The ordered dQ scheme (`FMHA_DQ_SCHEME_ORDERED`: the host executor's twin of the NVIDIA kernel's):
/// every mask kind in batch and group mode (zero-length sequences, GQA, lengths off the tiles), against
/// the float64 reference (bitwise reproducibility: the test above); unmasked on the host backend with 1
/// CU (units walk in turn) and 80 (rotated walks, the units interleaved). The host executor checks each
/// q tile's turn against its semaphore, so turn or index arithmetic that disagrees with the walks fails
/// the run rather than changing the sum. Backends without the scheme (AMD) answer unsupported.
#[test]
fn ordered_dq_is_correct_under_every_mask() {
    if matches!(fmha::runtime::ACTIVE_BACKEND, fmha::runtime::BackendKind::Rocm) {
        let mut case = Case::varlen_causal(vec![(8, 8); 2], true);
        case.dq_scheme = FMHA_DQ_SCHEME_ORDERED;
        let mut launcher = std::ptr::null_mut();
        let status =
            fmha::ffi::backward::fmha_bwd_launcher_create(&common::attention::bwd_traits(&case), &mut launcher);
        assert_eq!(status, fmha::ffi::status::FMHA_ERR_UNSUPPORTED);
        return;
    }
    let _serial = common::CU_COUNT_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let host = fmha::runtime::ACTIVE_BACKEND == fmha::runtime::BackendKind::Host;
    let mut rng = Rng::fresh();
    eprintln!("seed {}", rng.0);
    for (i, mask) in [
        Mask::NONE,
        Mask::causal(MaskType::BottomRight),
        Mask::causal(MaskType::TopLeft),
        Mask { kind: MaskType::BottomRight, left: 70, right: 20 },
        Mask { kind: MaskType::TopLeft, left: 5, right: 90 },
    ]
    .into_iter()
    .enumerate()
    {
        let cu_counts: &[i32] = if host && !mask.is_masked() { &[1, 80] } else { &[0] };
        for &cus in cu_counts {
            if cus > 0 {
                common::ok(fmha::ffi::runtime::fmha_host_set_cu_count(cus));
            }
            let dims = [(64, 64), (128, 128), (256, 256), (192, 128)][i % 4]; // the GPU buckets
            let mut case = Case::batch_mode(Dtype::Bf16, 2, 6, 3, (300, 600), dims, mask);
            case.dq_scheme = FMHA_DQ_SCHEME_ORDERED;
            check_backward_modes(&case, &[true], &mut rng);
            let mut case = Case::batch_mode(Dtype::F16, 4, 4, 2, (1, 1), (40, 40), mask);
            case.dq_scheme = FMHA_DQ_SCHEME_ORDERED;
            case.group = true;
            case.padding = vec![(0, 0); 4];
            case.seqlens = vec![(130, 260), (0, 77), (301, 190), (65, 0)];
            check_backward_modes(&case, &[true], &mut rng);
        }
    }
}
