//! Fills a buffer with one 32-bit value (the host twin of `hip/common/fill.hip`).

use crate::runtime::host::DeviceSlice;

pub fn fill_u32(out: DeviceSlice<u32>, value: u32) {
    out.fill(0, out.len(), value);
}
