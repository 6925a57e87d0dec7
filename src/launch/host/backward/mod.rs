//! The backward on the host: dot_do_o → (dq_acc zeroing) → dq_dk_dv → convert_dq, consuming the same
//! kernel arguments, workspace bytes and schedule as the GPU kernels.

pub mod context;
pub mod convert_dq;
pub mod dot_do_o;
pub mod dq_dk_dv;
pub mod zero_dq_acc;

pub use context::BwdContext;
