//! Bad inputs of every attention entry point: each gets a specific status and a message naming the
//! field, and nothing is written.

mod common;

use common::attention::{bwd_traits, BackwardBuffers, Buffers, Case, Dtype, Inputs, Rng};
use common::{expect_error, last_error, ok};
use fmha::ffi::attention::*;
use fmha::ffi::backward::*;
use fmha::ffi::runtime::*;
use fmha::ffi::status::*;
use fmha::problem::mask::{Mask, MaskType};
use std::ffi::c_void;
use std::ptr::{null, null_mut};

fn small_case(group: bool) -> Case {
    let mut case = Case::batch_mode(Dtype::F16, 2, 4, 2, (33, 47), (64, 64), Mask::causal(MaskType::TopLeft));
    if group {
        case.group = true;
        case.seqlens = vec![(20, 30), (13, 47)];
        case.padding = vec![(0, 0); 2];
    }
    case
}

fn buffers(case: &Case, rng: &mut Rng) -> Buffers {
    let inputs = Inputs {
        q: common::attention::random_dense(case, rng, case.nhead_q, case.hdim_q, false),
        k: common::attention::random_dense(case, rng, case.nhead_k, case.hdim_q, true),
        v: common::attention::random_dense(case, rng, case.nhead_k, case.hdim_v, true),
    };
    Buffers::new(case, &inputs, rng)
}

