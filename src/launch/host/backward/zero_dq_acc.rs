//! Zeroes the dq_acc elements this call adds into without writing them first, before dq_dk_dv: the
//! whole reserved region in non-deterministic mode (exactly what it uses); in deterministic group
//! mode the used prefix `offsets[batch]` (CK's DqAccPrezeroKernel), for slots a head leaves unused;
//! nothing in deterministic batch mode (`WorkspaceLayout::needs_zero_dq_acc`).

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
    c.dq_acc.fill(0, elements, 0.0);
    Ok(())
}
