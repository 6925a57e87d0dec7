//! Host buffers whose size comes from caller input (batch counts, metadata regions): allocated
//! fallibly, so that an absurd size is `FMHA_ERR_OUT_OF_MEMORY` naming the field rather than an abort.
//! (Where the system overcommits memory an allocation can succeed and fail only when touched: the
//! sizes themselves are bounded where they are computed, e.g. `workspace::MAX_METADATA_BYTES`.)

use crate::error::{Error, Result, Status};

/// The start alignment of [`AlignedBytes`]: the workspace's metadata sections are read as 16-byte
/// aligned structs (`workspace::SECTION_ALIGNMENT`).
pub const ALIGNMENT: usize = 16;

/// `len` copies of `value`, or `OutOfMemory` naming `field`.
pub fn try_filled<T: Clone>(len: usize, value: T, field: &str) -> Result<Vec<T>> {
    let mut vec = Vec::new();
    vec.try_reserve_exact(len).map_err(|_| out_of_memory::<T>(len, field))?;
    vec.resize(len, value);
    Ok(vec)
}

fn out_of_memory<T>(len: usize, field: &str) -> Error {
    Error::new(
        Status::OutOfMemory,
        format!("{field}: cannot allocate {len} host elements of {} bytes for it", std::mem::size_of::<T>()),
    )
}

/// A byte buffer whose start is [`ALIGNMENT`]-aligned, filled with one byte value.
pub struct AlignedBytes {
    storage: Vec<u8>,
    offset: usize,
    len: usize,
}

impl AlignedBytes {
    pub fn new(len: usize, fill: u8, field: &str) -> Result<AlignedBytes> {
        let padded = len.checked_add(ALIGNMENT).ok_or_else(|| out_of_memory::<u8>(len, field))?;
        let storage = try_filled(padded, fill, field)?;
        let offset = storage.as_ptr().align_offset(ALIGNMENT);
        Ok(AlignedBytes { storage, offset, len })
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.storage[self.offset..self.offset + self.len]
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.offset..self.offset + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absurd_sizes_are_out_of_memory_naming_the_field() {
        let e = try_filled(usize::MAX / 2, 0u64, "batch").unwrap_err();
        assert_eq!(e.status, Status::OutOfMemory);
        assert!(e.message.starts_with("batch"), "{}", e.message);
        let e = AlignedBytes::new(usize::MAX - 4, 0, "metadata").err().unwrap();
        assert_eq!(e.status, Status::OutOfMemory);
    }

    #[test]
    fn aligned_bytes_are_aligned_and_filled() {
        for len in [0, 1, 15, 16, 4097] {
            let mut b = AlignedBytes::new(len, 0xA5, "x").unwrap();
            assert_eq!(b.as_slice().as_ptr() as usize % ALIGNMENT, 0);
            assert_eq!(b.as_mut_slice().len(), len);
            assert!(b.as_slice().iter().all(|&x| x == 0xA5));
        }
    }
}
