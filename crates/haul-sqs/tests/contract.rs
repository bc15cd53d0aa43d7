//! The LoadQueue contract suite on SQS FIFO, against a local emulator (moto).

use std::sync::Arc;

use haul_store::queue_contract::{Guarantees, QueueUnderTest};

/// What SQS FIFO, as moto emulates it, promises of the suite's guarantees
/// (docs/internals.md, "SQS FIFO").
const SQS: Guarantees = Guarantees {
    reports_duplicates: false,
    // SQS keeps a deduplication id five minutes after the message is deleted; moto
    // forgets it at the delete. The log's DuplicateEntry covers both.
    dedup_after_ack: false,
    dedup_past_five_minutes: false,
    rejects_stale_receipts: false,
    remembers_bodies: false,
};

async fn fresh() -> QueueUnderTest {
    let queue = haul_sqs::emulator::fresh_queue().await.unwrap_or_else(|e| panic!("SQS emulator: {e}"));
    QueueUnderTest::real_time(Arc::new(queue), SQS)
}

haul_store::queue_contract_tests!(fresh);
