//! The analysis's live heap, peaks (bytes, time) and live bytes per site at them and at the end,
//! against a naive replay of the events memtrace's own dump tool printed (tests/data/**/*.dump*).
//!
//! The replay reads none of our code's output: a dump gives each event's time (µs after the
//! trace's start), object id and, for an allocation, its samples, kind and backtrace (caller
//! first); the `.info` beside it the rate, word size, start time and pid. It keeps a map
//! id -> (estimated bytes, allocation point) and, after all the events of a microsecond,
//! the live heap. The definitions it shares with the analysis (they are not what is tested):
//! * an allocation of n samples stands for round(n x (word bytes / rate)) bytes, rounded per
//!   allocation;
//! * the heap is taken after the last event of each microsecond holding an allocation or a
//!   collection (promotes change nothing); a peak is the first largest such heap; a process's
//!   own heap is taken at the microseconds of its own events;
//! * a site by function is the allocation point's function and file: the innermost location
//!   of the last frame, or of up to two frames above when a frame has no location (`$CODE`
//!   in a dump); none in three frames: `??` and the last frame's code in hex;
//! * with `from`/`to`: allocations of the window count; the heap as the window opens (what
//!   the events before `from` left, taken at `from`) is the first candidate peak of the run
//!   and of every process, then the heaps at the microseconds of its events; nothing after
//!   `to` is read, so `End` is the heap at `to`; every allocation the other filters keep is
//!   live until collected, in the window or not; a collection of an object left out (or
//!   never allocated) changes nothing.

mod common;

use common::{data_dir, open_reference_dump};
use memtrace_merge::analysis::{
    analyze, Analysis, AnalysisOptions, By, Filter, Frame, Mode, SiteRow, TimeSpec, Weight,
};
use memtrace_merge::{merge, AllocSource, MergeOptions};
use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// The fork scenario: a parent and the 4 children it forked, in this order.
const FORK: [&str; 5] = [
    "fork/parent",
    "fork/child-1",
    "fork/child-2",
    "fork/child-3",
    "fork/child-4",
];

/// Traces (in fewer events than this) whose heap the replay sums over every live object at
/// every microsecond; the others keep running sums (checked against whole sums at the peaks
/// and the end).
const BRUTE_EVENTS: usize = 60_000;

fn ctf(name: &str) -> PathBuf {
    data_dir().join(format!("{name}.ctf"))
}

// ---------------------------------------------------------------------------------------
// The reference files

/// The `.info` fields the replay needs (header fields, not computations under test).
#[derive(Clone, Debug)]
struct Info {
    rate: f64,
    word_bytes: f64,
    start_us: u64,
    pid: u64,
}

