//! `QueueMode`: whether the load queue is the store itself, said where the pipeline is
//! wired.
//!
//! On the store's own queue a run's ack goes into its append's transaction
//! (`EventStore::append_acking`: acked if and only if the append commits) and a
//! delivered outcome's publish into its row's mark
//! (`Outbox::publish_and_mark_dispatched`): one commit each instead of two. Any other
//! queue (SQS, a wrapper) takes the two steps. The worker's and the dispatcher's plans
//! read the mode; nothing compares objects to guess it.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QueueMode {
    /// The queue is the store the worker appends to and the dispatcher marks in.
    StoreQueue,
    /// The queue is another object: acks and publishes are steps of their own.
    Separate,
}

impl QueueMode {
    /// Whether the worker's ack and the dispatcher's delivered publish go into the
    /// store's own transaction.
    pub fn is_fused(self) -> bool {
        match self {
            QueueMode::StoreQueue => true,
            QueueMode::Separate => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::QueueMode;

    #[test]
    fn only_the_store_s_own_queue_fuses_acks_and_publishes() {
        assert!(QueueMode::StoreQueue.is_fused());
        assert!(!QueueMode::Separate.is_fused());
    }
}
