use super::*;

fn codes(v: &[u64]) -> Vec<LocationCode> {
    v.iter().map(|&x| LocationCode(x)).collect()
}

/// Encode a sequence of backtraces (each fully new), decode them back.
fn round_trip(bts: &[Vec<LocationCode>]) {
    let mut w = CacheWriter::default();
    let mut r = CacheReader::default();
    for (id, bt) in bts.iter().enumerate() {
        let mut b = WriteBuf::default();
        let mut misses = 0;
        let (n, done) =
            w.encode::<false>(&mut b, id as i64, bt, usize::MAX, None, |_, _| misses += 1);
        assert_eq!(done, bt.len());
        let mut c = Cursor::new(b.bytes());
        r.decode(&mut c, n, 0, |_| true).unwrap();
        assert_eq!(c.remaining(), 0);
        assert_eq!(r.backtrace(), &bt[..]);
        let v = w.next_verifier();
        assert!(r.verify(&v));
    }
}

#[test]
fn hits_predictions_and_misses() {
    let a = codes(&[10, 20, 30, 40, 50]);
    let b = codes(&[10, 20, 30, 41, 50]);
    let deep: Vec<LocationCode> = (0..1000).map(|i| LocationCode(7 + (i % 2))).collect();
    round_trip(&[a.clone(), a.clone(), b, a, deep.clone(), deep]);
}

#[test]
fn long_runs_of_predictions_overflow_255() {
    let bt: Vec<LocationCode> = (0..600).map(|i| LocationCode(1000 + i)).collect();
    round_trip(&[bt.clone(), bt.clone(), bt]);
}

/// A small random generator: `rnd(n)` is below `n`.
fn xorshift(mut x: u64) -> impl FnMut(u64) -> u64 {
    move |n| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    }
}

/// The transcribed reference encoder's tables, empty: codes, dates (OCaml ints),
/// predictions.
fn reference_tables() -> (Vec<u64>, Vec<i64>, Vec<u16>) {
    (
        vec![0u64; CACHE_SIZE],
        vec![0i64; CACHE_SIZE],
        vec![0u16; CACHE_SIZE],
    )
}

/// The reference's encoder transcribed frame by frame (`code_no_prediction`,
/// `code_cache_hit`, `code_with_prediction`), without any of the shortcuts.
fn reference_encode(
    cache: &mut [u64],
    date: &mut [i64],
    next: &mut [u16],
    id: i64,
    frames: &[LocationCode],
) -> Vec<u8> {
    let mut out = Vec::new();
    let (mut pos, mut predictor) = (0usize, 0usize);
    while pos < frames.len() {
        let code = frames[pos];
        let (h1, h2) = buckets(code);
        let mut hit = if cache[h1] == code.0 {
            h1
        } else if cache[h2] == code.0 {
            h2
        } else {
            let bucket = if date[h1] < date[h2] { h1 } else { h2 };
            cache[bucket] = code.0;
            date[bucket] = id;
            next[predictor] = bucket as u16;
            out.extend_from_slice(&(((bucket << 2) | 3) as u16).to_le_bytes());
            out.extend_from_slice(&code.0.to_le_bytes());
            predictor = bucket;
            pos += 1;
            continue;
        };
        loop {
            date[hit] = id;
            next[predictor] = hit as u16;
            predictor = hit;
            pos += 1;
            let mut ncorrect = 0;
            let mut again = false;
            while pos < frames.len() {
                let pb = next[predictor] as usize;
                if cache[pb] != frames[pos].0 {
                    break;
                }
                if ncorrect == 255 {
                    again = true;
                    break;
                }
                ncorrect += 1;
                predictor = pb;
                pos += 1;
            }
            match ncorrect {
                0 | 1 => out.extend_from_slice(&(((hit << 2) | ncorrect) as u16).to_le_bytes()),
                n => {
                    out.extend_from_slice(&(((hit << 2) | 2) as u16).to_le_bytes());
                    out.push(n as u8);
                }
            }
            if again {
                hit = next[predictor] as usize;
                continue;
            }
            break;
        }
    }
    out
}

