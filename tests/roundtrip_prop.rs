//! Property round-trips: random event streams written with `Writer` (formats 2 and 3,
//! lossless and reference-budget modes) and read back with `Reader` give back every event
//! (time, domain, id, length, nsamples, source, backtrace) and the locations of every frame.
//!
//! Streams come from a seeded generator (proptest picks the seed and the shape; shrinking the
//! event count shrinks a failure to a shortest failing prefix): allocations of lengths 0 to
//! 1,000,000 (many 1..=16 for short allocs), 1-1000 samples, all three sources; backtraces
//! from a pool of codes (sometimes more than the 16,384-entry cache holds) through stack
//! templates with recursion, sharing prefixes with the previous backtrace of their domain,
//! 0-300 deep and, in lossless mode, sometimes 2000-2800 fresh frames deep; promotes and
//! collects of live objects; time gaps of 0 to over 2^25 us; up to 4 domains in format 3.
//! Each code has its own location list (some empty, some inlined, some long names, a few
//! oversized or out of range to exercise the `<unknown>` substitution and the clamps).

mod common;
#[path = "support/splitmix.rs"]
mod splitmix;
use memtrace_merge::AllocHeader;

use memtrace_merge::Location;
use memtrace_merge::{
    AllocSource, DomainId, Event, LocationCode, LocationList, ObjId, Reader, Timestamp, TraceInfo,
    Writer, WriterOptions,
};
use proptest::prelude::*;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

// ---- a small deterministic PRNG ---------------------------------------------------------

#[derive(Clone)]
struct Rng(splitmix::SplitMix);

