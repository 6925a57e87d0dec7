//! The kernel instances compiled into this build, per architecture, and selection by traits.
//!
//! Only what changes a kernel's inner loop is an instance (operation, dtype, head-dim bucket, masked
//! or not, deterministic or not); everything else is a runtime argument. A request no instance serves
//! answers "unsupported" and names the nearest instances.

use crate::error::{Error, Result};
use crate::problem::{CacheDtype, Dtype, Fp8Format};
use crate::runtime::Arch;
use std::sync::OnceLock;

mod plan;
pub use plan::{Plan, Stage};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    Forward,
    Backward,
    /// The kv-cache forward (paged prefill).
    KvCache,
}

impl Operation {
    pub fn name(self) -> &'static str {
        match self {
            Operation::Forward => "fwd",
            Operation::Backward => "bwd",
            Operation::KvCache => "kvcache",
        }
    }
}

/// One compiled kernel instance (for the backward: the dq_dk_dv kernel, whose tile drives the
/// workspace and schedule; dot_do_o and convert_dq are tile-independent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Instance {
    pub operation: Operation,
    pub arch: Arch,
    pub dtype: CacheDtype,
    /// Largest `hdim_q` / `hdim_v` served (head dims are padded up to the bucket).
    pub hdim_q: i64,
    pub hdim_v: i64,
    pub masked: bool,
    pub deterministic: bool,
    /// The kv-cache's decode tile: its rows are (query row, query head) pairs of one kv head.
    pub packed_gqa: bool,
    /// Forward: q rows per tile and k rows per inner step. Backward: q rows per inner step (kM0) and
    /// k rows per work unit (kN0).
    pub m0: i64,
    pub n0: i64,
    pub pipeline: &'static str,
    /// Head dims must be multiples of this (the GPU kernels move 16-byte vectors).
    pub hdim_multiple: i64,
    /// Tensor addresses must be aligned to, and strides multiples of, this many bytes (0: any).
    pub vector_bytes: usize,
    /// Row strides (elements) of the tensors the kernels load must stay below this (0: any).
    pub max_input_row_stride: i64,
    /// Query heads and batches the launch grids address (their y and z dimensions; 0: any).
    pub max_grid_heads_and_batch: i64,
}

/// The GPU grids put query heads in their y and batches in their z dimension, which CUDA and HIP bound
/// by 65535.
const GPU_MAX_GRID_YZ: i64 = 65535;

/// The AMD kernels address the rows of a loaded tile as 32-bit byte offsets from its first row (a
/// scalar base register plus a per-lane offset): 128 rows of 16-bit elements must span less than 4 GiB.
const AMD_MAX_INPUT_ROW_STRIDE: i64 = 1 << 24;

impl Instance {
    /// Whether this packed-GQA instance takes a kv-cache call of `group` query heads per kv head, at most
    /// `max_seqlen_q` query rows per sequence, pages of `page_size` tokens and (fp8) per-page descales or
    /// not: every sequence's (query row, query head) pairs of one kv head fit one tile; the
    /// warp-specialized tile loads its rows as TMA boxes of `group` heads, so the group also divides its
    /// rows, and its descales are uniform (its producer takes every page size: TMA boxes of whole-tile
    /// pages, other pages gathered). Its kernel takes other calls too, through the cp.async kernel of its
    /// shape, which is slower than the one-warpgroup tiles (or, at D = 256, the prefill tile) that take
    /// them here.
    pub fn packs(&self, group: i64, max_seqlen_q: i64, page_size: i64, page_scales: bool) -> bool {
        let fits_tile = self.packed_gqa && max_seqlen_q * group <= self.m0;
        if !SM90_DECODE_WS_PIPELINES.contains(&self.pipeline) {
            return fits_tile;
        }
        fits_tile && group > 0 && self.m0 % group == 0 && page_size > 0 && !page_scales
    }

    /// Refuses tensors the instance cannot address with its vector loads, naming the field. Group mode
    /// ignores the batch stride, so only batch mode checks it.
    pub fn check_tensor(
        &self,
        field: &str,
        tensor: &crate::problem::Tensor,
        mode: crate::problem::Mode,
        element_bytes: usize,
    ) -> Result<()> {
        let ptr = tensor.ptr.0;
        if self.vector_bytes == 0 || ptr == 0 {
            return Ok(());
        }
        let elements = (self.vector_bytes / element_bytes) as i64;
        if ptr % self.vector_bytes != 0 {
            return Err(Error::unsupported(format!(
                "{field}.data: {:#x} is not {}-byte aligned, which the {} kernels need",
                ptr,
                self.vector_bytes,
                self.arch.name()
            )));
        }
        let batch_stride = if mode == crate::problem::Mode::Batch { tensor.batch_stride } else { 0 };
        for (name, stride) in
            [("batch_stride", batch_stride), ("head_stride", tensor.head_stride), ("row_stride", tensor.row_stride)]
        {
            if stride % elements != 0 {
                return Err(Error::unsupported(format!(
                    "{field}.{name}: {stride} is not a multiple of {elements} elements, which the {} kernels need",
                    self.arch.name()
                )));
            }
        }
        Ok(())
    }

    /// Refuses a tensor the kernels load (q, k, v; the backward also dO) whose row stride they cannot
    /// address, naming the field.
    pub fn check_input_rows(&self, field: &str, tensor: &crate::problem::Tensor) -> Result<()> {
        if self.max_input_row_stride > 0 && tensor.row_stride >= self.max_input_row_stride {
            return Err(Error::unsupported(format!(
                "{field}.row_stride: {} elements; the {} kernels need less than {}",
                tensor.row_stride,
                self.arch.name(),
                self.max_input_row_stride
            )));
        }
        Ok(())
    }