/// The reference's decoder transcribed codeword by codeword, frame by frame: the
/// frames, and the entry each came from.
fn reference_decode(
    loc: &mut [u64],
    pred: &mut [u16],
    bytes: &[u8],
    ncodes: usize,
) -> (Vec<LocationCode>, Vec<u16>) {
    let (mut frames, mut entries) = (Vec::new(), Vec::new());
    let mut c = Cursor::new(bytes);
    let mut predictor = 0usize;
    for _ in 0..ncodes {
        let cw = c.u16().unwrap();
        let bucket = (cw >> 2) as usize;
        pred[predictor] = bucket as u16;
        let n = match cw & 3 {
            0 => 0,
            1 => 1,
            2 => c.u8().unwrap() as usize,
            _ => {
                loc[bucket] = ocaml_int(c.u64().unwrap()) as u64;
                0
            }
        };
        let mut e = bucket;
        frames.push(LocationCode(loc[e]));
        entries.push(e as u16);
        for _ in 0..n {
            e = pred[e] as usize;
            frames.push(LocationCode(loc[e]));
            entries.push(e as u16);
        }
        predictor = e;
    }
    (frames, entries)
}

/// Backtraces full of recursion (runs of one code, of two alternating codes, of three;
/// code 0 among them, which entries never filled hold), some longer than 255 frames,
/// encode to exactly the reference's bytes and decode back to themselves.
#[test]
fn recursion_shortcuts_write_the_reference_bytes() {
    let mut rnd = xorshift(0x2545_f491_4f6c_dd1d);
    let mut w = CacheWriter::default();
    let mut r = CacheReader::default();
    let (mut cache, mut date, mut next) = reference_tables();
    let (mut loc, mut pred) = (vec![0u64; CACHE_SIZE], vec![0u16; CACHE_SIZE]);
    r.keep_slots(true);
    // (and a hinted encoder, its hints kept between backtraces)
    let mut h = CacheWriter::default();
    let mut hints: Vec<u16> = Vec::new();
    let mut bt: Vec<LocationCode> = Vec::new();
    for id in 0..3000i64 {
        bt.truncate(rnd(bt.len() as u64 + 1) as usize);
        for _ in 0..rnd(6) + 1 {
            let period = rnd(4) as usize;
            let len = [1, 3, 40, 300, 600][rnd(5) as usize];
            let cycle: Vec<LocationCode> = (0..period.max(1))
                .map(|_| LocationCode(rnd(60) + (id < 1500) as u64))
                .collect();
            for k in 0..len {
                bt.push(cycle[k % cycle.len()]);
            }
            if rnd(3) == 0 {
                // a break in the pattern
                bt.push(LocationCode(rnd(60) + (id < 1500) as u64));
            }
        }
        let mut b = WriteBuf::default();
        // (with and without a journal, as the writer's two uses)
        let mut journal = Journal::default();
        let j = (id % 2 == 0).then_some(&mut journal);
        let (ncodes, done) = w.encode::<true>(&mut b, id, &bt, usize::MAX, j, |_, _| {});
        assert_eq!(done, bt.len());
        let want = reference_encode(&mut cache, &mut date, &mut next, id, &bt);
        assert_eq!(b.bytes(), &want[..], "backtrace {id}");
        hints.resize(bt.len(), 0);
        let mut hb = WriteBuf::default();
        h.encode_hinted(&mut hb, id, &bt, &mut hints, usize::MAX, |_, _| {});
        assert_eq!(hb.bytes(), &want[..], "backtrace {id}, hinted");
        // and they decode back (until code 0 comes in, at 1500, which the reference
        // encodes as hits on entries no miss filled, and which this reader refuses),
        // each frame's entry kept as the reference's decoder finds it
        if id < 1500 {
            let mut c = Cursor::new(b.bytes());
            r.decode(&mut c, ncodes, 0, |_| true).unwrap();
            assert_eq!(r.backtrace(), &bt[..], "backtrace {id}");
            assert_eq!(c.remaining(), 0);
            let (frames, entries) = reference_decode(&mut loc, &mut pred, b.bytes(), ncodes);
            assert_eq!(frames, bt, "backtrace {id}");
            assert_eq!(r.slots(), &entries[..], "backtrace {id}");
        }
    }
}

