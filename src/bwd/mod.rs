//! The backward operation, CK's launcher model: create(traits) → workspace_size →
//! prepare_workspace(seqstarts) → run(args, stream) → destroy. `run` enqueues dot_do_o → dq_dk_dv →
//! convert_dq (plus the dq_acc zeroing the workspace rule asks for) on the caller's stream.

pub mod args;
pub mod dq_scheme;
pub mod launcher;
pub mod prepare_async;
pub mod traits;

pub use args::BwdArgs;
pub use dq_scheme::DqScheme;
pub use launcher::BwdLauncher;
pub use prepare_async::PrepareMethod;
pub use traits::BwdTraits;
