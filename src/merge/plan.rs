//! The plan of a merge, decided before any event is read: each input's state (thinning, its
//! tag, its warnings), its streams and their output domains, and which are encoded ahead.

use super::inputs::{merged_pids, process_tag, thinning_cost, Opened, Prepared};
use super::objects::{warn_input, InputState};
use super::streams::{ahead_pays, Backtrace, Stream, MAX_SHARES};
use super::{InputReport, MergeOptions};
use crate::error::{Error, Result};
use crate::format::event::DomainId;
use crate::format::location::IntMap;
use crate::merge::codes::Codes;
use crate::merge::live::LiveObjects;
use crate::pipeline::decoder::{order_key, Batch, StreamSpec, TAG_FRAME};
use crate::pipeline::fill::Warnings;
use crate::pipeline::share::ShareOf;
use crate::thin::Thinner;
use std::sync::Arc;

/// What a merge is to do: per input, per stream, per output domain.
pub(super) struct Plan {
    pub(super) codes: Codes,
    pub(super) states: Vec<InputState>,
    pub(super) streams: Vec<Stream>,
    pub(super) specs: Vec<StreamSpec>,
    pub(super) bts: Vec<Backtrace>,
    /// Some stream is encoded ahead.
    pub(super) encoded_ahead: bool,
    /// Per input whose packets are copied: its (domain, output domain) pairs.
    pub(super) copied: Vec<Option<Vec<(u16, u16)>>>,
    /// A domain no stream or copied input writes in (format 3, several inputs).
    pub(super) free_domain: u16,
}

impl Plan {
    /// The plan of a merge of `opened` (all readable) into `format` at `min_rate`, the
    /// inputs `copied` (format 3, several inputs) copied packet by packet.
    pub(super) fn new(
        opened: &[Opened],
        prepared: &Prepared,
        opts: &MergeOptions,
        format: u16,
        min_rate: f64,
        copied: &[bool],
    ) -> Result<Plan> {
        let single = opened.len() == 1;
        let mut plan = Plan {
            codes: Codes::default(),
            states: Vec::new(),
            streams: Vec::new(),
            specs: Vec::new(),
            bts: Vec::new(),
            encoded_ahead: false,
            copied: vec![None; opened.len()],
            free_domain: 0,
        };
        let mut out_domains: Vec<DomainId> = Vec::new();
        let mut next_domain = 0u16;
        for (k, o) in opened.iter().enumerate() {
            let st = input_state(k, o, opened, prepared, opts, min_rate, &mut plan.codes);
            let size = std::fs::metadata(&o.source).map_or(0, |m| m.len());
            for &d in &o.domains {
                // (format 3: each input's domains get domains of their own)
                let out_domain = if format < 3 {
                    DomainId(0)
                } else if single {
                    DomainId(d)
                } else {
                    next_domain = (next_domain.checked_add(1))
                        .ok_or_else(|| Error::Incompatible("more than 65535 domains".into()))?;
                    DomainId(next_domain - 1)
                };
                if copied.get(k) == Some(&true) {
                    (plan.copied[k].get_or_insert_with(Vec::new)).push((d, out_domain.0));
                    continue;
                }
                let out_slot = match out_domains.iter().position(|&x| x == out_domain) {
                    Some(i) => i,
                    None => {
                        out_domains.push(out_domain);
                        out_domains.len() - 1
                    }
                };
                plan.add_stream(k, o, d, size, &st, out_domain, out_slot);
            }
            plan.states.push(st);
        }
        plan.free_domain = next_domain;
        plan.choose_encoding(opened, opts, out_domains.len(), single);
        Ok(plan)
    }

    /// A stream of input `k` (`o`), its domain `d`, written in `out_domain`.
    #[allow(clippy::too_many_arguments)]
    fn add_stream(
        &mut self,
        k: usize,
        o: &Opened,
        d: u16,
        size: u64,
        st: &InputState,
        out_domain: DomainId,
        out_slot: usize,
    ) {
        self.specs.push(StreamSpec {
            input: k,
            path: o.source.clone(),
            name: o.path.clone(),
            domain: (o.info.version >= 3).then_some(d),
            size,
            share: None,
            tagged: st.tag.is_some(),
            thinner: None,
            solo: false,
        });
        self.streams.push(Stream {
            input: k,
            out_domain,
            batch: Batch::default(),
            pos: 0,
            frame_pos: 0,
            loc_pos: 0,
            out_slot,
            enc_pos: 0,
            solo: false,
            miss_pos: 0,
            wide_pos: 0,
            key_bits: order_key(0, k, 0, self.streams.len()),
            remap: IntMap::default(),
        });
        self.bts.push(Backtrace {
            frames: st.tag.into_iter().collect(),
            hints: Vec::new(),
            version: 0,
        });
    }

