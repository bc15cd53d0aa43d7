//! What tests and measures haul, and nothing that runs it in production: the eval
//! runner, the deterministic simulator, the benchmarks, the crash-test driver, and the
//! fake channel and model services they drive the real runtime against (over real
//! HTTP, speaking the services' wire contract).
//!
//! `haul-runtime` and `haul-server` never depend on this crate; the binary exposes it
//! only through the commands that test (`eval`, `sim`, `bench`, the hidden `testkit`).

pub mod bench;
pub mod crashtest;
pub mod eval;
pub mod export;
pub mod invariants;
pub mod oracle;
pub mod replay;
pub mod sim;
pub mod testkit;
pub mod testkit_llm;
pub mod testkit_otlp;
pub mod testkit_twilio;

/// The PostgreSQL database the test-and-measure commands make their throwaway schemas
/// in: `DATABASE_URL`, or the local test server.
pub use haul_postgres::scratch::{database_url, fresh_schema_url};

/// The scratch database, checked before a command starts on it: `DATABASE_URL` (or the
/// local test server) answering and holding its database (made when the server lets
/// it). The error says in one line what is wrong and how to mend it.
pub async fn scratch_database() -> anyhow::Result<String> {
    let url = database_url();
    haul_postgres::scratch::connect(&url).await.map_err(|e| anyhow::anyhow!(e.0))?;
    Ok(url)
}
