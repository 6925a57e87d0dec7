//! fp8 descales (spec/inference.md §2.2): the true value of an element is its decoded code times the
//! descale of its (sequence, kv head) and, for a paged cache's K and V, of its physical page.

use crate::abi_values::{abi_enum, FMHA_KV_SCALE_PAGE, FMHA_KV_SCALE_TENSOR};
use crate::error::{ensure_field, Error, Result};
use crate::problem::{check_device_array, CacheDtype, Operand};
use crate::runtime::DevicePtr;

abi_enum! {
    /// What the K/V descales vary over (`FMHA_KV_SCALE_*`).
    pub enum ScaleGranularity {
        /// One value per tensor, or per (sequence, kv head) through the strides.
        Tensor = FMHA_KV_SCALE_TENSOR => "tensor",
        /// One value per (physical page, kv head): CK's KV block scale.
        Page = FMHA_KV_SCALE_PAGE => "page",
    }
}

impl ScaleGranularity {
    pub fn from_i32(value: i32) -> Result<ScaleGranularity> {
        ScaleGranularity::parse(value).ok_or_else(|| {
            Error::invalid(
                "kv_scale_granularity",
                format!("{value} is not a scale granularity ({})", ScaleGranularity::choices()),
            )
        })
    }
}

/// A descale array: the value for (sequence `b`, kv head `g`, page `p`) is
/// `data[b·batch_stride + g·head_stride + p·page_stride]`; a null `data` means 1.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Descale {
    pub data: DevicePtr<f32>,
    pub batch_stride: i64,
    pub head_stride: i64,
    pub page_stride: i64,
}

impl Descale {
    pub fn is_none(&self) -> bool {
        self.data.is_null()
    }

    /// Elements from `data` the descales of `batch` sequences, `heads` kv heads and `pages` pages
    /// span, after checking the strides (non-negative; a page stride only where pages are allowed)
    /// and the array's addressability; 0 when `data` is null.
    pub fn extent(&self, field: &str, batch: i64, heads: i64, pages: Option<i64>) -> Result<usize> {
        if self.is_none() {
            return Ok(0);
        }
        for (name, stride) in
            [("batch_stride", self.batch_stride), ("head_stride", self.head_stride), ("page_stride", self.page_stride)]
        {
            ensure_field(stride >= 0, || format!("{field}.{name}"), || format!("{stride} is negative"))?;
        }
        let pages = match pages {
            Some(pages) => pages,
            None => {
                ensure_field(
                    self.page_stride == 0,
                    || format!("{field}.page_stride"),
                    || {
                        "must be 0: per-page descales are a paged KV cache's K and V descales, with \
                     kv_scale_granularity = FMHA_KV_SCALE_PAGE"
                            .into()
                    },
                )?;
                1
            }
        };
        let last = [(batch, self.batch_stride), (heads, self.head_stride), (pages, self.page_stride)]
            .iter()
            .try_fold(0i64, |acc, &(n, stride)| (n.max(1) - 1).checked_mul(stride).and_then(|x| x.checked_add(acc)));
        let elements = last.and_then(|x| x.checked_add(1)).and_then(|x| usize::try_from(x).ok()).ok_or_else(|| {
            Error::invalid(&format!("{field}.data"), "the strides span more elements than the address space")
        })?;
        check_device_array(self.data, elements, &format!("{field}.data"))?;
        Ok(elements)
    }

    /// Element offset of the descale of (sequence, kv head, page).
    pub fn offset(&self, b: i64, g: i64, page: i64) -> usize {
        (b * self.batch_stride + g * self.head_stride + page * self.page_stride) as usize
    }
}

/// The descales of one call (a per-page descale has a page stride).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Descales {
    pub q: Descale,
    pub k: Descale,
    pub v: Descale,
}

impl Descales {
    /// Checks a call's descales against its input type and returns the elements each array spans (q,
    /// k, v): descales belong to fp8 inputs only; they vary over `batch` sequences and `heads` kv heads,
    /// and K's and V's also over `kv_pages` physical pages when given (per-page descales belong to the
    /// page, whichever sequence reads it: batch stride 0).
    pub fn extents(&self, dtype: CacheDtype, batch: i64, heads: i64, kv_pages: Option<i64>) -> Result<[usize; 3]> {
        let mut extents = [0; 3];
        for (i, (field, descale)) in
            [("q_descale", self.q), ("k_descale", self.k), ("v_descale", self.v)].iter().enumerate()
        {
            if !matches!(dtype, CacheDtype::Fp8(_)) {
                ensure_field(
                    descale.is_none(),
                    || format!("{field}.data"),
                    || format!("must be NULL: descales apply to fp8 inputs, and dtype is {}", dtype.name()),
                )?;
                continue;
            }
            let pages = if i > 0 { kv_pages } else { None };
            if pages.is_some() {
                ensure_field(
                    descale.batch_stride == 0,
                    || format!("{field}.batch_stride"),
                    || "must be 0: per-page descales belong to the physical page, whichever sequence reads it".into(),
                )?;
            }
            extents[i] = descale.extent(field, batch, heads, pages)?;
        }
        Ok(extents)
    }

    /// The three arrays as read-only operands of the overlap check (outputs may share no byte with
    /// them), from the element `extents` that [`Descales::extents`] returned.
    pub fn operands(&self, extents: [usize; 3]) -> [Operand<'static>; 3] {
        let operand = |field, descale: Descale, elements: usize| {
            let bytes = if descale.is_none() { 0 } else { elements * 4 };
            Operand::bytes(field, descale.data.addr(), bytes, false)
        };
        [
            operand("q_descale", self.q, extents[0]),
            operand("k_descale", self.k, extents[1]),
            operand("v_descale", self.v, extents[2]),
        ]
    }
}