fn read_info(name: &str) -> Info {
    let path = data_dir().join(format!("{name}.info"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let field = |k: &str| -> &str {
        (text.lines())
            .find_map(|l| l.split_once('=').filter(|(key, _)| *key == k))
            .unwrap_or_else(|| panic!("{}: no {k}=", path.display()))
            .1
    };
    Info {
        rate: field("sample_rate").parse().unwrap(),
        word_bytes: field("word_size").parse::<f64>().unwrap() / 8.0,
        start_us: field("start_time_us").parse().unwrap(),
        pid: field("pid").parse().unwrap(),
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Alloc {
        nsamples: u64,
        source: AllocSource,
        /// Index in [`Dump::sites`].
        site: u32,
    },
    Promote,
    Collect,
}

#[derive(Clone, Copy, Debug)]
struct DumpEvent {
    /// µs after the trace's start.
    time: u64,
    id: u64,
    kind: Kind,
}

/// A reference dump, parsed.
struct Dump {
    events: Vec<DumpEvent>,
    /// Allocation points, as `By::Location` names them.
    sites: Vec<Frame>,
}

/// `defname@file:line:start-end`.
fn location(tok: &str) -> Frame {
    let at = tok
        .rfind('@')
        .unwrap_or_else(|| panic!("not a location: {tok}"));
    let mut rest = tok[at + 1..].rsplitn(3, ':');
    let (cols, line, file) = (rest.next(), rest.next(), rest.next());
    let (Some(cols), Some(line), Some(file)) = (cols, line, file) else {
        panic!("not a location: {tok}")
    };
    let (a, b) = cols.split_once('-').expect("start-end");
    Frame {
        function: tok[..at].to_string(),
        file: file.to_string(),
        line: line.parse().unwrap(),
        columns: (a.parse().unwrap(), b.parse().unwrap()),
    }
}

/// The allocation point of a backtrace given by its last (up to) 3 printed locations,
/// innermost first: the first that is a location (a `$CODE` is a frame of its own, without
/// one), else `??` named by the last frame's code (none: no backtrace at all).
fn allocation_point(last: &[&str]) -> (String, Frame) {
    if let Some(t) = last.iter().find(|t| !t.starts_with('$')) {
        return (t.to_string(), location(t));
    }
    let code = last.first().map_or(u64::MAX, |t| t[1..].parse().unwrap());
    let f = Frame {
        function: "??".into(),
        file: format!("#{code:x}"),
        line: 0,
        columns: (0, 0),
    };
    (format!("${code}"), f)
}

fn parse_dump(name: &str) -> Dump {
    let r = open_reference_dump(&ctf(name)).unwrap_or_else(|| panic!("{name}: no dump"));
    let mut r = std::io::BufReader::with_capacity(1 << 20, r);
    let mut events = Vec::new();
    let mut sites = Vec::new();
    let mut index: HashMap<String, u32> = HashMap::new();
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line).unwrap() == 0 {
            break;
        }
        let mut w = line.split_ascii_whitespace();
        let mut next = || {
            w.next()
                .unwrap_or_else(|| panic!("{name}: short line {line}"))
        };
        let time = next().parse().unwrap();
        let id = next().parse().unwrap();
        let kind = match next() {
            "promote" => Kind::Promote,
            "collect" => Kind::Collect,
            k => {
                let source = match k {
                    "alloc" => AllocSource::Minor,
                    "alloc_major" => AllocSource::Major,
                    "alloc_ext" => AllocSource::External,
                    _ => panic!("{name}: unknown event {k}"),
                };
                let nsamples = next().parse().unwrap();
                // (then len=, dom= in format 3, the common prefix `N:`, the locations)
                let is_prefix = |t: &str| {
                    t.strip_suffix(':')
                        .is_some_and(|n| n.parse::<u64>().is_ok())
                };
                let mut last = Vec::with_capacity(3);
                for t in w.by_ref().rev() {
                    if is_prefix(t) || last.len() == 3 {
                        break;
                    }
                    last.push(t);
                }
                let (key, frame) = allocation_point(&last);
                let site = *index.entry(key).or_insert_with(|| {
                    sites.push(frame);
                    sites.len() as u32 - 1
                });
                Kind::Alloc {
                    nsamples,
                    source,
                    site,
                }
            }
        };
        events.push(DumpEvent { time, id, kind });
    }
    Dump { events, sites }
}

/// A trace's reference files, parsed once per test binary.
struct Trace {
    name: &'static str,
    info: Info,
    dump: Dump,
}

/// Each trace's parsed files, filled by the first test that asks.
type Cache = Mutex<HashMap<&'static str, Arc<OnceLock<Arc<Trace>>>>>;

fn trace(name: &'static str) -> Arc<Trace> {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cell = (CACHE.get_or_init(Default::default).lock().unwrap())
        .entry(name)
        .or_default()
        .clone();
    cell.get_or_init(|| {
        let t = Trace {
            name,
            info: read_info(name),
            dump: parse_dump(name),
        };
        check_counts(&t);
        Arc::new(t)
    })
    .clone()
}

/// The parsed dump against the `.validate` counts (made by another tool, the reference
/// reader): the parser missed no line.
fn check_counts(t: &Trace) {
    let path = data_dir().join(format!("{}.validate", t.name));
    let text = std::fs::read_to_string(&path).unwrap();
    let field = |k: &str| -> u64 {
        (text.split_whitespace())
            .find_map(|w| w.strip_prefix(k)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("{}: no {k}=", path.display()))
            .parse()
            .unwrap()
    };
    let (mut allocs, mut promotes, mut collects, mut samples) = (0, 0, 0, 0);
    for e in &t.dump.events {
        match e.kind {
            Kind::Alloc { nsamples, .. } => {
                allocs += 1;
                samples += nsamples;
            }
            Kind::Promote => promotes += 1,
            Kind::Collect => collects += 1,
        }
    }
    let counts = (allocs, promotes, collects, samples);
    let expected = (
        field("allocs"),
        field("promotes"),
        field("collects"),
        field("samples"),
    );
    assert_eq!(counts, expected, "{}: dump vs .validate", t.name);
}

// ---------------------------------------------------------------------------------------
// The replay

/// What the replay counts: the analysis's filters, times in µs since the epoch.
#[derive(Clone, Copy, Debug, Default)]
struct Window {
    source: Option<AllocSource>,
    from: Option<u64>,
    to: Option<u64>,
}

impl Window {
    fn holds(&self, t: u64) -> bool {
        self.from.is_none_or(|f| t >= f) && self.to.is_none_or(|e| t <= e)
    }
}

/// Live (or allocated) bytes per (process, site).
type Sites = HashMap<(usize, u32), u64>;

/// The first largest heap and when (µs since the epoch).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Peak {
    bytes: u64,
    time: Option<u64>,
}

