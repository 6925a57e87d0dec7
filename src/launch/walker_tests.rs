//! The C++ walkers every dq_dk_dv kernel runs (`hip/bwd/schedule.h`, compiled for the CPU) against the
//! Rust schedule the host executor runs (`schedule::BatchPersistent::jobs`, `schedule::group_jobs`):
//! the same units in the same order for every workgroup, over thousands of random shapes and CU counts,
//! batch and group mode, masked and not. The kernels' parameter block is built as the GPU executor
//! builds it (`BwdParams::with_workspace`).

use super::abi::BwdParams;
use super::cpu_twin;
use crate::host_buffer::AlignedBytes;
use crate::runtime::DevicePtr;
use crate::schedule::{group_jobs, WorkUnit, XcdRemap};
use crate::test_rng::{starts, Rng};
use crate::workspace::{prepare_metadata, MetadataView, WorkspaceLayout, WorkspaceParams};

#[test]
fn cpp_walkers_walk_the_rust_schedule() {
    let mut rng = Rng::fresh();
    let seed = rng.0;
    let mut units_compared = 0usize;
    for case in 0..3000 {
        let group_mode = case % 2 == 1;
        let batch = rng.range(1, 24) as usize;
        let (q_lengths, k_lengths) = (rng.lengths(batch, 1500), rng.lengths(batch, 1500));
        let (seqstart_q, seqstart_k) = (starts(&q_lengths), starts(&k_lengths));
        let num_cus = rng.range(1, 320);
        let p = WorkspaceParams {
            group_mode,
            deterministic: true,
            batch: batch as i64,
            nhead_k: rng.range(1, 8),
            row_elements: 64 * rng.range(1, 4),
            seqlen_q: if group_mode { i64::from(seqstart_q[batch]) } else { rng.range(0, 1500) },
            seqlen_k: if group_mode { i64::from(seqstart_k[batch]) } else { rng.range(0, 1500) },
            max_seqlen_k: i64::from(*k_lengths.iter().max().unwrap()),
            m0: [16, 32, 64][rng.range(0, 2) as usize],
            n0: [64, 128][rng.range(0, 1) as usize],
            num_cus,
            remap: if rng.range(0, 1) == 0 { XcdRemap::None } else { XcdRemap::Xcd8 },
            masked: rng.range(0, 1) == 1,
            ordered_dq: false,
            nhead_q: 8,
        };
        let ctx = format!("seed {seed} case {case}: {p:?} lengths q {q_lengths:?} k {k_lengths:?}");
        let layout = WorkspaceLayout::new(&p).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        let mut metadata = AlignedBytes::new(layout.metadata_bytes, 0, "metadata").unwrap();
        let (q, k) = if group_mode { (Some(&seqstart_q[..]), Some(&seqstart_k[..])) } else { (None, None) };
        prepare_metadata(&layout, q, k, metadata.as_mut_slice()).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        let workspace = DevicePtr::new(metadata.as_slice().as_ptr() as usize);
        let params = BwdParams {
            batch: batch as i32,
            nhead_k: p.nhead_k as i32,
            group_mode: i32::from(group_mode),
            deterministic: 1,
            ..BwdParams::default()
        }
        .with_workspace(&layout, workspace);
        let view = MetadataView::new(&layout, metadata.as_slice()).unwrap();
        let states = view.batch_states();
        let masked = case % 4 >= 2;
        for worker in 0..num_cus {
            let rust: Vec<WorkUnit> = match layout.batch_plan {
                Some(plan) => plan.jobs(worker, masked).collect(),
                None => group_jobs(&view.cu_state(worker as usize), &states, p.nhead_k, masked).collect(),
            };
            let capacity = rust.len() + 4;
            let cpp = if group_mode {
                cpu_twin::group_jobs(&params, worker as i32, masked, capacity)
            } else {
                cpu_twin::batch_jobs(&params, worker, masked, capacity)
            };
            let cpp = cpp.unwrap_or_else(|| {
                panic!("{ctx}: worker {worker}: C++ walked more than {capacity} units, or its two batch walks differ")
            });
            assert_eq!(cpp, rust, "{ctx}: worker {worker}, masked {masked}");
            units_compared += rust.len();
        }
    }
    eprintln!("seed {seed}: {units_compared} units compared");
    assert!(units_compared > 100_000, "too few units compared to mean anything: {units_compared}");
}
