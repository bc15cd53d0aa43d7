//! A long simulation keeps nothing per seed: memory after many seeds is what it was
//! after a few. Alone in its own test binary, so no other test's memory is counted
//! (`cargo test` runs a binary's tests as threads of one process).

use haul_harness::eval::EvalStore;
use haul_harness::sim::{FaultSet, SimOptions, resident_memory, run};
use haul_runtime::faults::PlantedBugs;

async fn seeds(range: std::ops::Range<u64>) {
    for seed in range {
        let opts = SimOptions { seed, loads: 4, steps: 100, faults: FaultSet::all(), bugs: PlantedBugs::default() };
        let r = run(&opts, &EvalStore::SqliteMemory).await.unwrap();
        assert!(r.violation.is_none(), "seed {seed}: {:?}", r.violation);
    }
}

/// Each seed's services, their recorded calls and their pooled connections were kept
/// until the process ended: 0.14 MB a seed at the default size, 0.74 MB at 20 loads ×
/// 2,000 steps. Ten times the seeds now stay within a tenth of the memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_flat_over_ten_times_the_seeds() {
    seeds(1..21).await;
    let Some((after_20, _)) = resident_memory() else {
        eprintln!("no /proc/self/status on this system: memory is not measured here");
        return;
    };
    seeds(21..221).await;
    let (after_220, _) = resident_memory().unwrap();
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    assert!(
        after_220 as f64 <= after_20 as f64 * 1.10,
        "resident memory grew from {:.1} MiB after 20 seeds to {:.1} MiB after 220",
        mib(after_20),
        mib(after_220)
    );
}
