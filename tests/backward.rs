//! Backward end to end through the C ABI against the float64 reference, with the field's rule.

mod common;

use common::attention::{check_backward, Case, Dtype, Rng};
use fmha::mask::{Mask, MaskType};

#[test]
fn backward_small_cases() {
    let mut rng = Rng::fresh();
    eprintln!("seed {}", rng.0);
    for deterministic in [false, true] {
        for mask in
            [Mask::NONE, Mask::causal(MaskType::TopLeft), Mask { kind: MaskType::BottomRight, left: 4, right: 35 }]
        {
            let mut case = Case::batch_mode(Dtype::F16, 2, 4, 2, (77, 150), (64, 64), mask);
            case.deterministic = deterministic;
            check_backward(&case, &mut rng);
            let mut group = case.clone();
            group.group = true;
            group.seqlens = vec![(0, 40), (33, 0), (129, 77), (64, 300)];
            group.padding = vec![(3, 0), (0, 5), (7, 1), (0, 64)];
            check_backward(&group, &mut rng);
        }
    }
}