    /// Streams that take turns in one output domain, encoded ahead when that pays: as they
    /// are decoded, by whichever thread fills a batch (the merging thread fills one rather
    /// than wait for it).
    fn choose_encoding(
        &mut self,
        opened: &[Opened],
        opts: &MergeOptions,
        slots: usize,
        single: bool,
    ) {
        for slot in 0..slots {
            let members: Vec<usize> = (0..self.streams.len())
                .filter(|&j| self.streams[j].out_slot == slot)
                .collect();
            // (a stream alone in its domain, format 3, is encoded ahead in the domain's
            // whole cache, after what it keeps of its previous backtrace, but never a lone
            // input's, which the merge copies as it is; a thinned input's draws are made
            // again as its stream is encoded, in the order the merging thread makes them:
            // its one stream's)
            let possible = (1..=MAX_SHARES).contains(&members.len())
                && !single
                && members.iter().all(|&j| {
                    let k = self.streams[j].input;
                    self.states[k].thinner.is_none() || opened[k].domains.len() == 1
                });
            let ahead = possible
                && (opts.encode_ahead).unwrap_or_else(|| ahead_pays(&self.specs, &members));
            if ahead {
                self.encoded_ahead = true;
                self.encode_ahead(&members);
            }
        }
    }

    /// Encode the streams `members` of one output domain ahead: alone in the domain's
    /// cache, or each in its share of it.
    fn encode_ahead(&mut self, members: &[usize]) {
        for (rank, &j) in members.iter().enumerate() {
            if members.len() == 1 {
                self.specs[j].solo = true;
                self.streams[j].solo = true;
            } else {
                self.specs[j].share = Some(ShareOf {
                    index: rank as u16,
                    count: members.len() as u16,
                });
            }
            // (its share encodes the tag as TAG_FRAME: sent whole, it is the input's tag)
            let st = &self.states[self.streams[j].input];
            if let Some(t) = st.tag {
                self.streams[j].remap.insert(TAG_FRAME, t);
            }
            self.specs[j].thinner = st.thinner.clone();
        }
    }
}

/// The state of input `k` (`o`, of `opened`): its report, thinning to `min_rate`, its tag,
/// and the warnings known before it is read.
fn input_state(
    k: usize,
    o: &Opened,
    opened: &[Opened],
    prepared: &Prepared,
    opts: &MergeOptions,
    min_rate: f64,
    codes: &mut Codes,
) -> InputState {
    let i = &o.info;
    let mut st = InputState {
        report: InputReport {
            path: o.path.clone(),
            arg: prepared.args[o.index],
            pid: i.pid,
            format: i.version,
            sample_rate: i.sample_rate,
            keep_fraction: 1.0,
            ..Default::default()
        },
        // (the inputs' rings together at most 4 MiB at first)
        live: LiveObjects::with_ring((1 << 19) / opened.len().max(1)),
        thinner: None,
        tag: None,
        warnings: Warnings::default(),
        waiting: Vec::new(),
    };
    let p_keep = if i.sample_rate > min_rate {
        min_rate / i.sample_rate
    } else {
        1.0
    };
    if p_keep < 1.0 {
        st.thinner = Some(Thinner::new(p_keep, opts.seed, k as u64));
    } else if i.sample_rate < min_rate {
        let m = format!(
            "sampled at rate {}, but it holds no allocations: the merge keeps the rate of \
             the others ({min_rate})",
            i.sample_rate
        );
        warn_input(&mut st, m);
    }
    // (what thinning costs, said once: by the first input at the slowest rate)
    if opened.iter().position(|x| x.info.sample_rate == min_rate) == Some(k) {
        if let Some(m) = thinning_cost(opened, min_rate) {
            warn_input(&mut st, m);
        }
    }
    // An earlier merge beside one of the traces it holds (a directory merged before, its
    // output kept under another name, that records no start times): that process's
    // allocations would be twice.
    let held = merged_pids(i);
    for x in (opened.iter()).filter(|x| x.index != o.index && held.contains(&x.info.pid)) {
        let m = format!(
            "an earlier merge that holds pid {}, whose trace {} is merged too: if that is \
             the same process, its allocations appear twice",
            x.info.pid,
            x.path.display()
        );
        warn_input(&mut st, m);
    }
    for (_, again) in prepared.repeats.iter().filter(|(at, _)| *at == o.index) {
        warn_input(&mut st, again.clone());
    }
    if opts.tag_processes {
        st.tag = Some(codes.fresh(Arc::from(vec![process_tag(&o.path, i)])));
    }
    st
}
