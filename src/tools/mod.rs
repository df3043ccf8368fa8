//! The tools built on the reader and writer, each a library function that returns a report:
//! [`dump`], [`summary`] (info), [`check`], [`compare`], [`copy`].

pub mod check;
pub mod compare;
pub mod copy;
pub mod dump;
pub mod summary;