#[test]
fn forward_rejects_bad_inputs() {
    let mut rng = Rng::fresh();
    let case = small_case(false);
    let b = buffers(&case, &mut rng);
    let traits = Buffers::fwd_traits(&case);
    let args = b.fwd_args(&case);
    let run = |t: fmha_fwd_traits, a: fmha_fwd_args| fmha_fwd(&t, &a, null_mut());

    expect_error(fmha_fwd(null(), &args, null_mut()), FMHA_ERR_NULL_POINTER, &["traits"]);
    expect_error(fmha_fwd(&traits, null(), null_mut()), FMHA_ERR_NULL_POINTER, &["args"]);
    expect_error(
        run(fmha_fwd_traits { struct_size: 4, ..traits }, args),
        FMHA_ERR_INVALID_ARGUMENT,
        &["traits", "struct_size"],
    );
    expect_error(
        run(traits, fmha_fwd_args { struct_size: 0, ..args }),
        FMHA_ERR_INVALID_ARGUMENT,
        &["args", "struct_size"],
    );
    expect_error(run(fmha_fwd_traits { dtype: 7, ..traits }, args), FMHA_ERR_INVALID_ARGUMENT, &["dtype", "7"]);
    expect_error(run(fmha_fwd_traits { hdim_q: 0, ..traits }, args), FMHA_ERR_INVALID_ARGUMENT, &["hdim_q"]);
    expect_error(run(fmha_fwd_traits { hdim_v: 300, ..traits }, args), FMHA_ERR_INVALID_ARGUMENT, &["hdim_v", "300"]);
    expect_error(
        run(fmha_fwd_traits { is_group_mode: 2, ..traits }, args),
        FMHA_ERR_INVALID_ARGUMENT,
        &["is_group_mode"],
    );
    expect_error(run(fmha_fwd_traits { mask_type: 9, ..traits }, args), FMHA_ERR_INVALID_ARGUMENT, &["mask_type"]);
    expect_error(run(fmha_fwd_traits { mask_type: 3, ..traits }, args), FMHA_ERR_UNSUPPORTED, &["generic"]);
    expect_error(
        run(fmha_fwd_traits { bias_type: FMHA_BIAS_ALIBI, ..traits }, args),
        FMHA_ERR_UNSUPPORTED,
        &["bias_type", "ALiBi"],
    );
    expect_error(
        run(fmha_fwd_traits { bias_type: FMHA_BIAS_ELEMENTWISE, ..traits }, args),
        FMHA_ERR_UNSUPPORTED,
        &["bias_type"],
    );
    expect_error(run(fmha_fwd_traits { bias_type: 5, ..traits }, args), FMHA_ERR_INVALID_ARGUMENT, &["bias_type"]);
    expect_error(run(fmha_fwd_traits { has_dropout: 1, ..traits }, args), FMHA_ERR_UNSUPPORTED, &["dropout"]);
    expect_error(run(traits, fmha_fwd_args { nhead_q: 5, ..args }), FMHA_ERR_INVALID_ARGUMENT, &["nhead_q", "nhead_k"]);
    expect_error(run(traits, fmha_fwd_args { nhead_k: 0, ..args }), FMHA_ERR_INVALID_ARGUMENT, &["nhead_k"]);
    expect_error(run(traits, fmha_fwd_args { batch: 0, ..args }), FMHA_ERR_INVALID_ARGUMENT, &["batch"]);
    expect_error(
        run(traits, fmha_fwd_args { seqlen_q: -1, ..args }),
        FMHA_ERR_INVALID_ARGUMENT,
        &["seqlen_q", "negative"],
    );
    expect_error(run(traits, fmha_fwd_args { max_seqlen_k: 5, ..args }), FMHA_ERR_INVALID_ARGUMENT, &["max_seqlen_k"]);
    expect_error(run(traits, fmha_fwd_args { scale: f32::NAN, ..args }), FMHA_ERR_INVALID_ARGUMENT, &["scale"]);
    expect_error(run(traits, fmha_fwd_args { scale: -1.0, ..args }), FMHA_ERR_INVALID_ARGUMENT, &["scale"]);
    expect_error(
        run(traits, fmha_fwd_args { window_size_left: -2, ..args }),
        FMHA_ERR_INVALID_ARGUMENT,
        &["window_size_left"],
    );
    expect_error(
        run(fmha_fwd_traits { mask_type: FMHA_MASK_NONE, ..traits }, fmha_fwd_args { window_size_right: 0, ..args }),
        FMHA_ERR_INVALID_ARGUMENT,
        &["window_size_right"],
    );
    let null_q = fmha_tensor { data: null_mut(), ..args.q };
    expect_error(run(traits, fmha_fwd_args { q: null_q, ..args }), FMHA_ERR_NULL_POINTER, &["q.data"]);
    let negative = fmha_tensor { row_stride: -4, ..args.k };
    expect_error(run(traits, fmha_fwd_args { k: negative, ..args }), FMHA_ERR_INVALID_ARGUMENT, &["k.row_stride"]);
    let strided_lse = fmha_tensor { row_stride: 2, ..args.lse };
    expect_error(
        run(traits, fmha_fwd_args { lse: strided_lse, ..args }),
        FMHA_ERR_INVALID_ARGUMENT,
        &["lse.row_stride"],
    );
    let starts = [0i32, 33, 66];
    expect_error(
        run(traits, fmha_fwd_args { seqstart_q: starts.as_ptr(), ..args }),
        FMHA_ERR_INVALID_ARGUMENT,
        &["seqstart_q", "batch mode"],
    );
    // None of the refused calls queued anything: a synchronize reports no error.
    ok(fmha_stream_synchronize(null_mut()));

    // Group mode: missing seqstarts, and seqstarts that are wrong on the device (reported by the
    // stream, like a device-side check on a GPU, with nothing written out of bounds).
    let group = small_case(true);
    let g = buffers(&group, &mut rng);
    let gt = Buffers::fwd_traits(&group);
    let ga = g.fwd_args(&group);
    expect_error(
        fmha_fwd(&gt, &fmha_fwd_args { seqstart_k: null(), ..ga }, null_mut()),
        FMHA_ERR_INVALID_ARGUMENT,
        &["seqstart_k"],
    );
    // Errors found on a stream are sticky until its next synchronize: use a stream of this test's own
    // (tests run in parallel and share the default stream).
    let mut stream = null_mut();
    ok(fmha_stream_create(&mut stream));
    let bad_starts = common::attention::DeviceArray::new(&[0, 20, 15]);
    ok(fmha_fwd(&gt, &fmha_fwd_args { seqstart_q: bad_starts.as_ptr(), ..ga }, stream));
    common::expect_stream_error(
        fmha_stream_synchronize(stream),
        FMHA_ERR_INVALID_ARGUMENT,
        &["seqstart_q", "monotone"],
    );
    let short_max = fmha_fwd_args { max_seqlen_k: 40, ..ga };
    ok(fmha_fwd(&gt, &short_max, stream));
    common::expect_stream_error(fmha_stream_synchronize(stream), FMHA_ERR_INVALID_ARGUMENT, &["max_seqlen_k"]);
    let long_logical = common::attention::DeviceArray::new(&[21, 13]);
    ok(fmha_fwd(&gt, &fmha_fwd_args { seqlen_q_ptr: long_logical.as_ptr(), ..ga }, stream));
    common::expect_stream_error(fmha_stream_synchronize(stream), FMHA_ERR_INVALID_ARGUMENT, &["seqlen_q_ptr"]);
    ok(fmha_stream_destroy(stream));
    assert_eq!(g.forward(&group), FMHA_OK, "{}", last_error());
}