impl Peak {
    fn offer(&mut self, bytes: u64, time: u64) {
        if self.time.is_none() || bytes > self.bytes {
            *self = Peak {
                bytes,
                time: Some(time),
            };
        }
    }
}

/// What one replay found.
#[derive(Default)]
struct Replay {
    peak: Peak,
    own_peaks: Vec<Peak>,
    /// Per process: allocations, samples and bytes allocated in the window.
    allocated: Vec<(u64, u64, u64)>,
    allocated_sites: Sites,
    /// Live at the combined peak, at each process's own peak, at the end.
    at_peak: Sites,
    at_own_peak: Vec<Sites>,
    at_end: Sites,
    /// The whole heap as the window opens (before the events of its first microsecond).
    entering: Option<u64>,
    /// Microseconds at which the heap was taken.
    checkpoints: u64,
    /// Live at the end: allocated before, in and after the window.
    end_by_window: [u64; 3],
}

/// The events of `traces` in time order (µs since the epoch), each microsecond's allocations
/// before its collections (an object is never collected in its own microsecond in these
/// files; across domains an order is needed, and the analysis takes this one), otherwise in
/// file order: (time, process, event). Promotes are left out.
fn in_time_order<'a>(traces: &'a [&Trace]) -> Vec<(u64, usize, &'a DumpEvent)> {
    let mut v: Vec<(u64, usize, &DumpEvent)> = Vec::new();
    for (p, t) in traces.iter().enumerate() {
        for e in &t.dump.events {
            if !matches!(e.kind, Kind::Promote) {
                v.push((t.info.start_us + e.time, p, e));
            }
        }
    }
    v.sort_by_key(|&(t, _, e)| (t, matches!(e.kind, Kind::Collect)));
    v
}

/// The live objects: (process, id) -> (bytes, site, time allocated).
type Live = HashMap<(usize, u64), (u64, u32, u64)>;

/// Live bytes per (process, site), summed over the whole map of live objects.
fn group(live: &Live) -> Sites {
    let mut m = Sites::new();
    for (&(p, _), &(bytes, site, _)) in live {
        *m.entry((p, site)).or_default() += bytes;
    }
    m
}

fn sum(s: &Sites, process: Option<usize>) -> u64 {
    (s.iter())
        .filter(|((p, _), _)| process.is_none_or(|q| q == *p))
        .map(|(_, b)| b)
        .sum()
}

/// One pass over the events; `want`: the times after which to take the live sites.
fn pass(traces: &[&Trace], w: Window, want: &[u64]) -> (Replay, HashMap<u64, Sites>) {
    let events = in_time_order(traces);
    let brute = events.len() < BRUTE_EVENTS;
    let n = traces.len();
    let mut r = Replay {
        own_peaks: vec![Peak::default(); n],
        allocated: vec![(0, 0, 0); n],
        ..Replay::default()
    };
    let mut taken = HashMap::new();
    let mut live = Live::new();
    let (mut total, mut own) = (0u64, vec![0u64; n]);
    let mut i = 0;
    while i < events.len() {
        let now = events[i].0;
        if w.to.is_some_and(|t| now > t) {
            break;
        }
        if let Some(f) = w.from.filter(|&f| r.entering.is_none() && now >= f) {
            r.entering = Some(total);
            if i > 0 {
                r.checkpoints += 1;
                r.peak.offer(total, f);
                for (peak, &heap) in r.own_peaks.iter_mut().zip(&own) {
                    peak.offer(heap, f);
                }
                if want.contains(&f) {
                    taken.insert(f, group(&live));
                }
            }
        }
        let mut had_events = vec![false; n];
        while i < events.len() && events[i].0 == now {
            let (_, p, e) = events[i];
            i += 1;
            had_events[p] = true;
            match e.kind {
                Kind::Alloc {
                    nsamples,
                    source,
                    site,
                } => {
                    if w.source.is_some_and(|s| s != source) {
                        continue;
                    }
                    let info = &traces[p].info;
                    let bytes = (nsamples as f64 * (info.word_bytes / info.rate)).round() as u64;
                    if w.holds(now) {
                        let a = &mut r.allocated[p];
                        *a = (a.0 + 1, a.1 + nsamples, a.2 + bytes);
                        *r.allocated_sites.entry((p, site)).or_default() += bytes;
                    }
                    let before = live.insert((p, e.id), (bytes, site, now));
                    assert!(before.is_none(), "{}: id {} twice", traces[p].name, e.id);
                    total += bytes;
                    own[p] += bytes;
                }
                Kind::Collect => {
                    if let Some((bytes, ..)) = live.remove(&(p, e.id)) {
                        total -= bytes;
                        own[p] -= bytes;
                    }
                }
                Kind::Promote => unreachable!(),
            }
        }
        if w.holds(now) {
            r.checkpoints += 1;
            let whole = if brute {
                let s: u64 = live.values().map(|v| v.0).sum();
                assert_eq!(s, total);
                s
            } else {
                total
            };
            r.peak.offer(whole, now);
            for p in (0..n).filter(|&p| had_events[p]) {
                let heap = if brute {
                    (live.iter())
                        .filter(|(k, _)| k.0 == p)
                        .map(|(_, v)| v.0)
                        .sum()
                } else {
                    own[p]
                };
                r.own_peaks[p].offer(heap, now);
            }
        }
        if want.contains(&now) {
            // (an event at `from` itself: the heap entering the window was taken first)
            taken.entry(now).or_insert_with(|| group(&live));
        }
    }
    r.at_end = group(&live);
    for &(bytes, _, t) in live.values() {
        let i = if w.from.is_some_and(|f| t < f) {
            0
        } else if w.holds(t) {
            1
        } else {
            2
        };
        r.end_by_window[i] += bytes;
    }
    assert_eq!(sum(&r.at_end, None), total);
    (r, taken)
}

