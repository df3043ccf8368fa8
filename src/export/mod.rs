//! An analysis in other tools' formats: interactive SVG flame graphs (drawn by inferno),
//! pprof profiles (prost messages, gzipped), an HTML report (maud). Each crate is used here only.

pub mod flamegraph;
pub mod pprof;
pub mod report;

use crate::analysis::{Analysis, Mode};
use pprof::{LabelValue, ProfileBuilder};

/// The pprof profile of an analysis: every stack of every process with its allocated
/// objects and bytes, and its objects and bytes in use at `mode` (the run's peak, the end
/// or `--at`; [`Mode::Alloc`] takes the end), labelled with its process's `pid` and
/// `executable`, its `domain` and allocation `source`. `inuse_space` is the default.
pub fn pprof_profile(a: &Analysis, mode: Mode) -> ProfileBuilder {
    let mut b = ProfileBuilder::new(
        &[
            ("alloc_objects", "count"),
            ("alloc_space", "bytes"),
            ("inuse_objects", "count"),
            ("inuse_space", "bytes"),
        ],
        "inuse_space",
    );
    let t = a.total();
    let ps = a.processes();
    // (the profile's time is what was read: from the window's start, or the first process
    // kept, to the last event read)
    let start = a.window_us().0.map_or(t.start_us, |f| f.max(t.start_us));
    let end = t.last_time_us.unwrap_or(start).max(start);
    b.set_time(
        (start as i64).saturating_mul(1000),
        ((end - start) as i64).saturating_mul(1000),
    );
    let at = a.at_us().map_or(0, |t| t.saturating_sub(a.start_us()));
    b.add_comment(&format!(
        "memtrace-merge: {} process(es); in use = {}",
        ps.len(),
        match mode {
            Mode::Peak => "at the peak of the run".to_string(),
            Mode::At => format!("at +{:.6} s", at as f64 / 1e6),
            Mode::End | Mode::Alloc => "at the end".to_string(),
        }
    ));
    for s in a.stacks(mode) {
        let p = &ps[s.process];
        let stack: Vec<&[crate::analysis::Frame]> = s.frames.iter().map(|f| &f[..]).collect();
        let source = match s.source {
            crate::AllocSource::Minor => "minor",
            crate::AllocSource::Major => "major",
            crate::AllocSource::External => "external",
        };
        b.add_sample(
            &stack,
            &[
                s.allocated_objects.round() as i64,
                s.allocated_bytes as i64,
                s.live_objects.round() as i64,
                s.live_bytes as i64,
            ],
            &[
                ("pid", LabelValue::Num(p.pid as i64)),
                ("executable", LabelValue::Str(p.executable.clone())),
                ("domain", LabelValue::Num(s.domain.into())),
                ("source", LabelValue::Str(source.into())),
            ],
        );
    }
    b
}
