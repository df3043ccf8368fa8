//! The reader's cache tables, sparse while a stream has used few entries and dense after:
//! a merge of thousands of small inputs keeps a reader per input, each touching a few dozen.

use super::{CACHE_SIZE, EMPTY};

/// Slots a sparse table starts with.
const FIRST_SLOTS: usize = 16;
/// Entries in use past which the tables turn dense: their slots then take a fifth of the
/// dense tables' memory.
const MOST_ENTRIES: usize = CACHE_SIZE * (8 + 2) / 5 / (2 * std::mem::size_of::<Slot>());

/// The cache's codes (EMPTY where no miss ever filled them) and predictions, as the
/// decoder reads and writes them.
pub(super) trait Tables {
    fn loc(&self, i: usize) -> u64;
    fn set_loc(&mut self, i: usize, v: u64);
    fn pred(&self, i: usize) -> u16;
    fn set_pred(&mut self, i: usize, v: u16);
}

/// Every entry in place: one load an entry.
#[derive(Clone)]
pub(super) struct Dense {
    loc: Box<[u64; CACHE_SIZE]>,
    pred: Box<[u16; CACHE_SIZE]>,
}

/// Only the entries ever written, in an open-addressed table at most half full: the few
/// dozen entries a small trace touches fit in a kilobyte.
#[derive(Clone)]
pub(super) struct Sparse {
    /// A power of two long; linear probing from an entry's hash.
    slots: Box<[Slot]>,
    used: usize,
}

/// One written entry.
#[derive(Clone, Copy)]
struct Slot {
    /// The entry's index plus one; 0 for a free slot.
    key: u16,
    pred: u16,
    loc: u64,
}

const FREE: Slot = Slot {
    key: 0,
    pred: 0,
    loc: EMPTY,
};

/// A reader's tables: dense, or sparse first when asked for.
#[derive(Clone)]
pub(super) enum ReaderTables {
    Sparse(Sparse),
    Dense(Dense),
}

impl ReaderTables {
    /// Dense tables: no probing a frame (sparse ones made the merge of `fork/`, whose
    /// streams stay sparse, 4% slower).
    pub(super) fn dense() -> Self {
        ReaderTables::Dense(Dense::empty())
    }
}

impl Default for ReaderTables {
    fn default() -> Self {
        ReaderTables::Sparse(Sparse {
            slots: vec![FREE; FIRST_SLOTS].into_boxed_slice(),
            used: 0,
        })
    }
}

impl ReaderTables {
    /// Entry `i`'s code (EMPTY if never filled) and prediction.
    pub(super) fn entry(&self, i: usize) -> (u64, u16) {
        match self {
            ReaderTables::Sparse(t) => (t.loc(i), t.pred(i)),
            ReaderTables::Dense(t) => (t.loc(i), t.pred(i)),
        }
    }

    /// Turn dense once the sparse tables hold more than a few thousand entries (probing
    /// then costs more than it saves).
    pub(super) fn settle(&mut self) {
        if let ReaderTables::Sparse(s) = self {
            if s.used > MOST_ENTRIES {
                let mut d = Dense::empty();
                for slot in s.slots.iter().filter(|s| s.key != 0) {
                    let i = slot.key as usize - 1;
                    d.loc[i] = slot.loc;
                    d.pred[i] = slot.pred;
                }
                *self = ReaderTables::Dense(d);
            }
        }
    }

    #[cfg(test)]
    pub(super) fn is_dense(&self) -> bool {
        matches!(self, ReaderTables::Dense(_))
    }
}

impl Dense {
    /// Every entry empty, every prediction 0.
    fn empty() -> Dense {
        Dense {
            loc: super::table_of(EMPTY),
            pred: super::table_of(0),
        }
    }
}

