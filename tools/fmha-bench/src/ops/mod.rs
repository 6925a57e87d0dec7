//! One benchmark per operation, each through the C ABI: build the case's buffers, name the plan,
//! enqueue one call, verify.

mod dense;
mod kvcache;

use crate::device::check;
use crate::matrix::{Case, Op};
use crate::verify::Verdict;
use anyhow::Result;
use fmha::ffi::status::fmha_status;
use fmha::test_rng::Rng;
use std::ffi::c_char;

/// Arithmetic and memory traffic of one call (the report's TFLOPS and GB/s).
pub struct Work {
    pub flops: f64,
    pub bytes: f64,
}

pub trait Bench {
    /// What one call launches (`fmha_*_plan_json`).
    fn plan_json(&self) -> Result<String>;
    /// Enqueues one call on the default stream.
    fn launch(&mut self) -> Result<()>;
    fn work(&self) -> Work;
    /// Poisons the outputs, runs one call, and checks it against the float64 reference.
    fn verify(&mut self) -> Result<Verdict>;
}

/// Builds the case's benchmark; an error is what the library said (e.g. FMHA_ERR_UNSUPPORTED).
pub fn create(case: &Case, rng: &mut Rng) -> Result<Box<dyn Bench>> {
    Ok(match case.op {
        Op::Fwd => Box::new(dense::Forward::new(case, rng)?),
        Op::Bwd => Box::new(dense::Backward::new(case, rng)?),
        Op::Kvcache => Box::new(kvcache::KvCache::new(case, rng)?),
    })
}

/// The text of an `fmha_*_json` call (length first, then the text).
pub fn json_out(call: impl Fn(*mut c_char, usize, *mut usize) -> fmha_status, what: &str) -> Result<String> {
    let mut required = 0usize;
    check(call(std::ptr::null_mut(), 0, &mut required), what)?;
    let mut buffer = vec![0u8; required + 1];
    check(call(buffer.as_mut_ptr() as *mut c_char, buffer.len(), &mut required), what)?;
    buffer.truncate(required);
    Ok(String::from_utf8(buffer)?)
}