/// Dates are u32 (see [`Date`]): the reference's choices of entry up to allocation
/// `u32::MAX`, and past it, where every date is the same, backtraces that still decode
/// to their frames.
#[test]
fn dates_near_and_past_u32_max() {
    assert_eq!(date_of(-5), 0);
    assert_eq!(date_of(7), 7);
    assert_eq!(date_of(u32::MAX as i64 + 9), u32::MAX);
    let mut rnd = xorshift(0x1234_5678_9abc_def1);
    let mut w = CacheWriter::default();
    let mut r = CacheReader::default();
    let (mut cache, mut date, mut next) = reference_tables();
    let base = u32::MAX as i64 - 2000;
    for id in base..base + 4000 {
        // paths of 1-40 frames of 30,000 codes: entries evicted all along
        let bt: Vec<LocationCode> = (0..rnd(40) + 1)
            .map(|_| LocationCode(rnd(30_000) + 1))
            .collect();
        let mut b = WriteBuf::default();
        let (n, done) = w.encode::<false>(&mut b, id, &bt, usize::MAX, None, |_, _| {});
        assert_eq!(done, bt.len());
        let want = reference_encode(&mut cache, &mut date, &mut next, id, &bt);
        if id <= u32::MAX as i64 {
            assert_eq!(b.bytes(), &want[..], "backtrace {id}");
        }
        let mut c = Cursor::new(b.bytes());
        r.decode(&mut c, n, 0, |_| true).unwrap();
        assert_eq!(r.backtrace(), &bt[..], "backtrace {id}");
    }
    // (the table filled early on: misses after that chose between dated entries)
    assert!(cache.iter().filter(|&&c| c != 0).count() > CACHE_SIZE * 9 / 10);
}

/// Hints change nothing but speed: several streams of backtraces (sharing codes, with
/// recursion, code 0, more codes than the cache holds, a byte budget) interleaved,
/// each with its own hints (right, stale or wrong), encode to the reference's bytes,
/// and each encoded frame's hint is then the entry that holds it.
#[test]
fn hints_write_the_reference_bytes() {
    let mut rnd = xorshift(0x9e37_79b9_7f4a_7c15);
    let mut plain = CacheWriter::default();
    let mut hinted = CacheWriter::default();
    let mut streams: Vec<(Vec<LocationCode>, Vec<u16>)> = vec![Default::default(); 4];
    let mut hits = 0;
    for id in 0..6000i64 {
        let s = rnd(4) as usize;
        let (bt, hints) = &mut streams[s];
        let keep = rnd(bt.len() as u64 + 1) as usize;
        bt.truncate(keep);
        for _ in 0..rnd(40) {
            let pool = if id < 3000 { 3000 } else { 40_000 };
            let c = if rnd(8) == 0 && !bt.is_empty() {
                bt[bt.len() - 1 - rnd(bt.len().min(3) as u64) as usize]
            } else {
                LocationCode(rnd(pool) * 7 + s as u64 * (rnd(2) * 3))
            };
            bt.push(c);
        }
        match rnd(10) {
            0 => hints.iter_mut().for_each(|h| *h = rnd(1 << 16) as u16),
            _ => hints.resize(bt.len(), 0),
        }
        hints.resize(bt.len().max(hints.len()), 0);
        let from = rnd(keep as u64 + 1) as usize;
        let limit = if rnd(50) == 0 { 40 } else { usize::MAX };
        let mut want = WriteBuf::default();
        let (n1, d1) = plain.encode::<false>(&mut want, id, &bt[from..], limit, None, |_, _| {});
        let mut got = WriteBuf::default();
        let before: Vec<u16> = hints[from..bt.len()].to_vec();
        let (n2, d2) = hinted.encode_hinted(
            &mut got,
            id,
            &bt[from..],
            &mut hints[from..],
            limit,
            |_, _| {},
        );
        assert_eq!((n1, d1), (n2, d2), "backtrace {id}");
        assert_eq!(got.bytes(), want.bytes(), "backtrace {id}");
        for k in from..from + d2 {
            if hints[k] == before[k - from] && bt[k].0 != 0 {
                hits += 1;
            }
            let e = hints[k] as usize & (CACHE_SIZE - 1);
            // (a later miss of the same backtrace may have evicted it)
            if hinted.cache[e] != bt[k].0 {
                assert!(
                    id >= 3000 || limit != usize::MAX,
                    "backtrace {id} frame {k}"
                );
            }
        }
    }
    assert_eq!(plain.cache, hinted.cache);
    assert_eq!(plain.next, hinted.next);
    assert_eq!(plain.date, hinted.date);
    // (and the hints were right often enough for the fast path to be tested)
    assert!(hits > 20_000, "{hits}");
}

