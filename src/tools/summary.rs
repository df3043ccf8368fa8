//! Statistics of one trace for the `info` command: trace-info fields, event counts, times,
//! backtrace depth, location codes, packets and warnings, gathered in one streaming pass.

use crate::error::{Error, Result};
use crate::format::event::{AllocSource, Event, LocationCode};
use crate::format::info::TraceInfo;
use crate::format::location::IntMap;
use crate::reader::Reader;
use std::collections::HashSet;
use std::fmt;
use std::hash::BuildHasherDefault;
use std::io::Read;
use std::path::Path;

type IntSet<K> = HashSet<K, BuildHasherDefault<crate::format::location::IntHasher>>;

/// What `memtrace-merge info` reports about a trace.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Summary {
    /// The name the reader was given (the path for files).
    pub file: String,
    /// The trace_info event (sample rate, word size, executable, host, runtime params, pid,
    /// start time, context, format version, initial domain).
    pub info: TraceInfo,
    /// Allocations, promotes and collects (location events not included).
    pub events: u64,
    /// Allocations on the minor heap.
    pub minor_allocs: u64,
    /// Allocations directly on the major heap.
    pub major_allocs: u64,
    /// External allocations (outside the OCaml heap).
    pub external_allocs: u64,
    /// Promote events.
    pub promotes: u64,
    /// Collect events.
    pub collects: u64,
    /// Sum of the allocations' nsamples.
    pub samples: u64,
    /// Earliest and latest event time, in µs after `info.start_time` (None without events).
    /// In format 3 the file is not in time order across domains: these are min and max.
    pub first_event_us: Option<i64>,
    /// Latest event time, in µs after `info.start_time`.
    pub last_event_us: Option<i64>,
    /// Frames of the longest decoded backtrace.
    pub max_backtrace_length: u64,
    /// Distinct location codes appearing in backtraces.
    pub distinct_location_codes: u64,
    /// Location codes defined by location events.
    pub defined_location_codes: u64,
    /// Packets read, the trace-info packet included (skipped ones included too).
    pub packets: u64,
    /// Packets the reader skipped (wrong pid, out of sequence, truncated).
    pub skipped_packets: u64,
    /// Domains of the events read (sorted; `[0]` before format 3; the initial domain if none).
    pub domains: Vec<u16>,
    /// Bytes of the trace (bytes consumed by the reader; the file's size for files).
    pub file_size: u64,
    /// The reader's warnings, as text.
    pub warnings: Vec<String>,
    /// Warnings the reader counted but did not keep.
    pub warnings_dropped: u64,
}

impl Summary {
    /// Allocations of every source.
    pub fn allocs(&self) -> u64 {
        self.minor_allocs + self.major_allocs + self.external_allocs
    }
    /// Seconds from the trace's start to its last event.
    pub fn duration_s(&self) -> f64 {
        self.last_event_us.unwrap_or(0) as f64 / 1e6
    }
}

/// Tracks, per domain, the previous backtrace so only the frames that differ from it need
/// looking at (a backtrace usually shares most of its frames with the previous one).
#[derive(Default)]
pub(crate) struct NewFrames {
    prev: IntMap<u16, Vec<LocationCode>>,
}

impl NewFrames {
    /// The frames of `bt` not in the common prefix with the previous backtrace of `domain`.
    pub(crate) fn new_frames<'a>(
        &mut self,
        domain: u16,
        bt: &'a [LocationCode],
    ) -> &'a [LocationCode] {
        let prev = self.prev.entry(domain).or_default();
        let common = prev.iter().zip(bt).take_while(|(a, b)| a == b).count();
        prev.truncate(common);
        prev.extend_from_slice(&bt[common..]);
        &bt[common..]
    }
}

