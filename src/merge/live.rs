//! The merge's live objects of one input: source object id → merged id, kept only while the
//! object lives. Recent ids sit in a ring indexed by id; older survivors move to a map.

use crate::format::location::IntMap;

/// Ids within the ring's length of the newest allocation are looked up by index; most
/// sampled objects die young, so the map holds only the long-lived ones and memory stays
/// bounded by them. The ring starts at `MIN_RING` slots (fewer in a merge of many
/// inputs, each input with its own ring: see [`LiveObjects::with_ring`]) and doubles, up to `MAX_RING`,
/// when many of the objects it moves on from still live, as in the fork traces, where
/// many objects live a few thousand allocations (benches/PERFORMANCE.md, "live: the ring").
const MIN_RING: usize = 4096;
const MAX_RING: usize = 16384;
const EMPTY: u64 = u64::MAX;

#[derive(Clone, Debug, Default)]
pub(crate) struct LiveObjects {
    /// ids below `base` are in `old`; `ring[id % len]` holds id's entry for base ≤ id < base + len
    base: u64,
    ring: Vec<u64>,
    old: IntMap<u64, u64>,
    /// The last move of the ring sent many objects to `old`: the next one doubles it.
    crowded: bool,
    /// The ring's first size (0: `MIN_RING`).
    first_ring: usize,
}

impl LiveObjects {
    /// Objects whose ring starts at about `slots` (at most `MIN_RING`; a power of two).
    pub fn with_ring(slots: usize) -> Self {
        LiveObjects {
            first_ring: match slots.max(1) {
                n if n.is_power_of_two() => n,
                n => n.next_power_of_two() / 2,
            }
            .clamp(64, MIN_RING),
            ..Default::default()
        }
    }

    /// The slot of `id`, when it is in the ring's range.
    #[inline(always)]
    fn slot(&self, id: u64) -> Option<usize> {
        let n = self.ring.len();
        (id >= self.base && id - self.base < n as u64).then(|| id as usize & (n - 1))
    }

    /// Record `id` as live with value `v` (any value but `u64::MAX`).
    #[inline(always)]
    pub fn insert(&mut self, id: u64, v: u64) {
        debug_assert!(v != EMPTY);
        if id < self.base {
            self.old.insert(id, v);
            return;
        }
        if id - self.base >= self.ring.len() as u64 {
            self.make_room(id);
        }
        let k = id as usize & (self.ring.len() - 1);
        self.ring[k] = v;
    }

    /// Make a slot for `id`: allocate the ring, double it (when the last move sent many
    /// survivors to the map and `id` is near), or move it on so that `id` is in its
    /// first half (half a ring of allocations before the next move), sending survivors to
    /// the map.
    #[cold]
    #[inline(never)]
    fn make_room(&mut self, id: u64) {
        if self.ring.is_empty() {
            let first = match self.first_ring {
                0 => MIN_RING,
                n => n,
            };
            self.ring = vec![EMPTY; first];
        }
        let n = self.ring.len() as u64;
        if id - self.base < n {
            return;
        }
        if self.crowded && n < MAX_RING as u64 && id - self.base < 2 * n {
            let mut wider = vec![EMPTY; 2 * n as usize];
            for i in self.base..self.base + n {
                wider[i as usize & (2 * n as usize - 1)] = self.ring[i as usize & (n as usize - 1)];
            }
            self.ring = wider;
            self.crowded = false;
            return;
        }
        let new_base = id + 1 - n / 2;
        let before = self.old.len();
        if new_base - self.base >= n {
            for (k, v) in self.ring.iter_mut().enumerate() {
                if *v != EMPTY {
                    // slot k holds the id ≡ k (mod n) in [base, base + n)
                    let off = (k as u64).wrapping_sub(self.base) % n;
                    self.old.insert(self.base + off, *v);
                    *v = EMPTY;
                }
            }
        } else {
            for old_id in self.base..new_base {
                let slot = &mut self.ring[old_id as usize & (n as usize - 1)];
                if *slot != EMPTY {
                    self.old.insert(old_id, *slot);
                    *slot = EMPTY;
                }
            }
        }
        // (one survivor in 16 of the ids moved on from)
        self.crowded = (self.old.len() - before) as u64 * 16 >= (new_base - self.base).min(n);
        self.base = new_base;
    }

    /// The value of live object `id`, to read or change.
    #[inline(always)]
    pub fn get_mut(&mut self, id: u64) -> Option<&mut u64> {
        if let Some(k) = self.slot(id) {
            let slot = &mut self.ring[k];
            return if *slot == EMPTY { None } else { Some(slot) };
        }
        self.old.get_mut(&id)
    }

    /// Forget live object `id`, giving its value.
    #[inline(always)]
    pub fn remove(&mut self, id: u64) -> Option<u64> {
        if let Some(k) = self.slot(id) {
            let slot = &mut self.ring[k];
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

    /// Objects that each live 6,000 allocations outgrow a ring of 4,096: it doubles until
    /// they fit (16,384: a move passes ids 8,192 to 16,384 old), and the map then stays
    /// empty. Objects that die young leave the ring at its first size; objects that live
    /// longer than the largest ring go to the map, as many as live.
    #[test]
    fn the_ring_grows_for_longer_lives() {
        for (life, ring) in [(6_000u64, 16_384), (50, MIN_RING), (40_000, MAX_RING)] {
            let mut live = LiveObjects::default();
            let mut in_map = 0;
            for id in 0..200_000u64 {
                live.insert(id, id * 3);
                if id >= life {
                    assert_eq!(live.remove(id - life), Some((id - life) * 3), "id {id}");
                }
                if id > 100_000 {
                    in_map = in_map.max(live.old_len());
                }
            }
            assert_eq!(live.ring.len(), ring, "lives of {life}");
            if life < MAX_RING as u64 / 2 {
                assert_eq!(in_map, 0, "lives of {life}");
            } else {
                assert!(
                    in_map > 0 && in_map <= life as usize,
                    "lives of {life}: {in_map}"
                );
            }
        }
    }
}
