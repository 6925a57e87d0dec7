//! Asynchronous workspace preparation on the host backend: nothing blocks or is written before the
//! stream gets there, results equal the synchronous path bit for bit, the launcher can be destroyed
//! while the stream still works, failures on the stream are reported by the next call, and the host
//! and device methods write identical bytes.

mod common;

use common::attention::{bwd_traits, check_gradients, forward_and_expected, Buffers, Case, DeviceArray, Dtype, Rng};
use common::{expect_error, gated, host_backend, not_gated, ok, Gate};
use fmha::ffi::backward::*;
use fmha::ffi::pinned::*;
use fmha::ffi::runtime::*;
use fmha::ffi::status::*;
use fmha::problem::mask::{Mask, MaskType};
use fmha::runtime::Stream;
use std::collections::HashSet;
use std::ffi::c_void;
use std::ptr::{null, null_mut};
use std::sync::Mutex;
use std::time::{Duration, Instant};

struct Launcher {
    raw: *mut fmha_bwd_launcher,
    workspace: *mut c_void,
    size: usize,
}

impl Launcher {
    fn new(case: &Case) -> Launcher {
        Launcher::with_traits(&bwd_traits(case))
    }
    fn with_traits(traits: &fmha_bwd_traits) -> Launcher {
        let traits = *traits;
        let mut raw = null_mut();
        ok(fmha_bwd_launcher_create(&traits, &mut raw));
        let mut size = 0;
        ok(fmha_bwd_launcher_workspace_size(raw, &mut size));
        let mut workspace = null_mut();
        ok(fmha_device_malloc(&mut workspace, size));
        ok(fmha_memset(workspace, 0x7F, size));
        Launcher { raw, workspace, size }
    }
    fn prepare_async(&self, fwd: &Buffers, stream: fmha_stream_t, method: i32) -> fmha_status {
        let args = fwd.fwd_args_for_prepare();
        fmha_bwd_launcher_prepare_workspace_async(
            self.raw,
            self.workspace,
            self.size,
            args.0,
            args.1,
            stream,
            null(),
            method,
        )
    }
    fn metadata(&self, bytes: usize) -> Vec<u8> {
        let mut out = vec![0u8; bytes];
        ok(fmha_memcpy(out.as_mut_ptr() as *mut c_void, self.workspace, bytes, FMHA_MEMCPY_DEVICE_TO_HOST));
        out
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        fmha_bwd_launcher_destroy(self.raw);
        fmha_device_free(self.workspace);
    }
}

trait PrepareArgs {
    fn fwd_args_for_prepare(&self) -> (*const i32, *const i32);
}

impl PrepareArgs for Buffers {
    fn fwd_args_for_prepare(&self) -> (*const i32, *const i32) {
        (self.seqstart_q.as_ptr(), self.seqstart_k.as_ptr())
    }
}

fn metadata_bytes(case: &Case) -> usize {
    let traits = bwd_traits(case).to_traits().unwrap();
    fmha::bwd::BwdLauncher::new(traits).unwrap().layout().metadata_bytes
}

