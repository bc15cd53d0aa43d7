//! Checks on the repository itself, so a clone stands on its own and its documents stay
//! true: what the build needs (no OpenSSL), the scripts' promises (PostgreSQL restarted
//! only where allowed), the systemd unit, and the references in `docs/` against the code
//! they describe (scenario keys, metric names), with nothing pointing outside.

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
    for unit in ["deploy/haul.service", "deploy/haul@.service"] {
        let (ok, said) = script("check-systemd-unit", &[unit, bin], &[]);
        assert!(ok, "{unit}: {said}");
    }
    // The check bites: a setting systemd ignores fails it.
    let dir = std::env::temp_dir().join(format!("haul-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("haul.service");
    std::fs::write(&bad, unit.replace("Type=exec", "Type=sometimes")).unwrap();
    let (ok, said) = script("check-systemd-unit", &[bad.to_str().unwrap(), bin], &[]);
    assert!(!ok, "{said}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The names between backticks after "expected" in a serde unknown-field error.
fn expected_fields(message: &str) -> Vec<String> {
    let (_, expected) =
        message.split_once("expected").unwrap_or_else(|| panic!("not an unknown-field error: {message}"));
    expected.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

/// Every key the scenario parser accepts, read from its structs (each refuses unknown
/// keys and lists the ones it knows), and the fields of each inbound event kind.
fn scenario_keys() -> Vec<String> {
    use haul_harness::eval::scenario::parse;
    let head = "name = \"x\"\nstart = \"2026-03-02T07:00:00Z\"\n";
    let step = "[[step]]\nat = \"07:00\"\n";
    let probes = [
        format!("{head}zz_probe = 1\n"),
        format!("{head}[load]\nid = \"L1\"\nzz_probe = 1\n"),
        format!("{head}[[fault]]\nzz_probe = 1\n"),
        format!("{head}[[step]]\nzz_probe = 1\n"),
        format!("{head}{step}expect.zz_probe = 1\n"),
        format!("{head}{step}expect.sent = [{{ zz_probe = 1 }}]\n"),
        format!("{head}{step}expect.timers_scheduled = [{{ zz_probe = 1 }}]\n"),
        format!("{head}{step}expect.asks = [{{ zz_probe = 1 }}]\n"),
        format!("{head}{step}expect.decisions = [{{ zz_probe = 1 }}]\n"),
        format!("{head}{step}expect.open_asks = [{{ zz_probe = 1 }}]\n"),
        format!("{head}{step}expect.stage = [{{ zz_probe = 1 }}]\n"),
        format!("{head}[clients.a]\nzz_probe = 1\n"),
        format!("{head}[clients.a.eta_request]\nzz_probe = 1\n"),
        format!("{head}{step}unmatched_sms = [{{ zz_probe = 1 }}]\n"),
        format!("{head}{step}operator = [{{ zz_probe = 1 }}]\n"),
        format!("{head}{step}sms_status = [{{ zz_probe = 1 }}]\n"),
    ];
    let mut keys = Vec::new();
    for probe in &probes {
        let err = parse(probe).expect_err(probe);
        assert!(err.message.contains("zz_probe"), "{probe}: {err}");
        keys.extend(expected_fields(&err.message));
    }
    let load = haul_core::LoadId::parse("L1").unwrap();
    for kind in haul_core::event::event_kinds() {
        let v = serde_json::json!({"event_id": "e1", "kind": kind, "zz_probe": 1});
        let err = haul_core::InboundEvent::from_json(load.clone(), v).expect_err(kind);
        keys.extend(expected_fields(&err.message));
        keys.push(kind.to_owned());
    }
    // The inbound keys the scenario reads itself, and the event's own.
    keys.extend(["repeat", "load", "kind", "event_id"].map(str::to_owned));
    keys.sort();
    keys.dedup();
    keys
}

#[test]
fn docs_scenarios_md_names_every_scenario_key() {
    let doc = read("docs/scenarios.md");
    let keys = scenario_keys();
    assert!(keys.len() > 40, "{keys:?}");
    let missing: Vec<&String> = keys.iter().filter(|k| !doc.contains(&format!("`{k}`"))).collect();
    assert!(missing.is_empty(), "docs/scenarios.md does not name {missing:?}");
}

fn rust_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The metric families the code emits: the names given to `counter!`, `gauge!` and
/// `histogram!` in `crates/*/src`.
fn emitted_metrics() -> Vec<String> {
    let mut files = Vec::new();
    for krate in std::fs::read_dir(root().join("crates")).unwrap().flatten() {
        let src = krate.path().join("src");
        if src.is_dir() {
            rust_sources(&src, &mut files);
        }
    }
    let mut names = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for mac in ["counter!(", "gauge!(", "histogram!("] {
            for (i, _) in text.match_indices(mac) {
                let rest = text[i + mac.len()..].trim_start();
                if let Some(name) = rest.strip_prefix('"').and_then(|r| r.split('"').next())
                    && name.starts_with("haul_")
                {
                    names.push(name.to_owned());
                }
            }
        }
    }
    // The figures read from the store are rendered by the scrape itself, not by a macro.
    let metrics = read("crates/haul-server/src/metrics.rs");
    let figures = metrics.split("pub const STORE_FIGURES").nth(1).and_then(|rest| rest.split("];").next()).unwrap();
    names.extend(figures.split('"').skip(1).step_by(2).filter(|n| n.starts_with("haul_")).map(str::to_owned));
    names.sort();
    names.dedup();
    names
}

#[test]
fn docs_operations_md_lists_every_metric_the_code_emits_and_no_other() {
    let doc = read("docs/operations.md");
    let emitted = emitted_metrics();
    assert!(emitted.len() >= 10, "{emitted:?}");
    let missing: Vec<&String> = emitted.iter().filter(|m| !doc.contains(&format!("`{m}`"))).collect();
    assert!(missing.is_empty(), "docs/operations.md does not list {missing:?}");
    // And the document's metrics table names nothing the code does not emit.
    let listed: Vec<&str> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `haul_"))
        .map(|rest| rest.split('`').next().unwrap_or_default())
        .collect();
    for m in listed {
        assert!(
            emitted.iter().any(|e| e == &format!("haul_{m}")),
            "docs/operations.md lists haul_{m}, which nothing emits"
        );
    }
}

#[test]
fn the_alerting_rules_name_only_metrics_the_code_emits() {
    let rules = read("deploy/prometheus/alerts.yml") + &read("deploy/prometheus/alerts_test.yml");
    let emitted = emitted_metrics();
    let mut named = Vec::new();
    for (i, _) in rules.match_indices("haul_") {
        let name: String =
            rules[i..].chars().take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_').collect();
        named.push(name);
    }
    assert!(named.len() >= 6, "{named:?}");
    for name in named {
        let family = name.trim_end_matches("_bucket").trim_end_matches("_count").trim_end_matches("_sum");
        assert!(emitted.iter().any(|e| e == family), "deploy/prometheus names {name}, which nothing emits");
    }
}

/// Text files in the repository (git's list when git is there).
fn repo_files() -> Vec<PathBuf> {
    let out = std::process::Command::new("git").args(["ls-files", "-z"]).current_dir(root()).output();
    let mut files: Vec<PathBuf> = match out {
        Ok(o) if o.status.success() => o
            .stdout
            .split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| root().join(String::from_utf8_lossy(s).as_ref()))
            .collect(),
        _ => {
            let mut v = Vec::new();
            for dir in ["crates", "docs", "scripts", "evals", "evals-llm", "examples", "deploy", "bench", ".ci"] {
                let d = root().join(dir);
                if d.is_dir() {
                    rust_sources(&d, &mut v);
                }
            }
            v.extend(["README.md", "ARCHITECTURE.md"].map(|f| root().join(f)));
            v
        }
    };
    files.retain(|f| f.is_file() && !f.ends_with("Cargo.lock"));
    files
}

/// A clone has only what is in it: no document points outside the repository, and the
/// old names of the reference documents are given with their place in docs/.
#[test]
fn nothing_points_outside_the_repository() {
    // The folder that held the reference documents before docs/ (beside the repository,
    // never in a clone), spelt in parts so this test does not name it itself.
    let sibling = ["..", "shared"].join("/");
    let name = &sibling[3..];
    let outside = [sibling.clone(), format!("{name}/spec"), format!("{name}/adr"), "adr/0003".to_owned()];
    let bare = ["domain.md", "api.md", "config.md", "scenarios.md", "dependencies.md", "design.md", "operations.md"];
    let mut problems = Vec::new();
    for f in repo_files() {
        let Ok(text) = std::fs::read_to_string(&f) else { continue };
        let rel = f.strip_prefix(root()).unwrap().display().to_string();
        if rel == "crates/haul/tests/repo.rs" {
            continue;
        }
        for (n, line) in text.lines().enumerate() {
            for o in &outside {
                if line.contains(o.as_str()) {
                    problems.push(format!("{rel}:{}: {o}", n + 1));
                }
            }
            for b in bare {
                for (i, _) in line.match_indices(b) {
                    let before = &line[..i];
                    let linked = before.ends_with("docs/") || (rel.starts_with("docs/") && !before.ends_with('/'));
                    let word = before.chars().last().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
                    if !linked && !word {
                        problems.push(format!("{rel}:{}: {b} without docs/", n + 1));
                    }
                }
            }
        }
    }
    assert!(problems.is_empty(), "references outside the repository:\n{}", problems.join("\n"));
}

#[test]
fn the_docs_exist() {
    for doc in [
        "docs/design.md",
        "docs/scenarios.md",
        "docs/api.md",
        "docs/config.md",
        "docs/operations.md",
        "docs/replay.md",
        "docs/console.md",
        "docs/internals.md",
        "docs/postgres.md",
    ] {
        assert!(read(doc).len() > 2000, "{doc} is missing or nearly empty");
    }
}

/// ARCHITECTURE.md stays a map one reads at a sitting, and every file it names is there
/// (a path in backquotes that starts with a top-level folder of the repository).
#[test]
fn architecture_md_is_a_short_map_of_files_that_exist() {
    let text = read("ARCHITECTURE.md");
    let chars = text.chars().count();
    assert!(chars <= 30_000, "ARCHITECTURE.md is {chars} characters; move the detail to docs/internals.md");
    let mut missing = Vec::new();
    for quoted in text.split('`').skip(1).step_by(2) {
        let top = ["crates/", "docs/", "scripts/", "evals/", "examples/", "deploy/", "bench/"];
        if top.iter().any(|t| quoted.starts_with(t))
            && !quoted.contains(['{', '*', ' '])
            && !root().join(quoted).exists()
        {
            missing.push(quoted.to_owned());
        }
    }
    assert!(missing.is_empty(), "ARCHITECTURE.md names files that do not exist: {missing:?}");
}

/// The top-level module a source file of a crate's `src` is (`api` for `src/api.rs`,
/// `console` for `src/console/pages.rs`); `None` for `lib.rs` and `main.rs`.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_string_lossy().into_owned();
    let name = first.trim_end_matches(".rs").to_owned();
    (name != "lib" && name != "main").then_some(name)
}

/// No module of a crate imports one that imports it back, directly or around a loop
/// (the modules a file names as `crate::{module}`, its own folder's files as one).
#[test]
fn no_crate_has_a_circle_of_modules() {
    for krate in std::fs::read_dir(root().join("crates")).unwrap().flatten() {
        let src = krate.path().join("src");
        if !src.is_dir() {
            continue;
        }
        let mut files = Vec::new();
        rust_sources(&src, &mut files);
        let mut edges: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> = Default::default();
        for f in &files {
            let Some(from) = module_of(&src, f) else { continue };
            let text = std::fs::read_to_string(f).unwrap();
            // Imports only: code after a test module is the tests'.
            let code = text.split("#[cfg(test)]").next().unwrap_or("");
            for (i, _) in code.match_indices("crate::") {
                if i > 0 && code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
                    continue;
                }
                let rest = &code[i + "crate::".len()..];
                let to: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                let names_a_module = rest[to.len()..].starts_with("::") || rest[to.len()..].starts_with(";");
                if names_a_module && to != from && files.iter().any(|g| module_of(&src, g).as_deref() == Some(&to)) {
                    edges.entry(from.clone()).or_default().insert(to);
                }
            }
        }
        // A module reaches itself along its imports: a circle.
        for start in edges.keys() {
            let mut seen = std::collections::BTreeSet::new();
            let mut todo: Vec<(String, Vec<String>)> = vec![(start.clone(), vec![start.clone()])];
            while let Some((at, path)) = todo.pop() {
                for next in edges.get(&at).into_iter().flatten() {
                    assert!(
                        next != start,
                        "{}: modules import each other around a circle: {} -> {start}",
                        krate.file_name().to_string_lossy(),
                        path.join(" -> ")
                    );
                    if seen.insert(next.clone()) {
                        todo.push((next.clone(), [path.clone(), vec![next.clone()]].concat()));
                    }
                }
            }
        }
    }
}