/// The forward's optional scheduler workspace (`fmha_fwd_args.workspace`): `fmha_fwd_workspace_size`
/// says 16 bytes; a workspace that is too small, misaligned or shares bytes with a tensor is refused
/// (nothing queued); NULL is none whatever `workspace_size` says; a valid one, whatever its contents,
/// gives the bits the call without it gives (on sm_90a masked calls with more tiles than SMs take them
/// from its counter).
#[test]
fn forward_scheduler_workspace_is_checked_and_changes_no_result() {
    let mut rng = Rng::fresh();
    for group in [false, true] {
        let case = small_case(group);
        let b = buffers(&case, &mut rng);
        let traits = Buffers::fwd_traits(&case);
        let args = b.fwd_args(&case);
        let run = |a: fmha_fwd_args| fmha_fwd(&traits, &a, null_mut());
        let mut bytes = 0;
        ok(fmha_fwd_workspace_size(&traits, &mut bytes));
        assert_eq!(bytes, 16);
        // 64 bytes: room for a misaligned start and for a larger-than-needed workspace.
        let mut base = null_mut();
        ok(fmha_device_malloc(&mut base, 64));
        ok(fmha_memset(base, 0xFF, 64)); // contents on entry do not matter
        let at = |offset: usize| (base as usize + offset) as *mut c_void;
        let with = |workspace: *mut c_void, workspace_size: usize| fmha_fwd_args { workspace, workspace_size, ..args };

        expect_error(run(with(base, 8)), FMHA_ERR_WORKSPACE_TOO_SMALL, &["workspace_size", "8", "16"]);
        expect_error(run(with(base, 0)), FMHA_ERR_WORKSPACE_TOO_SMALL, &["workspace_size", "0"]);
        expect_error(run(with(base, 15)), FMHA_ERR_WORKSPACE_TOO_SMALL, &["workspace_size"]);
        for offset in [4, 8, 1] {
            expect_error(run(with(at(offset), 32)), FMHA_ERR_INVALID_ARGUMENT, &["workspace", "aligned"]);
        }
        // Written by the call: it may share no byte with an output or an input.
        expect_error(run(with(args.o.data, 16)), FMHA_ERR_INVALID_ARGUMENT, &["workspace", "the output o"]);
        expect_error(run(with(args.lse.data, 16)), FMHA_ERR_INVALID_ARGUMENT, &["workspace", "the output lse"]);
        let o_bytes = b.o.elements * b.o.element_bytes;
        let o_tail = ((args.o.data as usize + o_bytes - 16) & !15) as *mut c_void;
        expect_error(run(with(o_tail, 16)), FMHA_ERR_INVALID_ARGUMENT, &["workspace", "the output o"]);
        expect_error(run(with(args.q.data, 16)), FMHA_ERR_INVALID_ARGUMENT, &["workspace", "the input q"]);
        expect_error(run(with(args.v.data, 64)), FMHA_ERR_INVALID_ARGUMENT, &["workspace", "the input v"]);
        // None of the refused calls queued anything.
        ok(fmha_stream_synchronize(null_mut()));

        // Without a workspace, then NULL with sizes that would be wrong for a real one, then valid
        // workspaces (exact size, larger, reused, poisoned in between): the same bits.
        assert_eq!(b.forward(&case), FMHA_OK, "{}", last_error());
        let expected = (b.o.download(), b.lse.download());
        for (workspace, size) in [(null_mut(), 0), (null_mut(), 1), (null_mut(), usize::MAX), (base, 16), (base, 64)] {
            for _ in 0..2 {
                assert_eq!(b.forward_with(&case, &with(workspace, size)), FMHA_OK, "{}", last_error());
                assert!((b.o.download(), b.lse.download()) == expected, "workspace {workspace:?}/{size}: other bits");
                ok(fmha_memset(base, 0xA5, 64));
            }
        }
        // The struct of the previous version (336 bytes, before the workspace): the fields past it are not
        // read (here they would be refused).
        let previous = fmha_fwd_args { struct_size: 336, ..with(at(4), 1) };
        assert_eq!(b.forward_with(&case, &previous), FMHA_OK, "{}", last_error());
        assert!((b.o.download(), b.lse.download()) == expected, "336-byte struct: other bits");
        // The plan validates the workspace as the call does.
        let mut required = 0;
        let plan = |a: fmha_fwd_args, r: &mut usize| fmha_fwd_plan_json(&traits, &a, null_mut(), 0, r);
        expect_error(plan(with(base, 8), &mut required), FMHA_ERR_WORKSPACE_TOO_SMALL, &["workspace_size"]);
        ok(plan(with(base, 16), &mut required));
        ok(fmha_device_free(base));
    }
}

