//! Load state for runs: a cached snapshot per load caught up with the log's tail.
//!
//! The log stays the source of truth: a snapshot is the fold of a prefix, and since the
//! log is append-only, the snapshot plus `read_after(its version)` is the full fold
//! (property-tested in haul-core, and against real stores in the worker tests). A run
//! takes its load's snapshot out of the cache and puts the state after its append
//! back, so a run reads only what others appended since. A miss (or a cache that was
//! dropped after a failure) is a full read. The cache holds at most `capacity` loads.
//!
//! When the caller knows the log's version (the store's queue hands it out with each
//! message) and the snapshot is at it, there is nothing to read: the run decides on
//! the snapshot, with no statement sent. A version that moved on after the queue saw it
//! (another process appended meanwhile) makes the append conflict, and the run reads
//! again, as after any conflict.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use haul_core::ids::LoadId;
use haul_core::projection::{LoadState, project};
use haul_store::{Store, StoreError};

pub struct Projector {
    store: Arc<dyn Store>,
    capacity: usize,
    cache: Mutex<Cache>,
}

/// Snapshots with the tick of their last use, for least-recently-used eviction.
#[derive(Default)]
struct Cache {
    snapshots: HashMap<LoadId, (LoadState, u64)>,
    tick: u64,
}

impl Projector {
    pub fn new(store: Arc<dyn Store>, capacity: usize) -> Self {
        Projector { store, capacity: capacity.max(1), cache: Mutex::new(Cache::default()) }
    }

    /// The load's current state; the snapshot leaves the cache until `put` back. With
    /// `log_version`, the version the caller knows the log to be at: a snapshot at it is
    /// the state, unread.
    pub async fn take(&self, load: &LoadId, log_version: Option<u64>) -> Result<LoadState, StoreError> {
        let cached = self.cache.lock().unwrap_or_else(|p| p.into_inner()).snapshots.remove(load).map(|(s, _)| s);
        match cached {
            Some(state) if Some(state.version) == log_version => {
                metrics::counter!("haul_snapshot_reads_skipped_total").increment(1);
                Ok(state)
            }
            Some(mut state) => {
                let (tail, _) = self.store.read_after(load, state.version).await?;
                for r in &tail {
                    state.apply(r);
                }
                Ok(state)
            }
            None => {
                let (records, _) = self.store.read(load).await?;
                Ok(project(&records))
            }
        }
    }

    /// Keeps a state that is the fold of a prefix of the load's log.
    pub fn put(&self, load: &LoadId, state: LoadState) {
        let mut guard = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let Cache { snapshots: cache, tick } = &mut *guard;
        *tick += 1;
        cache.insert(load.clone(), (state, *tick));
        if cache.len() > self.capacity {
            // Drop the least recently used tenth.
            let mut ticks: Vec<u64> = cache.values().map(|(_, t)| *t).collect();
            ticks.sort_unstable();
            let cut = ticks[ticks.len() / 10];
            cache.retain(|_, (_, t)| *t > cut);
        }
    }

    pub fn cached(&self) -> usize {
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).snapshots.len()
    }
}