    /// Refuses head and batch counts the instance's launch grids cannot address, naming the field.
    pub fn check_grid(&self, nhead_q: i64, batch: i64) -> Result<()> {
        let max = self.max_grid_heads_and_batch;
        for (field, value) in [("nhead_q", nhead_q), ("batch", batch)] {
            if max > 0 && value > max {
                return Err(Error::unsupported(format!(
                    "{field}: {value}; the {} kernels' launch grid addresses at most {max}",
                    self.arch.name()
                )));
            }
        }
        Ok(())
    }

    pub fn name(&self) -> String {
        format!(
            "fmha_{}_d{}x{}_{}_{}_{}_b{}x{}_{}_{}",
            self.operation.name(),
            self.hdim_q,
            self.hdim_v,
            self.dtype.name(),
            if self.masked { "mask" } else { "nmask" },
            if self.deterministic { "deterministic" } else { "ndeterministic" },
            self.m0,
            self.n0,
            self.arch.name(),
            self.pipeline
        )
    }

    /// The instance as a JSON object: its name and every field that identifies the kernel.
    pub fn to_json(&self) -> String {
        format!(
            "{{\"name\":\"{}\",\"operation\":\"{}\",\"arch\":\"{}\",\"dtype\":\"{}\",\"hdim_q\":{},\"hdim_v\":{},\
             \"masked\":{},\"deterministic\":{},\"packed_gqa\":{},\"m0\":{},\"n0\":{},\"pipeline\":\"{}\",\
             \"hdim_multiple\":{},\"vector_bytes\":{},\"max_input_row_stride\":{},\
             \"max_grid_heads_and_batch\":{}}}",
            self.name(),
            self.operation.name(),
            self.arch.name(),
            self.dtype.name(),
            self.hdim_q,
            self.hdim_v,
            self.masked,
            self.deterministic,
            self.packed_gqa,
            self.m0,
            self.n0,
            self.pipeline,
            self.hdim_multiple,
            self.vector_bytes,
            self.max_input_row_stride,
            self.max_grid_heads_and_batch
        )
    }
}

/// What a launcher asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub operation: Operation,
    pub dtype: CacheDtype,
    pub hdim_q: i64,
    pub hdim_v: i64,
    pub masked: bool,
    pub deterministic: bool,
    /// The kv-cache's decode with GQA packed into the tile (only instances that pack serve it).
    pub packed_gqa: bool,
}

/// Backward tiles per head-dim bucket (kM0 × kN0), as CK's fp16/bf16 dq_dk_dv instances.
const BACKWARD_TILES: [(i64, i64, i64); 4] = [(32, 32, 128), (64, 32, 128), (128, 16, 128), (256, 16, 64)];
/// Forward tiles per head-dim bucket (q rows × k rows).
const FORWARD_TILES: [(i64, i64, i64); 4] = [(32, 64, 64), (64, 64, 64), (128, 64, 64), (256, 64, 32)];

/// Forward tiles of the GPU kernels (`hip/fwd/forward.hip`): head-dim bucket, q rows, k rows.
/// sm_90a's dense 16-bit forward: the warp-specialized kernel (`hip/fwd/sm90/specialized_kernel.h`), a TMA
/// producer warp and two consumer warpgroups of 64 q rows, 128 keys per tile up to D = 128 and 80 at
/// D = 256 (FA3's shape: two stages of K and V fit beside Q); tensors TMA cannot describe take the cp.async
/// kernel. The launch gives unmasked D = 64 calls three consumer warpgroups (192 q rows) where that pays
/// (`hip/fwd/sm90/instances.h`'s `dense_consumers`).
const SM90_DENSE_FORWARD_TILES: [(i64, i64, i64); 3] = [(64, 128, 128), (128, 128, 128), (256, 128, 80)];
/// The same kernel's tile for Q/K head dims up to 192 with V head dims up to 128 (hdim_v set apart).
const SM90_DENSE_FORWARD_192_128: (i64, i64, i64) = (192, 128, 128);
/// sm_90a's kv-cache prefill: the warp-specialized kernel (`hip/kvcache/sm90/specialized_paged.h`), two
/// consumer warpgroups of 64 q rows, 128 keys per tile at D = 64 and 128 (16-bit types), 64 at D = 256
/// (16-bit; pages it cannot load as TMA boxes, of fewer than 32 keys or not dividing the tile, take the
/// cp.async kernel), and at D = 128 for fp8 (`SM90_FP8_TILES`, the dense fp8 forward's tile too);
/// tensors TMA cannot describe take the cp.async kernel (`hip/fwd/sm90/kernel.h`).
const SM90_PAGED_TILES: [(i64, i64, i64); 3] = [(64, 128, 128), (128, 128, 128), (256, 128, 64)];
const SM90_FP8_TILES: [(i64, i64, i64); 1] = [(128, 128, 128)];
/// sm_90a's decode tiles (packed GQA) of the cp.async kernel: one warpgroup of 64 (query row, query
/// head) pairs; 64 keys for 16-bit types, 128 for fp8.
const SM90_DECODE_TILES: [(i64, i64, i64); 2] = [(64, 64, 64), (128, 64, 64)];
/// The warp-specialized kernel's decode tiles (`hip/kvcache/sm90/specialized_paged.h`, the prefill's
/// tiles): 128 (query row, query head) pairs, 128 keys (D = 256: 64), its rows loaded as TMA boxes (see
/// [`Instance::packs`]); for 16-bit types at D = 64, 128 and 256, for fp8 (V transposed by the
/// producer) at D = 128.
const SM90_DECODE_WS_TILES: [(i64, i64, i64); 3] = [(64, 128, 128), (128, 128, 128), (256, 128, 64)];
const SM90_DECODE_WS_TILE_FP8: (i64, i64, i64) = (128, 128, 128);
const SM90_DECODE_WS_PIPELINES: [&str; 2] = ["wgmma_ws_paged_gqa", "wgmma_ws_paged_vt_gqa"];
const SM90_DECODE_TILES_FP8: [(i64, i64, i64); 1] = [(128, 64, 128)];
/// gfx942: 4 waves of 32 q rows; k rows such that the double-buffered K and Vᵀ tiles take at most
/// half of the 64 KiB of LDS (two workgroups per CU).
const GFX942_FORWARD_TILES: [(i64, i64, i64); 2] = [(64, 128, 64), (128, 128, 32)];
/// gfx950: the same rule with 160 KiB of LDS.
const GFX950_FORWARD_TILES: [(i64, i64, i64); 2] = [(64, 128, 64), (128, 128, 64)];
/// The AMD kv-cache forward for fp8 (both archs): 128 dims, 128 query rows, 64 keys per step.
const AMD_FP8_TILES: [(i64, i64, i64); 1] = [(128, 128, 64)];

