//! Opaque handles (`fmha_bwd_launcher *`, `fmha_pinned_releaser *`) as checked ids, not addresses.
//!
//! A handle's value encodes a table tag, a slot index and the slot's generation; the object lives in
//! an `Arc` in the slot. Looking a handle up never dereferences the caller's value, so a destroyed,
//! doubly destroyed, foreign or garbage handle is an `FMHA_ERR_INVALID_ARGUMENT` naming the field, not
//! a use-after-free; and a call in flight holds its own `Arc`, so a concurrent destroy never frees an
//! object another thread is using (it goes when the last user returns).
//!
//! Bits of a handle value: 63..48 the table's tag, 47..24 the generation, 23..0 the slot index + 1
//! (never zero, so no handle is NULL). A slot's generation advances at every destroy; a stale handle
//! is recognised until the same slot has been reused 2^24 times.

use crate::error::{Error, Result};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

const INDEX_BITS: u32 = 24;
const GENERATION_BITS: u32 = 24;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;
const GENERATION_MASK: u64 = (1 << GENERATION_BITS) - 1;
const TAG_SHIFT: u32 = INDEX_BITS + GENERATION_BITS;

struct Slot<T> {
    generation: u64,
    object: Option<Arc<T>>,
}

struct Slots<T> {
    slots: Vec<Slot<T>>,
    free: Vec<usize>,
}

/// The live objects of one handle type.
pub(crate) struct HandleTable<T> {
    /// Distinguishes the tables, so that one type's handle passed as another's is refused.
    tag: u16,
    /// What the C API calls such a handle, for messages (`"fmha_bwd_launcher"`).
    kind: &'static str,
    slots: RwLock<Slots<T>>,
}

impl<T> HandleTable<T> {
    pub(crate) const fn new(tag: u16, kind: &'static str) -> HandleTable<T> {
        HandleTable { tag, kind, slots: RwLock::new(Slots { slots: Vec::new(), free: Vec::new() }) }
    }

