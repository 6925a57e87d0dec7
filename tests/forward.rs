//! Forward end to end through the C ABI against the float64 reference, with the field's rule.

mod common;

use common::attention::{check_forward, check_forward_with_workspace, forward_supported, Case, Dtype, Layout, Rng};

fn check(case: &Case, rng: &mut Rng) {
    if forward_supported(case) {
        check_forward(case, rng);
    }
}
use fmha::problem::mask::{Mask, MaskType};

fn masks() -> Vec<Mask> {
    vec![
        Mask::NONE,
        Mask::causal(MaskType::TopLeft),
        Mask::causal(MaskType::BottomRight),
        Mask { kind: MaskType::TopLeft, left: 128, right: 30 },
        Mask { kind: MaskType::BottomRight, left: 4, right: 35 },
    ]
}

#[test]
fn batch_mode_masks_layouts_and_gqa() {
    let mut rng = Rng::fresh();
    eprintln!("seed {}", rng.0);
    for (i, mask) in masks().into_iter().enumerate() {
        for dtype in [Dtype::F16, Dtype::Bf16] {
            let mut case = Case::batch_mode(dtype, 2, 4, [4, 2, 1][i % 3], (97, 181), (64, 64), mask);
            case.layout = if i % 2 == 0 { Layout::Bshd } else { Layout::Bhsd };
            check(&case, &mut rng);
        }
    }
}

#[test]
fn head_dims_including_unequal_q_and_v() {
    let mut rng = Rng::fresh();
    eprintln!("seed {}", rng.0);
    for (dq, dv) in [(32, 32), (128, 128), (256, 256), (40, 88), (120, 160), (256, 108)] {
        let case = Case::batch_mode(Dtype::Bf16, 1, 2, 1, (70, 131), (dq, dv), Mask::causal(MaskType::BottomRight));
        check(&case, &mut rng);
    }
}

#[test]
fn group_mode_with_zero_lengths_and_padding() {
    let mut rng = Rng::fresh();
    eprintln!("seed {}", rng.0);
    for mask in masks() {
        let mut case = Case::batch_mode(Dtype::F16, 5, 6, 2, (0, 0), (64, 64), mask);
        case.group = true;
        case.seqlens = vec![(0, 40), (33, 0), (129, 77), (1, 1), (64, 300)];
        case.padding = vec![(3, 0), (0, 5), (7, 1), (0, 0), (0, 64)];
        check(&case, &mut rng);
    }
}

/// Head dims above 128 over many q and k tiles (the GPU's 256 bucket: 80-key tiles, two stages), every
/// mask, equal and unequal q/v dims.
#[test]
fn long_sequences_wide_heads() {
    let mut rng = Rng::fresh();
    eprintln!("seed {}", rng.0);
    let lengths = if fmha::ffi::version::fmha_backend() == fmha::ffi::version::FMHA_BACKEND_HOST {
        vec![(161, 250)]
    } else {
        vec![(1000, 1000), (129, 2100), (2100, 81)]
    };
    for (sq, sk) in lengths {
        for (i, mask) in masks().into_iter().enumerate() {
            let dtype = if i % 2 == 0 { Dtype::Bf16 } else { Dtype::F16 };
            let dims = [(256, 256), (192, 128), (136, 200)][i % 3];
            let case = Case::batch_mode(dtype, 2, 2, 1, (sq, sk), dims, mask);
            check(&case, &mut rng);
        }
    }
}

/// Longer sequences: many q tiles and k tiles, unequal lengths, every mask, both dtypes.
#[test]
fn long_sequences() {
    let mut rng = Rng::fresh();
    eprintln!("seed {}", rng.0);
    let lengths = if fmha::ffi::version::fmha_backend() == fmha::ffi::version::FMHA_BACKEND_HOST {
        vec![(300, 700), (513, 257)]
    } else {
        vec![(1, 1), (17, 4096), (1000, 1000), (4096, 127), (129, 4096)]
    };
    for (sq, sk) in lengths {
        for (i, mask) in masks().into_iter().enumerate() {
            let dtype = if i % 2 == 0 { Dtype::Bf16 } else { Dtype::F16 };
            let case = Case::batch_mode(dtype, 1, 2, 1, (sq, sk), (128, 128), mask);
            check(&case, &mut rng);
        }
    }
}

/// Unmasked D = 64 (on the GPU three consumer warpgroups, 192 q rows a tile) over many q and k tiles:
/// lengths around the tile's edges in batch and group mode, GQA, both dtypes.
#[test]
fn unmasked_head_dim_64_across_tile_edges() {
    let mut rng = Rng::fresh();
    eprintln!("seed {}", rng.0);
    let host = fmha::ffi::version::fmha_backend() == fmha::ffi::version::FMHA_BACKEND_HOST;
    let lengths = if host { vec![(193, 130)] } else { vec![(191, 193), (1000, 1000), (2113, 385)] };
    for (i, (sq, sk)) in lengths.into_iter().enumerate() {
        let dtype = if i % 2 == 0 { Dtype::Bf16 } else { Dtype::F16 };
        check(&Case::batch_mode(dtype, 2, 4, [4, 1][i % 2], (sq, sk), (64, 64), Mask::NONE), &mut rng);
    }
    let mut group = Case::batch_mode(Dtype::Bf16, 5, 4, 2, (0, 0), (64, 64), Mask::NONE);
    group.group = true;
    group.seqlens = if host {
        vec![(192, 5), (0, 40), (193, 129), (1, 1), (70, 0)]
    } else {
        vec![(192, 700), (0, 40), (385, 1000), (1, 1), (1152, 193)]
    };
    check(&group, &mut rng);
}

/// A scheduler workspace changes which CTA computes a tile, never a bit of the result: causal with GQA,
/// varlen with a window and empty sequences, unmasked varlen, and head dim 256 with more heads than one
/// L2 section holds (a whole section and the rest). On a GPU the masked shapes have more tiles than the
/// SMs, so that the persistent grid takes them from the counter.
#[test]
fn scheduler_workspace_keeps_every_bit() {
    let mut rng = Rng::fresh();
    eprintln!("seed {}", rng.0);
    let host = fmha::ffi::version::fmha_backend() == fmha::ffi::version::FMHA_BACKEND_HOST;
    let scale = |n: usize| if host && n > 0 { n / 10 + 1 } else { n };
    let causal = Mask::causal(MaskType::BottomRight);
    let gqa = Case::batch_mode(Dtype::Bf16, 3, 6, 2, (scale(1100), scale(700)), (128, 128), causal);
    let mut windowed = Case::batch_mode(
        Dtype::F16,
        6,
        4,
        4,
        (0, 0),
        (64, 64),
        Mask { kind: MaskType::BottomRight, left: 300, right: 20 },
    );
    windowed.group = true;
    windowed.seqlens =
        [(1500, 800), (0, 300), (700, 500), (1, 1), (1200, 600), (333, 0)].map(|(q, k)| (scale(q), scale(k))).to_vec();
    let mut unmasked = windowed.clone();
    unmasked.mask = Mask::NONE;
    // (D 256, 1 MiB of K and V a head: 16 heads a section of 16 MiB, and 8 more)
    let wide = Case::batch_mode(
        Dtype::Bf16,
        2,
        12,
        12,
        (scale(700), scale(1024)),
        (256, 256),
        Mask::causal(MaskType::TopLeft),
    );
    for case in [gqa, windowed, unmasked, wide] {
        if forward_supported(&case) {
            check_forward_with_workspace(&case, &mut rng);
        }
    }
}