/// Read the whole trace and gather its statistics. Memory stays constant apart from the set
/// of distinct location codes (and the reader's own location table).
pub fn summarize<R: Read>(reader: &mut Reader<R>) -> Result<Summary> {
    let start = reader.info().start_time;
    let mut s = Summary {
        file: reader.name().to_string(),
        info: reader.info().clone(),
        events: 0,
        minor_allocs: 0,
        major_allocs: 0,
        external_allocs: 0,
        promotes: 0,
        collects: 0,
        samples: 0,
        first_event_us: None,
        last_event_us: None,
        max_backtrace_length: 0,
        distinct_location_codes: 0,
        defined_location_codes: 0,
        packets: 0,
        skipped_packets: 0,
        domains: Vec::new(),
        file_size: 0,
        warnings: Vec::new(),
        warnings_dropped: 0,
    };
    let mut codes: IntSet<LocationCode> = IntSet::default();
    let mut frames = NewFrames::default();
    let mut domains: Vec<u16> = vec![];
    let (mut tmin, mut tmax) = (i64::MAX, i64::MIN);
    while let Some(ev) = reader.next_event()? {
        s.events += 1;
        let t = ev.time().since(start);
        tmin = tmin.min(t);
        tmax = tmax.max(t);
        let d = ev.domain().0;
        if !domains.contains(&d) {
            domains.push(d);
        }
        match ev {
            Event::Alloc(a) => {
                match a.source {
                    AllocSource::Minor => s.minor_allocs += 1,
                    AllocSource::Major => s.major_allocs += 1,
                    AllocSource::External => s.external_allocs += 1,
                }
                s.samples += a.nsamples;
                s.max_backtrace_length = s.max_backtrace_length.max(a.backtrace.len() as u64);
                for &c in frames.new_frames(d, a.backtrace) {
                    codes.insert(c);
                }
            }
            Event::Promote { .. } => s.promotes += 1,
            Event::Collect { .. } => s.collects += 1,
        }
    }
    if s.events > 0 {
        s.first_event_us = Some(tmin);
        s.last_event_us = Some(tmax);
    }
    domains.sort_unstable();
    if domains.is_empty() {
        domains.push(reader.info().initial_domain.0);
    }
    s.domains = domains;
    s.distinct_location_codes = codes.len() as u64;
    s.defined_location_codes = reader.locations().len() as u64;
    let st = reader.stats();
    s.packets = 1 + st.packets;
    s.skipped_packets = st.skipped_packets;
    s.file_size = st.bytes;
    s.warnings = reader
        .take_warnings()
        .iter()
        .map(|w| w.to_string())
        .collect();
    s.warnings_dropped = reader.warnings_dropped();
    Ok(s)
}

/// [`summarize`] a file; `file_size` is the file's size on disk.
pub fn summarize_file(path: impl AsRef<Path>) -> Result<Summary> {
    let path = path.as_ref();
    let mut r = Reader::open(path)?;
    let mut s = summarize(&mut r)?;
    let meta = std::fs::metadata(path).map_err(|e| Error::input(path, "stat", e))?;
    s.file_size = meta.len();
    Ok(s)
}

