//! The kernels' C ABI is defined once, in Rust (`src/launch/abi.rs`, `src/schedule/records.rs`):
//! - the committed `hip/launch.h` must be what cbindgen generates from it (`cbindgen-kernels.toml`);
//! - the committed `hip/launch_layout.h` must hold the Rust layout of every struct in it (size and every
//!   field's offset) as `static_assert`s, which every C++ translation unit including `launch.h` checks
//!   against the C++ compiler's layout: a second guard, against cbindgen or a compiler laying a field
//!   out differently. Its field lists must name every field the generated header declares.
//!
//! After an intended change of the kernel ABI, refresh both with
//! `FMHA_UPDATE_HEADER=1 cargo test --test kernel_abi`.

use fmha::launch::abi::*;
use fmha::schedule::{BatchState, CuState};
use std::mem::{offset_of, size_of};

const LAUNCH_H: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/hip/launch.h");
const LAYOUT_H: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/hip/launch_layout.h");

/// A struct's C name, size and fields with their offsets, from Rust.
struct Layout {
    c_name: &'static str,
    size: usize,
    fields: Vec<(&'static str, usize)>,
}

macro_rules! layout {
    ($rust:ty, $c_name:literal, [$($field:ident),* $(,)?]) => {
        Layout {
            c_name: $c_name,
            size: size_of::<$rust>(),
            fields: vec![$((stringify!($field), offset_of!($rust, $field))),*],
        }
    };
}

fn layouts() -> Vec<Layout> {
    vec![
        layout!(FillParams, "fmha_fill_params", [dst, count, value, pad]),
        layout!(DescaleParams, "fmha_descale_params", [data, batch_stride, head_stride, page_stride]),
        layout!(
            PrepareParams,
            "fmha_prepare_params",
            [
                group_mode,
                deterministic,
                batch,
                nhead_k,
                row_elements,
                seqlen_q,
                seqlen_k,
                max_seqlen_k,
                m0,
                n0,
                num_cus,
                remap,
                nsplits_offset,
                nsplits_count,
                dq_acc_offsets_offset,
                dq_acc_offsets_count,
                cu_state_offset,
                cu_state_count,
                batch_state_offset,
                batch_state_count,
                metadata_bytes,
                masked,
                ordered_dq,
                nhead_q,
            ]
        ),
        layout!(PrepareArgs, "fmha_prepare_args", [workspace, seqstart_q, seqstart_k, params]),
        layout!(
            FwdParams,
            "fmha_fwd_params",
            [
                q,
                k,
                v,
                o,
                lse,
                seqstart_q,
                seqstart_k,
                seqlen_q_ptr,
                seqlen_k_ptr,
                q_batch_stride,
                q_head_stride,
                q_row_stride,
                k_batch_stride,
                k_head_stride,
                k_row_stride,
                v_batch_stride,
                v_head_stride,
                v_row_stride,
                o_batch_stride,
                o_head_stride,
                o_row_stride,
                lse_batch_stride,
                lse_head_stride,
                batch,
                nhead_q,
                nhead_k,
                hdim_q,
                hdim_v,
                seqlen_q,
                seqlen_k,
                max_seqlen_q,
                group_mode,
                mask_type,
                window_left,
                window_right,
                scale_log2,
                dtype,
                hdim_bucket,
                masked,
                q_descale,
                k_descale,
                v_descale,
                tile_counter,
            ]
        ),
        layout!(
            BwdParams,
            "fmha_bwd_params",
            [
                q,
                k,
                v,
                o,
                lse,
                d_o,
                d,
                dq,
                dk,
                dv,
                seqstart_q,
                seqstart_k,
                seqlen_q_ptr,
                seqlen_k_ptr,
                workspace,
                q_batch_stride,
                q_head_stride,
                q_row_stride,
                k_batch_stride,
                k_head_stride,
                k_row_stride,
                v_batch_stride,
                v_head_stride,
                v_row_stride,
                o_batch_stride,
                o_head_stride,
                o_row_stride,
                do_batch_stride,
                do_head_stride,
                do_row_stride,
                dq_batch_stride,
                dq_head_stride,
                dq_row_stride,
                dk_batch_stride,
                dk_head_stride,
                dk_row_stride,
                dv_batch_stride,
                dv_head_stride,
                dv_row_stride,
                lse_batch_stride,
                lse_head_stride,
                d_batch_stride,
                d_head_stride,
                metadata_bytes,
                nsplits_offset,
                dq_acc_offsets_offset,
                cu_state_offset,
                batch_state_offset,
                dq_acc_elements,
                fingerprint_params,
                jobs_per_head,
                jobs_per_worker,
                total_jobs,
                ordered_dq,
                dq_semaphore_words,
                batch,
                nhead_q,
                nhead_k,
                hdim_q,
                hdim_v,
                seqlen_q,
                seqlen_k,
                max_seqlen_q,
                max_seqlen_k,
                group_mode,
                deterministic,
                mask_type,
                window_left,
                window_right,
                num_cus,
                m0,
                n0,
                scale,
                scale_log2,
                dtype,
                hdim_bucket,
                masked,
            ]
        ),
        layout!(
            KvCacheParams,
            "fmha_kvcache_params",
            [
                q,
                k,
                v,
                o,
                lse,
                seqstart_q,
                seqlen_k,
                block_table,
                kv_indptr,
                page_indices,
                last_page_len,
                cache_batch_idx,
                workspace,
                q_batch_stride,
                q_head_stride,
                q_row_stride,
                k_batch_stride,
                k_head_stride,
                k_row_stride,
                v_batch_stride,
                v_head_stride,
                v_row_stride,
                o_batch_stride,
                o_head_stride,
                o_row_stride,
                lse_batch_stride,
                lse_head_stride,
                block_table_stride,
                q_descale,
                k_descale,
                v_descale,
                batch,
                nhead_q,
                nhead_k,
                hdim_q,
                hdim_v,
                seqlen_q,
                max_seqlen_q,
                max_seqlen_k,
                group_mode,
                mask_type,
                window_left,
                window_right,
                scale_log2,
                dtype,
                hdim_bucket,
                masked,
                table_kind,
                page_size,
                num_pages,
                max_pages_per_seq,
                num_page_indices,
                check_tables,
                max_splits,
                split_tiles,
                block_m,
                block_n,
                cu_count,
                split_plan,
                partial_lse,
                partial_o,
                partial_rows,
                pack_gqa,
                pad,
                sequence_order,
                order_keys,
                tile_counter,
            ]
        ),
        layout!(
            MergeParams,
            "fmha_merge_params",
            [
                o_in,
                lse_in,
                o_out,
                lse_out,
                o_in_state_stride,
                o_in_head_stride,
                o_in_row_stride,
                lse_in_state_stride,
                lse_in_head_stride,
                lse_in_row_stride,
                o_out_head_stride,
                o_out_row_stride,
                lse_out_head_stride,
                lse_out_row_stride,
                num_states,
                num_rows,
                nhead,
                hdim,
                in_dtype,
                out_dtype,
                lse_base2,
                pad,
            ]
        ),
        layout!(KvCacheFault, "fmha_kv_cache_fault", [magic, field, sequence, value, bound]),
        layout!(KvCacheSplitPlan, "fmha_kv_cache_split_plan", [magic, tiles_per_split, ordered, pad]),
        layout!(WalkArgs, "fmha_walk_args", [params, worker, masked, pad]),
        layout!(UnitRecord, "fmha_unit_record", [batch, head, k_tile, split, first_in_slot]),
        layout!(CuState, "fmha_cu_state", [w_lo, w_hi, ibatch, isplit, head_start, c_start]),
        layout!(BatchState, "fmha_batch_state", [sq, nc, nsplits, pad]),
    ]
}

/// The field names the header declares for `typedef struct NAME { ... } NAME;`, in order.
fn header_fields(header: &str, c_name: &str) -> Vec<String> {
    let open = format!("typedef struct {c_name} {{");
    let start = header.find(&open).unwrap_or_else(|| panic!("hip/launch.h declares no struct {c_name}"));
    let body = &header[start + open.len()..];
    let body = &body[..body.find('}').expect("the struct is closed")];
    body.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with("//"))
        .map(|line| {
            let declaration = line.trim_end_matches(';');
            declaration.rsplit([' ', '*']).next().unwrap().to_string()
        })
        .collect()
}