#[test]
fn gated_stream_async_prepare_and_run_return_at_once_and_match_the_sync_path() {
    let _alone = gated();
    let mut rng = Rng::fresh();
    eprintln!("seed {}", rng.0);
    let case = Case::varlen_causal(vec![(70, 130), (0, 33), (129, 64)], true);
    let (fwd, bwd, expected) = forward_and_expected(&case, &mut rng);
    // Reference: synchronous prepare.
    let sync = Launcher::new(&case);
    let (q, k) = (case.starts(false), case.starts(true));
    ok(fmha_bwd_launcher_prepare_workspace(sync.raw, sync.workspace, sync.size, q.as_ptr(), k.as_ptr()));
    bwd.poison(&case);
    ok(fmha_bwd_launcher_run(sync.raw, &bwd.args(&case, &fwd, sync.workspace), null_mut()));
    ok(fmha_stream_synchronize(null_mut()));
    check_gradients(&case, &bwd, &expected);
    let sync_bits = bwd.bits();
    let meta = metadata_bytes(&case);

    for method in [FMHA_PREPARE_HOST, FMHA_PREPARE_DEVICE, FMHA_PREPARE_AUTO] {
        let launcher = Launcher::new(&case);
        let mut stream = null_mut();
        ok(fmha_stream_create(&mut stream));
        bwd.poison(&case);
        let poisoned = bwd.bits();
        let gate = Gate::close(stream, false);
        let started = Instant::now();
        ok(launcher.prepare_async(&fwd, stream, method));
        ok(fmha_bwd_launcher_run(launcher.raw, &bwd.args(&case, &fwd, launcher.workspace), stream));
        let host_time = started.elapsed();
        assert!(host_time < Duration::from_millis(200), "prepare_async + run blocked for {host_time:?}");
        // Nothing was written while the stream was held. (Only observable on the host backend: a GPU
        // runtime's synchronous copy waits for every blocking stream, the gated one included.)
        if host_backend() {
            std::thread::sleep(Duration::from_millis(20));
            assert!(launcher.metadata(meta).iter().all(|&b| b == 0x7F), "metadata written before the gate opened");
            assert_eq!(bwd.bits(), poisoned, "gradients written before the gate opened");
        }
        gate.open();
        ok(fmha_stream_synchronize(stream));
        assert_eq!(bwd.bits(), sync_bits, "method {method}: async results differ from the sync path");
        assert_eq!(launcher.metadata(meta), sync.metadata(meta), "method {method}: metadata bytes differ");
        ok(fmha_stream_destroy(stream));
    }
}

#[test]
fn launcher_destroyed_while_the_stream_is_gated() {
    let _alone = gated();
    let mut rng = Rng::fresh();
    let case = Case::varlen_causal(vec![(50, 90), (31, 0), (64, 64)], true);
    let (fwd, bwd, expected) = forward_and_expected(&case, &mut rng);
    for method in [FMHA_PREPARE_HOST, FMHA_PREPARE_DEVICE] {
        let mut stream = null_mut();
        ok(fmha_stream_create(&mut stream));
        let launcher = Launcher::new(&case);
        bwd.poison(&case);
        let gate = Gate::close(stream, false);
        ok(launcher.prepare_async(&fwd, stream, method));
        ok(fmha_bwd_launcher_run(launcher.raw, &bwd.args(&case, &fwd, launcher.workspace), stream));
        // Destroy the launcher (not the workspace: the queued run still uses it) before the stream
        // has run anything; the staging buffer and kernel arguments live on in the queued work.
        ok(fmha_bwd_launcher_destroy(launcher.raw));
        let workspace = launcher.workspace;
        std::mem::forget(launcher);
        gate.open();
        ok(fmha_stream_synchronize(stream));
        check_gradients(&case, &bwd, &expected);
        ok(fmha_device_free(workspace));
        ok(fmha_stream_destroy(stream));
    }
}

#[test]
fn one_launcher_and_workspace_reused_over_a_hundred_varlen_calls() {
    let _shared = not_gated();
    let mut rng = Rng::fresh();
    eprintln!("seed {}", rng.0);
    let (total_q, total_k, batch) = (96usize, 120usize, 4usize);
    let split = |rng: &mut Rng, total: usize| -> Vec<usize> {
        let mut cuts: Vec<usize> = (0..batch - 1).map(|_| rng.size(0, total)).collect();
        cuts.sort();
        let mut lens = Vec::new();
        let mut last = 0;
        for c in cuts.into_iter().chain(std::iter::once(total)) {
            lens.push(c - last);
            last = c;
        }
        lens
    };
    let first = Case::varlen_causal(vec![(24, 30); 4], true);
    let mut template = first.clone();
    template.max_seqlen = Some((total_q, total_k));
    let launcher = Launcher::new(&template);
    let mut stream = null_mut();
    ok(fmha_stream_create(&mut stream));
    for call in 0..100 {
        let (lq, lk) = (split(&mut rng, total_q), split(&mut rng, total_k));
        let mut case = template.clone();
        case.seqlens = lq.into_iter().zip(lk).collect();
        let (fwd, bwd, expected) = forward_and_expected(&case, &mut rng);
        bwd.poison(&case);
        let method = if call % 2 == 0 { FMHA_PREPARE_HOST } else { FMHA_PREPARE_DEVICE };
        ok(launcher.prepare_async(&fwd, stream, method));
        ok(fmha_bwd_launcher_run(launcher.raw, &bwd.args(&case, &fwd, launcher.workspace), stream));
        ok(fmha_stream_synchronize(stream));
        check_gradients(&case, &bwd, &expected);
    }
    ok(fmha_stream_destroy(stream));
}

