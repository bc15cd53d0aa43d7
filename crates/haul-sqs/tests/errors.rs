//! An SQS queue that does not answer is one line naming the queue and the reason, not
//! the SDK's Debug text.

use haul_sqs::SqsQueue;

async fn check_error(endpoint: &str, queue_url: &str) -> String {
    let settings = haul_sqs::SqsSettings { queue_url: queue_url.into(), ..haul_sqs::emulator::settings(endpoint) };
    SqsQueue::connect(&settings).await.check().await.expect_err("the queue does not answer").to_string()
}

fn one_line(e: &str, queue_url: &str, reason: &str) {
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.len() < 500, "{} characters: {e}", e.len());
    assert!(e.contains(queue_url) && e.contains(reason), "{e}");
    assert!(!e.contains("DispatchFailure {") && !e.contains("ServiceError {"), "Debug text: {e}");
}

#[tokio::test]
async fn an_unreachable_queue_says_the_queue_and_connection_refused() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let url = format!("{endpoint}/123456789012/loads.fifo");
    one_line(&check_error(&endpoint, &url).await, &url, "Connection refused");
}

#[tokio::test]
async fn a_missing_queue_says_sqs_own_reason() {
    let endpoint = haul_sqs::emulator::endpoint().await.unwrap_or_else(|e| panic!("SQS emulator: {e}"));
    let url = format!("{endpoint}/123456789012/haul-no-such-queue-{}.fifo", std::process::id());
    one_line(&check_error(&endpoint, &url).await, &url, "does not exist");
}
