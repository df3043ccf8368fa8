//! What a trace's packet headers say, read without its events: its domains and allocations.

use crate::error::{Error, Result};
use crate::format::buf::Cursor;
use crate::format::packet::{header_size, PacketHeader};
use std::fs::File;
use std::io::Read;
use std::path::Path;

/// Most domains of one trace that a merge reads: each is read as a stream of its own (the
/// whole file again), so a trace naming thousands is refused rather than read thousands of
/// times over.
pub const MAX_MERGE_DOMAINS: usize = 1024;

/// The domains of a trace that have events, in order of first appearance (the info
/// packet's first), from its packet headers alone (formats 1-2: just domain 0). Stops
/// quietly at the first damaged header. More than [`MAX_MERGE_DOMAINS`] is an error.
pub fn scan_domains(path: &Path) -> Result<Vec<u16>> {
    Ok(scan_packets(path, false)?.domains)
}

/// What a trace's packet headers say, read without its events.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PacketScan {
    /// As [`scan_domains`].
    pub domains: Vec<u16>,
    /// Allocations the headers' id ranges claim (format 2: the last id; format 3: the sum
    /// of each packet's range), when asked for.
    pub alloc_ids: u64,
}

/// Scan a trace's packet headers: its domains and, with `count_allocs` (or in format 3),
/// its allocations. Stops quietly at the first damaged header.
pub fn scan_packets(path: &Path, count_allocs: bool) -> Result<PacketScan> {
    scan_packets_as(path, path, count_allocs)
}

/// [`scan_packets`] of `path`, which messages name `name`.
pub(crate) fn scan_packets_as(path: &Path, name: &Path, count_allocs: bool) -> Result<PacketScan> {
    use std::io::{Seek, SeekFrom};
    let mut f = File::open(path).map_err(|e| Error::input(name, "open", e))?;
    let len = f
        .metadata()
        .map_err(|e| Error::input(name, "stat", e))?
        .len();
    let mut off = 0u64;
    let mut scan = PacketScan::default();
    let mut seen = vec![false; 1 << 16];
    let mut hdr = [0u8; 68];
    let mut first = true;
    while off < len {
        f.seek(SeekFrom::Start(off))
            .map_err(|e| Error::input(name, "seek", e))?;
        let n = (len - off).min(68) as usize;
        if f.read_exact(&mut hdr[..n]).is_err() {
            break;
        }
        let h = match PacketHeader::parse(&mut Cursor::new(&hdr[..n])) {
            Ok(h) => h,
            Err(_) => break,
        };
        if h.version < 3 {
            if !count_allocs {
                scan.domains = vec![0];
                return Ok(scan);
            }
            // (the reader skips packets out of sequence: the last id counts them all)
            if h.size <= len - off {
                scan.alloc_ids = scan.alloc_ids.max(h.alloc_id_end);
            }
        } else if h.size <= len - off {
            scan.alloc_ids += h.alloc_id_end.saturating_sub(h.alloc_id_begin);
        }
        // a packet that is only its header holds no event: it needs no stream
        let has_events = h.size > header_size(h.version) as u64;
        if h.version >= 3 && (first || has_events) && !seen[h.domain as usize] {
            seen[h.domain as usize] = true;
            scan.domains.push(h.domain);
            if scan.domains.len() > MAX_MERGE_DOMAINS {
                return Err(Error::Incompatible(format!(
                    "{}: more than {MAX_MERGE_DOMAINS} domains with events (another one at byte {off}); merging so many domains of one trace is not supported",
                    name.display()
                )));
            }
        }
        first = false;
        off += h.size;
    }
    if scan.domains.is_empty() {
        scan.domains.push(0);
    }
    Ok(scan)
}