#[test]
fn failures_on_the_stream_are_reported_by_its_next_synchronize() {
    let _shared = not_gated();
    let mut rng = Rng::fresh();
    let case = Case::varlen_causal(vec![(20, 30), (13, 47)], false);
    let (fwd, bwd, expected) = forward_and_expected(&case, &mut rng);
    let launcher = Launcher::new(&case);
    let args = bwd.args(&case, &fwd, launcher.workspace);
    // A stream of its own: errors on a stream are sticky until its next synchronize, and tests run
    // in parallel.
    let mut stream = null_mut();
    ok(fmha_stream_create(&mut stream));
    let bad = DeviceArray::new(&[0, 40, 33]);
    let prepare = |seqstart_q: *const i32, method: i32| {
        fmha_bwd_launcher_prepare_workspace_async(
            launcher.raw,
            launcher.workspace,
            launcher.size,
            seqstart_q,
            fwd.seqstart_k.as_ptr(),
            stream,
            null(),
            method,
        )
    };
    bwd.poison(&case);
    let poisoned = bwd.bits();
    // Non-monotone device seqstarts, host method: prepare returned at once; the host function fails,
    // and its cause is the stream's error (on every backend), reported once.
    ok(prepare(bad.as_ptr(), FMHA_PREPARE_HOST));
    expect_error(fmha_stream_synchronize(stream), FMHA_ERR_ASYNC_FAILURE, &["seqstart_q", "prepare_workspace_async"]);
    ok(fmha_stream_synchronize(stream));
    // The workspace was left unprepared: a run with it computes nothing (the host backend says so at
    // the synchronize; a GPU kernel has no error channel).
    ok(fmha_bwd_launcher_run(launcher.raw, &args, stream));
    common::expect_stream_error(fmha_stream_synchronize(stream), FMHA_ERR_WORKSPACE_NOT_PREPARED, &["workspace"]);
    assert_eq!(bwd.bits(), poisoned, "a run on an unprepared workspace wrote gradients");
    // A good prepare then works.
    ok(launcher.prepare_async(&fwd, stream, FMHA_PREPARE_HOST));
    ok(fmha_bwd_launcher_run(launcher.raw, &args, stream));
    ok(fmha_stream_synchronize(stream));
    check_gradients(&case, &bwd, &expected);
    // The device method writes an unprepared (all-zero) region for bad seqstarts: the run is refused
    // instead of computing garbage. The host backend reports both at the stream's synchronize.
    ok(prepare(bad.as_ptr(), FMHA_PREPARE_DEVICE));
    common::expect_stream_error(fmha_stream_synchronize(stream), FMHA_ERR_INVALID_ARGUMENT, &["seqstart_q"]);
    bwd.poison(&case);
    let poisoned = bwd.bits();
    ok(fmha_bwd_launcher_run(launcher.raw, &args, stream));
    common::expect_stream_error(fmha_stream_synchronize(stream), FMHA_ERR_WORKSPACE_NOT_PREPARED, &["workspace"]);
    assert_eq!(bwd.bits(), poisoned, "a run on an unprepared workspace wrote gradients");
    // Seqstarts other than the prepared ones: the GPU kernels' fingerprint check (host: the run's
    // check) refuses them too.
    ok(launcher.prepare_async(&fwd, stream, FMHA_PREPARE_DEVICE));
    ok(fmha_stream_synchronize(stream));
    let other = DeviceArray::new(&[0, 21, 33]);
    let other_args = fmha_bwd_args { seqstart_q: other.as_ptr(), ..args };
    ok(fmha_bwd_launcher_run(launcher.raw, &other_args, stream));
    common::expect_stream_error(fmha_stream_synchronize(stream), FMHA_ERR_WORKSPACE_NOT_PREPARED, &["workspace"]);
    assert_eq!(bwd.bits(), poisoned, "a run with seqstarts the workspace was not prepared for wrote gradients");
    ok(fmha_stream_destroy(stream));
}