/// Backward (dq_dk_dv) tiles of the GPU kernels (`hip/bwd/backward.hip`): head-dim bucket, q rows per
/// step, keys per unit. sm_90a: two warpgroups of 64 keys (8 warps, one per 16 keys); at D = 256 both
/// warpgroups take the same 64 keys, each half of dK/dV's columns (`hip/bwd/sm90/tile.h`).
const SM90_BACKWARD_TILES: [(i64, i64, i64); 3] = [(64, 64, 128), (128, 64, 128), (256, 64, 64)];
/// The same kernel's tile for Q/K head dims up to 192 with V head dims up to 128 (hdim_v set apart): as
/// at D = 256, both warpgroups take the same 64 keys, each its part of dK's and of dV's columns.
const SM90_BACKWARD_192_128: (i64, i64, i64) = (192, 64, 64);
/// gfx942: 4 waves of 32 keys (`hip/bwd/amd/tile.h`); q steps such that a step's dQ is one
/// 32x32 block per wave (64 rows at D = 64, 32 at D = 128), which keeps the step's LDS within 49 KiB.
const GFX942_BACKWARD_TILES: [(i64, i64, i64); 2] = [(64, 64, 128), (128, 32, 128)];
/// gfx950: the same tiles. Registers, not LDS, bound the occupancy, so the larger LDS would buy nothing,
/// and the launch stub checks the workspace's tile without knowing which of the two the device is.
const GFX950_BACKWARD_TILES: [(i64, i64, i64); 2] = GFX942_BACKWARD_TILES;

/// The 16-bit input types, which every GPU kernel takes.
const HALF_DTYPES: [CacheDtype; 2] = [CacheDtype::Half(Dtype::F16), CacheDtype::Half(Dtype::Bf16)];

/// The instances of a GPU build for `arch` and `operation`: each of `dtypes`, masked or not (the
/// backward also atomic or deterministic dQ), one per tile. The GPU kernels move 16-byte vectors (head
/// dims in multiples of 16 bytes).
fn gpu_instances(
    arch: Arch,
    operation: Operation,
    dtypes: &[CacheDtype],
    tiles: &[(i64, i64, i64)],
    pipeline: &'static str,
) -> Vec<Instance> {
    let modes: &[bool] = if operation == Operation::Backward { &[false, true] } else { &[false] };
    let max_input_row_stride = match arch {
        Arch::Gfx942 | Arch::Gfx950 => AMD_MAX_INPUT_ROW_STRIDE,
        _ => 0,
    };
    let mut list = Vec::new();
    for &dtype in dtypes {
        for masked in [false, true] {
            for &deterministic in modes {
                for &(hdim, m0, n0) in tiles {
                    list.push(Instance {
                        operation,
                        arch,
                        dtype,
                        hdim_q: hdim,
                        hdim_v: hdim,
                        masked,
                        deterministic,
                        packed_gqa: false,
                        m0,
                        n0,
                        pipeline,
                        hdim_multiple: 16 / dtype.bytes() as i64,
                        vector_bytes: 16,
                        max_input_row_stride,
                        max_grid_heads_and_batch: GPU_MAX_GRID_YZ,
                    });
                }
            }
        }
    }
    list
}