/// Mutual recursion of every length, each ending in another frame, twice: the second
/// time every frame is predicted, through the entry each run ended on.
#[test]
fn runs_of_recursion_end_on_the_right_entry() {
    for len in 1..12usize {
        let mut bt: Vec<LocationCode> = vec![LocationCode(5)];
        bt.extend((0..len).map(|k| LocationCode(10 + (k % 2) as u64)));
        bt.push(LocationCode(20));
        bt.push(LocationCode(21));
        round_trip(&[bt.clone(), bt.clone(), bt[..len].to_vec(), bt.clone(), bt]);
    }
}

#[test]
fn eviction_with_more_than_cache_size_codes() {
    let bts: Vec<Vec<LocationCode>> = (0..40)
        .map(|k| (0..1000).map(|i| LocationCode(k * 1000 + i + 1)).collect())
        .collect();
    let mut again = bts.clone();
    again.extend(bts);
    round_trip(&again);
}

#[test]
fn budget_truncates_the_deep_end() {
    let mut w = CacheWriter::default();
    let bt: Vec<LocationCode> = (0..1000).map(|i| LocationCode(i * 977 + 3)).collect();
    let mut b = WriteBuf::default();
    let (n, done) = w.encode::<false>(&mut b, 0, &bt, MAX_LENGTH - MAX_ENTRY, None, |_, _| {});
    assert!(done < bt.len());
    assert!(b.len() <= MAX_LENGTH);
    let mut r = CacheReader::default();
    r.decode(&mut Cursor::new(b.bytes()), n, 0, |_| true)
        .unwrap();
    assert_eq!(r.backtrace(), &bt[..done]);
}

#[test]
fn prefix_longer_than_previous_keeps_previous() {
    let mut w = CacheWriter::default();
    let mut r = CacheReader::default();
    let mut b = WriteBuf::default();
    let (n, _) = w.encode::<false>(&mut b, 0, &codes(&[1, 2, 3]), usize::MAX, None, |_, _| {});
    r.decode(&mut Cursor::new(b.bytes()), n, 0, |_| true)
        .unwrap();
    let mut b = WriteBuf::default();
    let (n, _) = w.encode::<false>(&mut b, 1, &codes(&[9]), usize::MAX, None, |_, _| {});
    r.decode(&mut Cursor::new(b.bytes()), n, 10, |_| true)
        .unwrap();
    assert_eq!(r.backtrace(), &codes(&[1, 2, 3])[..]);
    // the cache still learned code 9
    let mut b = WriteBuf::default();
    let (n, _) = w.encode::<false>(&mut b, 2, &codes(&[9]), usize::MAX, None, |_, _| {
        panic!("9 must hit")
    });
    r.decode(&mut Cursor::new(b.bytes()), n, 0, |_| true)
        .unwrap();
    assert_eq!(r.backtrace(), &codes(&[9])[..]);
}

#[test]
fn undefined_codes_and_empty_entries_are_errors() {
    let mut w = CacheWriter::default();
    let mut b = WriteBuf::default();
    let (n, _) = w.encode::<false>(&mut b, 0, &codes(&[5]), usize::MAX, None, |_, _| {});
    let mut r = CacheReader::default();
    let e = r.decode(&mut Cursor::new(b.bytes()), n, 0, |c| c.0 != 5);
    assert_eq!(e, Err(Malformed::UndefinedLocation { code: 5 }));
    // a hit on a bucket no miss ever filled
    let mut r = CacheReader::default();
    let e = r.decode(&mut Cursor::new(&[0x10, 0x00]), 1, 0, |_| true);
    assert_eq!(e, Err(Malformed::EmptyCacheEntry));
}

/// A miss: bucket, tag 3, then the code.
fn miss(bucket: u16, code: u64) -> Vec<u8> {
    let mut v = ((bucket << 2) | 3).to_le_bytes().to_vec();
    v.extend_from_slice(&code.to_le_bytes());
    v
}

#[test]
fn empty_is_told_from_every_ocaml_int() {
    let codes: Vec<LocationCode> = [0u64, 1, (1 << 62) - 1, u64::MAX, 0xdead_beef_0000]
        .iter()
        .map(|&v| LocationCode(ocaml_int(v) as u64))
        .chain([LocationCode(ocaml_int(1 << 62) as u64)])
        .collect();
    assert!(!any_empty(&codes));
    for k in 0..codes.len() {
        let mut c = codes.clone();
        c[k] = LocationCode(EMPTY);
        assert!(any_empty(&c), "EMPTY at {k}");
    }
}