#[test]
fn forward_workspace_size_checks_the_traits() {
    let case = small_case(false);
    let traits = Buffers::fwd_traits(&case);
    let mut bytes = 0usize;
    expect_error(fmha_fwd_workspace_size(null(), &mut bytes), FMHA_ERR_NULL_POINTER, &["traits"]);
    expect_error(fmha_fwd_workspace_size(&traits, null_mut()), FMHA_ERR_NULL_POINTER, &["bytes"]);
    for (bad, status, needles) in [
        (fmha_fwd_traits { struct_size: 4, ..traits }, FMHA_ERR_INVALID_ARGUMENT, &["traits", "struct_size"][..]),
        (fmha_fwd_traits { dtype: 7, ..traits }, FMHA_ERR_INVALID_ARGUMENT, &["dtype", "7"]),
        (fmha_fwd_traits { hdim_q: 0, ..traits }, FMHA_ERR_INVALID_ARGUMENT, &["hdim_q"]),
        (fmha_fwd_traits { hdim_v: 300, ..traits }, FMHA_ERR_INVALID_ARGUMENT, &["hdim_v", "300"]),
        (fmha_fwd_traits { is_group_mode: 2, ..traits }, FMHA_ERR_INVALID_ARGUMENT, &["is_group_mode"]),
        (fmha_fwd_traits { mask_type: 9, ..traits }, FMHA_ERR_INVALID_ARGUMENT, &["mask_type"]),
        (fmha_fwd_traits { mask_type: 3, ..traits }, FMHA_ERR_UNSUPPORTED, &["generic"]),
        (fmha_fwd_traits { bias_type: FMHA_BIAS_ALIBI, ..traits }, FMHA_ERR_UNSUPPORTED, &["bias_type"]),
        (fmha_fwd_traits { bias_type: 5, ..traits }, FMHA_ERR_INVALID_ARGUMENT, &["bias_type"]),
        (fmha_fwd_traits { has_dropout: 1, ..traits }, FMHA_ERR_UNSUPPORTED, &["dropout"]),
        (fmha_fwd_traits { has_dropout: 2, ..traits }, FMHA_ERR_INVALID_ARGUMENT, &["has_dropout"]),
    ] {
        bytes = 12345;
        expect_error(fmha_fwd_workspace_size(&bad, &mut bytes), status, needles);
        assert_eq!(bytes, 12345, "written on failure");
    }
    for dtype in [FMHA_DTYPE_FP16, FMHA_DTYPE_BF16, FMHA_DTYPE_FP8_E4M3FN] {
        for (mask_type, group) in [(FMHA_MASK_NONE, 0), (FMHA_MASK_TOP_LEFT, 1), (FMHA_MASK_BOTTOM_RIGHT, 0)] {
            let t = fmha_fwd_traits { dtype, mask_type, is_group_mode: group, o_dtype: FMHA_DTYPE_BF16, ..traits };
            bytes = 0;
            ok(fmha_fwd_workspace_size(&t, &mut bytes));
            assert_eq!(bytes, 16);
        }
    }
}

