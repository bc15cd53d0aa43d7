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

fn script(name: &str, args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = std::process::Command::new(root().join("scripts").join(name));
    cmd.args(args).env_remove("CI").env_remove("HAUL_TEST_MAY_RESTART_POSTGRES").envs(env.iter().copied());
    let out = cmd.output().unwrap_or_else(|e| panic!("scripts/{name}: {e}"));
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// The crash test restarts the machine's PostgreSQL only where that is a test server.
#[test]
fn postgres_is_restarted_only_with_ci_or_the_explicit_variable() {
    let (ok, said) = script("may-restart-postgres", &[], &[]);
    assert!(!ok, "allowed with neither CI nor the variable");
    assert!(said.contains("SKIPPING") && said.contains("HAUL_TEST_MAY_RESTART_POSTGRES=1"), "{said}");
    for env in [[("CI", "true")], [("CI", "1")], [("HAUL_TEST_MAY_RESTART_POSTGRES", "1")]] {
        assert!(script("may-restart-postgres", &[], &env).0, "{env:?}");
    }
    for env in [[("CI", "false")], [("HAUL_TEST_MAY_RESTART_POSTGRES", "0")]] {
        assert!(!script("may-restart-postgres", &[], &env).0, "{env:?}");
    }
    let crash = read("scripts/crash-test");
    let asks = crash.find("if scripts/may-restart-postgres").expect("crash-test asks first");
    let restarts = crash.find("pg_ctlcluster --skip-systemctl-redirect").unwrap();
    assert!(asks < restarts, "crash-test must ask before it restarts PostgreSQL");
    assert!(read(".ci/run").contains("export CI="), ".ci/run must let the crash test restart CI's PostgreSQL");
}

#[test]
fn the_generated_api_token_is_ignored_by_git() {
    assert!(read(".gitignore").lines().any(|l| l.trim() == "haul-api-token"));
    for path in ["haul-api-token", "crates/haul/haul-api-token"] {
        if let Ok(out) = std::process::Command::new("git")
            .args(["check-ignore", "-q", "--no-index", path])
            .current_dir(root())
            .status()
        {
            assert!(out.success(), "git does not ignore {path}");
        }
    }
}

#[test]
fn the_systemd_unit_verifies_and_its_check_runs() {
    let bin = env!("CARGO_BIN_EXE_haul");
    let unit = read("deploy/haul.service");
    // The unit's own check, on the example settings.
    let pre = unit.lines().find_map(|l| l.strip_prefix("ExecStartPre=")).expect("an ExecStartPre");
    let args: Vec<String> = pre
        .split_whitespace()
        .skip(1)
        .map(|a| a.replace("/etc/haul/haul.toml", root().join("examples/haul.toml").to_str().unwrap()))
        .collect();
    let out = std::process::Command::new(bin).args(&args).env_remove("HAUL_LOG").output().unwrap();
    assert!(out.status.success(), "{pre}: {}", String::from_utf8_lossy(&out.stderr));
    let exec = unit.lines().find_map(|l| l.strip_prefix("ExecStart=")).expect("an ExecStart");
    assert!(exec.starts_with("/usr/local/bin/haul serve --config /etc/haul/haul.toml"), "{exec}");
    if std::process::Command::new("systemd-analyze").arg("--version").output().is_err() {
        return;
    }
    let (ok, said) = script("check-systemd-unit", &["deploy/haul.service", bin], &[]);
    assert!(ok, "{said}");
    // The check bites: a setting systemd ignores fails it.
    let dir = std::env::temp_dir().join(format!("haul-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("haul.service");
    std::fs::write(&bad, unit.replace("Type=exec", "Type=sometimes")).unwrap();
    let (ok, said) = script("check-systemd-unit", &[bad.to_str().unwrap(), bin], &[]);
    assert!(!ok, "{said}");
    let _ = std::fs::remove_dir_all(&dir);
}
