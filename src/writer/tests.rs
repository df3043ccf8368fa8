use super::*;
use crate::format::event::AllocHeader;
use crate::format::event::AllocSource;
use crate::format::event::Event;
use crate::format::location::Location;
use crate::reader::Reader;
use std::sync::Arc;

/// A trace info for tests (pid 1, rate 1e-4, started at 1 s).
pub(crate) fn info(version: u16) -> TraceInfo {
    TraceInfo {
        sample_rate: 1e-4,
        word_size: 64,
        executable_name: b"t".to_vec(),
        host_name: b"h".to_vec(),
        ocaml_runtime_params: vec![],
        pid: 1,
        start_time: Timestamp(1_000_000),
        context: None,
        initial_domain: DomainId(0),
        version,
    }
}

/// Locations for any code (one, its line from the code).
pub(crate) fn locs(c: LocationCode) -> Option<LocationList> {
    Some(Arc::from(vec![Location {
        filename: Arc::from(&b"a.ml"[..]),
        line: (c.0 % 1000) as u32,
        start_char: 0,
        end_char: 1,
        defname: Arc::from(&b"f"[..]),
    }]))
}

fn read_all(bytes: &[u8]) -> Vec<Vec<LocationCode>> {
    let mut r = Reader::new(bytes, "t").unwrap();
    let mut v = Vec::new();
    while let Some(ev) = r.next_event().unwrap() {
        if let Event::Alloc(a) = ev {
            v.push(a.backtrace.to_vec());
        }
    }
    v
}

/// A packet's first alloc id may be anything (ordered as a signed number, -1 is
/// before 0): an allocation id past u64::MAX is an error, not an overflow.
#[test]
fn allocation_ids_past_the_last_are_an_error() {
    let mut w = Writer::new(
        Vec::new(),
        &info(3),
        WriterOptions {
            version: 3,
            lossless: false,
        },
    )
    .unwrap();
    let t = Timestamp(1_000_001);
    let bt = [LocationCode(5)];
    let h = AllocHeader {
        time: t,
        domain: DomainId(0),
        length: 2,
        nsamples: 1,
        source: AllocSource::Minor,
    };
    w.put_alloc(&h, &bt, locs).unwrap();
    w.put_alloc(&h, &bt, locs).unwrap();
    let mut b = w.finish().unwrap();
    // the last packet, the allocations': its first and last alloc ids, the last 16
    // bytes of its 68-byte header
    let (mut at, mut last) = (0, 0);
    while at < b.len() {
        last = at;
        at += u32::from_le_bytes(b[at + 4..at + 8].try_into().unwrap()) as usize / 8;
    }
    let at = last;
    b[at + 52..at + 60].copy_from_slice(&u64::MAX.to_le_bytes());
    b[at + 60..at + 68].copy_from_slice(&u64::MAX.to_le_bytes());
    let mut r = Reader::new(&b[..], "t").unwrap();
    let mut err = None;
    loop {
        match r.next_event() {
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(e) => {
                err = Some(e.to_string());
                break;
            }
        }
    }
    assert!(
        err.as_deref().is_some_and(|e| e.contains("allocation id")),
        "{err:?}"
    );
}

/// The info packet must fit the reference reader's 32 KiB buffer: the writer refuses a
/// longer one (say, a long context), and the reader one it is given.
#[test]
fn an_info_packet_over_32_kib_is_refused() {
    let with = |n: usize| TraceInfo {
        context: Some(vec![b'x'; n]),
        ..info(2)
    };
    let fits = Writer::new(Vec::new(), &with(32_000), WriterOptions::default())
        .unwrap()
        .finish()
        .unwrap();
    assert_eq!(
        Reader::new(&fits[..], "t").unwrap().info().context,
        with(32_000).context
    );
    let e = Writer::new(Vec::new(), &with(33_000), WriterOptions::default()).err();
    assert!(matches!(e, Some(Error::Usage(m)) if m.contains("at most 32768")));
    // (such a packet, made as the writer would)
    let mut big = WriteBuf::default();
    PacketHeader::start(&mut big, 2, 1, 0, dummy_verifier());
    with(33_000).encode(&mut big);
    PacketHeader::finish(&mut big, 2, 1_000_000, 1_000_000, 0, 0);
    let e = Reader::new(big.bytes(), "t").err().map(|e| e.to_string());
    assert!(e.unwrap_or_default().contains("larger than 32 KiB"));
}