#[test]
fn backward_launcher_rejects_bad_inputs() {
    let mut rng = Rng::fresh();
    let case = small_case(true);
    let traits = bwd_traits(&case);
    let mut launcher = null_mut();
    let create = |t: fmha_bwd_traits| {
        let mut l = null_mut();
        let status = fmha_bwd_launcher_create(&t, &mut l);
        assert!(l.is_null() || status == FMHA_OK);
        if !l.is_null() {
            ok(fmha_bwd_launcher_destroy(l));
        }
        status
    };
    expect_error(fmha_bwd_launcher_create(null(), &mut launcher), FMHA_ERR_NULL_POINTER, &["traits"]);
    expect_error(fmha_bwd_launcher_create(&traits, null_mut()), FMHA_ERR_NULL_POINTER, &["launcher"]);
    expect_error(create(fmha_bwd_traits { struct_size: 1, ..traits }), FMHA_ERR_INVALID_ARGUMENT, &["struct_size"]);
    expect_error(create(fmha_bwd_traits { nhead_q: 3, ..traits }), FMHA_ERR_INVALID_ARGUMENT, &["nhead_q"]);
    expect_error(create(fmha_bwd_traits { hdim_q: 257, ..traits }), FMHA_ERR_INVALID_ARGUMENT, &["hdim_q"]);
    expect_error(create(fmha_bwd_traits { seqlen_k: -3, ..traits }), FMHA_ERR_INVALID_ARGUMENT, &["seqlen_k"]);
    expect_error(create(fmha_bwd_traits { max_seqlen_q: -1, ..traits }), FMHA_ERR_INVALID_ARGUMENT, &["max_seqlen_q"]);
    // Group mode: maxima are bounds of the per-batch lengths; one above the total is accepted.
    ok(create(fmha_bwd_traits { max_seqlen_q: 1000, ..traits }));
    expect_error(
        create(fmha_bwd_traits { is_deterministic: 2, ..traits }),
        FMHA_ERR_INVALID_ARGUMENT,
        &["is_deterministic"],
    );
    // dq_scheme: AUTO, SPLIT_SLOTS or ORDERED (AMD has no ordered kernel); a 0.1 caller's struct ends
    // before it, and whatever its padding holds is not read.
    for bad in [3, -1, i64::from(i32::MAX) + 1] {
        let t = fmha_bwd_traits { is_deterministic: 1, dq_scheme: bad, ..traits };
        expect_error(create(t), FMHA_ERR_INVALID_ARGUMENT, &["dq_scheme"]);
    }
    for scheme in [FMHA_DQ_SCHEME_AUTO, FMHA_DQ_SCHEME_SPLIT_SLOTS, FMHA_DQ_SCHEME_ORDERED] {
        let status = create(fmha_bwd_traits { is_deterministic: 1, dq_scheme: i64::from(scheme), ..traits });
        if scheme == FMHA_DQ_SCHEME_ORDERED && fmha::runtime::ACTIVE_BACKEND == fmha::runtime::BackendKind::Rocm {
            expect_error(status, FMHA_ERR_UNSUPPORTED, &["dq_scheme"]);
        } else {
            ok(status);
        }
    }
    let v01 = std::mem::offset_of!(fmha_bwd_traits, dq_scheme);
    ok(create(fmha_bwd_traits { struct_size: v01, is_deterministic: 1, dq_scheme: -7, ..traits }));
    expect_error(
        create(fmha_bwd_traits { struct_size: v01 - 4, ..traits }),
        FMHA_ERR_INVALID_ARGUMENT,
        &["struct_size"],
    );
    expect_error(create(fmha_bwd_traits { has_dbias: 1, ..traits }), FMHA_ERR_UNSUPPORTED, &["has_dbias"]);
    expect_error(create(fmha_bwd_traits { has_dropout: 1, ..traits }), FMHA_ERR_UNSUPPORTED, &["dropout"]);
    expect_error(create(fmha_bwd_traits { is_store_randval: 1, ..traits }), FMHA_ERR_UNSUPPORTED, &["randval"]);
    expect_error(create(fmha_bwd_traits { bias_type: FMHA_BIAS_ALIBI, ..traits }), FMHA_ERR_UNSUPPORTED, &["ALiBi"]);
    let mut size = 0usize;
    expect_error(fmha_bwd_workspace_size_upper_bound(null(), &mut size), FMHA_ERR_NULL_POINTER, &["traits"]);
    expect_error(fmha_bwd_workspace_size_upper_bound(&traits, null_mut()), FMHA_ERR_NULL_POINTER, &["bytes"]);
    expect_error(
        fmha_bwd_workspace_size_upper_bound(&fmha_bwd_traits { dtype: 7, ..traits }, &mut size),
        FMHA_ERR_INVALID_ARGUMENT,
        &["dtype"],
    );
    // fp8 is forward only.
    expect_error(
        fmha_bwd_workspace_size_upper_bound(&fmha_bwd_traits { dtype: FMHA_DTYPE_FP8_E4M3FNUZ, ..traits }, &mut size),
        FMHA_ERR_UNSUPPORTED,
        &["dtype", "fp8"],
    );
    expect_error(fmha_bwd_launcher_workspace_size(null(), &mut size), FMHA_ERR_NULL_POINTER, &["launcher"]);
    ok(fmha_bwd_launcher_destroy(null_mut()));

    // A real launcher: workspace and argument mismatches.
    let inputs = Inputs {
        q: common::attention::random_dense(&case, &mut rng, 4, 64, false),
        k: common::attention::random_dense(&case, &mut rng, 2, 64, true),
        v: common::attention::random_dense(&case, &mut rng, 2, 64, true),
    };
    let fwd = Buffers::new(&case, &inputs, &mut rng);
    assert_eq!(fwd.forward(&case), FMHA_OK);
    let bwd = BackwardBuffers::new(&case, &mut rng);
    ok(fmha_bwd_launcher_create(&traits, &mut launcher));
    ok(fmha_bwd_launcher_workspace_size(launcher, &mut size));
    expect_error(fmha_bwd_launcher_workspace_size(launcher, null_mut()), FMHA_ERR_NULL_POINTER, &["bytes"]);
    let mut workspace = null_mut();
    ok(fmha_device_malloc(&mut workspace, size));
    let args = bwd.args(&case, &fwd, workspace);
    // Never prepared: the run is refused by the stream (the workspace describes itself; a GPU kernel
    // finds no header and computes nothing). A stream of the test's own: errors on it are sticky.
    let mut stream = null_mut();
    ok(fmha_stream_create(&mut stream));
    ok(fmha_memset(workspace, 0x5A, size));
    ok(fmha_bwd_launcher_run(launcher, &args, stream));
    common::expect_stream_error(fmha_stream_synchronize(stream), FMHA_ERR_WORKSPACE_NOT_PREPARED, &["workspace"]);
    let (sq, sk) = ([0i32, 20, 33], [0i32, 30, 77]);
    expect_error(
        fmha_bwd_launcher_prepare_workspace(launcher, workspace, size - 1, sq.as_ptr(), sk.as_ptr()),
        FMHA_ERR_WORKSPACE_TOO_SMALL,
        &["workspace_size"],
    );
    expect_error(
        fmha_bwd_launcher_prepare_workspace(launcher, null_mut(), size, sq.as_ptr(), sk.as_ptr()),
        FMHA_ERR_NULL_POINTER,
        &["workspace"],
    );
    expect_error(
        fmha_bwd_launcher_prepare_workspace(launcher, workspace, size, null(), sk.as_ptr()),
        FMHA_ERR_NULL_POINTER,
        &["seqstart_q"],
    );
    let decreasing = [0i32, 40, 33];
    expect_error(
        fmha_bwd_launcher_prepare_workspace(launcher, workspace, size, decreasing.as_ptr(), sk.as_ptr()),
        FMHA_ERR_INVALID_ARGUMENT,
        &["seqstart_q"],
    );
    let too_long = [0i32, 70, 77];
    expect_error(
        fmha_bwd_launcher_prepare_workspace(launcher, workspace, size, sq.as_ptr(), too_long.as_ptr()),
        FMHA_ERR_INVALID_ARGUMENT,
        &["max_seqlen_k"],
    );
    expect_error(
        fmha_bwd_launcher_prepare_workspace(null_mut(), workspace, size, sq.as_ptr(), sk.as_ptr()),
        FMHA_ERR_NULL_POINTER,
        &["launcher"],
    );
    // Prepared for other lengths than the args carry: the run is refused by the stream.
    let other = [0i32, 21, 33];
    ok(fmha_bwd_launcher_prepare_workspace(launcher, workspace, size, other.as_ptr(), sk.as_ptr()));
    ok(fmha_bwd_launcher_run(launcher, &args, stream));
    common::expect_stream_error(
        fmha_stream_synchronize(stream),
        FMHA_ERR_WORKSPACE_NOT_PREPARED,
        &["prepared for other"],
    );
    ok(fmha_stream_destroy(stream));
    ok(fmha_bwd_launcher_prepare_workspace(launcher, workspace, size, sq.as_ptr(), sk.as_ptr()));
    let run = |a: fmha_bwd_args| fmha_bwd_launcher_run(launcher, &a, null_mut());
    expect_error(fmha_bwd_launcher_run(null(), &args, null_mut()), FMHA_ERR_NULL_POINTER, &["launcher"]);
    expect_error(fmha_bwd_launcher_run(launcher, null(), null_mut()), FMHA_ERR_NULL_POINTER, &["args"]);
    expect_error(run(fmha_bwd_args { struct_size: 8, ..args }), FMHA_ERR_INVALID_ARGUMENT, &["struct_size"]);
    expect_error(run(fmha_bwd_args { nhead_k: 4, ..args }), FMHA_ERR_INVALID_ARGUMENT, &["nhead_k", "traits"]);
    expect_error(run(fmha_bwd_args { seqlen_q: 34, ..args }), FMHA_ERR_INVALID_ARGUMENT, &["seqlen_q", "traits"]);
    expect_error(run(fmha_bwd_args { hdim_v: 32, ..args }), FMHA_ERR_INVALID_ARGUMENT, &["hdim_v", "traits"]);
    expect_error(run(fmha_bwd_args { workspace: null_mut(), ..args }), FMHA_ERR_NULL_POINTER, &["workspace"]);
    let skewed = (workspace as usize + 8) as *mut c_void;
    expect_error(
        run(fmha_bwd_args { workspace: skewed, ..args }),
        FMHA_ERR_INVALID_ARGUMENT,
        &["workspace", "aligned"],
    );
    expect_error(
        run(fmha_bwd_args { workspace_size: size - 1, ..args }),
        FMHA_ERR_WORKSPACE_TOO_SMALL,
        &["workspace_size"],
    );
    ok(run(fmha_bwd_args { workspace_size: size, ..args }));
    expect_error(run(fmha_bwd_args { window_size_left: -5, ..args }), FMHA_ERR_INVALID_ARGUMENT, &["window_size_left"]);
    expect_error(run(fmha_bwd_args { scale: f32::INFINITY, ..args }), FMHA_ERR_INVALID_ARGUMENT, &["scale"]);
    expect_error(run(fmha_bwd_args { seqstart_q: null(), ..args }), FMHA_ERR_INVALID_ARGUMENT, &["seqstart_q"]);
    let null_dk = fmha_tensor { data: null_mut(), ..args.dk };
    expect_error(run(fmha_bwd_args { dk: null_dk, ..args }), FMHA_ERR_NULL_POINTER, &["dk.data"]);
    let strided_d = fmha_tensor { row_stride: 3, ..args.d };
    expect_error(run(fmha_bwd_args { d: strided_d, ..args }), FMHA_ERR_INVALID_ARGUMENT, &["d.row_stride"]);
    ok(fmha_stream_synchronize(null_mut()));
    ok(fmha_bwd_launcher_run(launcher, &args, null_mut()));
    ok(fmha_stream_synchronize(null_mut()));
    ok(fmha_bwd_launcher_destroy(launcher));
    ok(fmha_device_free(workspace));
}

