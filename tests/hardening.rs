//! Regression tests of the defects a fuzzing and load campaign found (one test per defect): each
//! fails without its fix. Through the C ABI, on every backend.

mod common;

use common::attention::{bwd_traits, check_gradients, forward_and_expected, Buffers, Case, Dtype, Rng};
use common::{expect_error, expect_stream_error, gated, host_backend, last_error, not_gated, ok, Gate, GuardedBytes};
use fmha::ffi::attention::*;
use fmha::ffi::backward::*;
use fmha::ffi::pinned::*;
use fmha::ffi::runtime::*;
use fmha::ffi::status::*;
use fmha::problem::mask::{Mask, MaskType};
use std::collections::HashSet;
use std::ffi::c_void;
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Defect 1: a second `fmha_device_synchronize` returned before a destroyed stream's work was done (the
/// first caller had drained the list of destroyed streams), and only one caller saw its error.
#[test]
fn device_synchronize_waits_for_destroyed_streams_in_every_thread() {
    let _alone = gated();
    let mut buffer = null_mut();
    ok(fmha_device_malloc(&mut buffer, 4096));
    ok(fmha_memset(buffer, 0, 4096));
    let mut stream = null_mut();
    ok(fmha_stream_create(&mut stream));
    let gate = Gate::close(stream, host_backend());
    ok(fmha_memset_async(buffer, 0xAB, 4096, stream));
    ok(fmha_stream_destroy(stream));
    let returned = Arc::new(AtomicUsize::new(0));
    let waiters: Vec<_> = (0..2)
        .map(|i| {
            // The second starts once the first is waiting (and, before the fix, had drained the list).
            std::thread::sleep(Duration::from_millis(if i == 0 { 0 } else { 50 }));
            let returned = Arc::clone(&returned);
            std::thread::spawn(move || {
                let status = fmha_device_synchronize();
                returned.fetch_add(1, Ordering::SeqCst);
                status
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(returned.load(Ordering::SeqCst), 0, "a device synchronize returned while a stream's work was queued");
    gate.open();
    let statuses: Vec<fmha_status> = waiters.into_iter().map(|w| w.join().unwrap()).collect();
    let mut back = vec![0u8; 4096];
    ok(fmha_memcpy(back.as_mut_ptr() as *mut c_void, buffer, 4096, FMHA_MEMCPY_DEVICE_TO_HOST));
    assert!(back.iter().all(|&b| b == 0xAB), "the destroyed stream's memset was not done");
    if host_backend() {
        // Both callers waited for the failing work, so both report it.
        assert_eq!(statuses, [FMHA_ERR_ASYNC_FAILURE; 2]);
    } else {
        assert_eq!(statuses, [FMHA_OK; 2]);
    }
    ok(fmha_device_synchronize());
    ok(fmha_device_free(buffer));
}

/// Defect 2: destroying a releaser while other threads release into it freed the releaser under them.
/// Every release either succeeds (the buffer is freed exactly once) or fails with INVALID_ARGUMENT
/// (the caller keeps it). Run under valgrind by scripts/test.sh.
#[test]
fn releaser_destroy_racing_releases_touches_no_freed_memory() {
    let _shared = not_gated();
    static FREED: Mutex<Vec<usize>> = Mutex::new(Vec::new());
    unsafe extern "C" fn record(_user: *mut c_void, ptr: *mut c_void) {
        FREED.lock().unwrap().push(ptr as usize);
    }
    let allocator = fmha_pinned_allocator {
        struct_size: std::mem::size_of::<fmha_pinned_allocator>(),
        user_data: null_mut(),
        allocate: None, // a releaser only frees
        free: Some(record),
    };
    for round in 0..20usize {
        FREED.lock().unwrap().clear();
        let mut releaser = null_mut();
        ok(fmha_pinned_releaser_create(&allocator, &mut releaser));
        let handle = releaser as usize;
        let refused = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..8usize)
            .map(|t| {
                let (refused, stop) = (Arc::clone(&refused), Arc::clone(&stop));
                std::thread::spawn(move || {
                    let mut i = 0usize;
                    while !stop.load(Ordering::Relaxed) || i < 100 {
                        let ptr = 1 + (round * 8 + t) * 1_000_000 + i;
                        match fmha_pinned_releaser_release(handle as *const _, ptr as *mut c_void) {
                            FMHA_OK => {}
                            FMHA_ERR_INVALID_ARGUMENT => refused.lock().unwrap().push(ptr),
                            other => panic!("release answered {other}: {}", last_error()),
                        }
                        i += 1;
                        if i > 20_000 {
                            break;
                        }
                    }
                    i
                })
            })
            .collect();
        std::thread::sleep(Duration::from_micros(200 * (round as u64 % 5)));
        ok(fmha_pinned_releaser_destroy(releaser));
        stop.store(true, Ordering::Relaxed);
        let attempted: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        let freed = FREED.lock().unwrap().clone();
        let refused = refused.lock().unwrap().clone();
        let unique: HashSet<usize> = freed.iter().chain(&refused).copied().collect();
        assert_eq!(freed.len() + refused.len(), attempted, "round {round}: a release was lost or doubled");
        assert_eq!(unique.len(), attempted, "round {round}: a buffer was freed twice or freed and refused");
        expect_error(fmha_pinned_releaser_destroy(releaser), FMHA_ERR_INVALID_ARGUMENT, &["releaser", "live"]);
    }
}

/// Defect 3: a group-mode deterministic launcher with batch = INT32_MAX was accepted and its prepare
/// aborted the process on a failed 60 GB allocation.
#[test]
fn absurd_batch_sizes_are_refused_not_aborted() {
    let _shared = not_gated();
    let case = Case::varlen_causal(vec![(8, 8); 2], true);
    let traits = fmha_bwd_traits { batch: i32::MAX, ..bwd_traits(&case) };
    let mut launcher = null_mut();
    expect_error(fmha_bwd_launcher_create(&traits, &mut launcher), FMHA_ERR_INVALID_ARGUMENT, &["batch"]);
    let mut size = 0;
    expect_error(fmha_bwd_workspace_size_upper_bound(&traits, &mut size), FMHA_ERR_INVALID_ARGUMENT, &["batch"]);
    assert!(launcher.is_null());
}

/// Defect 4: extents of 2^63 bytes or more, or running past the end of the address space, were
/// accepted (then a segfault, or one head's LSE written over another's).
#[test]
fn extents_are_checked_in_bytes_and_addresses() {
    let _shared = not_gated();
    let mut rng = Rng::fresh();
    let case = Case::batch_mode(Dtype::Bf16, 2, 2, 2, (16, 16), (64, 64), Mask::NONE);
    let fwd = Buffers::new(&case, &common::attention::Inputs::random(&case, &mut rng), &mut rng);
    let traits = Buffers::fwd_traits(&case);
    let args = fwd.fwd_args(&case);
    let run = |a: fmha_fwd_args| fmha_fwd(&traits, &a, null_mut());
    let huge = 1i64 << 62;
    expect_error(run(fmha_fwd_args { q: fmha_tensor { batch_stride: huge, ..args.q }, ..args }), 1, &["q", "2^63"]);
    expect_error(run(fmha_fwd_args { lse: fmha_tensor { head_stride: huge, ..args.lse }, ..args }), 1, &["lse"]);
    let top = (usize::MAX - 4095) as *mut c_void;
    expect_error(run(fmha_fwd_args { k: fmha_tensor { data: top, ..args.k }, ..args }), 1, &["k", "address space"]);
    let odd = (args.v.data as usize + 1) as *mut c_void;
    expect_error(run(fmha_fwd_args { v: fmha_tensor { data: odd, ..args.v }, ..args }), 1, &["v.data", "aligned"]);
    // The runtime helpers refuse ranges that wrap around too.
    let mut byte = 0u8;
    let wrap = (usize::MAX - 15) as *mut c_void;
    expect_error(fmha_memset(wrap, 0, 64), 1, &["dst", "address space"]);
    expect_error(fmha_memcpy(&mut byte as *mut u8 as *mut c_void, wrap, 64, FMHA_MEMCPY_DEVICE_TO_HOST), 1, &["src"]);
    ok(fmha_stream_synchronize(null_mut()));
}

/// Defects 5 and 6: the synchronous and host-path prepares accepted a workspace that is not 16-byte
/// aligned; a batch-mode prepare with only `seqstart_k` named `seqstart_q`.
#[test]
fn prepares_check_alignment_and_name_the_right_seqstart() {
    let _shared = not_gated();
    let case = Case::batch_mode(Dtype::Bf16, 2, 4, 2, (20, 30), (64, 64), Mask::NONE);
    let traits = bwd_traits(&case);
    let mut launcher = null_mut();
    ok(fmha_bwd_launcher_create(&traits, &mut launcher));
    let mut size = 0;
    ok(fmha_bwd_launcher_workspace_size(launcher, &mut size));
    let mut workspace = null_mut();
    ok(fmha_device_malloc(&mut workspace, size + 16));
    let skewed = (workspace as usize + 8) as *mut c_void;
    expect_error(
        fmha_bwd_launcher_prepare_workspace(launcher, skewed, size, null(), null()),
        FMHA_ERR_INVALID_ARGUMENT,
        &["workspace", "aligned"],
    );
    let starts = [0i32, 30, 60];
    expect_error(
        fmha_bwd_launcher_prepare_workspace(launcher, workspace, size, null(), starts.as_ptr()),
        FMHA_ERR_INVALID_ARGUMENT,
        &["seqstart_k", "batch mode"],
    );
    ok(fmha_bwd_launcher_prepare_workspace(launcher, workspace, size, null(), null()));
    ok(fmha_bwd_launcher_destroy(launcher));
    ok(fmha_device_free(workspace));
}

/// Defect 7: the header said "nonzero" for flags the code accepted only as 0/1, "unused" for a group-mode
/// batch stride the code refused when negative, and the releaser required an `allocate` it never calls.
#[test]
fn header_and_code_agree_on_flags_strides_and_allocators() {
    let _shared = not_gated();
    let mut rng = Rng::fresh();
    let case = Case::varlen_causal(vec![(20, 30), (13, 47)], false);
    let (fwd, _bwd, _) = forward_and_expected(&case, &mut rng);
    let traits = Buffers::fwd_traits(&case);
    let args = fwd.fwd_args(&case);
    for flag in [2, -1] {
        let t = fmha_fwd_traits { has_dropout: flag, ..traits };
        expect_error(fmha_fwd(&t, &args, null_mut()), FMHA_ERR_INVALID_ARGUMENT, &["has_dropout", "0 or 1"]);
        let b = fmha_bwd_traits { is_deterministic: flag, ..bwd_traits(&case) };
        let mut launcher = null_mut();
        expect_error(fmha_bwd_launcher_create(&b, &mut launcher), 1, &["is_deterministic", "0 or 1"]);
    }
    // Group mode ignores batch_stride, whatever its value.
    let ignored = fmha_fwd_args { q: fmha_tensor { batch_stride: -12345, ..args.q }, ..args };
    ok(fmha_fwd(&traits, &ignored, null_mut()));
    ok(fmha_stream_synchronize(null_mut()));
    // A releaser needs `free` only.
    unsafe extern "C" fn free_nothing(_user: *mut c_void, _ptr: *mut c_void) {}
    let allocator = fmha_pinned_allocator {
        struct_size: std::mem::size_of::<fmha_pinned_allocator>(),
        user_data: null_mut(),
        allocate: None,
        free: Some(free_nothing),
    };
    let mut releaser = null_mut();
    ok(fmha_pinned_releaser_create(&allocator, &mut releaser));
    ok(fmha_pinned_releaser_destroy(releaser));
}

/// Defect 8: the library copied the whole struct, then required the exact size, though docs/abi.md
/// promises that it reads only the first `struct_size` bytes of an older caller's struct. A 0.1
/// `fmha_bwd_args` (416 bytes, before `workspace_size`) ends at an unreadable page here.
#[test]
fn struct_size_is_read_first_and_nothing_past_it() {
    let _shared = not_gated();
    let mut rng = Rng::fresh();
    let case = Case::varlen_causal(vec![(20, 30), (13, 47)], true);
    let (fwd, bwd, expected) = forward_and_expected(&case, &mut rng);
    let prepared = common::attention::PreparedLauncher::new(&case);
    let v1 = 416;
    assert!(v1 < std::mem::size_of::<fmha_bwd_args>());
    let mut args = bwd.args(&case, &fwd, prepared.workspace);
    args.struct_size = v1;
    args.workspace_size = 1; // past the 0.1 struct: must not be read (it would be "too small")
    let guarded = GuardedBytes::new(v1);
    let old_caller = guarded.place(&args, v1);
    bwd.poison(&case);
    ok(fmha_bwd_launcher_run(prepared.launcher, old_caller, null_mut()));
    ok(fmha_stream_synchronize(null_mut()));
    check_gradients(&case, &bwd, &expected);
    // Every extensible struct at its exact current size against the guard page.
    let fwd_args = fwd.fwd_args(&case);
    let fwd_traits = Buffers::fwd_traits(&case);
    let fwd_size = std::mem::size_of::<fmha_fwd_args>();
    let (g1, g2) = (GuardedBytes::new(fwd_size), GuardedBytes::new(40));
    ok(fmha_fwd(g2.place(&fwd_traits, 40), g1.place(&fwd_args, fwd_size), null_mut()));
    ok(fmha_stream_synchronize(null_mut()));
    // A caller of the first fmha_fwd_args (240 bytes, before the fp8 descales).
    let g0 = GuardedBytes::new(240);
    ok(fmha_fwd(g2.place(&fwd_traits, 40), g0.place(&fmha_fwd_args { struct_size: 240, ..fwd_args }, 240), null_mut()));
    ok(fmha_stream_synchronize(null_mut()));
    // A caller of the struct with the fp8 descales (336 bytes, before the scheduler workspace), whose
    // struct ends at the guard page.
    let previous = 336;
    assert!(previous < fwd_size);
    let g336 = GuardedBytes::new(previous);
    let a336 = fmha_fwd_args { struct_size: previous, ..fwd_args };
    ok(fmha_fwd(g2.place(&fwd_traits, 40), g336.place(&a336, previous), null_mut()));
    ok(fmha_stream_synchronize(null_mut()));
    // Sizes between the versions end inside a field: no header's struct, refused.
    for size in [248, previous - 8, previous + 8, fwd_size - 8, fwd_size - 1] {
        let g = GuardedBytes::new(size);
        let a = fmha_fwd_args { struct_size: size, ..fwd_args };
        expect_error(fmha_fwd(g2.place(&fwd_traits, 40), g.place(&a, size), null_mut()), 1, &["args", "struct_size"]);
    }
    let traits = bwd_traits(&case);
    let traits_size = std::mem::size_of::<fmha_bwd_traits>();
    let g3 = GuardedBytes::new(traits_size);
    let mut bytes = 0;
    ok(fmha_bwd_workspace_size_upper_bound(g3.place(&traits, traits_size), &mut bytes));
    // A caller of the first fmha_bwd_traits (80 bytes, before dq_scheme), whose struct ends at the guard
    // page.
    let v01_traits = std::mem::offset_of!(fmha_bwd_traits, dq_scheme);
    let g80 = GuardedBytes::new(v01_traits);
    let old_traits = fmha_bwd_traits { struct_size: v01_traits, ..traits };
    let mut old_bytes = 0;
    ok(fmha_bwd_workspace_size_upper_bound(g80.place(&old_traits, v01_traits), &mut old_bytes));
    assert_eq!(old_bytes, bytes);
    // Smaller than the first version, inside a field, larger than this library knows: refused, naming
    // the struct.
    for size in [0, 8, v1 - 8, v1 + 4, std::mem::size_of::<fmha_bwd_args>() + 8] {
        let a = fmha_bwd_args { struct_size: size, ..args };
        expect_error(fmha_bwd_launcher_run(prepared.launcher, &a, null_mut()), 1, &["args", "struct_size"]);
    }
}

/// Defect 9: a launcher remembered one prepared workspace, so per-thread workspaces on one launcher
/// were refused as not prepared. Workspaces now describe themselves: 8 threads, one launcher, a
/// workspace and a stream each; and a workspace prepared by another launcher with the same traits.
#[test]
fn one_launcher_serves_many_workspaces_on_many_streams() {
    let _shared = not_gated();
    let mut rng = Rng::fresh();
    eprintln!("seed {}", rng.0);
    let case = Case::varlen_causal(vec![(40, 50), (0, 17), (33, 64)], true);
    let traits = bwd_traits(&case);
    let mut launcher = null_mut();
    ok(fmha_bwd_launcher_create(&traits, &mut launcher));
    let mut size = 0;
    ok(fmha_bwd_launcher_workspace_size(launcher, &mut size));
    let handle = launcher as usize;
    std::thread::scope(|scope| {
        for seed in (0..8).map(|_| rng.next_u64()) {
            let case = &case;
            scope.spawn(move || {
                let (fwd, bwd, expected) = forward_and_expected(case, &mut Rng(seed));
                let (fwd, bwd, expected) = (&fwd, &bwd, &expected);
                let launcher = handle as *mut fmha_bwd_launcher;
                let (mut workspace, mut stream) = (null_mut(), null_mut());
                ok(fmha_device_malloc(&mut workspace, size));
                ok(fmha_stream_create(&mut stream));
                let (q, k) = (case.starts(false), case.starts(true));
                for _ in 0..3 {
                    ok(fmha_bwd_launcher_prepare_workspace(launcher, workspace, size, q.as_ptr(), k.as_ptr()));
                    bwd.poison(case);
                    let args = fmha_bwd_args { workspace_size: size, ..bwd.args(case, fwd, workspace) };
                    ok(fmha_bwd_launcher_run(launcher, &args, stream));
                    ok(fmha_stream_synchronize(stream));
                    check_gradients(case, bwd, expected);
                }
                ok(fmha_stream_destroy(stream));
                ok(fmha_device_free(workspace));
            });
        }
    });
    // Prepared by one launcher, run by another with the same traits.
    let other = common::attention::PreparedLauncher::new(&case);
    let (fwd, bwd, expected) = forward_and_expected(&case, &mut rng);
    bwd.poison(&case);
    ok(fmha_bwd_launcher_run(launcher, &bwd.args(&case, &fwd, other.workspace), null_mut()));
    ok(fmha_stream_synchronize(null_mut()));
    check_gradients(&case, &bwd, &expected);
    ok(fmha_bwd_launcher_destroy(launcher));
}

/// Defect 10: a double destroy aborted in glibc and a stale or garbage launcher answered OK with garbage;
/// outputs overlapping each other or an input were accepted.
#[test]
fn stale_handles_and_overlapping_outputs_are_refused() {
    let _shared = not_gated();
    let mut rng = Rng::fresh();
    let case = Case::batch_mode(Dtype::Bf16, 2, 4, 2, (24, 40), (64, 64), Mask::causal(MaskType::BottomRight));
    let prepared = common::attention::PreparedLauncher::new(&case);
    let (fwd, bwd, expected) = forward_and_expected(&case, &mut rng);
    let args = bwd.args(&case, &fwd, prepared.workspace);
    // Handles.
    let mut launcher = null_mut();
    ok(fmha_bwd_launcher_create(&bwd_traits(&case), &mut launcher));
    ok(fmha_bwd_launcher_destroy(launcher));
    let mut size = 0;
    expect_error(fmha_bwd_launcher_destroy(launcher), FMHA_ERR_INVALID_ARGUMENT, &["launcher", "live"]);
    expect_error(fmha_bwd_launcher_workspace_size(launcher, &mut size), 1, &["launcher"]);
    expect_error(fmha_bwd_launcher_run(launcher, &args, null_mut()), 1, &["launcher"]);
    let garbage = 0x1234 as *mut fmha_bwd_launcher;
    expect_error(fmha_bwd_launcher_workspace_size(garbage, &mut size), 1, &["launcher"]);
    expect_error(fmha_bwd_launcher_destroy(garbage), 1, &["launcher"]);
    let random_bytes = [0xA5u8; 64];
    let pointer = random_bytes.as_ptr() as *mut fmha_bwd_launcher;
    expect_error(fmha_bwd_launcher_run(pointer, &args, null_mut()), 1, &["launcher"]);
    let releaser_as_launcher = {
        let mut releaser = null_mut();
        ok(fmha_pinned_releaser_create(null(), &mut releaser));
        releaser
    };
    expect_error(fmha_bwd_launcher_workspace_size(releaser_as_launcher as *const _, &mut size), 1, &["launcher"]);
    ok(fmha_pinned_releaser_destroy(releaser_as_launcher));
    // Overlapping outputs.
    let run = |a: fmha_bwd_args| fmha_bwd_launcher_run(prepared.launcher, &a, null_mut());
    expect_error(run(fmha_bwd_args { dk: args.dv, ..args }), 1, &["dk", "dv"]);
    expect_error(run(fmha_bwd_args { dq: args.q, ..args }), 1, &["dq", "the input q"]);
    expect_error(run(fmha_bwd_args { dv: fmha_tensor { head_stride: 0, ..args.dv }, ..args }), 1, &["dv"]);
    let (traits, fargs) = (Buffers::fwd_traits(&case), fwd.fwd_args(&case));
    expect_error(fmha_fwd(&traits, &fmha_fwd_args { o: fargs.q, ..fargs }, null_mut()), 1, &["o", "q"]);
    // The forward's scheduler workspace is written too (its counter is zeroed by the call).
    let in_o = fmha_fwd_args { workspace: fargs.o.data, workspace_size: 16, ..fargs };
    expect_error(fmha_fwd(&traits, &in_o, null_mut()), 1, &["workspace", "the output o"]);
    // Nothing was queued by the refused calls; the arguments as they were still work.
    bwd.poison(&case);
    ok(run(args));
    ok(fmha_stream_synchronize(null_mut()));
    check_gradients(&case, &bwd, &expected);
}

/// Outputs may interleave without sharing bytes: dq, dk, dv as views of one packed `[b, s, 3, h, d]`
/// buffer (flash-attn's qkvpacked backward) give the same bits as separate buffers.
#[test]
fn packed_dqkv_outputs_are_accepted_and_equal_separate_ones() {
    let _shared = not_gated();
    let mut rng = Rng::fresh();
    let case = Case::batch_mode(Dtype::Bf16, 2, 4, 4, (33, 33), (64, 64), Mask::causal(MaskType::BottomRight));
    let prepared = common::attention::PreparedLauncher::new(&case);
    let (fwd, bwd, expected) = forward_and_expected(&case, &mut rng);
    prepared.run(&case, &fwd, &bwd);
    check_gradients(&case, &bwd, &expected);
    let separate = bwd.bits();
    let (b, s, h, d) = (2usize, 33usize, 4usize, 64usize);
    let bytes = b * s * 3 * h * d * 2;
    let mut packed = null_mut();
    ok(fmha_device_malloc(&mut packed, bytes));
    ok(fmha_memset(packed, 0xFF, bytes));
    let view = |which: usize| fmha_tensor {
        data: (packed as usize + which * h * d * 2) as *mut c_void,
        batch_stride: (s * 3 * h * d) as i64,
        head_stride: d as i64,
        row_stride: (3 * h * d) as i64,
    };
    let args = fmha_bwd_args { dq: view(0), dk: view(1), dv: view(2), ..bwd.args(&case, &fwd, prepared.workspace) };
    ok(fmha_bwd_launcher_run(prepared.launcher, &args, null_mut()));
    ok(fmha_stream_synchronize(null_mut()));
    let mut host = vec![0u8; bytes];
    ok(fmha_memcpy(host.as_mut_ptr() as *mut c_void, packed, bytes, FMHA_MEMCPY_DEVICE_TO_HOST));
    // Unpack [b][s][3][h][d] into the separate buffers' [b][s][h][d] order and compare bits.
    let unpack = |which: usize| -> Vec<u8> {
        let mut out = Vec::with_capacity(b * s * h * d * 2);
        for row in 0..b * s {
            let at = (row * 3 + which) * h * d * 2;
            out.extend_from_slice(&host[at..at + h * d * 2]);
        }
        out
    };
    assert_eq!(unpack(0), separate.dq, "packed dq differs");
    assert_eq!(unpack(1), separate.dk, "packed dk differs");
    assert_eq!(unpack(2), separate.dv, "packed dv differs");
    ok(fmha_device_free(packed));
}

/// Work is sized by the data, not by counts or bounds that cover none: a group-mode forward with
/// max_seqlen_q = INT32_MAX (a bound) ran a grid sized by it for seconds (the bound is clamped to the
/// total rows), and an empty forward with 10^7 heads visited an empty block per head.
#[test]
fn huge_varlen_bounds_do_not_size_the_work() {
    let _shared = not_gated();
    // Its own stream: the errors this test provokes stay with it (the default stream's would reach the
    // synchronous copies of tests running beside it).
    let mut stream = null_mut();
    ok(fmha_stream_create(&mut stream));
    let empty = Case::batch_mode(Dtype::Bf16, 2, 10_000_000, 1, (0, 0), (64, 64), Mask::NONE);
    let empty_tensor = fmha_tensor { data: null_mut(), batch_stride: 0, head_stride: 0, row_stride: 0 };
    let args = fmha_fwd_args {
        struct_size: std::mem::size_of::<fmha_fwd_args>(),
        q: empty_tensor,
        k: empty_tensor,
        v: empty_tensor,
        o: empty_tensor,
        lse: empty_tensor,
        seqstart_q: null(),
        seqstart_k: null(),
        seqlen_q_ptr: null(),
        seqlen_k_ptr: null(),
        batch: 2,
        seqlen_q: 0,
        seqlen_k: 0,
        max_seqlen_q: 0,
        max_seqlen_k: 0,
        nhead_q: 10_000_000,
        nhead_k: 1,
        scale: 0.0,
        window_size_left: -1,
        window_size_right: -1,
        q_descale: fmha_scale::default(),
        k_descale: fmha_scale::default(),
        v_descale: fmha_scale::default(),
        workspace: null_mut(),
        workspace_size: 0,
    };
    let started = Instant::now();
    let status = fmha_fwd(&Buffers::fwd_traits(&empty), &args, stream);
    if host_backend() {
        ok(status);
    } else {
        // The GPU grids address at most 65535 heads: refused, naming the field.
        expect_error(status, FMHA_ERR_UNSUPPORTED, &["nhead_q"]);
    }
    ok(fmha_stream_synchronize(stream));
    assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());

    let mut rng = Rng::fresh();
    let case = Case::varlen_causal(vec![(20, 30), (13, 47)], false);
    let (fwd, _, _) = forward_and_expected(&case, &mut rng);
    let args = fmha_fwd_args { max_seqlen_q: i32::MAX, max_seqlen_k: i32::MAX, ..fwd.fwd_args(&case) };
    let started = Instant::now();
    ok(fmha_fwd(&Buffers::fwd_traits(&case), &args, stream));
    ok(fmha_stream_synchronize(stream));
    assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());

    // A grid with no block still checks the device arrays: max_seqlen_q = 0 leaves no q tile, yet a
    // batch has 20 rows. The host backend reports it at the synchronize (a GPU clamps device arrays).
    let args = fmha_fwd_args { max_seqlen_q: 0, ..fwd.fwd_args(&case) };
    ok(fmha_fwd(&Buffers::fwd_traits(&case), &args, stream));
    expect_stream_error(fmha_stream_synchronize(stream), FMHA_ERR_INVALID_ARGUMENT, &["max_seqlen_q", "batch 0"]);

    // The same in the backward, where every stage's grid is empty: no query rows (no dot_do_o or
    // convert_dq block) and max_seqlen_k = 0 (no dK/dV unit), yet batch 0 has 11 keys.
    let case = Case::varlen_causal(vec![(0, 11)], false);
    let prepared = common::attention::PreparedLauncher::new(&case);
    let (fwd, bwd, _) = forward_and_expected(&case, &mut rng);
    let args = fmha_bwd_args { max_seqlen_k: 0, ..bwd.args(&case, &fwd, prepared.workspace) };
    ok(fmha_bwd_launcher_run(prepared.launcher, &args, stream));
    expect_stream_error(fmha_stream_synchronize(stream), FMHA_ERR_INVALID_ARGUMENT, &["max_seqlen_k", "batch 0"]);
    ok(fmha_stream_destroy(stream));
}