#[test]
fn bad_inputs_of_prepare_async() {
    let _shared = not_gated();
    let mut rng = Rng::fresh();
    let case = Case::varlen_causal(vec![(20, 30), (13, 47)], true);
    let (fwd, _bwd, _) = forward_and_expected(&case, &mut rng);
    let launcher = Launcher::new(&case);
    let (q, k) = fwd.fwd_args_for_prepare();
    let call = |ws: *mut c_void,
                size: usize,
                q: *const i32,
                k: *const i32,
                alloc: *const fmha_pinned_allocator,
                method: i32| {
        fmha_bwd_launcher_prepare_workspace_async(launcher.raw, ws, size, q, k, null_mut(), alloc, method)
    };
    expect_error(
        fmha_bwd_launcher_prepare_workspace_async(
            null_mut(),
            launcher.workspace,
            launcher.size,
            q,
            k,
            null_mut(),
            null(),
            0,
        ),
        FMHA_ERR_NULL_POINTER,
        &["launcher"],
    );
    expect_error(call(launcher.workspace, launcher.size, q, k, null(), 7), FMHA_ERR_INVALID_ARGUMENT, &["method"]);
    expect_error(call(null_mut(), launcher.size, q, k, null(), 0), FMHA_ERR_NULL_POINTER, &["workspace"]);
    expect_error(call(launcher.workspace, 16, q, k, null(), 0), FMHA_ERR_WORKSPACE_TOO_SMALL, &["workspace_size"]);
    expect_error(call(launcher.workspace, launcher.size, null(), k, null(), 0), FMHA_ERR_NULL_POINTER, &["seqstart_q"]);
    expect_error(call(launcher.workspace, launcher.size, q, null(), null(), 0), FMHA_ERR_NULL_POINTER, &["seqstart_k"]);
    let no_free = fmha_pinned_allocator {
        struct_size: std::mem::size_of::<fmha_pinned_allocator>(),
        user_data: null_mut(),
        allocate: Some(failing_allocate),
        free: None,
    };
    expect_error(
        call(launcher.workspace, launcher.size, q, k, &no_free, 1),
        FMHA_ERR_NULL_POINTER,
        &["allocator.free"],
    );
    let failing = fmha_pinned_allocator { free: Some(counting_free), ..no_free };
    expect_error(
        call(launcher.workspace, launcher.size, q, k, &failing, 1),
        FMHA_ERR_OUT_OF_MEMORY,
        &["allocator.allocate"],
    );
    let short = fmha_pinned_allocator { struct_size: 3, ..failing };
    expect_error(
        call(launcher.workspace, launcher.size, q, k, &short, 1),
        FMHA_ERR_INVALID_ARGUMENT,
        &["allocator", "struct_size"],
    );
    // Nothing was queued by the refused calls.
    ok(fmha_stream_synchronize(null_mut()));
    let batch = Case { group: false, seqlens: vec![(20, 30); 2], ..case.clone() };
    let batch_launcher = Launcher::new(&batch);
    expect_error(
        fmha_bwd_launcher_prepare_workspace_async(
            batch_launcher.raw,
            batch_launcher.workspace,
            batch_launcher.size,
            q,
            null(),
            null_mut(),
            null(),
            0,
        ),
        FMHA_ERR_INVALID_ARGUMENT,
        &["seqstart_q", "batch mode"],
    );
    // Only seqstart_k given: the message names seqstart_k.
    expect_error(
        fmha_bwd_launcher_prepare_workspace_async(
            batch_launcher.raw,
            batch_launcher.workspace,
            batch_launcher.size,
            null(),
            k,
            null_mut(),
            null(),
            0,
        ),
        FMHA_ERR_INVALID_ARGUMENT,
        &["seqstart_k", "batch mode"],
    );
    // A workspace that is not 16-byte aligned, for every method.
    let skewed = (launcher.workspace as usize + 4) as *mut c_void;
    for method in [FMHA_PREPARE_AUTO, FMHA_PREPARE_HOST, FMHA_PREPARE_DEVICE] {
        expect_error(
            call(skewed, launcher.size - 4, q, k, null(), method),
            FMHA_ERR_INVALID_ARGUMENT,
            &["workspace", "aligned"],
        );
    }
    // Misaligned seqstarts (device int32 arrays).
    let skewed_q = (q as usize + 2) as *const i32;
    expect_error(
        call(launcher.workspace, launcher.size, skewed_q, k, null(), 0),
        FMHA_ERR_INVALID_ARGUMENT,
        &["seqstart_q", "aligned"],
    );
}

