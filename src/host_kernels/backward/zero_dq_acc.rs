//! Zeroes the dq_acc elements this call accumulates into, before dq_dk_dv (dq_acc is accumulated
//! with adds, so every call needs a clean slate). In deterministic group mode only the used prefix
//! `offsets[batch]` is zeroed (CK's DqAccPrezeroKernel), elsewhere the whole reserved region, which
//! is exactly what those modes use.

use super::BwdContext;
use crate::error::Result;
use crate::problem::Element;

pub fn run<E: Element>(c: &BwdContext<E>) -> Result<()> {
    let layout = &c.kargs.layout;
    let elements = if layout.needs_zero_dq_acc() {
        layout.upper_bound_dq_acc_bytes() / 4
    } else {
        layout.zero_dq_acc_elements(&c.metadata()?)
    };
    const CHUNK: usize = 4096;
    let zeros = [0f32; CHUNK];
    let mut start = 0;
    while start < elements {
        let n = CHUNK.min(elements - start);
        c.dq_acc.write_from(start, &zeros[..n]);
        start += n;
    }
    Ok(())
}
