//! pyctl's core: pure, deterministic functions of their inputs. No I/O, no clocks, no panics on
//! any input; errors are `CoreError`s naming the offending field, raised in Python as
//! `ValueError`. The Python bindings (feature `python`) live in `python/` and only convert.

pub mod bitmask;
pub mod compaction;
pub mod error;
pub mod fragment;
pub mod mig;
pub mod placement;
pub mod replay;
pub mod topology;

#[cfg(feature = "python")]
mod python;