/// Replay `traces` together: a first pass finds the peaks, a second takes the live sites
/// at them.
fn replay(traces: &[&Trace], w: Window) -> Replay {
    let (mut r, _) = pass(traces, w, &[]);
    let want: Vec<u64> = (std::iter::once(r.peak))
        .chain(r.own_peaks.iter().copied())
        .filter_map(|p| p.time)
        .collect();
    let (again, mut taken) = pass(traces, w, &want);
    assert_eq!((again.peak, &again.own_peaks), (r.peak, &r.own_peaks));
    if let Some(t) = r.peak.time {
        r.at_peak = taken[&t].clone();
        assert_eq!(sum(&r.at_peak, None), r.peak.bytes);
    }
    for (p, peak) in r.own_peaks.iter().enumerate() {
        let at = match peak.time {
            Some(t) => (taken.entry(t).or_default().iter())
                .filter(|((q, _), _)| *q == p)
                .map(|(&k, &v)| (k, v))
                .collect(),
            None => Sites::new(),
        };
        assert_eq!(sum(&at, Some(p)), peak.bytes);
        r.at_own_peak.push(at);
    }
    r
}

// ---------------------------------------------------------------------------------------
// Comparing

/// A site table: its frames (one, or a backtrace caller first) -> bytes, zeros left out.
type Table = BTreeMap<Vec<Frame>, u64>;

/// The replay's sites named as `by` names them, summed (of `process` only, if given).
fn expected(traces: &[&Trace], s: &Sites, by: By, process: Option<usize>) -> Table {
    let mut t = Table::new();
    for (&(p, site), &bytes) in s {
        if process.is_some_and(|q| q != p) || bytes == 0 {
            continue;
        }
        let f = &traces[p].dump.sites[site as usize];
        let f = match by {
            By::Location => f.clone(),
            _ => Frame {
                line: 0,
                columns: (0, 0),
                ..f.clone()
            },
        };
        *t.entry(vec![f]).or_default() += bytes;
    }
    t
}

/// A table of `rows`, every site once.
fn to_table(rows: &[SiteRow], by: By) -> Table {
    let mut t = Table::new();
    for r in rows {
        assert!(
            by == By::Backtrace || r.frames.len() == 1,
            "{by:?}: {:?}",
            r.frames
        );
        let again = t.insert(r.frames.clone(), r.value);
        assert!(again.is_none(), "{by:?}: {:?} twice", r.frames);
    }
    t
}

/// The analysis's table of the run, and of each process.
fn tables(a: &Analysis, mode: Mode, by: By) -> (Table, Vec<Table>) {
    let top = a.top(mode, by, true);
    let each = top.process_sites.iter().map(|r| to_table(r, by)).collect();
    (to_table(&top.sites, by), each)
}

/// What a table's key is called in a report.
trait SiteName {
    fn site_name(&self) -> String;
}

impl SiteName for Vec<Frame> {
    /// Its frame, or a backtrace's last three.
    fn site_name(&self) -> String {
        let from = self.len().saturating_sub(3);
        let names: Vec<String> = self[from..].iter().map(|f| f.to_string()).collect();
        format!(
            "{}{}",
            if from > 0 { "... " } else { "" },
            names.join(" > ")
        )
    }
}

impl SiteName for String {
    /// A folded stack's last 200 characters.
    fn site_name(&self) -> String {
        let cut = self.char_indices().rev().nth(200).map_or(0, |(i, _)| i);
        format!("{}{}", if cut > 0 { "..." } else { "" }, &self[cut..])
    }
}