/// Every instance this build has for `arch`.
pub fn instances(arch: Arch) -> Vec<Instance> {
    match arch {
        Arch::Host => {
            let mut list = host_instances();
            list.extend(host_kvcache_instances());
            list
        }
        Arch::Sm90 if cfg!(feature = "cuda") => {
            let mut list = sm90_dense_forward_instances();
            // fp8 (OCP, the format Hopper's tensor cores take) with the D = 128 shape only, as the
            // kv cache's: the warp-specialized kernel, its producer warpgroup transposing V in shared
            // memory (hip/fwd/sm90/transpose_v.h); tensors TMA cannot describe take the cp.async kernel.
            list.extend(gpu_instances(
                arch,
                Operation::Forward,
                &[CacheDtype::Fp8(Fp8Format::E4m3fn)],
                &SM90_FP8_TILES,
                "wgmma_ws_tma_vt",
            ));
            list.extend(sm90_backward_instances());
            // The forward kernel with paged K/V tiles (hip/kvcache/kvcache.hip): the warp-specialized
            // one, its producer loading K/V as TMA boxes of whole pages or gathering them row by row
            // (other pages; the cp.async kernel takes tensors TMA cannot describe). fp8 in the OCP format
            // (the one Hopper's tensor cores take) with the D = 128 shape only: the warp-specialized
            // kernel for uniform descales, the cp.async kernel for per-page descales.
            list.extend(gpu_instances(arch, Operation::KvCache, &HALF_DTYPES, &SM90_PAGED_TILES, "wgmma_ws_paged"));
            list.extend(gpu_instances(
                arch,
                Operation::KvCache,
                &[CacheDtype::Fp8(Fp8Format::E4m3fn)],
                &SM90_FP8_TILES,
                "wgmma_ws_paged_vt",
            ));
            list.extend(sm90_decode_instances());
            list
        }
        Arch::Gfx942 if cfg!(feature = "rocm") => amd_instances(arch, &GFX942_FORWARD_TILES, &GFX942_BACKWARD_TILES),
        Arch::Gfx950 if cfg!(feature = "rocm") => amd_instances(arch, &GFX950_FORWARD_TILES, &GFX950_BACKWARD_TILES),
        _ => Vec::new(),
    }
}

/// sm_90a's 16-bit instances of `operation`, one per bucket of `tiles`, and Q/K 192 with V 128
/// (DeepSeek's MLA shape), whose smaller V gets its own tile (`tile_192_128`).
fn sm90_instances_with_192_128(
    operation: Operation,
    tiles: &[(i64, i64, i64)],
    tile_192_128: (i64, i64, i64),
    pipeline: &'static str,
) -> Vec<Instance> {
    let mut list = gpu_instances(Arch::Sm90, operation, &HALF_DTYPES, tiles, pipeline);
    list.extend(
        gpu_instances(Arch::Sm90, operation, &HALF_DTYPES, &[tile_192_128], pipeline)
            .into_iter()
            .map(|i| Instance { hdim_v: 128, ..i }),
    );
    list
}

/// sm_90a's dense 16-bit forward instances (the warp-specialized kernel with TMA loads).
fn sm90_dense_forward_instances() -> Vec<Instance> {
    sm90_instances_with_192_128(
        Operation::Forward,
        &SM90_DENSE_FORWARD_TILES,
        SM90_DENSE_FORWARD_192_128,
        "wgmma_ws_tma",
    )
}

/// sm_90a's backward instances: the warp-specialized kernel (hip/bwd/sm90/kernel.h), a producer
/// warpgroup loading ahead of the consumers (Q and dO as TMA boxes where it can, the rest with cp.async),
/// in both dQ modes.
fn sm90_backward_instances() -> Vec<Instance> {
    sm90_instances_with_192_128(Operation::Backward, &SM90_BACKWARD_TILES, SM90_BACKWARD_192_128, "wgmma_ws_cp_async")
}

/// sm_90a's decode instances (packed GQA: tile rows pack the query heads of one kv head): the
/// warp-specialized tiles first (16-bit at D = 64, 128 and 256, fp8 at D = 128), the cp.async kernel's
/// one-warpgroup tiles (D = 64 and 128) for the calls they do not take.
fn sm90_decode_instances() -> Vec<Instance> {
    let packed = |dtypes: &[CacheDtype], tiles: &[(i64, i64, i64)], pipeline| {
        gpu_instances(Arch::Sm90, Operation::KvCache, dtypes, tiles, pipeline)
            .into_iter()
            .map(|i| Instance { packed_gqa: true, ..i })
    };
    let fp8 = [CacheDtype::Fp8(Fp8Format::E4m3fn)];
    let mut list: Vec<Instance> = packed(&HALF_DTYPES, &SM90_DECODE_WS_TILES, SM90_DECODE_WS_PIPELINES[0]).collect();
    list.extend(packed(&fp8, &[SM90_DECODE_WS_TILE_FP8], SM90_DECODE_WS_PIPELINES[1]));
    list.extend(packed(&HALF_DTYPES, &SM90_DECODE_TILES, "wgmma_cp_async_paged_gqa"));
    list.extend(packed(&fp8, &SM90_DECODE_TILES_FP8, "wgmma_cp_async_paged_vt_gqa"));
    list
}

/// The instances of a rocm build for `arch`: the forward, the backward and the forward kernel with
/// paged K/V tiles (hip/kvcache/kvcache.hip: fp16/bf16, strided pools; its pools' page strides are
/// 64-bit, their row strides bounded like every input's), and that kernel for fp8 e4m3 in the
/// architecture's own encoding (gfx942 FNUZ, gfx950 OCP: the other format has no instance) at the
/// 128-dim bucket, whose rows of 128 bytes take 64 keys per step on both (hip/fwd/amd/tile.h), for the
/// dense forward too; each kv-cache instance also packed (GQA: rows of several query heads).
fn amd_instances(arch: Arch, forward: &[(i64, i64, i64)], backward: &[(i64, i64, i64)]) -> Vec<Instance> {
    let format = if arch == Arch::Gfx950 { Fp8Format::E4m3fn } else { Fp8Format::E4m3fnuz };
    let mut list = gpu_instances(arch, Operation::Forward, &HALF_DTYPES, forward, "mfma_lds");
    list.extend(gpu_instances(arch, Operation::Forward, &[CacheDtype::Fp8(format)], &AMD_FP8_TILES, "mfma_lds"));
    list.extend(gpu_instances(arch, Operation::Backward, &HALF_DTYPES, backward, "mfma_lds"));
    list.extend(gpu_instances(arch, Operation::KvCache, &HALF_DTYPES, forward, "mfma_lds_paged"));
    list.extend(gpu_instances(arch, Operation::KvCache, &[CacheDtype::Fp8(format)], &AMD_FP8_TILES, "mfma_lds_paged"));
    // Decode: the same kernels with the query heads of one kv head packed into the tile's rows.
    let packed = |dtypes: &[CacheDtype], tiles: &[(i64, i64, i64)]| {
        gpu_instances(arch, Operation::KvCache, dtypes, tiles, "mfma_lds_paged_gqa")
            .into_iter()
            .map(|i| Instance { packed_gqa: true, ..i })
    };
    list.extend(packed(&HALF_DTYPES, forward));
    list.extend(packed(&[CacheDtype::Fp8(format)], &AMD_FP8_TILES));
    list
}

