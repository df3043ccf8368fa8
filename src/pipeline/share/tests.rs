use super::*;
use crate::format::event::{AllocSource, DomainId, Event, Timestamp};
use crate::reader::Reader;
use crate::writer::tests::locs;
use crate::writer::{common_prefix, Writer, WriterOptions};

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The next backtrace of a source: mostly its last one again, else a changed suffix,
/// recursion, a new path, or (rarely) a very deep one.
fn next_path(r: &mut Rng, src: u64, last: &[LocationCode], pool: u64) -> Vec<LocationCode> {
    let code = |r: &mut Rng| match r.below(50) {
        0 => LocationCode(0),
        1 => LocationCode(0x42), // a code every source uses
        _ => LocationCode(0x1_0000 * (src + 1) + r.below(pool)),
    };
    let mut bt = last.to_vec();
    match r.below(20) {
        0..=9 => {}
        10..=14 => {
            bt.truncate(r.below(bt.len() as u64 + 1) as usize);
            for _ in 0..r.below(6) {
                bt.push(code(r));
            }
        }
        15 | 16 => {
            // recursion: one frame or two repeated
            bt.truncate(r.below(bt.len() as u64 + 1) as usize);
            let (a, b) = (code(r), code(r));
            for k in 0..2 + r.below(40) {
                bt.push(if k % 2 == 0 || r.below(3) == 0 { a } else { b });
            }
        }
        17 | 18 => {
            // a new path from the common root
            bt = vec![LocationCode(0x7), LocationCode(0x8)];
            for _ in 0..r.below(30) {
                bt.push(code(r));
            }
        }
        _ => {
            if r.below(40) == 0 {
                let n = if r.below(2) == 0 { 2500 } else { 5000 };
                bt.extend((0..n).map(|k| LocationCode(0x100_0000 * (src + 1) + k)));
            }
        }
    }
    bt
}

/// Several sources take turns in one domain, each encoding its backtraces whole in its
/// share, ahead (on tables of its own thread: `threads` of them) as a merge's decoders
/// do: every backtrace read back is the one written.
fn round_trip(seed: u64, sources: u64, count: u16, pool: u64, n: usize, threads: usize) {
    let mut r = Rng(seed);
    let info = crate::writer::tests::info(2);
    let opts = WriterOptions {
        version: 2,
        lossless: true,
    };
    let mut w = Writer::new(Vec::new(), &info, opts).unwrap();
    let mut tables: Vec<CacheWriter> = (0..threads).map(|_| CacheWriter::default()).collect();
    let mut shares: Vec<Share> = (0..sources)
        .map(|i| {
            Share::new(ShareOf {
                index: i as u16,
                count,
            })
        })
        .collect();
    let mut last: Vec<Vec<LocationCode>> = vec![vec![LocationCode(0x7)]; sources as usize];
    let mut ids = vec![0i64; sources as usize];
    let mut written: Vec<Vec<LocationCode>> = Vec::new();
    let mut src = 0;
    let mut enc = WriteBuf::with_capacity(1024);
    let mut cuts = 0;
    for k in 0..n {
        if r.below(3) != 0 {
            src = r.below(sources) as usize;
        }
        let bt = next_path(&mut r, src as u64, &last[src], pool);
        let own = common_prefix(&last[src], &bt);
        // any keep up to the longest shared prefix will do
        let keep = if r.below(4) == 0 {
            r.below(own as u64 + 1) as usize
        } else {
            own
        };
        enc.clear();
        let mut misses = Vec::new();
        ids[src] += 1;
        // hints: where an input's cache would have the frames, or nonsense, or none
        let hints: Vec<u16> = match seed % 3 {
            0 => bt
                .iter()
                .map(|&c| crate::format::backtrace::buckets(c).0 as u16)
                .collect(),
            1 => bt.iter().map(|_| r.below(1 << 16) as u16).collect(),
            _ => Vec::new(),
        };
        let (ncodes, done) = shares[src].encode(
            &mut tables[src % threads],
            &mut enc,
            ids[src],
            &bt,
            &hints,
            keep,
            LIMIT,
            |i, at| misses.push((bt[i], at)),
        );
        for &(c, at) in &misses {
            assert_eq!(enc.bytes()[at..at + 8], c.0.to_le_bytes(), "a miss's code");
        }
        let codes: Vec<LocationCode> = misses.iter().map(|m| m.0).collect();
        w.put_alloc_encoded(
            Timestamp(1_000_000 + k as u64),
            DomainId(0),
            3,
            1,
            AllocSource::Minor,
            0,
            done,
            ncodes,
            enc.bytes(),
            &codes,
            locs,
        )
        .unwrap();
        shares[src].check_uses();
        cuts += (done < bt.len()) as usize;
        written.push(bt[..done].to_vec());
        last[src] = bt;
    }
    let bytes = w.finish().unwrap();
    let mut rd = Reader::new(&bytes[..], "t").unwrap();
    let mut k = 0;
    while let Some(ev) = rd.next_event().unwrap() {
        if let Event::Alloc(a) = ev {
            let (got, want) = (a.backtrace, &written[k]);
            assert!(
                got == &want[..],
                "alloc {k} (seed {seed}): {} frames read, {} written, {} alike",
                got.len(),
                want.len(),
                common_prefix(got, want)
            );
            k += 1;
        }
    }
    assert_eq!(k, n);
    assert!(rd.warnings().is_empty(), "{:?}", rd.warnings());
    // only backtraces too deep for a packet are cut
    assert!(cuts <= n / 50, "{cuts} cut");
}

