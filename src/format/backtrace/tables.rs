//! The reader's cache tables, sparse while a stream has used few entries and dense after:
//! a merge of thousands of small inputs keeps a reader per input, each touching a few dozen.

use super::{CACHE_SIZE, EMPTY};

/// Entries a page of the sparse tables holds.
const PAGE: usize = 16;
const PAGES: usize = CACHE_SIZE / PAGE;
/// Pages in use past which the tables turn dense: a quarter of the dense tables' memory.
const MOST_PAGES: usize = CACHE_SIZE * (8 + 2) / 4 / std::mem::size_of::<Page>();

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

/// Only the pages of entries ever written, found through a directory.
#[derive(Clone)]
pub(super) struct Sparse {
    /// Each page's place in `pages`; 0, the blank page (never written), for a page not
    /// written yet.
    dir: Box<[u16; PAGES]>,
    pages: Vec<Page>,
}

#[derive(Clone, Copy)]
struct Page {
    loc: [u64; PAGE],
    pred: [u16; PAGE],
}

const BLANK: Page = Page {
    loc: [EMPTY; PAGE],
    pred: [0; PAGE],
};

/// A reader's tables: dense, or sparse first when asked for.
#[derive(Clone)]
pub(super) enum ReaderTables {
    Sparse(Sparse),
    Dense(Dense),
}

impl ReaderTables {
    /// Dense tables: a directory's load a frame saved (sparse ones made the merge of
    /// `fork/`, whose streams stay sparse, 4% slower).
    pub(super) fn dense() -> Self {
        ReaderTables::Dense(Dense::empty())
    }
}

impl Default for ReaderTables {
    fn default() -> Self {
        ReaderTables::Sparse(Sparse {
            dir: vec![0; PAGES]
                .into_boxed_slice()
                .try_into()
                .unwrap_or_else(|_| unreachable!()),
            pages: vec![BLANK],
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

    /// Turn dense once the sparse tables have grown past a quarter of the dense ones'
    /// memory (their directory is then one more load a frame for little saved).
    pub(super) fn settle(&mut self) {
        if let ReaderTables::Sparse(s) = self {
            if s.pages.len() > MOST_PAGES {
                let mut d = Dense::empty();
                for (k, &p) in s.dir.iter().enumerate() {
                    let page = &s.pages[p as usize];
                    d.loc[k * PAGE..(k + 1) * PAGE].copy_from_slice(&page.loc);
                    d.pred[k * PAGE..(k + 1) * PAGE].copy_from_slice(&page.pred);
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
    /// The page of entry `i`, made (copied from the blank one) if not written yet.
    #[inline(always)]
    fn page_mut(&mut self, i: usize) -> &mut Page {
        let d = &mut self.dir[i / PAGE];
        if *d == 0 {
            *d = self.pages.len() as u16;
            self.pages.push(BLANK);
        }
        &mut self.pages[*d as usize]
    }
}

impl Tables for Sparse {
    #[inline(always)]
    fn loc(&self, i: usize) -> u64 {
        self.pages[self.dir[i / PAGE] as usize].loc[i % PAGE]
    }
    #[inline(always)]
    fn set_loc(&mut self, i: usize, v: u64) {
        self.page_mut(i).loc[i % PAGE] = v;
    }
    #[inline(always)]
    fn pred(&self, i: usize) -> u16 {
        self.pages[self.dir[i / PAGE] as usize].pred[i % PAGE]
    }
    #[inline(always)]
    fn set_pred(&mut self, i: usize, v: u16) {
        self.page_mut(i).pred[i % PAGE] = v;
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
            assert_eq!(sp.pages.len(), 4, "the blank page and three written");
        }
        s.settle();
        assert!(!s.is_dense());
        assert_eq!(s.entry(5), (47, 0));
        assert_eq!(s.entry(6), (EMPTY, 0));
        assert_eq!(s.entry(16383), (42 + 16383, 0));
    }
}
