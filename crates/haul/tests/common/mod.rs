//! What the tests that run the real `haul serve` binary share: ports, folders, the
//! child process guard, the wait for health, and the channel services' settings.
#![allow(dead_code)] // each test binary uses its own part

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use haul_harness::testkit::FakeServices;
use reqwest::StatusCode;

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A fresh folder `haul-{area}-{tag}-…` in the temporary directory.
pub fn temp_dir(area: &str, tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("haul-{area}-{tag}-{}-{}", std::process::id(), fastrand::u32(..)));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A child process, killed (SIGKILL) if the test ends without stopping it; its
/// stderr goes to `log`.
pub struct Proc {
    pub child: Child,
    pub log: PathBuf,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then the exit status within ten seconds.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(Instant::now() < deadline, "did not exit within 10 s of SIGTERM:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Waits (at most 20 s) until `haul serve` at `base` answers `/healthz`.
pub async fn wait_healthy(client: &reqwest::Client, base: &str, p: &Proc) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(r) = client.get(format!("{base}/healthz")).send().await
            && r.status() == StatusCode::OK
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("haul serve at {base} never became healthy:\n{}", p.log());
}

/// The settings that send every channel to `svc`, with its token.
pub fn channel_env(svc: &FakeServices) -> Vec<(String, String)> {
    let mut env = vec![("HAUL_SVC_TOKEN".to_string(), "svc-token-123".to_string())];
    for (name, path) in [("SMS", "sms"), ("HERO", "hero"), ("SLACK", "slack"), ("TMS", "tms"), ("OPS", "ops")] {
        env.push((format!("HAUL_CHANNELS_{name}_URL"), format!("http://{}/{path}", svc.addr)));
        env.push((format!("HAUL_CHANNELS_{name}_TOKEN_ENV"), "HAUL_SVC_TOKEN".into()));
    }
    env
}

/// A form body (reqwest is built without its `form` feature).
pub trait FormOf {
    fn form_of(self, pairs: &[(&str, &str)]) -> Self;
}

impl FormOf for reqwest::RequestBuilder {
    fn form_of(self, pairs: &[(&str, &str)]) -> Self {
        self.header("content-type", "application/x-www-form-urlencoded")
            .body(serde_urlencoded::to_string(pairs).unwrap())
    }
}

/// The settings that put haul's load queue on `queue_url` of the SQS emulator at
/// `endpoint`, with the static credentials the emulator takes.
pub fn sqs_env(queue_url: &str, endpoint: &str) -> Vec<(String, String)> {
    [
        ("HAUL_QUEUE_KIND", "sqs"),
        ("HAUL_QUEUE_URL", queue_url),
        ("HAUL_QUEUE_ENDPOINT", endpoint),
        ("HAUL_QUEUE_REGION", "us-east-1"),
        ("AWS_ACCESS_KEY_ID", "haul-test"),
        ("AWS_SECRET_ACCESS_KEY", "haul-test"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}