/// Folded stacks as a table.
fn folded_table(v: Vec<(String, u64)>) -> BTreeMap<String, u64> {
    let n = v.len();
    let t: BTreeMap<String, u64> = v.into_iter().collect();
    assert_eq!(t.len(), n, "a folded stack twice");
    t
}

/// Two tables equal, or a report of how they differ (at most 10 sites shown).
fn assert_tables<K: Ord + SiteName>(what: &str, got: &BTreeMap<K, u64>, want: &BTreeMap<K, u64>) {
    if got == want {
        return;
    }
    let mut diff = Vec::new();
    for f in got
        .keys()
        .chain(want.keys().filter(|f| !got.contains_key(*f)))
    {
        let (g, e) = (got.get(f).copied(), want.get(f).copied());
        if g != e {
            diff.push(format!("  {}: {g:?}, {e:?}", f.site_name()));
        }
    }
    let n = diff.len();
    diff.truncate(10);
    panic!(
        "{what}: {n} sites differ (got {} B in {} sites, expected {} B in {}):\n{}",
        got.values().sum::<u64>(),
        got.len(),
        want.values().sum::<u64>(),
        want.len(),
        diff.join("\n")
    );
}

fn secs(t: Option<u64>, start: u64) -> String {
    t.map_or("-".into(), |t| {
        format!("+{:.6} s", (t - start) as f64 / 1e6)
    })
}

/// The analysis of `traces` (those its filter keeps) against their replay:
/// totals, the combined and each process's peak, the end, and the Alloc/Peak/End tables by
/// function and by location, the run's and each process's (Peak: at its own peak).
fn check(what: &str, a: &Analysis, traces: &[&Trace], r: &Replay) {
    let start = traces.iter().map(|t| t.info.start_us).min().unwrap();
    check_from(what, a, traces, r, start)
}

/// [`check`], the times since `start` (the earliest start of all inputs, of those the
/// filter left out too).
fn check_from(what: &str, a: &Analysis, traces: &[&Trace], r: &Replay, start: u64) {
    let ps = a.processes();
    assert_eq!(ps.len(), traces.len(), "{what}: processes");
    for (p, (s, t)) in ps.iter().zip(traces).enumerate() {
        let w = format!("{what}: {}", t.name);
        assert_eq!((s.pid, s.sample_rate), (t.info.pid, t.info.rate), "{w}");
        let (allocations, samples, bytes) = r.allocated[p];
        assert_eq!(
            (s.allocations, s.samples, s.allocated_bytes),
            (allocations, samples, bytes),
            "{w}: allocations, samples, bytes"
        );
        let own = r.own_peaks[p];
        assert_eq!(
            (s.peak_bytes, s.peak_time_us),
            (own.bytes, own.time),
            "{w}: own peak (bytes, µs since the epoch: analysis at {}, replay at {})",
            secs(s.peak_time_us, t.info.start_us),
            secs(own.time, t.info.start_us),
        );
        assert_eq!(s.end_bytes, sum(&r.at_end, Some(p)), "{w}: end");
    }
    assert_eq!(a.start_us(), start, "{what}: start");
    let total = a.total();
    let alloc = |i: usize| r.allocated.iter().map(|a| [a.0, a.1, a.2][i]).sum::<u64>();
    assert_eq!(
        (total.allocations, total.samples, total.allocated_bytes),
        (alloc(0), alloc(1), alloc(2)),
        "{what}: allocations, samples, bytes"
    );
    assert_eq!(
        (total.peak_bytes, total.peak_time_us),
        (r.peak.bytes, r.peak.time),
        "{what}: peak (bytes, µs since the epoch: analysis at {}, replay at {})",
        secs(total.peak_time_us, start),
        secs(r.peak.time, start),
    );
    assert_eq!(total.end_bytes, sum(&r.at_end, None), "{what}: end");
    // (the timeline holds the window only: its largest values are the peaks)
    let tl = a.timeline();
    assert_eq!(
        tl.rows.iter().map(|row| row.0).max(),
        Some(r.peak.bytes),
        "{what}: the timeline's largest heap"
    );
    for (p, own) in r.own_peaks.iter().enumerate() {
        let most = tl.rows.iter().map(|row| row.1.get(p).copied().unwrap_or(0));
        assert_eq!(
            most.max(),
            Some(own.bytes),
            "{what}: {}'s largest heap in the timeline",
            traces[p].name
        );
    }
    for by in [By::Function, By::Location] {
        for (mode, s) in [
            (Mode::Alloc, &r.allocated_sites),
            (Mode::Peak, &r.at_peak),
            (Mode::End, &r.at_end),
        ] {
            let (run, each) = tables(a, mode, by);
            let what = format!("{what}: {mode:?} by {by:?}");
            assert_tables(&what, &run, &expected(traces, s, by, None));
            assert_eq!(each.len(), traces.len());
            for (p, got) in each.iter().enumerate() {
                // (a process's Peak table: at its own peak)
                let s = if mode == Mode::Peak {
                    &r.at_own_peak[p]
                } else {
                    s
                };
                let what = format!("{what}, {}", traces[p].name);
                assert_tables(&what, got, &expected(traces, s, by, Some(p)));
            }
        }
    }
    eprintln!(
        "{what}: peak {} B at {} (of {} heaps taken), end {} B, {} allocations, {} B allocated",
        r.peak.bytes,
        secs(r.peak.time, start),
        r.checkpoints,
        total.end_bytes,
        total.allocations,
        total.allocated_bytes
    );
}