// A caller allocator that counts: every staging buffer is freed once, on the releaser thread.
// Outstanding allocations per address (an address may be handed out again after its free).
static OUTSTANDING: Mutex<Vec<(usize, i64)>> = Mutex::new(Vec::new());
static FREED: Mutex<Vec<(usize, String)>> = Mutex::new(Vec::new());

fn count(ptr: usize, delta: i64) -> i64 {
    let mut outstanding = OUTSTANDING.lock().unwrap();
    match outstanding.iter_mut().find(|(p, _)| *p == ptr) {
        Some((_, n)) => {
            *n += delta;
            *n
        }
        None => {
            outstanding.push((ptr, delta));
            delta
        }
    }
}

unsafe extern "C" fn counting_allocate(_user: *mut c_void, bytes: usize, ptr: *mut *mut c_void) -> fmha_status {
    let mut p = null_mut();
    let status = fmha_host_malloc_pinned(&mut p, bytes);
    if status == FMHA_OK {
        count(p as usize, 1);
        unsafe { ptr.write(p) };
    }
    status
}

unsafe extern "C" fn counting_free(_user: *mut c_void, ptr: *mut c_void) {
    let thread = std::thread::current().name().unwrap_or("").to_string();
    // A free without an outstanding allocation is a double free: record it as a negative count.
    count(ptr as usize, -1);
    FREED.lock().unwrap().push((ptr as usize, thread));
    fmha_host_free_pinned(ptr);
}

unsafe extern "C" fn failing_allocate(_user: *mut c_void, _bytes: usize, _ptr: *mut *mut c_void) -> fmha_status {
    FMHA_ERR_OUT_OF_MEMORY
}

#[test]
fn caller_allocator_buffers_are_freed_once_on_the_releaser_thread() {
    let _shared = not_gated();
    let mut rng = Rng::fresh();
    let case = Case::varlen_causal(vec![(20, 30), (13, 47)], true);
    let (fwd, _bwd, _) = forward_and_expected(&case, &mut rng);
    let launcher = Launcher::new(&case);
    let allocator = fmha_pinned_allocator {
        struct_size: std::mem::size_of::<fmha_pinned_allocator>(),
        user_data: null_mut(),
        allocate: Some(counting_allocate),
        free: Some(counting_free),
    };
    let (q, k) = fwd.fwd_args_for_prepare();
    for _ in 0..20 {
        ok(fmha_bwd_launcher_prepare_workspace_async(
            launcher.raw,
            launcher.workspace,
            launcher.size,
            q,
            k,
            null_mut(),
            &allocator,
            FMHA_PREPARE_HOST,
        ));
    }
    ok(fmha_stream_synchronize(null_mut()));
    // The releaser frees asynchronously: wait until it caught up.
    let deadline = Instant::now() + Duration::from_secs(10);
    while FREED.lock().unwrap().len() < 20 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let freed = FREED.lock().unwrap().clone();
    assert_eq!(freed.len(), 20);
    assert!(OUTSTANDING.lock().unwrap().iter().all(|&(_, n)| n == 0), "a buffer was freed twice or never");
    assert!(freed.iter().all(|(_, thread)| thread == "fmha-pinned-releaser"), "{freed:?}");
}

