//! The batch: a stream's events as decoded ahead, with the frames, locations and (encoded
//! ahead) codewords they need, written by the filling thread and read by the merging one.

use crate::format::buf::WriteBuf;
use crate::format::event::{AllocSource, LocationCode};
use crate::format::location::LocationList;

/// One event of a batch, at its time. (32 bytes, two to a cache line: the merging thread
/// reads every one decoded on another core, and the fewer cache lines they take, the
/// sooner.)
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timed {
    pub time: u64,
    pub ev: Ev,
}

/// An event of a batch. An allocation's backtrace is the previous allocation's (of the
/// same stream) first `keep` frames followed by `new` frames from the batch's frame list;
/// in a stream encoded ahead ([`StreamSpec::share`]) it is `keep` codewords in the batch's
/// `enc`, for `new` frames (`new` is [`THINNED_OUT`], and nothing encoded, for one that
/// thinning leaves out). `length` is [`WIDE_LENGTH`] and `nsamples` [`WIDE_SAMPLES`] when
/// the value is that or more, and then the batch's next entry in `wide` (the length first).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Ev {
    Alloc {
        id: u64,
        length: u32,
        keep: u32,
        new: u32,
        nsamples: u16,
        source: AllocSource,
    },
    Promote {
        id: u64,
    },
    Collect {
        id: u64,
    },
}

const _: () = assert!(std::mem::size_of::<Timed>() == 32);

/// An allocation's `length` that stands for the batch's next entry in `wide`.
pub(crate) const WIDE_LENGTH: u32 = u32::MAX;
/// An allocation's `nsamples` that stands for the batch's next entry in `wide`.
pub(crate) const WIDE_SAMPLES: u16 = u16::MAX;

impl Timed {
    /// Its place in the merged order, given its stream's bits of [`order_key`].
    #[inline(always)]
    pub fn key(&self, stream_bits: u128) -> u128 {
        let rank = match self.ev {
            Ev::Alloc { .. } => 0,
            Ev::Promote { .. } => 1,
            Ev::Collect { .. } => 2,
        };
        order_key(self.time, 0, rank, 0) | stream_bits
    }
}

/// Events of one stream, in its order, with the stream's own location codes.
#[derive(Default)]
pub(crate) struct Batch {
    pub evs: Vec<Timed>,
    /// The lengths and sample counts too wide for their fields in [`Ev::Alloc`], in order.
    pub wide: Vec<u64>,
    pub frames: Vec<LocationCode>,
    /// The input's cache entry of each frame: hints for the output's encoder, whose cache
    /// often places a code where the input's did (empty when the stream gives none).
    pub slots: Vec<u16>,
    /// Codes defined by location events, each with the index of the event it precedes.
    pub locs: Vec<(u32, LocationCode, LocationList)>,
    /// A stream encoded ahead: each allocation's codewords after their length (a u32, its
    /// top bit set when the backtrace had to be cut to fit a packet).
    pub enc: WriteBuf,
    /// Where in `enc` a code is sent whole (a miss), and the code.
    pub misses: Vec<(u32, LocationCode)>,
    /// The stream has no events after this batch.
    pub last: bool,
    /// Its allocations come encoded in `enc` (the stream is in a share: whichever thread
    /// filled the batch encoded it with the stream's [`Encoder`]); else as kept and new
    /// frames.
    pub encoded: bool,
    /// Frames and slots the batch held before it was last cleared.
    pub(crate) frames_used: usize,
    pub(crate) slots_used: usize,
}

/// In an encoding's length word (see [`Batch::enc`]): the backtrace was cut.
pub(crate) const CUT: u32 = 1 << 31;

/// One backtrace encoded ahead, as its record in [`Batch::enc`] says.
pub(crate) struct Encoding {
    /// Where its codewords are in `enc`.
    pub codewords: std::ops::Range<usize>,
    /// Where the next record starts.
    pub next: usize,
    /// (alone in its output domain) the frames it keeps of the stream's previous backtrace
    pub kept: usize,
    /// Its backtrace had to be cut (it did not fit the stream's share).
    pub cut: bool,
}

impl Batch {
    /// The record at `head` in `enc`: a length word (with [`CUT`]), for a stream alone in
    /// its output domain (`solo`) the count of frames kept, then the codewords. Written by
    /// [`crate::pipeline::fill`].
    #[inline(always)]
    pub fn encoding(&self, head: usize, solo: bool) -> Encoding {
        let b = self.enc.bytes();
        let word = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let len = word(head);
        let next = head + 4 + (len & !CUT) as usize;
        let (start, kept) = if solo {
            (head + 8, word(head + 4) as usize)
        } else {
            (head + 4, 0)
        };
        Encoding {
            codewords: start..next,
            next,
            kept,
            cut: len & CUT != 0,
        }
    }