// ---------------------------------------------------------------------------------------
// Single traces

fn check_single(name: &'static str) {
    let clock = Instant::now();
    let t = trace(name);
    let a = analyze(&[ctf(name)], &AnalysisOptions::default()).unwrap();
    let r = replay(&[&t], Window::default());
    check(name, &a, &[&t], &r);
    eprintln!("{name}: {:.2} s", clock.elapsed().as_secs_f64());
}

#[test]
fn external_agrees_with_a_replay_of_its_dump() {
    check_single("external");
}

#[test]
fn long_agrees_with_a_replay_of_its_dump() {
    check_single("long");
}

#[test]
fn bytecode_agrees_with_a_replay_of_its_dump() {
    check_single("bytecode");
}

#[test]
fn fork_traces_each_agree_with_a_replay_of_its_dump() {
    for name in FORK {
        check_single(name);
    }
}

/// Format 3, OCaml 5: one domain.
#[test]
fn ocaml5_domains_agrees_with_a_replay_of_its_dump() {
    check_single("ocaml5/domains");
}

/// Format 3, OCaml 5: five domains, their packets interleaved (the dump in file order),
/// some objects collected by another domain than their own.
#[test]
fn ocaml5_perdomain_agrees_with_a_replay_of_its_dump() {
    check_single("ocaml5/perdomain");
}

// ---------------------------------------------------------------------------------------
// The fork scenario: five processes at once, apart and merged

fn fork_traces() -> Vec<Arc<Trace>> {
    FORK.iter().map(|&n| trace(n)).collect()
}

fn fork_inputs() -> Vec<PathBuf> {
    FORK.iter().map(|n| ctf(n)).collect()
}

/// The five traces analysed together against their dumps replayed together, each aligned
/// on its own start time: the combined heap and its peak, each process's own peak, and the
/// sites at them.
#[test]
fn fork_traces_together_agree_with_a_replay_of_their_dumps() {
    let clock = Instant::now();
    let ts = fork_traces();
    let traces: Vec<&Trace> = ts.iter().map(|t| &**t).collect();
    let a = analyze(&fork_inputs(), &AnalysisOptions::default()).unwrap();
    let r = replay(&traces, Window::default());
    check("fork/ together", &a, &traces, &r);
    let start = a.start_us();
    for (p, t) in traces.iter().enumerate() {
        eprintln!(
            "  {}: own peak {} B at {}, {} B of it live at the combined peak",
            t.name,
            r.own_peaks[p].bytes,
            secs(r.own_peaks[p].time, start),
            sum(&r.at_peak, Some(p))
        );
    }
    // (the processes' heaps overlap in time: the combined peak is more than any one's)
    let largest = r.own_peaks.iter().map(|p| p.bytes).max().unwrap();
    assert!(r.peak.bytes > largest, "{} <= {largest}", r.peak.bytes);
    eprintln!("fork/ together: {:.2} s", clock.elapsed().as_secs_f64());
}

/// `inputs` merged into `dir`: nothing thinned (one rate), cut, skipped or warned about.
fn merged(inputs: &[PathBuf], dir: &std::path::Path, tag_processes: bool) -> PathBuf {
    let out = dir.join(if tag_processes {
        "tagged.ctf"
    } else {
        "merged.ctf"
    });
    let opts = MergeOptions {
        tag_processes,
        ..MergeOptions::default()
    };
    let report = merge(inputs, &out, &opts).unwrap();
    assert_eq!(
        report.warnings,
        0,
        "{}",
        memtrace_merge::format_warnings(&report)
    );
    assert_eq!(report.inputs.len(), inputs.len());
    for i in &report.inputs {
        let what = i.path.display();
        assert_eq!(i.keep_fraction, 1.0, "{what}");
        assert_eq!(
            (i.allocs_written, i.samples_written),
            (i.allocs, i.samples_read),
            "{what}"
        );
        assert_eq!(i.cut_backtraces, 0, "{what}");
        assert!(!i.skipped && !i.stopped_at_error, "{what}");
    }
    out
}

