//! The deterministic backward's dQ scheme (`fmha_bwd_traits.dq_scheme`; `hip/bwd/dq_scheme.h` is the
//! kernels' side): the one a launcher runs, by request, device and shape.

use super::traits::BwdTraits;
use crate::abi_values::{abi_enum, FMHA_DQ_SCHEME_AUTO, FMHA_DQ_SCHEME_ORDERED, FMHA_DQ_SCHEME_SPLIT_SLOTS};
use crate::error::{Error, Result};
use crate::problem::Mode;
use crate::runtime::Arch;

abi_enum! {
    /// How a deterministic backward sums dQ (`FMHA_DQ_SCHEME_*`).
    pub enum DqScheme {
        /// The library's choice for the device and shape ([`runs_ordered`]).
        Auto = FMHA_DQ_SCHEME_AUTO => "auto",
        /// Per-workgroup split slots of the persistent schedule, summed by convert_dq (CK's).
        SplitSlots = FMHA_DQ_SCHEME_SPLIT_SLOTS => "split slots",
        /// One accumulator, its writers taking turns per q tile (FlashAttention-3's).
        Ordered = FMHA_DQ_SCHEME_ORDERED => "ordered",
    }
}

impl DqScheme {
    pub fn from_i64(value: i64, field: &str) -> Result<DqScheme> {
        i32::try_from(value)
            .ok()
            .and_then(DqScheme::parse)
            .ok_or_else(|| Error::invalid(field, format!("{value} is not a dQ scheme ({})", DqScheme::choices())))
    }
}

/// Batch-mode rows at D = 128 take the ordered scheme from this many keys on: at 512 keys its turns
/// cost more than the split slots (0.92-0.98× their speed, masked or not), at 1024 it gains 1-8 %.
const ORDERED_MIN_SEQLEN_K: i64 = 1024;

/// Whether a launcher of `traits` on `arch` runs the ordered scheme (`WorkspaceParams::ordered_dq`):
/// never outside deterministic mode; where asked, on the backends that have it (NVIDIA sm_90a, the
/// host); by default where it measured faster than the split slots. On an H200 (2026-11-27 18:07 and
/// 19:16 UTC, docs/perf.md) it costs 11-16 % at D = 64 against the split slots; at D = 128 it gains 7-8 %
/// unmasked and 8-13 % under a causal mask at 2k-8k keys, 1-8 % at 1k, loses 2-8 % at 512, and gains
/// 13-34 % in group mode; at D = 256 it runs 1.53-1.96× as fast (21:21 UTC). The host backend's default
/// is the split slots of the AMD kernels (CK's), as its tests assume.
pub fn runs_ordered(traits: &BwdTraits, arch: Arch) -> Result<bool> {
    if !traits.deterministic {
        return Ok(false);
    }
    match (traits.dq_scheme, arch) {
        (DqScheme::SplitSlots, _) => Ok(false),
        (DqScheme::Ordered, Arch::Host | Arch::Sm90) => Ok(true),
        (DqScheme::Ordered, arch) => Err(Error::unsupported(format!(
            "dq_scheme: no ordered dQ kernel for {} (its deterministic backward sums split slots: \
             FMHA_DQ_SCHEME_SPLIT_SLOTS or AUTO)",
            arch.name()
        ))),
        (DqScheme::Auto, Arch::Sm90) => Ok(ordered_pays(traits)),
        (DqScheme::Auto, _) => Ok(false),
    }
}

/// sm_90a's default (see [`runs_ordered`]). Past D = 128 the tile has 64 keys, twice the split slots' units
/// and slots: there split slots measured 1.90-2.48× the non-deterministic time, ordered 1.21-1.39× (H200,
/// 2026-11-27 21:21 UTC, S 2k-8k and varlen), and ordered was faster at S 512 too (21:33 UTC).
fn ordered_pays(traits: &BwdTraits) -> bool {
    let hdim = traits.hdim_q.max(traits.hdim_v);
    hdim > 128 || (hdim > 64 && (traits.mode == Mode::Group || traits.seqlen_k >= ORDERED_MIN_SEQLEN_K))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{BiasType, Dtype, MaskType};

    fn traits(hdim: i64, mask_type: MaskType, mode: Mode, seqlen_k: i64, dq_scheme: DqScheme) -> BwdTraits {
        BwdTraits {
            dtype: Dtype::Bf16,
            mode,
            mask_type,
            bias_type: BiasType::None,
            has_dbias: false,
            has_dropout: false,
            is_store_randval: false,
            deterministic: true,
            dq_scheme,
            batch: 2,
            seqlen_q: seqlen_k,
            seqlen_k,
            max_seqlen_q: 0,
            max_seqlen_k: 0,
            nhead_q: 8,
            nhead_k: 8,
            hdim_q: hdim,
            hdim_v: hdim,
        }
    }

    #[test]
    fn auto_takes_the_ordered_scheme_where_it_measured_faster_on_sm90() {
        let auto =
            |hdim, mask, mode, sk| runs_ordered(&traits(hdim, mask, mode, sk, DqScheme::Auto), Arch::Sm90).unwrap();
        assert!(auto(128, MaskType::BottomRight, Mode::Batch, 2048));
        assert!(auto(128, MaskType::None, Mode::Group, 2048));
        assert!(auto(128, MaskType::None, Mode::Batch, 8192));
        assert!(auto(96, MaskType::TopLeft, Mode::Batch, 1024));
        assert!(auto(128, MaskType::None, Mode::Batch, 1024));
        assert!(auto(128, MaskType::None, Mode::Group, 512));
        assert!(!auto(128, MaskType::None, Mode::Batch, 512));
        assert!(!auto(128, MaskType::BottomRight, Mode::Batch, 512));
        assert!(!auto(64, MaskType::BottomRight, Mode::Batch, 2048));
        assert!(!auto(64, MaskType::None, Mode::Group, 8192));
        assert!(auto(256, MaskType::None, Mode::Batch, 512));
        assert!(auto(192, MaskType::BottomRight, Mode::Batch, 128));
    }

    #[test]
    fn other_devices_default_to_split_slots_and_refuse_ordered_where_they_have_no_kernel() {
        let t = traits(128, MaskType::BottomRight, Mode::Group, 8192, DqScheme::Auto);
        for arch in [Arch::Host, Arch::Gfx942, Arch::Gfx950] {
            assert!(!runs_ordered(&t, arch).unwrap());
        }
        let ordered = BwdTraits { dq_scheme: DqScheme::Ordered, ..t };
        assert!(runs_ordered(&ordered, Arch::Host).unwrap());
        let e = runs_ordered(&ordered, Arch::Gfx942).unwrap_err();
        assert!(e.message.contains("dq_scheme") && e.message.contains("gfx942"), "{}", e.message);
        let split = BwdTraits { dq_scheme: DqScheme::SplitSlots, ..t };
        assert!(!runs_ordered(&split, Arch::Sm90).unwrap());
        // Non-deterministic runs have no scheme to take.
        let atomic = BwdTraits { deterministic: false, ..ordered };
        assert!(!runs_ordered(&atomic, Arch::Gfx950).unwrap());
    }
}
