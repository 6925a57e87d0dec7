//! The host backend's kernels: the same algorithms as `hip/`, as tile loops over the same kernel
//! arguments, workspace bytes and schedule, run on stream worker threads.

pub mod backward;
pub mod fill;
pub mod forward;
pub mod grid;
pub mod sequence;
pub mod tensor_view;
pub mod tile_math;