/// The five traces analysed apart, and merged into `dir` (with process tags or not).
fn apart_and_merged(dir: &std::path::Path, tag_processes: bool) -> (Analysis, Analysis) {
    let inputs = fork_inputs();
    let apart = analyze(&inputs, &AnalysisOptions::default()).unwrap();
    let out = merged(&inputs, dir, tag_processes);
    (apart, analyze(&[out], &AnalysisOptions::default()).unwrap())
}

/// Analysing the five traces, or a merge of them, gives the same answers: totals, the
/// combined peak (bytes and time), the end, the timeline of the combined heap, the
/// Alloc/Peak/End tables by function and by location (values and order), and the folded
/// stacks (bytes and samples) of each mode. (A merged trace is one
/// process: its own peak is the combined one, and what each process held at its own peak
/// is lost; the tagged merge below keeps what each held at the combined peak.)
#[test]
fn fork_merged_and_unmerged_agree() {
    let clock = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let (apart, one) = apart_and_merged(dir.path(), false);
    let (x, y) = (apart.total(), one.total());
    assert_eq!(
        (x.allocations, x.samples, x.allocated_bytes),
        (y.allocations, y.samples, y.allocated_bytes),
        "allocations, samples, bytes"
    );
    assert_eq!(
        (x.peak_bytes, x.peak_time_us, x.end_bytes, x.last_time_us),
        (y.peak_bytes, y.peak_time_us, y.end_bytes, y.last_time_us),
        "peak, its time, end, last event"
    );
    let p = one.processes();
    assert_eq!(p.len(), 1);
    assert_eq!(
        (p[0].peak_bytes, p[0].peak_time_us),
        (x.peak_bytes, x.peak_time_us)
    );
    assert_eq!(apart.start_us(), one.start_us(), "start");
    let heap = |a: &Analysis| -> Vec<u64> { a.timeline().rows.iter().map(|r| r.0).collect() };
    assert_eq!(heap(&apart), heap(&one), "the combined heap over time");
    for by in [By::Function, By::Location] {
        for mode in [Mode::Alloc, Mode::Peak, Mode::End] {
            let what = format!("{mode:?} by {by:?}, merged vs apart");
            let (a, b) = (one.top(mode, by, false), apart.top(mode, by, false));
            assert_tables(&what, &to_table(&a.sites, by), &to_table(&b.sites, by));
            // (and in the same order)
            let frames = |rows: &[SiteRow]| -> Vec<Vec<Frame>> {
                rows.iter().map(|r| r.frames.clone()).collect()
            };
            assert!(frames(&a.sites) == frames(&b.sites), "{what}: order");
        }
    }
    // Whole backtraces through folded stacks (their function names, caller first): a
    // By::Backtrace table of these traces takes seconds, child-1's being 3,825 frames deep.
    for mode in [Mode::Alloc, Mode::Peak, Mode::End] {
        for weight in [Weight::Bytes, Weight::Samples] {
            let what = format!("{mode:?} folded by {weight:?}, merged vs apart");
            let (a, b) = (
                one.folded(mode, weight, false),
                apart.folded(mode, weight, false),
            );
            assert_tables(&what, &folded_table(a), &folded_table(b));
        }
    }
    eprintln!(
        "fork/ merged: peak {} B at {}, end {} B, {} allocations: same as apart ({:.2} s)",
        y.peak_bytes,
        secs(y.peak_time_us, one.start_us()),
        y.end_bytes,
        y.allocations,
        clock.elapsed().as_secs_f64()
    );
}

/// A merge with `tag_processes` (a root frame naming each input's pid) keeps each process's
/// share: per pid, what it allocated and holds at the end as the analysis of the five
/// gives it, and what it held at the combined peak as the replay of the five dumps does;
/// without the root frame, the folded stacks of the five.
#[test]
fn fork_merged_with_process_tags_agrees_per_process() {
    let clock = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let (apart, tagged) = apart_and_merged(dir.path(), true);
    let ts = fork_traces();
    let traces: Vec<&Trace> = ts.iter().map(|t| &**t).collect();
    let r = replay(&traces, Window::default());
    let ps = apart.processes();
    for mode in [Mode::Alloc, Mode::Peak, Mode::End] {
        let mut per_pid: BTreeMap<u64, u64> = BTreeMap::new();
        let mut untagged = BTreeMap::new();
        for (stack, w) in tagged.folded(mode, Weight::Bytes, false) {
            let (root, rest) = stack.split_once(';').unwrap_or((&stack, ""));
            let pid = (root.strip_prefix("pid "))
                .and_then(|s| s.split(' ').next()?.parse().ok())
                .unwrap_or_else(|| panic!("{mode:?}: no process tag in {root}"));
            *per_pid.entry(pid).or_default() += w;
            *untagged.entry(rest.to_string()).or_default() += w;
        }
        let want: BTreeMap<u64, u64> = (ps.iter().enumerate())
            .map(|(p, s)| {
                let v = match mode {
                    Mode::Alloc => s.allocated_bytes,
                    Mode::End => s.end_bytes,
                    _ => sum(&r.at_peak, Some(p)),
                };
                (s.pid, v)
            })
            .filter(|(_, v)| *v > 0)
            .collect();
        assert_eq!(
            per_pid, want,
            "{mode:?}: per pid, tagged merge vs apart/replay"
        );
        let what = format!("{mode:?} folded, tagged merge without its tags vs apart");
        let apart_folded = folded_table(apart.folded(mode, Weight::Bytes, false));
        assert_tables(&what, &untagged, &apart_folded);
        eprintln!("fork/ tagged, {mode:?} per pid: {per_pid:?}");
    }
    eprintln!("fork/ tagged: {:.2} s", clock.elapsed().as_secs_f64());
}

