//! A local SQS emulator: moto in server mode on 127.0.0.1, for `haul eval --queue sqs`
//! (the scenarios on SQS FIFO, each on a fresh queue) and the tests.

use std::process::Stdio;
use std::time::Duration;

use tokio::sync::OnceCell;

use super::{SqsQueue, SqsSettings};

/// The variable naming a running emulator (`scripts/test` starts one for the run).
pub const ENDPOINT_VAR: &str = "HAUL_SQS_ENDPOINT";

static STARTED: OnceCell<String> = OnceCell::const_new();

/// Settings for the emulator: static credentials and region, so the SDK never
/// looks for credentials anywhere else.
pub fn settings(endpoint: &str) -> SqsSettings {
    SqsSettings {
        queue_url: String::new(),
        endpoint: Some(endpoint.to_string()),
        region: Some("us-east-1".into()),
        static_credentials: Some(("haul-test".into(), "haul-test".into())),
    }
}

/// The emulator's endpoint: `HAUL_SQS_ENDPOINT` when set, else a `moto_server` this
/// process starts (once) and that stops when this process exits. Errors say how to
/// install moto; tests fail on them, never skip.
pub async fn endpoint() -> Result<String, String> {
    if let Ok(url) = std::env::var(ENDPOINT_VAR) {
        return Ok(url);
    }
    STARTED.get_or_try_init(start).await.cloned()
}

/// A fresh FIFO queue on the emulator, named so runs never share one.
pub async fn fresh_queue() -> Result<SqsQueue, String> {
    let endpoint = endpoint().await?;
    let name = format!("haul-test-{}-{:016x}.fifo", std::process::id(), fastrand::u64(..));
    SqsQueue::create(&settings(&endpoint), &name).await.map_err(|e| format!("{e} (emulator at {endpoint})"))
}

async fn start() -> Result<String, String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port for moto_server: {e}"))?
        .port();
    // moto's server outlives a killed parent; a small Python wrapper kills it when
    // its stdin (this process's pipe) closes, however this process ends.
    let wrapper = "import subprocess, sys\n\
        p = subprocess.Popen([sys.executable, '-m', 'moto.server', '-H', '127.0.0.1', '-p', sys.argv[1]], \
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n\
        sys.stdin.read()\n\
        p.kill()\n";
    let mut child = tokio::process::Command::new("python3")
        .args(["-c", wrapper, &port.to_string()])
        .stdin(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run python3 for moto_server: {e}"))?;
    // Keep the pipe open for the life of the process.
    let stdin = child.stdin.take();
    std::mem::forget(stdin);
    std::mem::forget(child);
    let endpoint = format!("http://127.0.0.1:{port}");
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            return Ok(endpoint);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!(
        "moto_server did not start on {endpoint} within 10 s; install it with `pip install 'moto[server]'` \
         or set {ENDPOINT_VAR} to a running SQS emulator"
    ))
}
