//! The simulator's own checks: a seed repeats exactly, and planted bugs are caught
//! within a bounded number of seeds (a harness that cannot fail is worthless).

use haul_harness::eval::EvalStore;
use haul_harness::sim::{FaultSet, SimOptions, run};
use haul_runtime::faults::PlantedBugs;

fn opts(seed: u64, bugs: PlantedBugs) -> SimOptions {
    SimOptions { seed, loads: 4, steps: 200, faults: FaultSet::all(), bugs }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_repeats_exactly() {
    let a = run(&opts(42, PlantedBugs::default()), &EvalStore::SqliteMemory).await.unwrap();
    let b = run(&opts(42, PlantedBugs::default()), &EvalStore::SqliteMemory).await.unwrap();
    let c = run(&opts(43, PlantedBugs::default()), &EvalStore::SqliteMemory).await.unwrap();
    assert_eq!(a.digest, b.digest);
    assert_eq!(a.coverage, b.coverage);
    assert_ne!(a.digest, c.digest);
    assert!(a.violation.is_none(), "{:?}\n{:#?}", a.violation, a.excerpt);
    assert!(a.events > 20 && a.effects > 5, "a run that trivially passes: {} events, {} effects", a.events, a.effects);
}

/// Runs seeds 1..=limit with the bug planted; returns the first seed caught and why.
async fn first_caught(bugs: PlantedBugs, limit: u64) -> (u64, String) {
    for seed in 1..=limit {
        let r = run(&opts(seed, bugs), &EvalStore::SqliteMemory).await.unwrap();
        if let Some(v) = r.violation {
            assert!(!r.excerpt.is_empty());
            // The same seed without the bug passes: the bug, not the seed, broke it.
            let clean = run(&opts(seed, PlantedBugs::default()), &EvalStore::SqliteMemory).await.unwrap();
            assert!(clean.violation.is_none(), "seed {seed} fails without the bug too: {:?}", clean.violation);
            return (seed, v);
        }
    }
    panic!("{bugs:?} was not caught in {limit} seeds");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skipping_the_version_check_is_caught() {
    let (seed, why) = first_caught(PlantedBugs { skip_version_check: true, ..Default::default() }, 20).await;
    assert!(why.contains("was made on a state its log does not give"), "seed {seed}: {why}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn marking_before_publishing_is_caught() {
    let (seed, why) = first_caught(PlantedBugs { mark_before_publish: true, ..Default::default() }, 20).await;
    assert!(why.contains("has no delivered outcome"), "seed {seed}: {why}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acking_before_appending_is_caught() {
    let (seed, why) = first_caught(PlantedBugs { ack_before_append: true, ..Default::default() }, 20).await;
    // The lost message is an inbound event or an action outcome, whichever the
    // checker meets first: an event missing from the log, or a dispatched row whose
    // delivered outcome never got there.
    assert!(
        why.contains("in the log 0 times") || why.contains("has no delivered outcome in the log"),
        "seed {seed}: {why}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_decision_is_caught_by_the_rule_table() {
    let (seed, why) = first_caught(PlantedBugs { rule7_on_any_update: true, ..Default::default() }, 1).await;
    assert_eq!(seed, 1);
    assert!(why.contains("is not the SOP's") && why.contains("closed"), "seed {seed}: {why}");
}

/// Liveness is judged apart from safety: a row never tried again, or a follow-up timer
/// never fired, breaks no invariant on what happened, yet the load never comes to rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_never_claimed_again_is_a_liveness_failure() {
    let (seed, why) = first_caught(PlantedBugs { never_reclaim: true, ..Default::default() }, 1).await;
    assert_eq!(seed, 1);
    assert!(why.starts_with("liveness: not at rest") && why.contains("pending rows"), "{why}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timer_never_pumped_is_a_liveness_failure() {
    let (seed, why) = first_caught(PlantedBugs { timer_never_pumped: true, ..Default::default() }, 1).await;
    assert_eq!(seed, 1);
    assert!(why.starts_with("liveness: not at rest") && why.contains("2 timers not fired"), "{why}");
}

/// Every fault point is named in the coverage check, hit or not; only those under a
/// tenth of a hit a seed are listed.
#[test]
fn the_rare_fault_points_are_those_under_a_tenth_of_a_hit_a_seed() {
    use haul_harness::sim::rare_fault_points;
    let coverage = [("crash:after_read", 10), ("crash:after_mark", 9), ("queue:outage", 0)]
        .map(|(k, n)| (k.to_owned(), n))
        .into_iter()
        .chain(
            ["after_decide", "after_append", "append_answer_lost", "after_claim", "after_send", "after_publish"]
                .map(|p| (format!("crash:{p}"), 50)),
        )
        .collect();
    let rare = rare_fault_points(&coverage, 100);
    assert_eq!(rare, [("crash:after_mark".to_owned(), 9), ("crash:after_pump_publish".to_owned(), 0)]);
}