#[test]
fn releaser_c_api() {
    let _shared = not_gated();
    // 100k releases from 16 threads and from stream host functions, freed exactly once.
    static RELEASED: Mutex<Vec<usize>> = Mutex::new(Vec::new());
    unsafe extern "C" fn record_free(_user: *mut c_void, ptr: *mut c_void) {
        RELEASED.lock().unwrap().push(ptr as usize);
    }
    unsafe extern "C" fn never_allocate(_user: *mut c_void, _bytes: usize, _ptr: *mut *mut c_void) -> fmha_status {
        FMHA_ERR_OUT_OF_MEMORY
    }
    let allocator = fmha_pinned_allocator {
        struct_size: std::mem::size_of::<fmha_pinned_allocator>(),
        user_data: null_mut(),
        allocate: Some(never_allocate),
        free: Some(record_free),
    };
    let mut releaser = null_mut();
    expect_error(fmha_pinned_releaser_create(&allocator, null_mut()), FMHA_ERR_NULL_POINTER, &["releaser"]);
    let bad = fmha_pinned_allocator { free: None, ..allocator };
    expect_error(fmha_pinned_releaser_create(&bad, &mut releaser), FMHA_ERR_NULL_POINTER, &["allocator.free"]);
    ok(fmha_pinned_releaser_create(&allocator, &mut releaser));
    let handle = releaser as usize;
    std::thread::scope(|scope| {
        for t in 0..16usize {
            scope.spawn(move || {
                for i in 0..5000usize {
                    ok(fmha_pinned_releaser_release(handle as *const _, (1 + t * 5000 + i) as *mut c_void));
                }
            });
        }
    });
    let mut stream = null_mut();
    ok(fmha_stream_create(&mut stream));
    let rt = fmha::runtime::current().unwrap();
    for i in 0..20_000usize {
        rt.launch_host_func(
            Stream(stream as usize),
            Box::new(move || {
                ok(fmha_pinned_releaser_release(handle as *const _, (1_000_000 + i) as *mut c_void));
                Ok(())
            }),
        )
        .unwrap();
    }
    ok(fmha_stream_synchronize(stream));
    ok(fmha_stream_destroy(stream));
    ok(fmha_pinned_releaser_destroy(releaser)); // drains
    let released = RELEASED.lock().unwrap().clone();
    assert_eq!(released.len(), 100_000);
    assert_eq!(released.iter().collect::<HashSet<_>>().len(), 100_000);
    ok(fmha_pinned_releaser_destroy(null_mut()));
    ok(fmha_pinned_releaser_release(null(), null_mut())); // default releaser, null pointer: no-op
                                                          // The default releaser frees memory from fmha_host_malloc_pinned.
    let mut p = null_mut();
    ok(fmha_host_malloc_pinned(&mut p, 64));
    ok(fmha_pinned_releaser_release(null(), p));
}