/// The room a merge's decoder gives one encoding (a packet's, less its header and an
/// allocation's fields).
const LIMIT: usize = 32_000;

#[test]
fn sources_taking_turns_read_back_exactly() {
    for seed in 1..=12 {
        round_trip(seed * 7919, 5, 5, 200, 3000, 1);
    }
}

#[test]
fn more_codes_than_a_share_holds() {
    // 4 shares of 4,095 entries, each source drawing from 20,000 codes
    for seed in 1..=4 {
        round_trip(seed * 104_729, 4, 4, 20_000, 4000, 2);
    }
}

#[test]
fn tiny_shares_where_codes_move_all_the_time() {
    // shares of 16 entries for 40 codes a source: evictions, codes found again in
    // their other entry, paths whose entries changed under them
    for seed in 1..=8 {
        round_trip(seed * 1_000_003, 3, 1000, 40, 3000, 3);
    }
}

/// Two worlds in lockstep, one that never takes a shortcut (a known-good path repeated
/// without looking at it, or an encoding from memory): every encoding must
/// agree in its codewords, its misses, and everything it leaves behind (path, doubts,
/// entry counts, hints, tables), with good, wrong and no hints, bytes already in the
/// buffer, limits that cut, a `keep` short of the shared prefix, tiny shares, several
/// shares on one thread's tables, and recursive paths long enough to tangle.
#[test]
fn an_encoding_from_memory_is_the_one_made_the_long_way() {
    let mut from_memory = 0usize;
    let mut long_from_memory = 0usize;
    let mut over_scan = 0usize;
    let mut long_again = 0usize;
    let mut cuts = 0usize;
    for seed in 1..=24u64 {
        let mut r = Rng(seed * 104_723 + 17);
        let sources = 1 + (seed % 4) as usize;
        let count: u16 = match seed % 3 {
            0 => sources as u16,
            1 => 1000,
            _ => 64,
        };
        let pool = if seed % 3 == 1 { 40 } else { 300 };
        let threads = 1 + (seed % 2) as usize;
        let mk = || -> (Vec<Share>, Vec<CacheWriter>) {
            (
                (0..sources)
                    .map(|i| {
                        Share::new(ShareOf {
                            index: i as u16,
                            count,
                        })
                    })
                    .collect(),
                (0..threads).map(|_| CacheWriter::default()).collect(),
            )
        };
        let (mut s1, mut t1) = mk();
        let (mut s2, mut t2) = mk();
        for s in &mut s2 {
            s.long_way = true;
        }
        let mut last: Vec<Vec<LocationCode>> = vec![vec![LocationCode(0x7)]; sources];
        let mut ids = vec![0i64; sources];
        let mut src = 0usize;
        for k in 0..6000usize {
            if r.below(5) == 0 {
                src = r.below(sources as u64) as usize;
            }
            let bt = match r.below(10) {
                0..=6 => last[src].clone(),
                7 => {
                    // long recursion: scanned paths of several words, and paths over
                    // SCAN_MAX (tangled)
                    let mut bt = last[src].clone();
                    bt.truncate(r.below(bt.len() as u64 + 1) as usize);
                    let a = LocationCode(0x1_0000 * (src as u64 + 1) + r.below(pool));
                    let b = LocationCode(0x1_0000 * (src as u64 + 1) + r.below(pool));
                    let reps = match r.below(8) {
                        0 => r.below(SCAN_MAX as u64 + 200),
                        1..=3 => r.below(700),
                        _ => r.below(240),
                    };
                    for j in 0..reps {
                        bt.push(if j % 3 == 0 {
                            a
                        } else {
                            LocationCode(b.0 + j % 5)
                        });
                    }
                    bt.truncate(SCAN_MAX + 100);
                    bt
                }
                _ => {
                    let mut bt = next_path(&mut r, src as u64, &last[src], pool);
                    bt.truncate(if r.below(10) == 0 { 6000 } else { 280 });
                    bt
                }
            };
            let own = common_prefix(&last[src], &bt);
            let keep = if r.below(8) == 0 {
                r.below(own as u64 + 1) as usize
            } else {
                own
            };
            let hints: Vec<u16> = match r.below(4) {
                0 => bt
                    .iter()
                    .map(|&c| crate::format::backtrace::buckets(c).0 as u16)
                    .collect(),
                1 => bt.iter().map(|_| r.below(1 << 16) as u16).collect(),
                2 => bt.iter().map(|_| r.below(64) as u16).collect(),
                _ => Vec::new(),
            };
            let pre = r.below(40) as usize;
            let mut b1 = WriteBuf::with_capacity(64);
            let mut b2 = WriteBuf::with_capacity(64);
            for _ in 0..pre {
                b1.u8(0xAA);
                b2.u8(0xAA);
            }
            let limit = match r.below(6) {
                0 => pre + r.below(12) as usize,
                1 => pre + r.below(80) as usize,
                // (around where the last hit of a long path repeated starts)
                2 => (pre + 3 * (bt.len().div_ceil(256).max(1) - 1) + r.below(5) as usize)
                    .saturating_sub(2),
                _ => LIMIT,
            };
            ids[src] += 1;
            let id = ids[src];
            let th = src % threads;
            let m = &s1[src].memo;
            let at_len = s1[src].at.len();
            if m.valid && keep >= at_len && at_len == bt.len() && pre + m.bytes.len() <= limit {
                from_memory += 1;
                long_from_memory += (at_len > 256) as usize;
            }
            over_scan += (bt.len() > SCAN_MAX) as usize;
            long_again += (keep >= at_len && at_len == bt.len() && at_len > 256) as usize;
            let mut miss1 = Vec::new();
            let mut miss2 = Vec::new();
            let r1 = s1[src].encode(
                &mut t1[th],
                &mut b1,
                id,
                &bt,
                &hints,
                keep,
                limit,
                |i, a| miss1.push((i, a)),
            );
            let r2 = s2[src].encode(
                &mut t2[th],
                &mut b2,
                id,
                &bt,
                &hints,
                keep,
                limit,
                |i, a| miss2.push((i, a)),
            );
            let ctx = format!(
                "seed {seed}, step {k}, src {src}, n {}, keep {keep}, limit {limit}, pre {pre}",
                bt.len()
            );
            assert_eq!(r1, r2, "{ctx}");
            cuts += (r1.1 < bt.len()) as usize;
            assert_eq!(miss1, miss2, "{ctx}");
            assert_eq!(b1.bytes(), b2.bytes(), "{ctx}");
            let (a, b) = (&s1[src], &s2[src]);
            assert_eq!(
                (&a.at, &a.doubt, a.tangled),
                (&b.at, &b.doubt, b.tangled),
                "{ctx}"
            );
            assert!(a.uses[..] == b.uses[..], "uses {ctx}");
            assert!(a.xlat[..] == b.xlat[..], "xlat {ctx}");
            a.check_uses();
            let ((c1, d1, n1), (c2, d2, n2)) = (t1[th].tables(), t2[th].tables());
            assert!(c1[..] == c2[..], "cache {ctx}");
            assert!(d1[..] == d2[..], "date {ctx}");
            assert!(n1[..] == n2[..], "next {ctx}");
            last[src] = bt;
        }
    }
    assert!(cuts > 1000, "{cuts} encodings cut");
    assert!(from_memory > 1000, "{from_memory} encodings from memory");
    assert!(
        long_from_memory > 100,
        "{long_from_memory} encodings of more than 256 frames from memory"
    );
    assert!(over_scan > 100, "{over_scan} encodings of tangled paths");
    assert!(
        long_again > 1000,
        "{long_again} paths of more than 256 frames again"
    );
}