#[test]
fn registry_json_lists_instances() {
    let mut required = 0usize;
    expect_error(fmha_registry_json(null_mut(), 0, null_mut()), FMHA_ERR_NULL_POINTER, &["required"]);
    ok(fmha_registry_json(null_mut(), 0, &mut required));
    assert!(required > 2);
    let mut buffer = vec![0u8; required + 1];
    ok(fmha_registry_json(buffer.as_mut_ptr() as *mut _, buffer.len(), &mut required));
    let json = std::str::from_utf8(&buffer[..required]).unwrap();
    assert!(json.starts_with('[') && json.ends_with(']'));
    if fmha::ffi::version::fmha_backend() == fmha::ffi::version::FMHA_BACKEND_HOST {
        assert!(json.contains("\"operation\":\"bwd\"") && json.contains("\"deterministic\":true"), "{json}");
    }
    let mut small = [0x55u8; 8];
    ok(fmha_registry_json(small.as_mut_ptr() as *mut _, small.len(), &mut required));
    assert_eq!(small[7], 0);
}

/// The JSON text an `fmha_*_plan_json` call writes (asked for its length first).
fn plan_json(call: impl Fn(*mut std::ffi::c_char, usize, *mut usize) -> fmha_status) -> String {
    let mut required = 0usize;
    ok(call(null_mut(), 0, &mut required));
    let mut buffer = vec![0u8; required + 1];
    ok(call(buffer.as_mut_ptr() as *mut _, buffer.len(), &mut required));
    assert_eq!(buffer[required], 0);
    String::from_utf8(buffer[..required].to_vec()).unwrap()
}