/// Every input type of the host backend's forward kernels (dense and kv-cache); its backward takes
/// the 16-bit ones.
const HOST_FORWARD_DTYPES: [CacheDtype; 4] = [
    CacheDtype::Half(Dtype::F16),
    CacheDtype::Half(Dtype::Bf16),
    CacheDtype::Fp8(Fp8Format::E4m3fn),
    CacheDtype::Fp8(Fp8Format::E4m3fnuz),
];

/// The host backend's instances: every forward and backward tile.
fn host_instances() -> Vec<Instance> {
    let arch = Arch::Host;
    let mut list = Vec::new();
    for dtype in HOST_FORWARD_DTYPES {
        for masked in [false, true] {
            for &(hdim, m0, n0) in &FORWARD_TILES {
                list.push(Instance {
                    operation: Operation::Forward,
                    arch,
                    dtype,
                    hdim_q: hdim,
                    hdim_v: hdim,
                    masked,
                    deterministic: false,
                    packed_gqa: false,
                    m0,
                    n0,
                    pipeline: "host_tile_loop",
                    hdim_multiple: 1,
                    vector_bytes: 0,
                    max_input_row_stride: 0,
                    max_grid_heads_and_batch: 0,
                });
            }
            let CacheDtype::Half(_) = dtype else { continue };
            for deterministic in [false, true] {
                for &(hdim, m0, n0) in &BACKWARD_TILES {
                    list.push(Instance {
                        operation: Operation::Backward,
                        arch,
                        dtype,
                        hdim_q: hdim,
                        hdim_v: hdim,
                        masked,
                        deterministic,
                        packed_gqa: false,
                        m0,
                        n0,
                        pipeline: if deterministic { "host_persistent" } else { "host_atomic" },
                        hdim_multiple: 1,
                        vector_bytes: 0,
                        max_input_row_stride: 0,
                        max_grid_heads_and_batch: 0,
                    });
                }
            }
        }
    }
    list
}

/// The host backend's kv-cache instances: the forward's tiles (so a paged call and a dense one on
/// the same tokens compute the same tiles), for every input type.
fn host_kvcache_instances() -> Vec<Instance> {
    let mut list = Vec::new();
    for dtype in HOST_FORWARD_DTYPES {
        for masked in [false, true] {
            for &(hdim, m0, n0) in &FORWARD_TILES {
                list.push(Instance {
                    operation: Operation::KvCache,
                    arch: Arch::Host,
                    dtype,
                    hdim_q: hdim,
                    hdim_v: hdim,
                    masked,
                    deterministic: false,
                    packed_gqa: false,
                    m0,
                    n0,
                    pipeline: "host_tile_loop",
                    hdim_multiple: 1,
                    vector_bytes: 0,
                    max_input_row_stride: 0,
                    max_grid_heads_and_batch: 0,
                });
            }
        }
    }
    list
}

/// Whether instance `i` serves `request`.
fn fits(i: &Instance, request: &Request) -> bool {
    i.operation == request.operation
        && i.dtype == request.dtype
        && i.masked == request.masked
        && i.deterministic == (request.deterministic && request.operation == Operation::Backward)
        && i.packed_gqa == request.packed_gqa
        && request.hdim_q <= i.hdim_q
        && request.hdim_v <= i.hdim_v
        && request.hdim_q % i.hdim_multiple == 0
        && request.hdim_v % i.hdim_multiple == 0
}

/// The instances in `all` serving `request`, smallest bucket first (in `all`'s order within one).
fn serving_in(all: &[Instance], request: &Request) -> Vec<Instance> {
    let mut list: Vec<Instance> = all.iter().filter(|i| fits(i, request)).copied().collect();
    list.sort_by_key(|i| (i.hdim_q, i.hdim_v));
    list
}

/// The smallest instance in `all` serving `request` (the first of `serving_in`'s list, without building it:
/// `min_by_key` keeps the first of equal keys).
fn smallest_fit(all: &[Instance], request: &Request) -> Option<Instance> {
    all.iter().filter(|i| fits(i, request)).min_by_key(|i| (i.hdim_q, i.hdim_v)).copied()
}

/// [`instances`] of `arch`, built once: every launch selects from it.
fn cached_instances(arch: Arch) -> &'static [Instance] {
    static LISTS: [OnceLock<Vec<Instance>>; 5] = [const { OnceLock::new() }; 5];
    let slot = match arch {
        Arch::Host => 0,
        Arch::Sm90 => 1,
        Arch::Gfx942 => 2,
        Arch::Gfx950 => 3,
        Arch::Other => 4,
    };
    LISTS[slot].get_or_init(|| instances(arch))
}

/// Every instance serving `request` on `arch`, smallest bucket first (in the build's order within one).
pub fn serving(arch: Arch, request: &Request) -> Vec<Instance> {
    serving_in(cached_instances(arch), request)
}

