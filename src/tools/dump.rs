//! The text dump of a trace, byte for byte as the reference `dump_trace` tool prints it
//! (v0.2.3's layout for formats 1-2, HEAD's with `dom=` for format 3).

use crate::error::{Error, Malformed, Result};
use crate::format::event::{Event, LocationCode};
use crate::format::location::{IntMap, LocationTable};
use crate::reader::Reader;
use std::io::{Read, Write};

/// Append `v` in decimal, zero-padded to `width` (as printf's `%0*d`).
#[inline]
fn put_padded(out: &mut Vec<u8>, v: i64, width: usize) {
    let mut tmp = [0u8; 24];
    let mut i = tmp.len();
    let neg = v < 0;
    let mut u = v.unsigned_abs();
    loop {
        i -= 1;
        tmp[i] = b'0' + (u % 10) as u8;
        u /= 10;
        if u == 0 {
            break;
        }
    }
    let digits = tmp.len() - i;
    if neg {
        out.push(b'-');
    }
    let sign = neg as usize;
    for _ in digits + sign..width {
        out.push(b'0');
    }
    out.extend_from_slice(&tmp[i..]);
}

#[inline]
fn put_int(out: &mut Vec<u8>, v: i64) {
    put_padded(out, v, 0)
}

/// Formats frames, caching each code's text (a code's locations never change).
#[derive(Default)]
pub struct FrameFormatter {
    cache: IntMap<LocationCode, Vec<u8>>,
}

impl FrameFormatter {
    /// Append ` LOC LOC ...` for one frame, or ` $CODE` when it has no locations.
    pub fn put(
        &mut self,
        out: &mut Vec<u8>,
        code: LocationCode,
        table: &LocationTable,
    ) -> Result<(), Malformed> {
        if let Some(s) = self.cache.get(&code) {
            out.extend_from_slice(s);
            return Ok(());
        }
        let locs = table
            .get(&code)
            .ok_or(Malformed::UndefinedLocation { code: code.0 })?;
        let mut s = Vec::new();
        if locs.is_empty() {
            s.extend_from_slice(b" $");
            put_int(&mut s, code.0 as i64);
        } else {
            for l in locs.iter() {
                s.push(b' ');
                l.write_to(&mut s);
            }
        }
        out.extend_from_slice(&s);
        self.cache.insert(code, s);
        Ok(())
    }
}

/// Print every event of `reader` to `out`. Warnings go to `warn` as they happen. As the
/// reference dump does, it stops at a promote the reference reader refuses
/// ([`Reader::set_strict_promotes`]).
pub fn dump<R: Read, W: Write>(
    reader: &mut Reader<R>,
    out: &mut W,
    mut warn: impl FnMut(&str),
) -> Result<()> {
    reader.set_strict_promotes(true);
    let start = reader.info().start_time;
    let v3 = reader.info().version >= 3;
    let mut frames = FrameFormatter::default();
    let mut line = Vec::with_capacity(1 << 16);
    let wr = |e: std::io::Error| Error::output("<stdout>", "write", e);
    loop {
        let next = reader.next_with_locations();
        let (ev, table) = match next {
            Ok(Some(x)) => x,
            Ok(None) => break,
            Err(e) => {
                out.write_all(&line).map_err(wr)?;
                return Err(e);
            }
        };
        put_padded(&mut line, ev.time().since(start), 10);
        line.push(b' ');
        match ev {
            Event::Alloc(a) => {
                put_padded(&mut line, a.id.0 as i64, 10);
                line.push(b' ');
                line.extend_from_slice(a.source.name().as_bytes());
                line.push(b' ');
                put_int(&mut line, a.nsamples as i64);
                line.extend_from_slice(b" len=");
                put_int(&mut line, a.length as i64);
                if v3 {
                    line.extend_from_slice(b" dom=");
                    put_int(&mut line, a.domain.0 as i64);
                }
                // "% 4d": a space for the sign, padded to 4
                line.push(b' ');
                let mut p = Vec::with_capacity(8);
                p.push(b' ');
                put_int(&mut p, a.common_prefix as i64);
                line.resize(line.len() + 4usize.saturating_sub(p.len()), b' ');
                line.extend_from_slice(&p);
                line.push(b':');
                for &code in a.backtrace {
                    if let Err(what) = frames.put(&mut line, code, table) {
                        let keep = line.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
                        out.write_all(&line[..keep]).map_err(wr)?;
                        return Err(Error::Malformed {
                            at: reader.position(),
                            what,
                        });
                    }
                }
                line.push(b'\n');
            }
            Event::Promote { id, .. } => {
                put_padded(&mut line, id.0 as i64, 10);
                line.extend_from_slice(b" promote\n");
            }
            Event::Collect { id, .. } => {
                put_padded(&mut line, id.0 as i64, 10);
                line.extend_from_slice(b" collect\n");
            }
        }
        if line.len() > (1 << 16) - 8192 {
            out.write_all(&line).map_err(wr)?;
            line.clear();
        }
        if !reader.warnings().is_empty() {
            for w in reader.take_warnings() {
                warn(&w.to_string());
            }
        }
    }
    out.write_all(&line).map_err(wr)?;
    for w in reader.take_warnings() {
        warn(&w.to_string());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_matches_printf() {
        let mut v = Vec::new();
        put_padded(&mut v, 42, 10);
        v.push(b'|');
        put_padded(&mut v, -5, 10);
        v.push(b'|');
        put_padded(&mut v, 12345678901, 10);
        assert_eq!(
            String::from_utf8(v).unwrap(),
            "0000000042|-000000005|12345678901"
        );
    }
}