impl Tables for Dense {
    #[inline(always)]
    fn loc(&self, i: usize) -> u64 {
        self.loc[i]
    }
    #[inline(always)]
    fn set_loc(&mut self, i: usize, v: u64) {
        self.loc[i] = v;
    }
    #[inline(always)]
    fn pred(&self, i: usize) -> u16 {
        self.pred[i]
    }
    #[inline(always)]
    fn set_pred(&mut self, i: usize, v: u16) {
        self.pred[i] = v;
    }
}

impl Sparse {
    /// The slot where entry `i` is, or the free slot where it would go.
    #[inline(always)]
    fn find(&self, i: usize) -> usize {
        let mask = self.slots.len() - 1;
        // (Fibonacci hashing: entries next to each other land apart)
        let mut k = ((i as u32).wrapping_mul(0x9E37_79B1) >> 16) as usize & mask;
        let key = i as u16 + 1;
        loop {
            let s = self.slots[k].key;
            if s == key || s == 0 {
                return k;
            }
            k = (k + 1) & mask;
        }
    }

    /// Entry `i`'s slot, made if not written yet.
    #[inline(always)]
    fn slot_mut(&mut self, i: usize) -> &mut Slot {
        let mut k = self.find(i);
        if self.slots[k].key == 0 {
            if 2 * (self.used + 1) > self.slots.len() {
                self.grow();
                k = self.find(i);
            }
            self.used += 1;
            self.slots[k].key = i as u16 + 1;
        }
        &mut self.slots[k]
    }

    /// Twice the slots, every entry placed again.
    #[cold]
    fn grow(&mut self) {
        let twice = vec![FREE; self.slots.len() * 2].into_boxed_slice();
        let old = std::mem::replace(&mut self.slots, twice);
        for s in old.iter().filter(|s| s.key != 0) {
            let k = self.find(s.key as usize - 1);
            self.slots[k] = *s;
        }
    }
}

impl Tables for Sparse {
    #[inline(always)]
    fn loc(&self, i: usize) -> u64 {
        self.slots[self.find(i)].loc
    }
    #[inline(always)]
    fn set_loc(&mut self, i: usize, v: u64) {
        self.slot_mut(i).loc = v;
    }
    #[inline(always)]
    fn pred(&self, i: usize) -> u16 {
        self.slots[self.find(i)].pred
    }
    #[inline(always)]
    fn set_pred(&mut self, i: usize, v: u16) {
        self.slot_mut(i).pred = v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same writes into both give the same reads, and turning dense keeps them.
    #[test]
    fn sparse_reads_as_dense() {
        let mut s = ReaderTables::default();
        let mut d = Dense::empty();
        let mut x = 7u64;
        for n in 0..3000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let i = (x >> 40) as usize % CACHE_SIZE;
            let ReaderTables::Sparse(sp) = &mut s else {
                break;
            };
            if n % 3 == 0 {
                sp.set_loc(i, x >> 2);
                d.set_loc(i, x >> 2);
            } else {
                sp.set_pred(i, n as u16);
                d.set_pred(i, n as u16);
            }
            s.settle();
        }
        assert!(s.is_dense(), "3,000 scattered writes make it dense");
        for i in 0..CACHE_SIZE {
            assert_eq!(s.entry(i), (d.loc(i), d.pred(i)), "entry {i}");
        }
    }

    #[test]
    fn a_few_entries_stay_sparse_and_small() {
        let mut s = ReaderTables::default();
        if let ReaderTables::Sparse(sp) = &mut s {
            for i in [0, 5, 16, 16383] {
                sp.set_loc(i, 42 + i as u64);
            }
            assert_eq!(sp.used, 4);
            assert_eq!(sp.slots.len(), 16, "four entries in sixteen slots");
        }
        s.settle();
        assert!(!s.is_dense());
        assert_eq!(s.entry(5), (47, 0));
        assert_eq!(s.entry(6), (EMPTY, 0));
        assert_eq!(s.entry(16383), (42 + 16383, 0));
    }
}