#[test]
fn a_repeated_backtrace_is_one_hit_and_a_run() {
    let mut cw = CacheWriter::default();
    let mut s = Share::new(ShareOf { index: 1, count: 4 });
    let bt: Vec<LocationCode> = (0..40).map(|i| LocationCode(0x500 + i)).collect();
    let mut b = WriteBuf::with_capacity(1024);
    let mut misses = 0;
    let (n, done) = s.encode(&mut cw, &mut b, 1, &bt, &[], 0, 4000, |_, _| misses += 1);
    assert_eq!((n, done, misses), (40, 40, 40));
    let at = b.len();
    let (n, done) = s.encode(&mut cw, &mut b, 2, &bt, &[], 40, 4000, |_, _| misses += 1);
    assert_eq!((n, done, misses), (1, 40, 40));
    assert_eq!(b.len() - at, 3, "a hit and a run of 39");
    // a long path that holds an entry many times, with different frames after it,
    // tangles the share while it is encoded; its bits are found again at the end
    let n = SCAN_MAX + 90;
    let rec: Vec<LocationCode> = (0..n)
        .map(|i| LocationCode(if i % 3 == 0 { 1 } else { 0x900 + i as u64 }))
        .collect();
    let mut long = WriteBuf::with_capacity(1 << 14);
    for k in 0..3 {
        s.encode(&mut cw, &mut long, 3 + k, &rec, &[], n, 1 << 20, |_, _| {});
        assert!(!s.tangled);
    }
    s.encode(&mut cw, &mut b, 6, &bt, &[], 0, 4000, |_, _| {});
    let at = b.len();
    let (n, _) = s.encode(&mut cw, &mut b, 7, &bt, &[], 40, 4000, |_, _| {});
    assert_eq!((n, b.len() - at), (1, 3));
    // every entry named is in the share's range
    assert!(s
        .at
        .iter()
        .all(|&e| (e as usize) >= s.lo && (e as usize) < s.lo + s.len));
}
