//! How a merge is made fast: inputs decoded ahead in batches on other threads, backtraces
//! encoded ahead in shares of the output cache, the output written on a thread of its own.
//! Never imports `merge`: its changes keep the bytes a merge writes.

pub mod batch;
pub mod decoder;
pub mod files;
pub(crate) mod fill;
pub mod output;
pub mod placement;
pub mod share;