    // Critical sections only move `Arc`s in and out of slots: a poisoned lock holds consistent data.
    fn read(&self) -> RwLockReadGuard<'_, Slots<T>> {
        self.slots.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Slots<T>> {
        self.slots.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores `object` and returns its handle value.
    pub(crate) fn insert(&self, object: T) -> Result<usize> {
        let mut table = self.write();
        let index = match table.free.pop() {
            Some(index) => index,
            None => {
                if table.slots.len() as u64 >= INDEX_MASK {
                    return Err(Error::new(
                        crate::Status::OutOfMemory,
                        format!("{}: {} handles are alive, the most there can be", self.kind, INDEX_MASK),
                    ));
                }
                table.slots.push(Slot { generation: 0, object: None });
                table.slots.len() - 1
            }
        };
        let slot = &mut table.slots[index];
        slot.object = Some(Arc::new(object));
        Ok(self.encode(index, slot.generation))
    }

    fn encode(&self, index: usize, generation: u64) -> usize {
        let value = (u64::from(self.tag) << TAG_SHIFT) | (generation << INDEX_BITS) | (index as u64 + 1);
        value as usize
    }

    /// The slot index of `handle` if it is one of this table's values (not necessarily alive).
    fn decode(&self, handle: usize) -> Option<(usize, u64)> {
        let value = handle as u64;
        let index = value & INDEX_MASK;
        if value >> TAG_SHIFT != u64::from(self.tag) || index == 0 {
            return None;
        }
        Some(((index - 1) as usize, (value >> INDEX_BITS) & GENERATION_MASK))
    }

    fn refuse(&self, field: &str, handle: usize) -> Error {
        Error::invalid(
            field,
            format!(
                "{handle:#x} is not a live {} handle (it was destroyed, or did not come from {}_create)",
                self.kind, self.kind
            ),
        )
    }

    /// The object behind a live handle, kept alive for as long as the caller holds the `Arc`.
    pub(crate) fn get(&self, handle: usize, field: &str) -> Result<Arc<T>> {
        if handle == 0 {
            return Err(Error::null(field));
        }
        let (index, generation) = self.decode(handle).ok_or_else(|| self.refuse(field, handle))?;
        let table = self.read();
        match table.slots.get(index) {
            Some(Slot { generation: g, object: Some(object) }) if *g == generation => Ok(Arc::clone(object)),
            _ => Err(self.refuse(field, handle)),
        }
    }

    /// Removes a live handle and returns its object; the handle (and any copy of it) is dead from now.
    pub(crate) fn remove(&self, handle: usize, field: &str) -> Result<Arc<T>> {
        let (index, generation) = self.decode(handle).ok_or_else(|| self.refuse(field, handle))?;
        let mut table = self.write();
        let object = match table.slots.get_mut(index) {
            Some(slot) if slot.generation == generation && slot.object.is_some() => {
                slot.generation = (slot.generation + 1) & GENERATION_MASK;
                slot.object.take()
            }
            _ => None,
        };
        let object = object.ok_or_else(|| self.refuse(field, handle))?;
        table.free.push(index);
        Ok(object)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn stale_foreign_and_garbage_handles_are_refused() {
        let table = HandleTable::<String>::new(0x7A01, "fmha_test");
        let other = HandleTable::<String>::new(0x7A02, "fmha_other");
        let a = table.insert("a".into()).unwrap();
        assert_eq!(*table.get(a, "h").unwrap(), "a");
        assert_ne!(a, 0);
        // Another table's handle with the same slot and generation.
        let b = other.insert("b".into()).unwrap();
        assert!(table.get(b, "h").unwrap_err().message.contains("not a live fmha_test handle"));
        for garbage in [1usize, 0x1234, usize::MAX, a ^ (1 << 30), a + 1] {
            let e = table.get(garbage, "launcher").unwrap_err();
            assert_eq!(e.status, crate::Status::InvalidArgument, "{garbage:#x}");
            assert!(e.message.starts_with("launcher"), "{}", e.message);
        }
        assert_eq!(table.get(0, "launcher").unwrap_err().status, crate::Status::NullPointer);
        // Destroy, destroy again, use after destroy; the slot's reuse gets a new handle value.
        assert_eq!(*table.remove(a, "h").unwrap(), "a");
        assert!(table.remove(a, "h").is_err());
        assert!(table.get(a, "h").is_err());
        let c = table.insert("c".into()).unwrap();
        assert_ne!(c, a);
        assert!(table.get(a, "h").is_err());
        assert_eq!(*table.get(c, "h").unwrap(), "c");
    }

    #[test]
    fn an_object_in_use_outlives_its_destroy() {
        struct Counted(Arc<AtomicUsize>);
        impl Drop for Counted {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let drops = Arc::new(AtomicUsize::new(0));
        let table = HandleTable::<Counted>::new(0x7A03, "fmha_test");
        let h = table.insert(Counted(Arc::clone(&drops))).unwrap();
        let in_use = table.get(h, "h").unwrap();
        drop(table.remove(h, "h").unwrap());
        assert_eq!(drops.load(Ordering::SeqCst), 0, "freed while a call still used it");
        drop(in_use);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn sixteen_threads_create_use_and_destroy() {
        let table = Arc::new(HandleTable::<usize>::new(0x7A04, "fmha_test"));
        std::thread::scope(|scope| {
            for t in 0..16usize {
                let table = Arc::clone(&table);
                scope.spawn(move || {
                    for i in 0..2000usize {
                        let h = table.insert(t * 10_000 + i).unwrap();
                        assert_eq!(*table.get(h, "h").unwrap(), t * 10_000 + i);
                        table.remove(h, "h").unwrap();
                        assert!(table.get(h, "h").is_err());
                    }
                });
            }
        });
        assert_eq!(table.read().free.len(), table.read().slots.len());
    }
}