/// The smallest instance serving `request` on `arch`; none is FMHA_ERR_UNSUPPORTED naming the nearest.
pub fn select(arch: Arch, request: &Request) -> Result<Instance> {
    let all = cached_instances(arch);
    if let Some(best) = smallest_fit(all, request) {
        return Ok(best);
    }
    // Nearest: same operation, ranked by how many key fields differ, then by head-dim distance.
    let mut near: Vec<&Instance> = all.iter().filter(|i| i.operation == request.operation).collect();
    // No kernel of the operation takes the input type at all (an fp8 format the device has no
    // kernel for, fp8 on a backward): the traits' dtype is what to change.
    let field = if near.iter().any(|i| i.dtype == request.dtype) { "" } else { "dtype: " };
    near.sort_by_key(|i| {
        let mismatches = (i.dtype != request.dtype) as i64
            + (i.masked != request.masked) as i64
            + (i.deterministic != request.deterministic) as i64;
        (mismatches, (i.hdim_q - request.hdim_q).abs() + (i.hdim_v - request.hdim_v).abs())
    });
    let nearest: Vec<String> = near.iter().take(3).map(|i| i.name()).collect();
    Err(Error::unsupported(format!(
        "{field}no {} kernel for {} hdim_q={} hdim_v={} {} {} on {}; nearest compiled instances: {}",
        request.operation.name(),
        request.dtype.name(),
        request.hdim_q,
        request.hdim_v,
        if request.masked { "masked" } else { "unmasked" },
        if request.deterministic { "deterministic" } else { "non-deterministic" },
        arch.name(),
        if nearest.is_empty() {
            "none (this build has no attention kernels for this device)".into()
        } else {
            nearest.join(", ")
        }
    )))
}

