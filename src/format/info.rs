//! The trace_info event: the first packet's only event, describing the traced process
//! (sampling rate, word size, executable, host, runtime params, pid, start time, context).

use crate::error::Malformed;
use crate::format::buf::{Cursor, WriteBuf};
use crate::format::event::{encode_header, DomainId, EventCode, Timestamp};

/// What a trace says about the process that wrote it.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceInfo {
    /// Fraction of allocated words sampled (memtrace's default: 1e-6).
    pub sample_rate: f64,
    /// Bits per word of the traced program (64 or 32).
    pub word_size: u8,
    /// The traced program's path, as it was run.
    pub executable_name: Vec<u8>,
    /// The machine's name.
    pub host_name: Vec<u8>,
    /// The runtime's OCAMLRUNPARAM-style settings.
    pub ocaml_runtime_params: Vec<u8>,
    /// The traced process's id.
    pub pid: u64,
    /// The info packet's timestamp: the trace's start time.
    pub start_time: Timestamp,
    /// Absent in format 1; an empty string means none.
    pub context: Option<Vec<u8>>,
    /// The info packet's domain (format 3; 0 before).
    pub initial_domain: DomainId,
    /// Format version of the info packet (1, 2 or 3).
    pub version: u16,
}

impl TraceInfo {
    /// Decode the event body (after its header) of a packet of the given version.
    pub fn decode(
        c: &mut Cursor<'_>,
        start_time: Timestamp,
        version: u16,
        domain: u16,
    ) -> Result<TraceInfo, Malformed> {
        let sample_rate = c.f64()?;
        let word_size = c.u8()?;
        let executable_name = c.string()?.to_vec();
        let host_name = c.string()?.to_vec();
        let ocaml_runtime_params = c.string()?.to_vec();
        let pid = c.u64()?;
        let context = if version >= 2 {
            let s = c.string()?;
            if s.is_empty() {
                None
            } else {
                Some(s.to_vec())
            }
        } else {
            None
        };
        Ok(TraceInfo {
            sample_rate,
            word_size,
            executable_name,
            host_name,
            ocaml_runtime_params,
            pid,
            start_time,
            context,
            initial_domain: DomainId(domain),
            version,
        })
    }

    /// Encode the event, header included (format 2 and 3 always carry the context).
    pub fn encode(&self, b: &mut WriteBuf) {
        b.u32(encode_header(EventCode::TraceInfo, self.start_time));
        b.f64(self.sample_rate);
        b.u8(self.word_size);
        b.string(&self.executable_name);
        b.string(&self.host_name);
        b.string(&self.ocaml_runtime_params);
        b.u64(self.pid);
        b.string(self.context.as_deref().unwrap_or(b""));
    }

    /// The context as text ("" when none).
    pub fn context_str(&self) -> String {
        String::from_utf8_lossy(self.context.as_deref().unwrap_or(b"")).into_owned()
    }
}