// ---------------------------------------------------------------------------------------
// Filters

/// `--pid` of child-2 given all five traces, `--source major`, `--from 1.8 --to 2.8`
/// (seconds after the earliest start of all five, the parent's, which `--pid` does not
/// move): against the replay of child-2's dump with the same filters. Child-2 allocates
/// 300,000-word arrays in the major heap (several samples each).
#[test]
fn filtered_fork_child_agrees_with_a_replay_of_its_dump() {
    let clock = Instant::now();
    let t = trace("fork/child-2");
    let opts = AnalysisOptions {
        filter: Filter {
            pids: vec![t.info.pid],
            source: Some(AllocSource::Major),
            from: Some(TimeSpec::SinceStart(1.8)),
            to: Some(TimeSpec::SinceStart(2.8)),
            ..Filter::default()
        },
        ..AnalysisOptions::default()
    };
    let a = analyze(&fork_inputs(), &opts).unwrap();
    let start = (["parent", "child-1", "child-2", "child-3", "child-4"].iter())
        .map(|n| read_info(&format!("fork/{n}")).start_us)
        .min()
        .unwrap();
    assert!(start < t.info.start_us);
    let w = Window {
        source: Some(AllocSource::Major),
        from: Some(start + 1_800_000),
        to: Some(start + 2_800_000),
    };
    let r = replay(&[&t], w);
    // (the filters leave something to compare: major allocations in the window, a heap)
    assert!(r.allocated[0].0 > 0 && r.peak.bytes > 0);
    check_from("fork/child-2 filtered", &a, &[&t], &r, start);
    // (the timeline's first step holds the window's start)
    let tl = a.timeline();
    let first = tl.start_us + tl.first_step as u64 * tl.step_us;
    assert!(first <= start + 1_800_000 && start + 1_800_000 < first + tl.step_us);
    let entering = r.entering.unwrap();
    eprintln!(
        "  the heap entering the window: {entering} B (peak in it {} B at {}); {} B \
         allocated in it ({} allocations); live at the end, allocated before/in/after \
         it: {:?} B",
        r.peak.bytes,
        secs(r.peak.time, start),
        r.allocated[0].2,
        r.allocated[0].0,
        r.end_by_window
    );
    eprintln!("filtered: {:.2} s", clock.elapsed().as_secs_f64());
}

/// A window opening 1 µs after the peak of child-3's major heap (the replay finds it), so
/// that the heap entering the window is the largest in it, and whose first microsecond
/// holds only minor allocations (left out by `--source major`). One process: its peak and
/// the run's must be one, the replay's.
#[test]
fn window_opening_after_a_peak_gives_the_process_and_the_run_one_peak() {
    let name = "fork/child-3";
    let t = trace(name);
    let major = Window {
        source: Some(AllocSource::Major),
        ..Window::default()
    };
    let from = replay(&[&t], major).peak.time.unwrap() + 1;
    let w = Window {
        from: Some(from),
        ..major
    };
    let r = replay(&[&t], w);
    // (the premise: nothing in the window is above the heap entering it)
    assert!(r.entering.unwrap() >= r.peak.bytes);
    let opts = AnalysisOptions {
        filter: Filter {
            source: Some(AllocSource::Major),
            from: Some(TimeSpec::Absolute(from)),
            ..Filter::default()
        },
        ..AnalysisOptions::default()
    };
    let a = analyze(&[ctf(name)], &opts).unwrap();
    let (run, own) = (a.total(), a.processes().remove(0));
    let start = t.info.start_us;
    assert_eq!(
        (own.peak_bytes, own.peak_time_us),
        (run.peak_bytes, run.peak_time_us),
        "{name}: the process's peak (at {}) and the run's (at {})",
        secs(own.peak_time_us, start),
        secs(run.peak_time_us, start),
    );
    check(&format!("{name} after its major peak"), &a, &[&t], &r);
}