/// The instance list as JSON (an array of objects), the seed of a dispatcher or benchmark tool.
pub fn to_json(instances: &[Instance]) -> String {
    let items: Vec<String> = instances.iter().map(Instance::to_json).collect();
    format!("[{}]", items.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(op: Operation, hdim_q: i64, hdim_v: i64) -> Request {
        Request {
            operation: op,
            dtype: CacheDtype::Half(Dtype::Bf16),
            hdim_q,
            hdim_v,
            masked: true,
            deterministic: true,
            packed_gqa: false,
        }
    }

    #[test]
    fn selects_the_smallest_bucket_that_fits() {
        let i = select(Arch::Host, &request(Operation::Backward, 40, 88)).unwrap();
        assert_eq!((i.hdim_q, i.hdim_v, i.m0, i.n0), (128, 128, 16, 128));
        let i = select(Arch::Host, &request(Operation::Backward, 32, 32)).unwrap();
        assert_eq!((i.hdim_q, i.m0, i.n0), (32, 32, 128));
        assert!(i.deterministic && i.masked);
        let i = select(Arch::Host, &request(Operation::Forward, 256, 108)).unwrap();
        assert_eq!(i.hdim_q, 256);
        assert!(!i.deterministic);
    }

    #[test]
    fn sm90_forward_buckets_include_192_with_v_128() {
        let all = sm90_dense_forward_instances();
        let forward = |hdim_q, hdim_v| {
            let i = smallest_fit(&all, &request(Operation::Forward, hdim_q, hdim_v)).unwrap();
            (i.hdim_q, i.hdim_v, i.n0)
        };
        assert_eq!(forward(192, 128), (192, 128, 128));
        assert_eq!(forward(160, 96), (192, 128, 128));
        assert_eq!(forward(192, 192), (256, 256, 80));
        assert_eq!(forward(128, 256), (256, 256, 80));
        assert_eq!(forward(96, 128), (128, 128, 128));
    }

    #[test]
    fn sm90_decode_takes_the_warp_specialized_tile_where_its_producer_takes_the_rows_and_pages() {
        let all = sm90_decode_instances();
        let pick_typed = |dtype, hdim, group, max_seqlen_q, page_size, page_scales| {
            let request = Request {
                operation: Operation::KvCache,
                dtype,
                masked: false,
                packed_gqa: true,
                ..request(Operation::KvCache, hdim, hdim)
            };
            serving_in(&all, &request)
                .into_iter()
                .find(|i| i.packs(group, max_seqlen_q, page_size, page_scales))
                .map(|i| (i.m0, i.n0, i.pipeline))
        };
        let bf16 = CacheDtype::Half(Dtype::Bf16);
        let pick = |hdim, group, max_seqlen_q, page_size| pick_typed(bf16, hdim, group, max_seqlen_q, page_size, false);
        let ws = Some((128, 128, SM90_DECODE_WS_PIPELINES[0]));
        let cp_async = Some((64, 64, "wgmma_cp_async_paged_gqa"));
        for page in [16, 48, 128, 256, 1024] {
            assert_eq!(pick(128, 4, 1, page), ws, "page {page}");
        }
        assert_eq!(pick(128, 4, 32, 16), ws, "128 rows: one tile");
        assert_eq!(pick(128, 1, 128, 16), ws);
        assert_eq!(pick(128, 16, 8, 16), ws);
        assert_eq!(pick(128, 4, 33, 16), None, "over a tile: the prefill tile");
        assert_eq!(pick(128, 6, 1, 16), cp_async, "a group that does not divide the rows");
        assert_eq!(pick(128, 6, 11, 16), None);
        for page in [1, 5, 8, 24, 100] {
            assert_eq!(pick(128, 4, 1, page), ws, "page {page}");
        }
        assert_eq!(pick(128, 4, 1, 0), cp_async, "no pages: the launcher refuses the call first");
        // D = 64 and 256: the same rule, on 64-key tiles at D = 256.
        assert_eq!(pick(64, 4, 1, 16), ws);
        assert_eq!(pick(40, 8, 16, 1), ws);
        assert_eq!(pick(64, 6, 1, 16), cp_async);
        assert_eq!(pick(256, 4, 1, 16), Some((128, 64, SM90_DECODE_WS_PIPELINES[0])));
        assert_eq!(pick(200, 2, 64, 128), Some((128, 64, SM90_DECODE_WS_PIPELINES[0])));
        assert_eq!(pick(256, 6, 1, 16), None, "no one-warpgroup tile at D = 256: the prefill tile");
        // fp8: every page size; per-page descales take the cp.async tile.
        let fp8 = CacheDtype::Fp8(Fp8Format::E4m3fn);
        let ws8 = Some((128, 128, SM90_DECODE_WS_PIPELINES[1]));
        let cp_async8 = Some((64, 128, "wgmma_cp_async_paged_vt_gqa"));
        for page in [1, 3, 4, 8, 16, 24, 128, 1024] {
            assert_eq!(pick_typed(fp8, 128, 4, 1, page, false), ws8, "fp8 page {page}");
        }
        assert_eq!(pick_typed(fp8, 128, 4, 1, 128, true), cp_async8, "per-page descales");
        assert_eq!(pick_typed(fp8, 128, 6, 1, 128, false), cp_async8);
    }

    #[test]
    fn unsupported_names_the_nearest_instances() {
        let e = select(Arch::Host, &request(Operation::Backward, 300, 256)).unwrap_err();
        assert_eq!(e.status, crate::Status::Unsupported);
        assert!(
            e.message.contains("nearest compiled instances: fmha_bwd_d256x256_bf16_mask_deterministic"),
            "{}",
            e.message
        );
        let e = select(Arch::Other, &request(Operation::Forward, 64, 64)).unwrap_err();
        assert!(e.message.contains("no attention kernels"), "{}", e.message);
    }

    #[test]
    fn gpu_forward_instances_cover_dtypes_and_masks() {
        let list = gpu_instances(Arch::Gfx942, Operation::Forward, &HALF_DTYPES, &GFX942_FORWARD_TILES, "mfma_lds");
        assert_eq!(list.len(), 2 * 2 * GFX942_FORWARD_TILES.len());
        let i = list.iter().find(|i| i.dtype == CacheDtype::Half(Dtype::Bf16) && i.masked && i.hdim_q == 128).unwrap();
        assert_eq!((i.m0, i.n0, i.pipeline, i.vector_bytes), (128, 32, "mfma_lds", 16));
        assert_eq!(i.name(), "fmha_fwd_d128x128_bf16_mask_ndeterministic_b128x32_gfx942_mfma_lds");
    }

    #[test]
    fn amd_instances_refuse_input_rows_they_cannot_address() {
        let tensor = |row_stride| crate::problem::Tensor {
            ptr: crate::runtime::DeviceAddr(0),
            batch_stride: 0,
            head_stride: 0,
            row_stride,
        };
        let amd =
            &gpu_instances(Arch::Gfx950, Operation::Backward, &HALF_DTYPES, &GFX950_BACKWARD_TILES, "mfma_lds")[0];
        amd.check_input_rows("do", &tensor((1 << 24) - 8)).unwrap();
        let e = amd.check_input_rows("do", &tensor(1 << 24)).unwrap_err();
        assert_eq!(e.status, crate::Status::Unsupported);
        assert!(e.message.starts_with("do.row_stride: 16777216 elements; the gfx950"), "{}", e.message);
        let sm90 =
            &gpu_instances(Arch::Sm90, Operation::Forward, &HALF_DTYPES, &SM90_DENSE_FORWARD_TILES, "wgmma_ws_tma")[0];
        sm90.check_input_rows("q", &tensor(1 << 40)).unwrap();
    }

    #[test]
    fn gpu_instances_check_vector_strides_and_grids_naming_the_field() {
        use crate::problem::{Mode, Tensor};
        let sm90 =
            &gpu_instances(Arch::Sm90, Operation::Forward, &HALF_DTYPES, &SM90_DENSE_FORWARD_TILES, "wgmma_ws_tma")[0];
        let t = Tensor {
            ptr: crate::runtime::DeviceAddr(1 << 20),
            batch_stride: -12345,
            head_stride: 64,
            row_stride: 1024,
        };
        // Group mode ignores the batch stride; batch mode needs it in whole 16-byte vectors.
        sm90.check_tensor("q", &t, Mode::Group, 2).unwrap();
        let e = sm90.check_tensor("q", &t, Mode::Batch, 2).unwrap_err();
        assert_eq!(e.status, crate::Status::Unsupported);
        assert!(e.message.starts_with("q.batch_stride: -12345 is not a multiple of 8"), "{}", e.message);
        let e = sm90.check_tensor("k", &Tensor { head_stride: 3, ..t }, Mode::Group, 2).unwrap_err();
        assert!(e.message.starts_with("k.head_stride: 3"), "{}", e.message);
        sm90.check_grid(65535, 65535).unwrap();
        let e = sm90.check_grid(65536, 1).unwrap_err();
        assert!(e.status == crate::Status::Unsupported && e.message.starts_with("nhead_q: 65536"), "{}", e.message);
        assert!(sm90.check_grid(1, 1 << 31).unwrap_err().message.starts_with("batch"));
        let host = select(Arch::Host, &request(Operation::Forward, 64, 64)).unwrap();
        host.check_grid(1 << 40, 1 << 40).unwrap();
        host.check_tensor("q", &t, Mode::Batch, 2).unwrap();
    }

    #[test]
    fn sm90_backward_buckets_include_192_with_v_128() {
        let all = sm90_backward_instances();
        let backward = |hdim_q, hdim_v| {
            let i = smallest_fit(&all, &request(Operation::Backward, hdim_q, hdim_v)).unwrap();
            (i.hdim_q, i.hdim_v, i.m0, i.n0)
        };
        assert_eq!(backward(192, 128), (192, 128, 64, 64));
        assert_eq!(backward(136, 64), (192, 128, 64, 64));
        assert_eq!(backward(192, 136), (256, 256, 64, 64));
        assert_eq!(backward(120, 160), (256, 256, 64, 64));
        assert_eq!(backward(128, 128), (128, 128, 64, 128));
    }

    #[test]
    fn gpu_backward_instances_cover_both_dq_modes() {
        let list = sm90_backward_instances();
        assert_eq!(list.len(), 2 * 2 * 2 * (SM90_BACKWARD_TILES.len() + 1));
        assert_eq!(list.iter().filter(|i| i.deterministic).count(), list.len() / 2);
        let i = list
            .iter()
            .find(|i| i.dtype == CacheDtype::Half(Dtype::F16) && i.deterministic && i.hdim_q == 128)
            .unwrap();
        assert_eq!((i.m0, i.n0, i.vector_bytes), (64, 128, 16));
    }

    #[test]
    fn amd_backward_instances_cover_both_archs_and_dq_modes() {
        for (arch, tiles) in [(Arch::Gfx942, &GFX942_BACKWARD_TILES), (Arch::Gfx950, &GFX950_BACKWARD_TILES)] {
            let list = gpu_instances(arch, Operation::Backward, &HALF_DTYPES, tiles, "mfma_lds");
            assert_eq!(list.len(), 2 * 2 * 2 * tiles.len());
            assert_eq!(list.iter().filter(|i| i.deterministic).count(), list.len() / 2);
            // One 32x32 dQ block per wave of the four: m0 · hdim = 4 · 32 · 32; 32 keys per wave.
            assert!(list.iter().all(|i| i.m0 * i.hdim_q == 4 * 32 * 32 && i.n0 == 128 && i.vector_bytes == 16));
            let i = list
                .iter()
                .find(|i| i.dtype == CacheDtype::Half(Dtype::Bf16) && i.masked && i.deterministic && i.hdim_q == 64)
                .unwrap();
            assert_eq!(i.name(), format!("fmha_bwd_d64x64_bf16_mask_deterministic_b64x128_{}_mfma_lds", arch.name()));
        }
    }

    #[test]
    fn amd_kvcache_instances_are_the_forward_tiles_for_16_bit_inputs() {
        for (arch, tiles) in [(Arch::Gfx942, &GFX942_FORWARD_TILES), (Arch::Gfx950, &GFX950_FORWARD_TILES)] {
            let list = amd_instances(arch, tiles, &GFX942_BACKWARD_TILES);
            let paged: Vec<_> = list
                .iter()
                .filter(|i| i.operation == Operation::KvCache && matches!(i.dtype, CacheDtype::Half(_)))
                .collect();
            // Masked or not, packed GQA or not.
            assert_eq!(paged.len(), 2 * 2 * 2 * tiles.len());
            assert_eq!(paged.iter().filter(|i| i.packed_gqa).count(), 2 * 2 * tiles.len());
            for i in &paged {
                let forward = list
                    .iter()
                    .find(|f| {
                        f.operation == Operation::Forward
                            && f.dtype == i.dtype
                            && f.masked == i.masked
                            && f.hdim_q == i.hdim_q
                    })
                    .unwrap();
                assert_eq!((i.m0, i.n0, i.max_input_row_stride), (forward.m0, forward.n0, AMD_MAX_INPUT_ROW_STRIDE));
                assert_eq!(i.pipeline, if i.packed_gqa { "mfma_lds_paged_gqa" } else { "mfma_lds_paged" });
            }
        }
    }

    #[test]
    fn amd_fp8_is_the_architectures_own_format_at_128_dims() {
        for (arch, tiles, own, other) in [
            (Arch::Gfx942, &GFX942_FORWARD_TILES, Fp8Format::E4m3fnuz, Fp8Format::E4m3fn),
            (Arch::Gfx950, &GFX950_FORWARD_TILES, Fp8Format::E4m3fn, Fp8Format::E4m3fnuz),
        ] {
            let list = amd_instances(arch, tiles, &GFX942_BACKWARD_TILES);
            let fp8: Vec<_> = list.iter().filter(|i| matches!(i.dtype, CacheDtype::Fp8(_))).collect();
            // The dense forward masked or not; the kv-cache's also packed GQA or not.
            assert_eq!(fp8.len(), 6);
            assert_eq!(fp8.iter().filter(|i| i.operation == Operation::Forward).count(), 2);
            for i in fp8 {
                assert_ne!(i.operation, Operation::Backward);
                assert_eq!((i.dtype, i.hdim_q, i.hdim_v, i.m0, i.n0), (CacheDtype::Fp8(own), 128, 128, 128, 64));
                assert_eq!((i.hdim_multiple, i.vector_bytes), (16, 16));
            }
            assert!(!list.iter().any(|i| i.dtype == CacheDtype::Fp8(other)));
        }
    }

    #[test]
    fn json_lists_every_instance() {
        let list = instances(Arch::Host);
        let json = to_json(&list);
        assert_eq!(json.matches("\"name\"").count(), list.len());
        assert!(json.starts_with("[{") && json.ends_with("}]"));
    }
}
