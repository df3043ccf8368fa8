//! The merge's live objects of one input: source object id → merged id, kept only while the
//! object lives. Recent ids sit in a ring indexed by id; older survivors move to a map.

use crate::location::IntMap;

/// Ids within `RING` of the newest allocation are looked up by index; most sampled objects
/// die young, so the map holds only the long-lived ones and memory stays bounded by them.
const RING: usize = 4096;
const EMPTY: u64 = u64::MAX;

#[derive(Default)]
pub(crate) struct LiveObjects {
    /// ids below `base` are in `old`; `ring[id % RING]` holds id's entry for base ≤ id < base + RING
    base: u64,
    ring: Vec<u64>,
    old: IntMap<u64, u64>,
}

impl LiveObjects {
    /// Record `id` as live with value `v` (any value but `u64::MAX`).
    #[inline(always)]
    pub fn insert(&mut self, id: u64, v: u64) {
        debug_assert!(v != EMPTY);
        if id < self.base {
            self.old.insert(id, v);
            return;
        }
        if id - self.base >= RING as u64 || self.ring.is_empty() {
            self.make_room(id);
        }
        self.ring[id as usize % RING] = v;
    }

    /// Make a slot for `id`: allocate the ring, or move it on so that `id` is in its first
    /// half (half a ring of allocations before the next move), sending survivors to the map.
    #[cold]
    #[inline(never)]
    fn make_room(&mut self, id: u64) {
        if self.ring.is_empty() {
            self.ring = vec![EMPTY; RING];
        }
        if id - self.base < RING as u64 {
            return;
        }
        let new_base = id + 1 - (RING / 2) as u64;
        if new_base - self.base >= RING as u64 {
            for (k, v) in self.ring.iter_mut().enumerate() {
                if *v != EMPTY {
                    // slot k holds the id ≡ k (mod RING) in [base, base + RING)
                    let off = (k as u64).wrapping_sub(self.base) % RING as u64;
                    self.old.insert(self.base + off, *v);
                    *v = EMPTY;
                }
            }
        } else {
            for old_id in self.base..new_base {
                let slot = &mut self.ring[old_id as usize % RING];
                if *slot != EMPTY {
                    self.old.insert(old_id, *slot);
                    *slot = EMPTY;
                }
            }
        }
        self.base = new_base;
    }

    /// The value of live object `id`, to read or change.
    #[inline(always)]
    pub fn get_mut(&mut self, id: u64) -> Option<&mut u64> {
        if id >= self.base && id - self.base < RING as u64 && !self.ring.is_empty() {
            let slot = &mut self.ring[id as usize % RING];
            return if *slot == EMPTY { None } else { Some(slot) };
        }
        self.old.get_mut(&id)
    }

    /// Forget live object `id`, giving its value.
    #[inline(always)]
    pub fn remove(&mut self, id: u64) -> Option<u64> {
        if id >= self.base && id - self.base < RING as u64 && !self.ring.is_empty() {
            let slot = &mut self.ring[id as usize % RING];
            return if *slot == EMPTY {
                None
            } else {
                Some(std::mem::replace(slot, EMPTY))
            };
        }
        self.old.remove(&id)
    }

    /// Objects held in the map (survivors of the ring).
    #[cfg(test)]
    fn old_len(&self) -> usize {
        self.old.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A pseudo-random workload (mostly short lives, some long, ids with gaps and some out
    /// of order) gives the same answers as a plain map.
    #[test]
    fn agrees_with_a_map() {
        let mut live = LiveObjects::default();
        let mut model: HashMap<u64, u64> = HashMap::new();
        let mut x = 0x9e3779b97f4a7c15u64;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut next = 0u64;
        let mut alive: Vec<u64> = Vec::new();
        for step in 0..200_000u64 {
            let r = rnd();
            match r % 8 {
                0..=3 => {
                    // ids mostly dense, sometimes a jump past the whole ring
                    next += if r % 1000 == 7 {
                        10_000
                    } else {
                        1 + (r >> 20) % 3
                    };
                    let id = if r % 97 == 5 && next > 100 {
                        next - 50
                    } else {
                        next
                    };
                    if model.contains_key(&id) {
                        continue;
                    }
                    live.insert(id, step);
                    model.insert(id, step);
                    alive.push(id);
                }
                4..=6 if !alive.is_empty() => {
                    // collect a young object most of the time, an old one sometimes
                    let k = if r % 5 == 0 {
                        (r >> 8) as usize % alive.len()
                    } else {
                        alive.len() - 1 - (r >> 8) as usize % alive.len().min(8)
                    };
                    let id = alive.swap_remove(k);
                    assert_eq!(live.remove(id), model.remove(&id), "remove {id}");
                }
                _ => {
                    let id = (r >> 4) % (next + 2);
                    let got = live.get_mut(id).map(|v| {
                        *v ^= 1;
                        *v
                    });
                    let want = model.get_mut(&id).map(|v| {
                        *v ^= 1;
                        *v
                    });
                    assert_eq!(got, want, "get {id}");
                }
            }
        }
        for (id, v) in model {
            assert_eq!(live.remove(id), Some(v));
        }
        assert_eq!(live.old_len(), 0);
    }
}