fn layout_header(layouts: &[Layout]) -> String {
    let mut out = String::from(
        "// The Rust layout of every struct of launch.h, checked by the C++ compiler wherever launch.h is\n\
         // included. Generated by tests/kernel_abi.rs; do not edit.\n\
         #pragma once\n\n\
         #ifdef __cplusplus\n",
    );
    for l in layouts {
        let n = l.c_name;
        out += &format!("static_assert(sizeof({n}) == {}, \"{n}: size differs from Rust's\");\n", l.size);
        for (field, offset) in &l.fields {
            out += &format!(
                "static_assert(offsetof({n}, {field}) == {offset}, \"{n}.{field}: offset differs from Rust's\");\n"
            );
        }
    }
    out += "#endif  // __cplusplus\n";
    out
}

fn check_or_update(path: &str, expected: &str) {
    if std::env::var_os("FMHA_UPDATE_HEADER").is_some() {
        std::fs::write(path, expected).unwrap_or_else(|e| panic!("{path}: {e}"));
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        committed == expected,
        "{path} is not what src/launch/abi.rs and src/schedule/records.rs define; after an intended change run \
         `FMHA_UPDATE_HEADER=1 cargo test --test kernel_abi`"
    );
}

#[test]
fn committed_kernel_header_is_generated() {
    check_or_update(LAUNCH_H, include_str!(concat!(env!("OUT_DIR"), "/launch.h")));
}

#[test]
fn layout_asserts_cover_every_field_of_the_header() {
    let header = include_str!(concat!(env!("OUT_DIR"), "/launch.h"));
    let layouts = layouts();
    for l in &layouts {
        let declared = header_fields(header, l.c_name);
        let listed: Vec<String> = l.fields.iter().map(|(f, _)| f.to_string()).collect();
        assert_eq!(listed, declared, "{}: the layout list must name the header's fields in order", l.c_name);
    }
    let declared_structs = header.matches("typedef struct ").count();
    assert_eq!(declared_structs, layouts.len(), "every struct of hip/launch.h needs a layout list here");
    check_or_update(LAYOUT_H, &layout_header(&layouts));
}
