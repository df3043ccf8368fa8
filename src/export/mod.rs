//! An analysis in other tools' formats: interactive SVG flame graphs (drawn by inferno) and
//! pprof profiles (prost messages, gzipped). Each crate is used here only.

pub mod flamegraph;
pub mod pprof;