#[test]
fn a_prediction_never_set_leads_to_entry_0_and_is_checked_there() {
    // bucket 5 filled; its prediction was never set, so it predicts entry 0
    let hit_and_one = [(5u16 << 2 | 1) as u8, 0];
    let mut r = CacheReader::default();
    r.decode(&mut Cursor::new(&miss(5, 7)), 1, 0, |_| true)
        .unwrap();
    let e = r.decode(&mut Cursor::new(&hit_and_one), 1, 0, |_| true);
    assert_eq!(e, Err(Malformed::EmptyCacheEntry), "entry 0 is empty");
    // once entry 0 holds a code, the same prediction gives it
    let mut r = CacheReader::default();
    let first = [miss(0, 9), miss(5, 7)].concat();
    r.decode(&mut Cursor::new(&first), 2, 0, |_| true).unwrap();
    assert_eq!(r.backtrace(), &codes(&[9, 7])[..]);
    r.decode(&mut Cursor::new(&hit_and_one), 1, 0, |_| true)
        .unwrap();
    assert_eq!(r.backtrace(), &codes(&[7, 9])[..]);
}

#[test]
fn bucket_hashes_match_ocaml() {
    // ((code * 0x4983723) lsr 11) land 0x3fff, computed by hand for code = 0x5555_0000_1234
    let code = 0x5555_0000_1234u64;
    let p1 = code.wrapping_mul(0x4983723) & ((1 << 63) - 1);
    let p2 = code.wrapping_mul(0xfdea731) & ((1 << 63) - 1);
    assert_eq!(
        buckets(LocationCode(code)),
        (
            ((p1 >> 11) & 0x3fff) as usize,
            ((p2 >> 21) & 0x3fff) as usize
        )
    );
}

/// A random run of codewords over a few buckets: misses, hits, hits with one or more
/// predictions, some on entries no miss filled.
fn random_codewords(rnd: &mut impl FnMut(u64) -> u64, n: usize) -> Vec<u8> {
    let mut v = Vec::new();
    for _ in 0..n {
        let bucket = rnd(16) as u16;
        match rnd(8) {
            0..=2 => v.extend(miss(bucket, 100 + rnd(8))),
            3 | 4 => {
                v.extend(((bucket << 2) | 2).to_le_bytes());
                v.push(rnd(40) as u8);
            }
            tag => v.extend(((bucket << 2) | (tag as u16 & 1)).to_le_bytes()),
        }
    }
    v
}

#[test]
fn walking_changes_the_cache_and_length_as_decoding_does() {
    let mut rnd = xorshift(0x5eed_1234_abcd);
    let (mut ok, mut failed) = (0, 0);
    for _ in 0..400 {
        let (mut d, mut w) = (CacheReader::default(), CacheReader::default());
        // (entries 1 to 14 filled first; entry 0 only when a miss fills it)
        let fill: Vec<u8> = (1..15)
            .flat_map(|b| miss(b, 100 + u64::from(b) % 7))
            .collect();
        d.decode(&mut Cursor::new(&fill), 14, 0, |_| true).unwrap();
        w.walk(&mut Cursor::new(&fill), 14, 0, |_| true).unwrap();
        for _ in 0..20 {
            let n = rnd(6) as usize;
            let bytes = random_codewords(&mut rnd, n);
            let prefix = rnd(d.backtrace().len() as u64 + 4);
            // (code 107 is never defined)
            let defined = |c: LocationCode| c.0 != 107;
            let a = d.decode(&mut Cursor::new(&bytes), n, prefix, defined);
            let b = w.walk(&mut Cursor::new(&bytes), n, prefix, defined);
            assert_eq!(a, b, "{bytes:?} after a prefix of {prefix}");
            if a.is_err() {
                failed += 1;
                break;
            }
            ok += 1;
            assert_eq!(d.backtrace().len(), w.last_len);
            for i in 0..CACHE_SIZE {
                let entry = |r: &CacheReader| r.tables.as_ref().map(|t| t.entry(i));
                assert_eq!(entry(&d), entry(&w), "entry {i}");
            }
        }
    }
    assert!(ok > 500 && failed > 100, "ok {ok}, failed {failed}");
}