#[test]
fn lossless_keeps_deep_backtraces_whole_and_cuts_only_what_no_packet_holds() {
    // 3,000 distinct frames (30 KB of misses) fit a packet of their own; 5,000 do not.
    let deep: Vec<LocationCode> = (0..3000).map(|i| LocationCode(0x1000 + i)).collect();
    let deeper: Vec<LocationCode> = (0..5000).map(|i| LocationCode(0x9000 + i)).collect();
    let mut after = deeper.clone();
    after.push(LocationCode(7));
    let small = vec![LocationCode(1), LocationCode(2)];
    let mut w = Writer::new(
        Vec::new(),
        &info(2),
        WriterOptions {
            version: 2,
            lossless: true,
        },
    )
    .unwrap();
    for (k, bt) in [&small, &deep, &small, &deeper, &after, &small]
        .iter()
        .enumerate()
    {
        w.put_alloc(
            &AllocHeader {
                time: Timestamp(1_000_000 + k as u64),
                domain: DomainId(0),
                length: 3,
                nsamples: 1,
                source: AllocSource::Minor,
            },
            bt,
            locs,
        )
        .unwrap();
    }
    assert_eq!(w.stats().cut_backtraces, 1);
    assert!(w.stats().relocated_backtraces >= 2);
    let got = read_all(&w.finish().unwrap());
    assert_eq!(got.len(), 6);
    assert_eq!(got[1], deep, "a 3,000-frame backtrace is kept whole");
    assert!(
        got[3].len() < deeper.len() && deeper.starts_with(&got[3]),
        "cut to a prefix"
    );
    assert_eq!(
        got[4], after,
        "the next backtrace is whole again, shared frames resent"
    );
    assert_eq!(got[5], small);
}

#[test]
fn reference_mode_truncates_like_the_reference() {
    let deep: Vec<LocationCode> = (0..3000).map(|i| LocationCode(0x1000 + i)).collect();
    let mut w = Writer::new(
        Vec::new(),
        &info(2),
        WriterOptions {
            version: 2,
            lossless: false,
        },
    )
    .unwrap();
    w.put_alloc(
        &AllocHeader {
            time: Timestamp(1_000_000),
            domain: DomainId(0),
            length: 3,
            nsamples: 1,
            source: AllocSource::Minor,
        },
        &deep,
        locs,
    )
    .unwrap();
    let got = read_all(&w.finish().unwrap());
    // 4 KiB budget: about 400 ten-byte misses
    assert!(
        got[0].len() < 420 && deep.starts_with(&got[0]),
        "{}",
        got[0].len()
    );
}

#[test]
fn common_prefix_agrees_with_a_plain_count() {
    let mut x = 0x2545f4914f6cdd1du64;
    for _ in 0..5000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let la = (x % 23) as usize;
        let lb = ((x >> 8) % 23) as usize;
        let a: Vec<LocationCode> = (0..la as u64).map(LocationCode).collect();
        let mut b: Vec<LocationCode> = (0..lb as u64).map(LocationCode).collect();
        if lb > 0 && !(x >> 20).is_multiple_of(3) {
            let k = ((x >> 24) as usize) % lb;
            b[k] = LocationCode(1 << 40);
        }
        // (counted another way than the function does)
        let want = (0..la.min(lb))
            .find(|&i| a[i] != b[i])
            .unwrap_or(la.min(lb));
        assert_eq!(common_prefix(&a, &b), want, "{a:?} {b:?}");
    }
}
