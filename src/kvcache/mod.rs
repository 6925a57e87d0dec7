//! The kv-cache operation (spec/inference.md §1, §2): queries against each sequence's tokens in a
//! paged cache, one launcher for prefill, chunked prefill and split-KV decode — create(traits) → workspace_size →
//! prepare_async(args) (checks the lengths and tables on the stream, recording the first fault) →
//! run(args, stream) → check (reports what the prepare found) → destroy.

pub mod args;
pub mod launcher;
pub mod traits;
pub mod workspace;

pub use args::KvCacheArgs;
pub use launcher::KvCacheLauncher;
pub use traits::{KvCacheTraits, MAX_SPLITS};