/// With a long kernel occupying the stream, `prepare_workspace_async` + `run` of a group-mode
/// deterministic backward return in a small fraction of the kernel's time, and the prepared bytes and
/// the gradients equal the synchronous path's, bit for bit. Runs on every backend; on a GPU it is part
/// of scripts/gpu-check.sh (the times are printed).
#[test]
fn prepare_async_returns_long_before_a_busy_stream_gets_to_it() {
    let _shared = not_gated();
    if common::no_device() {
        return;
    }
    let _serial = common::CU_COUNT_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let gpu = !host_backend();
    let mut rng = Rng::fresh();
    eprintln!("seed {}", rng.0);
    // Group-mode deterministic backward of a realistic varlen batch (host: a smaller one).
    let lengths: &[usize] = if gpu { &[1024, 3000, 17, 0, 2048, 511] } else { &[100, 300, 17, 0, 204, 51] };
    let mut case = Case::varlen_causal(lengths.iter().map(|&l| (l, l)).collect(), true);
    case.nhead_q = 16;
    case.nhead_k = 4;
    case.hdim_q = 128;
    case.hdim_v = 128;
    let inputs = common::attention::Inputs {
        q: common::attention::random_dense(&case, &mut rng, case.nhead_q, case.hdim_q, false),
        k: common::attention::random_dense(&case, &mut rng, case.nhead_k, case.hdim_q, true),
        v: common::attention::random_dense(&case, &mut rng, case.nhead_k, case.hdim_v, true),
    };
    let fwd = Buffers::new(&case, &inputs, &mut rng);
    ok(fwd.forward(&case));
    let bwd = common::attention::BackwardBuffers::new(&case, &mut rng);
    let sync = Launcher::new(&case);
    let (q, k) = (case.starts(false), case.starts(true));
    ok(fmha_bwd_launcher_prepare_workspace(sync.raw, sync.workspace, sync.size, q.as_ptr(), k.as_ptr()));
    ok(fmha_bwd_launcher_run(sync.raw, &bwd.args(&case, &fwd, sync.workspace), null_mut()));
    ok(fmha_stream_synchronize(null_mut()));
    let sync_bits = bwd.bits();
    let meta = metadata_bytes(&case);
    // The busy stream: fills of a large buffer (GPU: ~100 ms of HBM traffic; host: a few ms).
    let (words, repeats) = if gpu { (1usize << 30, 100) } else { (1usize << 22, 4) };
    let mut busy = null_mut();
    ok(fmha_device_malloc(&mut busy, words * 4));
    let mut stream = null_mut();
    ok(fmha_stream_create(&mut stream));
    for method in [FMHA_PREPARE_HOST, FMHA_PREPARE_DEVICE] {
        let launcher = Launcher::new(&case);
        bwd.poison(&case);
        let started = Instant::now();
        for _ in 0..repeats {
            fmha::launch::fill_u32(fmha::runtime::DevicePtr::new(busy as usize), 7, words, Stream(stream as usize))
                .unwrap();
        }
        let queued = Instant::now();
        ok(launcher.prepare_async(&fwd, stream, method));
        ok(fmha_bwd_launcher_run(launcher.raw, &bwd.args(&case, &fwd, launcher.workspace), stream));
        let host_time = queued.elapsed();
        ok(fmha_stream_synchronize(stream));
        let stream_time = started.elapsed();
        eprintln!(
            "method {}: prepare_workspace_async + run host time {:.3} ms; stream busy for {:.3} ms",
            if method == FMHA_PREPARE_HOST { "host" } else { "device" },
            host_time.as_secs_f64() * 1e3,
            stream_time.as_secs_f64() * 1e3
        );
        if gpu {
            assert!(host_time * 20 < stream_time, "prepare_async + run blocked: {host_time:?} of {stream_time:?}");
        }
        assert_eq!(launcher.metadata(meta), sync.metadata(meta), "async metadata differs from the sync path");
        assert_eq!(bwd.bits(), sync_bits, "async gradients differ from the sync path");
    }
    ok(fmha_stream_destroy(stream));
    ok(fmha_device_free(busy));
}

