//! The forward operation: traits (dispatch key), args, validation into kernel arguments, launch.

pub mod args;
pub mod kargs;
pub mod launcher;
pub mod traits;

pub use args::FwdArgs;
pub use kargs::FwdKargs;
pub use launcher::run;
pub use traits::FwdTraits;