/// `1234567` → `1,234,567`.
pub fn thousands(v: u64) -> String {
    let d = v.to_string();
    let mut out = String::with_capacity(d.len() + d.len() / 3);
    for (i, ch) in d.chars().enumerate() {
        if i > 0 && (d.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// A byte count in binary units: `1.6 MiB`, `30.0 KiB`, `812 B`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// A duration given in µs: `4.61 s`, `52.96 ms`, `291 µs`, `1 h 14 min`.
pub fn human_us(us: i64) -> String {
    let sign = if us < 0 { "-" } else { "" };
    let a = us.unsigned_abs();
    if a < 1000 {
        format!("{sign}{a} µs")
    } else if a < 1_000_000 {
        format!("{sign}{:.2} ms", a as f64 / 1e3)
    } else if a < 3_600_000_000 {
        format!("{sign}{:.2} s", a as f64 / 1e6)
    } else {
        let min = a / 60_000_000;
        format!("{sign}{} h {} min", min / 60, min % 60)
    }
}

/// Microseconds since the Unix epoch as `YYYY-MM-DD hh:mm:ss.uuuuuu UTC`.
pub fn utc_time(us: u64) -> String {
    let secs = us / 1_000_000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + (month <= 2) as i64;
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{:06} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        us % 1_000_000
    )
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

impl Summary {
    /// The trace info, as `(key, value)` lines.
    fn header_lines(&self) -> Vec<(&'static str, String)> {
        let i = &self.info;
        let per = if i.sample_rate > 0.0 && i.sample_rate.is_finite() {
            let words = (1.0 / i.sample_rate).round() as u64;
            format!(" (1 sample per {} words)", thousands(words))
        } else {
            String::new()
        };
        let size = human_bytes(self.file_size);
        vec![
            (
                "file",
                format!(
                    "{} ({size}, {} bytes)",
                    self.file,
                    thousands(self.file_size)
                ),
            ),
            ("format", format!("version {}", i.version)),
            ("executable", text(&i.executable_name)),
            ("host", text(&i.host_name)),
            ("pid", i.pid.to_string()),
            (
                "context",
                i.context.as_ref().map_or("(none)".to_string(), |c| text(c)),
            ),
            ("runtime params", text(&i.ocaml_runtime_params)),
            ("word size", format!("{} bits", i.word_size)),
            ("sample rate", format!("{}{per}", i.sample_rate)),
            (
                "start time",
                format!("{} µs ({})", i.start_time.0, utc_time(i.start_time.0)),
            ),
        ]
    }

    /// The statistics, as `(key, value)` lines.
    fn stats_lines(&self) -> Vec<(&'static str, String)> {
        let t = thousands;
        let mut v = match (self.first_event_us, self.last_event_us) {
            (Some(a), Some(b)) => vec![
                (
                    "first event",
                    format!("+{} µs ({})", t(a.max(0) as u64), human_us(a)),
                ),
                (
                    "last event",
                    format!("+{} µs ({})", t(b.max(0) as u64), human_us(b)),
                ),
            ],
            _ => vec![("events", "none".to_string())],
        };
        let allocs = format!(
            "{} (minor {}, major {}, external {})",
            t(self.allocs()),
            t(self.minor_allocs),
            t(self.major_allocs),
            t(self.external_allocs)
        );
        let codes = format!(
            "{} in backtraces, {} defined",
            t(self.distinct_location_codes),
            t(self.defined_location_codes)
        );
        let packets = format!(
            "{} (info packet included), {} skipped",
            t(self.packets),
            t(self.skipped_packets)
        );
        let doms: Vec<String> = self.domains.iter().map(|d| d.to_string()).collect();
        v.extend([
            ("events", t(self.events)),
            ("  allocs", allocs),
            ("  promotes", t(self.promotes)),
            ("  collects", t(self.collects)),
            ("  samples", t(self.samples)),
            (
                "max backtrace",
                format!("{} frames", t(self.max_backtrace_length)),
            ),
            ("location codes", codes),
            ("packets", packets),
            (
                "domains",
                format!("{} ({})", self.domains.len(), doms.join(", ")),
            ),
        ]);
        v
    }
}

impl fmt::Display for Summary {
    /// Aligned `key: value` lines for a person to read, then the warnings.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (k, v) in self.header_lines().into_iter().chain(self.stats_lines()) {
            writeln!(f, "{:<17} {v}", format!("{k}:"))?;
        }
        let nw = self.warnings.len() as u64 + self.warnings_dropped;
        if nw == 0 {
            return writeln!(f, "{:<17} none", "warnings:");
        }
        writeln!(f, "{:<17} {}", "warnings:", thousands(nw))?;
        for w in &self.warnings {
            writeln!(f, "  {w}")?;
        }
        if self.warnings_dropped > 0 {
            writeln!(f, "  ... and {} more", thousands(self.warnings_dropped))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1_667_379), "1,667,379");
        assert_eq!(human_bytes(812), "812 B");
        assert_eq!(human_bytes(1_667_379), "1.6 MiB");
        assert_eq!(human_us(291), "291 µs");
        assert_eq!(human_us(52_962), "52.96 ms");
        assert_eq!(human_us(4_613_517), "4.61 s");
        assert_eq!(utc_time(0), "1970-01-01 00:00:00.000000 UTC");
        assert_eq!(
            utc_time(951_782_400_000_001),
            "2000-02-29 00:00:00.000001 UTC"
        );
        assert_eq!(
            utc_time(1_586_965_711_174_340),
            "2020-04-15 15:48:31.174340 UTC"
        );
    }
}