/// The kernels named in a plan's stages, in order.
fn plan_kernels(json: &str) -> Vec<String> {
    json.split("\"kernel\":\"").skip(1).map(|s| s[..s.find('"').unwrap()].to_string()).collect()
}

#[test]
fn forward_plan_names_the_instance_fmha_fwd_runs() {
    let mut rng = Rng::fresh();
    let case = small_case(true);
    let b = buffers(&case, &mut rng);
    let traits = Buffers::fwd_traits(&case);
    let args = b.fwd_args(&case);
    let before = (b.o.download(), b.lse.download());
    let json = plan_json(|buffer, length, required| fmha_fwd_plan_json(&traits, &args, buffer, length, required));
    assert_eq!(plan_kernels(&json), ["fwd"], "{json}");
    assert!(json.contains("\"operation\":\"fwd\"") && json.contains("\"masked\":true"), "{json}");
    // The instance is one the registry lists.
    let registry = plan_json(|buffer, length, required| fmha_registry_json(buffer, length, required));
    let name = &json[json.find("\"name\":\"").unwrap() + 8..];
    assert!(registry.contains(&format!("\"name\":\"{}\"", &name[..name.find('"').unwrap()])), "{json}");
    // Validated as fmha_fwd validates; nothing launched, nothing written.
    let mut required = 0usize;
    expect_error(fmha_fwd_plan_json(&traits, &args, null_mut(), 0, null_mut()), FMHA_ERR_NULL_POINTER, &["required"]);
    expect_error(fmha_fwd_plan_json(null(), &args, null_mut(), 0, &mut required), FMHA_ERR_NULL_POINTER, &["traits"]);
    expect_error(
        fmha_fwd_plan_json(&fmha_fwd_traits { hdim_v: 300, ..traits }, &args, null_mut(), 0, &mut required),
        FMHA_ERR_INVALID_ARGUMENT,
        &["hdim_v", "300"],
    );
    expect_error(
        fmha_fwd_plan_json(&traits, &fmha_fwd_args { nhead_k: 3, ..args }, null_mut(), 0, &mut required),
        FMHA_ERR_INVALID_ARGUMENT,
        &["nhead_k"],
    );
    ok(fmha_stream_synchronize(null_mut()));
    assert!((b.o.download(), b.lse.download()) == before, "a plan wrote an output");
}