/// In group mode the launcher's totals and maxima are bounds: one launcher (and one workspace) serves
/// every varlen batch that fits, as a training loop with varying lengths needs.
#[test]
fn one_launcher_serves_varlen_batches_within_its_bounds() {
    let _shared = not_gated();
    let mut rng = Rng::fresh();
    eprintln!("seed {}", rng.0);
    let template = Case::varlen_causal(vec![(1, 1); 3], true);
    let mut traits = bwd_traits(&template);
    (traits.seqlen_q, traits.seqlen_k, traits.max_seqlen_q, traits.max_seqlen_k) = (300, 360, 200, 240);
    let launcher = Launcher::with_traits(&traits);
    let mut stream = null_mut();
    ok(fmha_stream_create(&mut stream));
    for call in 0..12 {
        let mut case = template.clone();
        case.seqlens = (0..3).map(|_| (rng.size(0, 100), rng.size(0, 120))).collect();
        case.max_seqlen = Some((200, 240));
        let (fwd, bwd, expected) = forward_and_expected(&case, &mut rng);
        bwd.poison(&case);
        if call % 3 == 0 {
            let (q, k) = (case.starts(false), case.starts(true));
            ok(fmha_bwd_launcher_prepare_workspace(
                launcher.raw,
                launcher.workspace,
                launcher.size,
                q.as_ptr(),
                k.as_ptr(),
            ));
        } else {
            let method = if call % 3 == 1 { FMHA_PREPARE_HOST } else { FMHA_PREPARE_DEVICE };
            ok(launcher.prepare_async(&fwd, stream, method));
        }
        ok(fmha_bwd_launcher_run(launcher.raw, &bwd.args(&case, &fwd, launcher.workspace), stream));
        ok(fmha_stream_synchronize(stream));
        check_gradients(&case, &bwd, &expected);
    }
    // Over the bound is refused, naming the field.
    let mut case = template.clone();
    case.seqlens = vec![(150, 10), (150, 10), (1, 10)];
    case.max_seqlen = Some((200, 240));
    let (fwd, bwd, _) = forward_and_expected(&case, &mut rng);
    expect_error(
        fmha_bwd_launcher_run(launcher.raw, &bwd.args(&case, &fwd, launcher.workspace), stream),
        FMHA_ERR_INVALID_ARGUMENT,
        &["seqlen_q", "exceeds", "bound"],
    );
    ok(fmha_stream_destroy(stream));
}

#[test]
fn auto_method_never_touches_pinned_memory() {
    // An allocator that always fails shows which path ran: only the host method allocates staging.
    let _shared = not_gated();
    unsafe extern "C" fn refuse(_user: *mut c_void, _bytes: usize, _ptr: *mut *mut c_void) -> fmha_status {
        FMHA_ERR_OUT_OF_MEMORY
    }
    unsafe extern "C" fn never_called(_user: *mut c_void, _ptr: *mut c_void) {}
    let allocator = fmha_pinned_allocator {
        struct_size: std::mem::size_of::<fmha_pinned_allocator>(),
        user_data: null_mut(),
        allocate: Some(refuse),
        free: Some(never_called),
    };
    let prepare = |case: &Case, (q, k): (*const i32, *const i32), method: i32| {
        let launcher = Launcher::new(case);
        let status = fmha_bwd_launcher_prepare_workspace_async(
            launcher.raw,
            launcher.workspace,
            launcher.size,
            q,
            k,
            null_mut(),
            &allocator,
            method,
        );
        ok(fmha_stream_synchronize(null_mut()));
        status
    };
    let batch = Case::batch_mode(Dtype::Bf16, 2, 4, 2, (70, 90), (64, 64), Mask::causal(MaskType::BottomRight));
    let group = Case::varlen_causal(vec![(20, 30), (13, 47)], true);
    let (fwd, _, _) = forward_and_expected(&group, &mut Rng::fresh());
    // Batch and group mode: the device kernel, whatever the allocator.
    assert_eq!(prepare(&batch, (null(), null()), FMHA_PREPARE_AUTO), FMHA_OK);
    assert_eq!(prepare(&group, fwd.fwd_args_for_prepare(), FMHA_PREPARE_AUTO), FMHA_OK);
    // The host method does use it.
    assert_eq!(prepare(&group, fwd.fwd_args_for_prepare(), FMHA_PREPARE_HOST), FMHA_ERR_OUT_OF_MEMORY);
}