impl Rng {
    fn next(&mut self) -> u64 {
        // SplitMix64: the library's own generator
        self.0.next_u64()
    }
    /// Uniform in 0..n (n > 0).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// Uniform in lo..=hi.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
    /// True with probability `percent`/100.
    fn pct(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

// ---- what to generate ---------------------------------------------------------------------

#[derive(Clone, Debug)]
struct Params {
    seed: u64,
    events: usize,
    /// Distinct location codes available.
    pool: usize,
    version: u16,
    lossless: bool,
    /// Domains used (format 3; 1 for format 2).
    domains: usize,
    /// Include 2000-2800 frame fresh backtraces (lossless mode only).
    deep: bool,
    /// Include gaps over 30 s and over 2^25 us.
    big_gaps: bool,
    /// Format 3: flush a domain's packet when switching domains, as the reference's
    /// multiplexed writer does (else each domain keeps its packet open until full, and only
    /// each domain's own order is kept in the file).
    flush_on_switch: bool,
}

/// Frames a backtrace may add beyond its common prefix in reference-budget mode without
/// risking truncation (10 bytes a frame at worst within a 4086-byte budget).
const MAX_NEW_FRAMES_LOSSY: usize = 399;
const START: u64 = 1_796_026_339_843_713;
const DOMAIN_IDS: [u16; 4] = [0, 1, 2, 7];

/// The codes, their locations (as given to the writer and as a reader must see them) and
/// stack templates.
struct Corpus {
    codes: Vec<LocationCode>,
    given: HashMap<LocationCode, LocationList>,
    expected: HashMap<LocationCode, LocationList>,
    templates: Vec<Vec<LocationCode>>,
}

/// The location codec's bound on a list's encoding (lists over 4096 bytes or 255 entries are
/// written as one `<unknown>` location).
fn size_bound(locs: &[Location]) -> usize {
    locs.iter().fold(9, |sz, l| {
        sz + 6 + (l.filename.len() + 1) + (l.defname.len() + 1)
    })
}

/// What a reader must decode for a list: memtrace HEAD's clamping (line 20 bits, start 8,
/// end 10) and the `<unknown>` substitution for oversized lists.
fn expected_locations(locs: &[Location]) -> LocationList {
    if locs.len() > 255 || size_bound(locs) > 4096 {
        return Arc::from(vec![Location::unknown()]);
    }
    locs.iter()
        .map(|l| Location {
            filename: l.filename.clone(),
            line: l.line.min(0xfffff),
            start_char: l.start_char.min(0xff),
            end_char: l.end_char.min(0x3ff),
            defname: l.defname.clone(),
        })
        .collect::<Vec<_>>()
        .into()
}

fn name(rng: &mut Rng, base: &str, long_pct: u64) -> Arc<[u8]> {
    let mut s = base.as_bytes().to_vec();
    if rng.pct(long_pct) {
        let n = rng.range(50, 700) as usize;
        for i in 0..n {
            s.push(b"abcdefghijklmnopqrstuvwxyz_.0123456789"[(i * 7 + n) % 38]);
        }
    }
    if rng.pct(5) {
        s.extend_from_slice("_é∂".as_bytes()); // non-ASCII bytes are fine
    }
    Arc::from(s)
}

impl Corpus {
    fn new(rng: &mut Rng, pool: usize) -> Corpus {
        let files: Vec<Arc<[u8]>> = (0..45)
            .map(|i| name(rng, &format!("src/dir{}/file_{i}.ml", i % 4), 10))
            .collect();
        let defs: Vec<Arc<[u8]>> = (0..80)
            .map(|i| name(rng, &format!("Mod_{}.fun_{i}", i % 9), 8))
            .collect();
        let mut seen = HashSet::new();
        let mut codes = Vec::with_capacity(pool);
        while codes.len() < pool {
            let c = if rng.pct(80) {
                // like code addresses of a PIE executable
                0x5555_0000_0000 + rng.range(0, 1 << 26) * 4
            } else {
                // any 63-bit OCaml int (as the reader widens it: bit 63 = bit 62)
                LocationCode::from_raw(rng.next()).0
            };
            if c != 0 && seen.insert(c) {
                codes.push(LocationCode(c));
            }
        }
        let mut given = HashMap::with_capacity(pool);
        let mut expected = HashMap::with_capacity(pool);
        for &c in &codes {
            let n = match rng.below(100) {
                0..=4 => 0,
                5..=79 => 1,
                80..=96 => rng.range(2, 4) as usize,
                97..=98 => rng.range(5, 20) as usize,
                _ => {
                    if rng.pct(50) {
                        300 // too many: written as <unknown>
                    } else {
                        12
                    }
                }
            };
            let odd = rng.pct(3);
            let locs: Vec<Location> = (0..n)
                .map(|_| {
                    let f = files[rng.below(files.len())].clone();
                    let d = if n == 12 {
                        Arc::from(vec![b'x'; 400]) // 12 × 400 bytes: over the 4 KiB bound
                    } else {
                        defs[rng.below(defs.len())].clone()
                    };
                    Location {
                        filename: f,
                        line: if odd {
                            rng.range(0, 0x3f_ffff) as u32
                        } else {
                            rng.range(1, 20_000) as u32
                        },
                        start_char: if odd {
                            rng.range(0, 3000) as u32
                        } else {
                            rng.range(0, 255) as u32
                        },
                        end_char: if odd {
                            rng.range(0, 5000) as u32
                        } else {
                            rng.range(0, 1023) as u32
                        },
                        defname: d,
                    }
                })
                .collect();
            expected.insert(c, expected_locations(&locs));
            given.insert(c, LocationList::from(locs));
        }
        let mut templates = Vec::new();
        let main_len = 4.min(pool);
        for _ in 0..48 {
            let mut t: Vec<LocationCode> = codes[..main_len].to_vec();
            while t.len() < 300 {
                if rng.pct(10) {
                    // recursion: a pair of frames repeated
                    let a = codes[rng.below(pool)];
                    let b = codes[rng.below(pool)];
                    for _ in 0..rng.range(2, 40) {
                        t.push(a);
                        t.push(b);
                    }
                } else {
                    t.push(codes[rng.below(pool)]);
                }
            }
            t.truncate(300);
            templates.push(t);
        }
        Corpus {
            codes,
            given,
            expected,
            templates,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Op {
    Alloc {
        time: u64,
        domain: u16,
        length: u64,
        nsamples: u64,
        source: AllocSource,
        backtrace: Vec<LocationCode>,
    },
    /// Of the `target`-th allocation of the stream.
    Promote {
        time: u64,
        domain: u16,
        target: usize,
    },
    Collect {
        time: u64,
        domain: u16,
        target: usize,
    },
}

struct Live {
    ordinal: usize,
    promotable: bool,
}

/// A deterministic stream of operations; the same params give the same ops.
struct Gen {
    p: Params,
    rng: Rng,
    clock: Vec<u64>,
    prev: Vec<Vec<LocationCode>>,
    live: Vec<Vec<Live>>,
    dom: usize,
    allocs: usize,
    done: usize,
}

fn common_prefix(a: &[LocationCode], b: &[LocationCode]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Gen {
    fn new(p: &Params) -> Gen {
        let mut rng = Rng(splitmix::SplitMix::from_state(p.seed ^ 0x5eed));
        let first = rng.below(p.domains);
        Gen {
            p: p.clone(),
            rng,
            clock: vec![START; p.domains],
            prev: vec![Vec::new(); p.domains],
            live: (0..p.domains).map(|_| Vec::new()).collect(),
            dom: first,
            allocs: 0,
            done: 0,
        }
    }

    fn initial_domain(&self) -> u16 {
        DOMAIN_IDS[self.dom]
    }

    fn tick(&mut self, d: usize) -> u64 {
        let r = &mut self.rng;
        let dt = match r.below(1000) {
            0..=499 => 0,
            500..=899 => r.range(1, 200),
            900..=979 => r.range(201, 1_000_000),
            980..=989 if self.p.big_gaps => r.range(30_000_001, (1 << 25) - 1),
            990..=999 if self.p.big_gaps => r.range(1 << 25, 200_000_000),
            _ => r.range(1, 5000),
        };
        self.clock[d] += dt;
        self.clock[d]
    }

    fn backtrace(&mut self, c: &Corpus, d: usize) -> Vec<LocationCode> {
        let r = &mut self.rng;
        let prev = &self.prev[d];
        let pool = c.codes.len();
        let mut bt: Vec<LocationCode>;
        if self.p.deep && self.p.lossless && r.pct(2) {
            let depth = r.range(2000, 2800) as usize;
            bt = if r.pct(50) {
                // fresh codes: every frame a miss, far over the 4 KiB budget
                (0..depth).map(|_| c.codes[r.below(pool)]).collect()
            } else {
                // deep recursion of a few frames
                let t = &c.templates[r.below(c.templates.len())];
                let mut v = t[..20].to_vec();
                let a = c.codes[r.below(pool)];
                let b = c.codes[r.below(pool)];
                while v.len() < depth {
                    v.push(a);
                    v.push(b);
                }
                v
            };
        } else {
            match r.below(100) {
                0..=24 if !prev.is_empty() => {
                    bt = prev.clone();
                    if r.pct(50) {
                        bt.pop();
                        bt.push(c.codes[r.below(pool)]);
                    }
                }
                0..=69 => {
                    let k = r.below(prev.len() + 1);
                    bt = prev[..k].to_vec();
                    let t = &c.templates[r.below(c.templates.len())];
                    let s = r.below(t.len());
                    let m = r.below((t.len() - s).min(80) + 1);
                    bt.extend_from_slice(&t[s..s + m]);
                }
                70..=89 => {
                    let t = &c.templates[r.below(c.templates.len())];
                    let depth = r.range(0, 300) as usize;
                    bt = t[..depth.min(t.len())].to_vec();
                    while bt.len() < depth {
                        bt.push(c.codes[r.below(pool)]);
                    }
                }
                _ => {
                    let depth = r.range(0, 300) as usize;
                    bt = (0..depth).map(|_| c.codes[r.below(pool)]).collect();
                }
            }
        }
        if !self.p.lossless {
            let common = common_prefix(prev, &bt);
            bt.truncate(common + MAX_NEW_FRAMES_LOSSY);
        }
        self.prev[d] = bt.clone();
        bt
    }

    fn next(&mut self, c: &Corpus) -> Option<Op> {
        if self.done == self.p.events {
            return None;
        }
        self.done += 1;
        if self.p.domains > 1 && self.rng.pct(20) {
            self.dom = self.rng.below(self.p.domains);
        }
        let d = self.dom;
        let domain = DOMAIN_IDS[d];
        let kind = self.rng.below(100);
        if kind < 60 || self.live[d].is_empty() {
            let time = self.tick(d);
            let r = &mut self.rng;
            let length = match r.below(100) {
                0..=34 => r.range(1, 16),
                35..=44 => 0,
                45..=79 => r.range(17, 1000),
                _ => r.range(1001, 1_000_000),
            };
            let nsamples = if r.pct(70) { 1 } else { r.range(1, 1000) };
            let source = match r.below(100) {
                0..=59 => AllocSource::Minor,
                60..=84 => AllocSource::Major,
                _ => AllocSource::External,
            };
            let backtrace = self.backtrace(c, d);
            self.live[d].push(Live {
                ordinal: self.allocs,
                promotable: source == AllocSource::Minor,
            });
            self.allocs += 1;
            return Some(Op::Alloc {
                time,
                domain,
                length,
                nsamples,
                source,
                backtrace,
            });
        }
        let time = self.tick(d);
        if kind < 75 {
            // A few random tries at a not-yet-promoted minor object (else collect one).
            for _ in 0..4 {
                let i = self.rng.below(self.live[d].len());
                if self.live[d][i].promotable {
                    self.live[d][i].promotable = false;
                    return Some(Op::Promote {
                        time,
                        domain,
                        target: self.live[d][i].ordinal,
                    });
                }
            }
        }
        // Collect: usually an object of this domain; in format 3 sometimes another domain's.
        let mut from = d;
        if self.p.domains > 1 && self.rng.pct(5) {
            let o = self.rng.below(self.p.domains);
            if !self.live[o].is_empty() {
                from = o;
            }
        }
        let i = self.rng.below(self.live[from].len());
        let l = self.live[from].swap_remove(i);
        Some(Op::Collect {
            time,
            domain,
            target: l.ordinal,
        })
    }
}

fn info(version: u16, initial_domain: u16) -> TraceInfo {
    TraceInfo {
        sample_rate: 1e-4,
        word_size: 64,
        executable_name: b"/tmp/roundtrip_prop".to_vec(),
        host_name: b"vm".to_vec(),
        ocaml_runtime_params: b"s=262144".to_vec(),
        pid: 4242,
        start_time: Timestamp(START),
        context: Some(b"prop".to_vec()),
        initial_domain: DomainId(if version >= 3 { initial_domain } else { 0 }),
        version,
    }
}

/// What writing a stream gave.
struct Written {
    bytes: Vec<u8>,
    /// Id of each allocation, by ordinal.
    ids: Vec<ObjId>,
    /// How many times the writer asked for a code's locations (= location events written).
    resolves: u64,
    relocated: u64,
    distinct_codes: usize,
}

fn write_stream(p: &Params, c: &Corpus) -> Result<Written, String> {
    let mut g = Gen::new(p);
    let inf = info(p.version, g.initial_domain());
    let mut w = Writer::new(
        Vec::new(),
        &inf,
        WriterOptions {
            version: p.version,
            lossless: p.lossless,
        },
    )
    .map_err(|e| e.to_string())?;
    if !p.flush_on_switch {
        w.set_flush_on_domain_switch(false);
    }
    let mut ids = Vec::new();
    let mut resolves = 0u64;
    let mut used = HashSet::new();
    let mut n = 0;
    while let Some(op) = g.next(c) {
        let r = match op {
            Op::Alloc {
                time,
                domain,
                length,
                nsamples,
                source,
                backtrace,
            } => {
                used.extend(backtrace.iter().copied());
                w.put_alloc(
                    &AllocHeader {
                        time: Timestamp(time),
                        domain: DomainId(domain),
                        length,
                        nsamples,
                        source,
                    },
                    &backtrace,
                    |code| {
                        resolves += 1;
                        c.given.get(&code).cloned()
                    },
                )
                .map(|id| ids.push(id))
            }
            Op::Promote {
                time,
                domain,
                target,
            } => w.put_promote(Timestamp(time), DomainId(domain), ids[target]),
            Op::Collect {
                time,
                domain,
                target,
            } => w.put_collect(Timestamp(time), DomainId(domain), ids[target]),
        };
        r.map_err(|e| format!("writing op #{n}: {e}"))?;
        n += 1;
    }
    let relocated = w.stats().relocated_backtraces;
    let bytes = w.finish().map_err(|e| e.to_string())?;
    Ok(Written {
        bytes,
        ids,
        resolves,
        relocated,
        distinct_codes: used.len(),
    })
}

/// Read `w.bytes` back and compare every event with a fresh run of the generator.
fn check_read_back(p: &Params, c: &Corpus, w: &Written) -> Result<u64, String> {
    let mut g = Gen::new(p);
    let mut r = Reader::new(&w.bytes[..], "roundtrip").map_err(|e| e.to_string())?;
    let want_info = info(p.version, g.initial_domain());
    if r.info() != &want_info {
        return Err(format!("trace info {:?} != {:?}", r.info(), want_info));
    }
    let mut checked: HashSet<LocationCode> = HashSet::new();
    let mut n = 0u64;
    // Ops not yet read back, per domain, with the ordinal of each allocation. The file keeps
    // each domain's order; with a flush on every domain switch, the global order too.
    let mut pending: HashMap<u16, VecDeque<(usize, Op)>> = HashMap::new();
    let mut allocs_generated = 0usize;
    loop {
        let got = r
            .next_with_locations()
            .map_err(|e| format!("reading event #{n}: {e}"))?;
        let Some((ev, table)) = got else {
            let left: usize = pending.values().map(|q| q.len()).sum();
            let more = g.next(c);
            if left > 0 || more.is_some() {
                return Err(format!(
                    "the trace ends after {n} events, but {} more were written (next: {:?})",
                    left + more.is_some() as usize,
                    more
                ));
            }
            break;
        };
        let d = ev.domain().0;
        while pending.get(&d).is_none_or(|q| q.is_empty()) {
            let Some(op) = g.next(c) else {
                return Err(format!(
                    "event #{n}: read {:?}, but nothing more was written to domain {d}",
                    ev.to_owned_event()
                ));
            };
            let od = match &op {
                Op::Alloc { domain, .. }
                | Op::Promote { domain, .. }
                | Op::Collect { domain, .. } => *domain,
            };
            let ordinal = allocs_generated;
            if matches!(op, Op::Alloc { .. }) {
                allocs_generated += 1;
            }
            pending.entry(od).or_default().push_back((ordinal, op));
        }
        let (alloc_no, op) = pending.get_mut(&d).unwrap().pop_front().unwrap();
        if p.flush_on_switch && pending.values().any(|q| !q.is_empty()) {
            return Err(format!(
                "event #{n} ({:?}): read before earlier events of other domains",
                ev.to_owned_event()
            ));
        }
        let ev = (ev, op);
        let ok = match &ev {
            (
                Event::Alloc(a),
                Op::Alloc {
                    time,
                    domain,
                    length,
                    nsamples,
                    source,
                    backtrace,
                },
            ) => {
                a.time.0 == *time
                    && a.domain.0 == *domain
                    && a.id == w.ids[alloc_no]
                    && a.length == *length
                    && a.nsamples == *nsamples
                    && a.source == *source
                    && a.backtrace == &backtrace[..]
            }
            (
                Event::Promote { time, domain, id },
                Op::Promote {
                    time: t,
                    domain: d,
                    target,
                },
            )
            | (
                Event::Collect { time, domain, id },
                Op::Collect {
                    time: t,
                    domain: d,
                    target,
                },
            ) => time.0 == *t && domain.0 == *d && *id == w.ids[*target],
            _ => false,
        };
        if !ok {
            let (e, op) = &ev;
            let mut msg = format!(
                "event #{n} differs:\n  read  {:?}\n  wrote {op:?}",
                e.to_owned_event()
            );
            if let (Event::Alloc(a), Op::Alloc { backtrace, .. }) = &ev {
                let k = common_prefix(a.backtrace, backtrace);
                msg += &format!(
                    "\n  backtraces: read {} frames, wrote {}, equal for {k}",
                    a.backtrace.len(),
                    backtrace.len()
                );
            }
            return Err(msg);
        }
        if let Event::Alloc(a) = ev.0 {
            for code in a.backtrace {
                if checked.insert(*code) {
                    let got = table.get(code);
                    let want = c.expected.get(code);
                    if got != want {
                        return Err(format!(
                            "event #{n}: locations of code {code}: read {got:?}, want {want:?}"
                        ));
                    }
                }
            }
        }
        n += 1;
    }
    if !r.warnings().is_empty() {
        return Err(format!("warnings: {:?}", r.warnings()));
    }
    // Every location list, checked again at the end (a later redefinition would be an error).
    for code in &checked {
        if r.lookup(*code) != c.expected.get(code) {
            return Err(format!("locations of code {code} changed"));
        }
    }
    Ok(n)
}

fn round_trip(p: &Params) -> Result<(), TestCaseError> {
    let mut rng = Rng(splitmix::SplitMix::from_state(p.seed));
    let c = Corpus::new(&mut rng, p.pool);
    let w = write_stream(p, &c).map_err(TestCaseError::fail)?;
    let n = check_read_back(p, &c, &w).map_err(TestCaseError::fail)?;
    prop_assert_eq!(n as usize, p.events);
    if !p.lossless {
        prop_assert_eq!(w.relocated, 0);
    }
    Ok(())
}

fn params(version: u16, lossless: bool) -> impl Strategy<Value = Params> {
    (
        any::<u64>(),
        0usize..2500,
        prop_oneof![5 => 1usize..400, 1 => 16_500usize..20_000],
        1usize..=4,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            move |(seed, events, pool, domains, deep, big_gaps, flush_on_switch)| Params {
                seed,
                events,
                pool,
                version,
                lossless,
                domains: if version >= 3 { domains } else { 1 },
                deep: deep && lossless,
                big_gaps,
                flush_on_switch: flush_on_switch || version < 3,
            },
        )
}

/// 40 cases per property (PROPTEST_CASES overrides, for longer soak runs).
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    ProptestConfig {
        cases,
        max_shrink_iters: 400,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn round_trip_v2(p in params(2, false)) {
        round_trip(&p)?;
    }

    #[test]
    fn round_trip_v2_lossless(p in params(2, true)) {
        round_trip(&p)?;
    }

    #[test]
    fn round_trip_v3(p in params(3, false)) {
        round_trip(&p)?;
    }

    #[test]
    fn round_trip_v3_lossless(p in params(3, true)) {
        round_trip(&p)?;
    }
}

/// A big stream: 200,000 events, 20,000 distinct codes (more than the cache holds, so codes
/// are evicted and their locations written again), gaps over 2^25 us. Round-trips, and
/// writing is deterministic.
fn big(version: u16, domains: usize) {
    let p = Params {
        seed: 0x0123_4567_89ab_cdef ^ version as u64,
        events: 200_000,
        pool: 20_000,
        version,
        lossless: false,
        domains,
        deep: false,
        big_gaps: true,
        flush_on_switch: true,
    };
    let t0 = std::time::Instant::now();
    let mut rng = Rng(splitmix::SplitMix::from_state(p.seed));
    let c = Corpus::new(&mut rng, p.pool);
    let w1 = write_stream(&p, &c).unwrap();
    let t1 = t0.elapsed();
    let n = check_read_back(&p, &c, &w1).unwrap();
    assert_eq!(n, 200_000);
    assert!(
        w1.distinct_codes > 16_384,
        "only {} distinct codes used",
        w1.distinct_codes
    );
    assert!(
        w1.resolves > w1.distinct_codes as u64,
        "no code was evicted and re-logged ({} location events for {} codes)",
        w1.resolves,
        w1.distinct_codes
    );
    let w2 = write_stream(&p, &c).unwrap();
    assert!(
        w1.bytes == w2.bytes,
        "writing the same stream twice gave different bytes"
    );
    eprintln!(
        "v{version}, {domains} domain(s): {} bytes, {} distinct codes, {} location events; write {:?}, total {:?}",
        w1.bytes.len(),
        w1.distinct_codes,
        w1.resolves,
        t1,
        t0.elapsed()
    );
}

#[test]
fn big_deterministic_v2() {
    big(2, 1);
}

#[test]
fn big_deterministic_v3_three_domains() {
    big(3, 3);
}

/// A fresh 2000-frame backtrace (every frame a cache miss) does not fit the reference's
/// 4 KiB budget: the reference-compatible writer truncates it (the reader gets a prefix),
/// the lossless writer moves it to a packet of its own and keeps every frame.
#[test]
fn deep_fresh_backtrace_truncated_unless_lossless() {
    let bt: Vec<LocationCode> = (0..2000u64)
        .map(|i| LocationCode(0x5555_0000_0000 + i * 8))
        .collect();
    for version in [2, 3] {
        for lossless in [false, true] {
            let mut w = Writer::new(
                Vec::new(),
                &info(version, 0),
                WriterOptions { version, lossless },
            )
            .unwrap();
            let t = Timestamp(START + 10);
            w.put_alloc(
                &AllocHeader {
                    time: t,
                    domain: DomainId(0),
                    length: 3,
                    nsamples: 1,
                    source: AllocSource::Minor,
                },
                &bt[..5],
                |_| Some(LocationList::from(vec![])),
            )
            .unwrap();
            let id = w
                .put_alloc(
                    &AllocHeader {
                        time: t,
                        domain: DomainId(0),
                        length: 100,
                        nsamples: 1,
                        source: AllocSource::Major,
                    },
                    &bt,
                    |_| Some(LocationList::from(vec![])),
                )
                .unwrap();
            w.put_collect(Timestamp(START + 20), DomainId(0), id)
                .unwrap();
            let relocated = w.stats().relocated_backtraces;
            let bytes = w.finish().unwrap();
            let t = common::read_bytes(&bytes, "deep").unwrap();
            assert_eq!(t.events.len(), 3);
            let got = match &t.events[1] {
                memtrace_merge::OwnedEvent::Alloc(a) => a.backtrace.clone(),
                e => panic!("{e:?}"),
            };
            if lossless {
                assert_eq!(got, bt, "v{version} lossless");
                assert_eq!(relocated, 1);
            } else {
                assert!(
                    got.len() < bt.len() && got[..] == bt[..got.len()],
                    "v{version}: {} frames",
                    got.len()
                );
                assert!(
                    got.len() > 300,
                    "v{version}: only {} frames kept",
                    got.len()
                );
            }
            assert!(
                matches!(t.events[2], memtrace_merge::OwnedEvent::Collect { id: i, .. } if i == id)
            );
        }
    }
}

/// The generator reaches the cases the properties are about (so a change to it cannot
/// silently make them vacuous): short allocs, every source, 2000+ frame backtraces moved to
/// their own packet, more distinct codes than the cache holds, gaps over 30 s and 2^25 us,
/// several domains and cross-domain collects, empty, inlined and oversized location lists.
#[test]
fn generator_covers_the_interesting_cases() {
    let p = Params {
        seed: 7,
        events: 6000,
        pool: 18_000,
        version: 3,
        lossless: true,
        domains: 4,
        deep: true,
        big_gaps: true,
        flush_on_switch: false,
    };
    let mut rng = Rng(splitmix::SplitMix::from_state(p.seed));
    let c = Corpus::new(&mut rng, p.pool);
    let mut g = Gen::new(&p);
    let (mut short, mut deep, mut gap30, mut gap25, mut cross, mut promotes) = (0, 0, 0, 0, 0, 0);
    let mut sources = HashSet::new();
    let mut domains = HashSet::new();
    let mut codes = HashSet::new();
    let mut last = HashMap::new();
    let mut alloc_dom = Vec::new();
    while let Some(op) = g.next(&c) {
        let (time, domain) = match &op {
            Op::Alloc { time, domain, .. }
            | Op::Promote { time, domain, .. }
            | Op::Collect { time, domain, .. } => (*time, *domain),
        };
        let dt = time - *last.get(&domain).unwrap_or(&START);
        last.insert(domain, time);
        gap30 += (dt > 30_000_000) as u32;
        gap25 += (dt >= 1 << 25) as u32;
        domains.insert(domain);
        match op {
            Op::Alloc {
                length,
                nsamples,
                source,
                backtrace,
                ..
            } => {
                short += ((1..=16).contains(&length)
                    && nsamples == 1
                    && source == AllocSource::Minor) as u32;
                deep += (backtrace.len() >= 2000) as u32;
                sources.insert(source as u8);
                codes.extend(backtrace);
                alloc_dom.push(domain);
            }
            Op::Collect { target, .. } => cross += (alloc_dom[target] != domain) as u32,
            Op::Promote { target, .. } => {
                assert_eq!(alloc_dom[target], domain);
                promotes += 1;
            }
        }
    }
    let used = |f: &dyn Fn(&LocationList) -> bool| codes.iter().filter(|k| f(&c.given[*k])).count();
    let empty = used(&|l| l.is_empty());
    let inlined = used(&|l| l.len() > 1);
    let oversized = codes
        .iter()
        .filter(|k| c.expected[*k][..] == [Location::unknown()])
        .count();
    eprintln!(
        "short {short}, deep {deep}, promotes {promotes}, gaps>30s {gap30}, gaps>=2^25 {gap25}, cross-domain collects {cross}, \
         codes {}, empty {empty}, inlined {inlined}, oversized {oversized}",
        codes.len()
    );
    assert!(short > 500 && deep >= 5 && gap30 >= 5 && gap25 >= 5 && cross >= 5 && promotes > 300);
    assert_eq!((sources.len(), domains.len()), (3, 4));
    assert!(codes.len() > 16_384 && empty > 10 && inlined > 10 && oversized > 5);
    let w = write_stream(&p, &c).unwrap();
    assert!(
        w.relocated >= 1,
        "no backtrace was moved to a packet of its own"
    );
    check_read_back(&p, &c, &w).unwrap();
}