#[test]
fn backward_plan_lists_its_stages_in_launch_order() {
    for (group, deterministic) in [(false, false), (false, true), (true, true)] {
        let case = small_case(group);
        let traits = fmha_bwd_traits { is_deterministic: deterministic as i32, ..bwd_traits(&case) };
        let mut launcher = null_mut();
        ok(fmha_bwd_launcher_create(&traits, &mut launcher));
        let json =
            plan_json(|buffer, length, required| fmha_bwd_launcher_plan_json(launcher, buffer, length, required));
        let kernels = plan_kernels(&json);
        let host = fmha::ffi::version::fmha_backend() == fmha::ffi::version::FMHA_BACKEND_HOST;
        // Deterministic batch mode writes each dq_acc slot before adding into it: no zeroing (the AMD
        // kernels keep CK's rule and zero always).
        let zeroes = !deterministic || group || json.contains("\"arch\":\"gfx9");
        // The GPU kernels zero dq_acc in the dot_do_o launch; the host executor in a stage of its own.
        let expected: &[&str] = match (zeroes, host) {
            (true, true) => &["dot_do_o", "zero_dq_acc", "dq_dk_dv", "convert_dq"],
            (true, false) => &["dot_do_o_and_zero_dq_acc", "dq_dk_dv", "convert_dq"],
            (false, _) => &["dot_do_o", "dq_dk_dv", "convert_dq"],
        };
        assert_eq!(kernels, expected, "{json}");
        assert!(json.contains(&format!("\"deterministic\":{deterministic}")), "{json}");
        if host {
            assert!(json.contains("\"arch\":\"host\""), "{json}");
        }
        ok(fmha_bwd_launcher_destroy(launcher));
        let mut required = 0usize;
        expect_error(
            fmha_bwd_launcher_plan_json(launcher, null_mut(), 0, &mut required),
            FMHA_ERR_INVALID_ARGUMENT,
            &["launcher"],
        );
    }
}
