//! Fills a buffer with one 32-bit value (the host twin of `hip/common/fill.hip`).

use crate::runtime::host::DeviceSlice;

pub fn fill_u32(out: DeviceSlice<u32>, value: u32) {
    const CHUNK: usize = 4096;
    let block = [value; CHUNK];
    let mut start = 0;
    while start < out.len() {
        let n = CHUNK.min(out.len() - start);
        out.write_from(start, &block[..n]);
        start += n;
    }
}
