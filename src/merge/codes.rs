//! The merged trace's location codes: a code keeps its value while every input agrees on
//! its locations; each further meaning gets a fresh code from the top of the 63-bit range.

use crate::format::event::LocationCode;
use crate::format::location::{IntMap, LocationList};
use std::collections::HashMap;

/// Every merged code with its locations, and the fresh codes given to second meanings.
#[derive(Default)]
pub(crate) struct Codes {
    pub meanings: IntMap<LocationCode, LocationList>,
    alternatives: HashMap<(LocationCode, LocationList), LocationCode>,
    next_fresh: u64,
}

impl Codes {
    const FRESH_TOP: u64 = (1 << 62) - 1;

    /// A code no input has used so far, with the given meaning.
    pub fn fresh(&mut self, locs: LocationList) -> LocationCode {
        loop {
            let c = LocationCode(Self::FRESH_TOP - self.next_fresh);
            self.next_fresh += 1;
            if let std::collections::hash_map::Entry::Vacant(v) = self.meanings.entry(c) {
                v.insert(locs);
                return c;
            }
        }
    }

    /// The merged code for `code` meaning `locs`; true when it had to be remapped.
    pub fn map(&mut self, code: LocationCode, locs: &LocationList) -> (LocationCode, bool) {
        match self.meanings.get(&code) {
            None => {
                self.meanings.insert(code, locs.clone());
                (code, false)
            }
            Some(l) if l == locs => (code, false),
            Some(_) => {
                if let Some(&c) = self.alternatives.get(&(code, locs.clone())) {
                    return (c, true);
                }
                let c = self.fresh(locs.clone());
                self.alternatives.insert((code, locs.clone()), c);
                (c, true)
            }
        }
    }
}
