//! Checks on the repository itself: what a fresh clone needs to build, and that it
//! stands on its own.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// One TLS stack (rustls, shared with the AWS SDK): the build needs no OpenSSL headers.
#[test]
fn the_build_links_no_openssl() {
    let lock = read("Cargo.lock");
    for name in ["openssl-sys", "native-tls", "hyper-tls"] {
        assert!(!lock.contains(&format!("name = \"{name}\"\n")), "Cargo.lock has {name}: reqwest must use rustls");
    }
    assert!(!read("scripts/test").contains("libssl"), "scripts/test must not install OpenSSL");
}