    /// A batch with room for `events` events and their frames (a batch ends once it
    /// holds `most_frames`), so that filling it does not grow (copy and fault in) its
    /// vectors step by step.
    pub(crate) fn with_capacity(events: usize, most_frames: usize) -> Batch {
        // (16 new frames an event is plenty but for deep stacks; past `BATCH_FRAMES`,
        // room for the last backtrace's new frames, pages touched only when used, so
        // that batches seldom grow by a copy into new pages (benches/PERFORMANCE.md,
        // "Batch::with_capacity"). The small batches of many streams, each stream holding
        // one or two, get room for their limit and a short last backtrace past it, rather
        // than grow to it a quarter at a time.)
        let frames = if events >= BATCH_EVENTS / 4 {
            (events * 16).min(BATCH_FRAMES) + 4096
        } else {
            (events * 16).min(most_frames) + SMALL_BATCH_SLACK
        };
        Batch {
            evs: Vec::with_capacity(events),
            wide: Vec::new(),
            frames: Vec::with_capacity(frames),
            slots: Vec::with_capacity(frames),
            locs: Vec::new(),
            enc: WriteBuf::with_capacity(0),
            misses: Vec::new(),
            last: false,
            encoded: false,
            frames_used: 0,
            slots_used: 0,
        }
    }

    /// Write over the room for events (and codewords) of a batch the merging thread let go
    /// of, in one pass before filling it. Its cache lines are in the merging thread's core;
    /// taken back one by one as events are added, each is a wait that the decoding thread
    /// cannot hide when the host places the two vCPUs apart (benches/PERFORMANCE.md, "Batch::take_back").
    pub(crate) fn take_back(&mut self) {
        const BLANK: Timed = Timed {
            time: 0,
            ev: Ev::Collect { id: 0 },
        };
        // (the batch is empty: `Decoder::recycle` cleared it)
        self.evs.resize(self.evs.capacity(), BLANK);
        self.evs.clear();
        // (a share's codewords: a few bytes' room in a batch of frames)
        self.enc.clear_and_zero();
        // (and the frames' and slots' as far as the last fill went: deep stacks fill them
        // all; a stream that keeps no slots leaves theirs empty)
        self.frames.resize(self.frames_used, LocationCode(0));
        self.frames.clear();
        self.slots.resize(self.slots_used, 0);
        self.slots.clear();
    }

    pub(crate) fn clear(&mut self) {
        self.frames_used = self.frames.len();
        self.slots_used = self.slots.len();
        self.evs.clear();
        self.wide.clear();
        self.frames.clear();
        self.slots.clear();
        self.locs.clear();
        self.enc.clear();
        self.misses.clear();
        self.last = false;
        self.encoded = false;
    }
}

/// Where an event goes in the merged order, as one number: by time, then by input (in the
/// order given), then allocations before promotions before collections (so that an object
/// collected by another domain of its input in the same microsecond still comes after its
/// allocation), then by stream. The low 32 bits are the stream's index.
/// A stream's own events are never reordered: only its next one competes.
pub(crate) fn order_key(time: u64, input: usize, rank: u8, stream: usize) -> u128 {
    ((time as u128) << 64) | ((input as u128) << 34) | ((rank as u128) << 32) | stream as u128
}

/// Events per batch (fewer with many streams). Small batches keep the memory touched, and
/// so the page faults, down; too small, and the threads hand batches over too often
/// (benches/PERFORMANCE.md, "BATCH_EVENTS").
pub(crate) const BATCH_EVENTS: usize = 2048;
/// Events per batch where backtraces are encoded ahead, the decoding threads' work per
/// event the most: half the handoffs between the threads (benches/PERFORMANCE.md, "BATCH_EVENTS_AHEAD").
pub(crate) const BATCH_EVENTS_AHEAD: usize = 4096;
/// Events in a stream's first batch: the merge can start once every stream has one.
pub(crate) const FIRST_BATCH_EVENTS: usize = 64;
/// A batch ends early once it holds this many frames (deep backtraces), so that deep
/// stacks do not make every batch's pages many (benches/PERFORMANCE.md, "BATCH_FRAMES").
pub(crate) const BATCH_FRAMES: usize = 8_192;
/// A small batch's room for frames past its limit: the last backtrace's new frames.
const SMALL_BATCH_SLACK: usize = 64;

/// The room one encoding made ahead may take: a packet's, but for its header and the
/// allocation's fields.
pub(crate) const ENCODING_ROOM: usize = crate::format::packet::MAX_PACKET_SIZE - 512;
