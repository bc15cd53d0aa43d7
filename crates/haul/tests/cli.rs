//! The `haul` binary's own behaviour at start: settings it refuses, in one line.

#[test]
fn serve_with_the_llm_decider_and_no_base_url_stops_with_one_line() {
    let dir = std::env::temp_dir().join(format!("haul-llm-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (toml, want) in [
        ("[decider]\nkind = \"llm\"\n", "decider.llm.base_url"),
        ("[decider]\nkind = \"llm\"\nllm.base_url = \"http://127.0.0.1:9/v1\"\n", "decider.llm.model"),
        (
            "[decider]\nkind = \"llm\"\nllm.base_url = \"http://127.0.0.1:9/v1\"\nllm.model = \"m\"\n\
             llm.api_key_env = \"HAUL_TEST_NO_SUCH_KEY\"\n",
            "HAUL_TEST_NO_SUCH_KEY",
        ),
        // An unknown model in the price table, and a budget in a bad form, at start.
        (
            "[decider]\nkind = \"llm\"\nllm.base_url = \"http://127.0.0.1:9/v1\"\nllm.model = \"m\"\n\
             [decider.llm.prices.other]\ninput_usd_per_mtok = 1.0\noutput_usd_per_mtok = 2.0\n",
            "decider.llm.model = \"m\" has no price in decider.llm.prices (priced: other)",
        ),
        ("[decider.llm.budget]\nclient_usd_per_day = \"ten\"\n", "decider.llm.budget.client_usd_per_day"),
    ] {
        let path = dir.join("haul.toml");
        std::fs::write(&path, toml).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_haul"))
            .args(["serve", "--config", path.to_str().unwrap(), "--db", "sqlite::memory:", "--listen", "127.0.0.1:0"])
            .env_remove("HAUL_TEST_NO_SUCH_KEY")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{toml}: {stderr}");
        let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(lines.len(), 1, "{toml}: {stderr}");
        assert!(lines[0].contains(want), "{toml}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// With no `HAUL_API_TOKEN`, `serve` makes a token into `./haul-api-token`, but only
/// once it is sure to serve: a start refused for a setting, the store or the port
/// leaves no file behind. The token is 256 bits from the OS's random source.
#[test]
fn the_generated_api_token_is_written_only_once_serve_can_serve() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();
    let dir = std::env::temp_dir().join(format!("haul-token-file-{}", std::process::id()));
    let serve = |args: &[&str], env: &[(&str, &str)]| {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_haul"));
        cmd.arg("serve").args(args).current_dir(&dir).env_remove("HAUL_API_TOKEN").envs(env.iter().copied());
        cmd
    };
    // (flags, variables, what the one error line names)
    for (args, env, want) in [
        (vec!["--db", "sqlite::memory:", "--listen", &taken], vec![], "server.listen; --listen"),
        (vec!["--db", "postgres://haul@127.0.0.1:1/none", "--listen", "127.0.0.1:0"], vec![], "store.url"),
        (
            vec!["--db", "sqlite::memory:", "--listen", "127.0.0.1:0"],
            vec![("HAUL_WORKER_CONCURRENCY", "0")],
            "worker.concurrency",
        ),
        (
            vec!["--db", "sqlite::memory:", "--listen", "127.0.0.1:0"],
            vec![
                ("HAUL_CHANNELS_SMS_URL", "http://127.0.0.1:9"),
                ("HAUL_CHANNELS_SMS_TOKEN_ENV", "HAUL_TEST_NO_SUCH_VAR"),
            ],
            "HAUL_TEST_NO_SUCH_VAR",
        ),
    ] {
        let out = serve(&args, &env).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} {env:?}: {stderr}");
        let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
        assert!(errors.len() == 1 && errors[0].contains(want), "{args:?} {env:?}: {stderr}");
        assert!(!dir.join("haul-api-token").exists(), "{args:?} {env:?} left a token file: {stderr}");
    }
    let mut child = serve(&["--db", "sqlite::memory:", "--listen", "127.0.0.1:0"], &[])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let path = dir.join("haul-api-token");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !path.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    let token = std::fs::read_to_string(&path).expect("serve wrote no token file");
    assert!(token.len() == 64 && token.chars().all(|c| c.is_ascii_hexdigit()), "{token:?}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn haul(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_haul"));
    cmd.args(args);
    // The test's own environment must not leak settings in.
    let leaks = |k: &str| k.starts_with("HAUL_") || k.starts_with("OTEL_") || k == "DATABASE_URL";
    for (k, _) in std::env::vars().filter(|(k, _)| leaks(k)) {
        cmd.env_remove(k);
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn scratch(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("haul-cli-{tag}-{}-{}", std::process::id(), fastrand::u32(..)));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn version_names_the_commit_and_the_features() {
    let (ok, out, _) = haul(&["--version"], &[]);
    assert!(ok);
    let line = out.trim();
    assert!(line.starts_with(&format!("haul {} (commit ", env!("CARGO_PKG_VERSION"))), "{line}");
    assert!(!line.contains("commit )"), "{line}");
    let features = if cfg!(feature = "sqs") { "features: sqs, " } else { "features: none, " };
    assert!(line.contains(features), "{line}");
    assert!(line.ends_with(&format!("schema {})", haul_backends::SCHEMA_VERSION)), "{line}");
}

#[test]
fn completions_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let (ok, out, err) = haul(&["completions", shell], &[]);
        assert!(ok, "{shell}: {err}");
        for word in ["serve", "migrate", "prune", "config", "older-than"] {
            assert!(out.contains(word), "{shell} completions lack {word}");
        }
    }
    // The bash script is valid bash.
    let dir = scratch("completions");
    let (_, script, _) = haul(&["completions", "bash"], &[]);
    std::fs::write(dir.join("haul.bash"), script).unwrap();
    if let Ok(s) = std::process::Command::new("bash").arg("-n").arg(dir.join("haul.bash")).status() {
        assert!(s.success(), "bash -n rejects the completion script");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Exactly one `error:` line on stderr, containing every `want`, and a failure exit.
fn one_error_line(args: &[&str], env: &[(&str, &str)], want: &[&str]) {
    let (ok, _, err) = haul(args, env);
    assert!(!ok, "{args:?} {env:?} succeeded: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{args:?} {env:?}: {err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    for w in want {
        assert!(lines[0].contains(w), "{args:?} {env:?}: {err} lacks {w}");
    }
}

/// `decider.shadow`: `config check` reads the shadow's file and names it; a file that
/// does not read stops `config check` and `serve` with one line naming it.
#[test]
fn config_check_and_serve_read_the_shadow_file() {
    let dir = std::env::temp_dir().join(format!("haul-shadow-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("shadow.toml");
    let path = file.to_str().unwrap();
    std::fs::write(&file, "[clients.acme.eta_request]\nmax_attempts = 2\n").unwrap();
    let env = [("HAUL_DECIDER_SHADOW", path)];
    let (ok, out, err) = haul(&["config", "check", "--db", "sqlite::memory:"], &env);
    assert!(ok, "{err}");
    assert!(out.contains(&format!("decider sop, shadow sop ({path})")), "{out}");
    std::fs::write(&file, "[clients.acme.eta_request]\nmax_attempts = 0\n").unwrap();
    for cmd in [
        &["config", "check", "--db", "sqlite::memory:"][..],
        &["serve", "--db", "sqlite::memory:", "--listen", "127.0.0.1:0"],
    ] {
        one_error_line(cmd, &env, &[&format!("decider.shadow = {path:?}"), "max_attempts"]);
    }
    std::fs::remove_file(&file).unwrap();
    one_error_line(&["config", "check", "--db", "sqlite::memory:"], &env, &["decider.shadow", "reading"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn config_check_says_ok_or_one_line_naming_the_variable() {
    let (ok, out, err) = haul(&["config", "check", "--db", "sqlite::memory:"], &[]);
    assert!(ok, "{err}");
    assert!(out.starts_with("ok: store sqlite::memory:"), "{out}");
    one_error_line(
        &["config", "check"],
        &[("HAUL_DISPATCHER_LEASE", "90")],
        &["HAUL_DISPATCHER_LEASE=\"90\"", "dispatcher.lease", "missing unit"],
    );
    one_error_line(&["config", "check"], &[("HAUL_LOG", "haul=verbose")], &["HAUL_LOG=\"haul=verbose\""]);
    one_error_line(&["serve", "--db", "sqlite::memory:"], &[("HAUL_LOG", "haul=loud")], &["HAUL_LOG"]);
    one_error_line(
        &["config", "check"],
        &[("HAUL_CHANNELS_SMS_URL", "http://127.0.0.1:9"), ("HAUL_CHANNELS_SMS_TOKEN_ENV", "HAUL_NO_SUCH_TOKEN")],
        &["channels.sms.token_env", "HAUL_NO_SUCH_TOKEN"],
    );
    // The test script's variable is read by the harness: no warning.
    let (ok, _, err) = haul(&["config", "check"], &[("HAUL_SQS_ENDPOINT", "http://127.0.0.1:5000")]);
    assert!(ok && !err.contains("HAUL_SQS_ENDPOINT"), "{err}");
}

/// `config check` with SMS through Twilio: its secret must be set, the answer says
/// where SMS goes, and a missing public URL (no delivery receipts) is a warning.
#[test]
fn config_check_says_sms_goes_through_twilio_and_warns_without_receipts() {
    let twilio = [
        ("HAUL_CHANNELS_SMS_KIND", "twilio"),
        ("HAUL_TWILIO_ACCOUNT_SID", "AC0123456789abcdef0123456789abcdef"),
        ("HAUL_TWILIO_FROM", "+15555550000"),
    ];
    let (ok, _, err) = haul(&["config", "check"], &twilio);
    assert!(!ok && err.contains("HAUL_TWILIO_AUTH_TOKEN"), "{err}");
    let with_token = [twilio.as_slice(), &[("HAUL_TWILIO_AUTH_TOKEN", "tok")]].concat();
    let (ok, out, err) = haul(&["config", "check"], &with_token);
    assert!(ok && out.contains("sms through twilio"), "{out}{err}");
    assert!(err.contains("without server.public_url") && !err.contains("tok\n"), "{err}");
    let public = [with_token.as_slice(), &[("HAUL_SERVER_PUBLIC_URL", "https://haul.example.com")]].concat();
    let (ok, _, err) = haul(&["config", "check"], &public);
    assert!(ok && !err.contains("public_url"), "{err}");
}

#[test]
fn config_show_says_where_each_value_came_from_and_masks_secrets() {
    let dir = scratch("show");
    let file = dir.join("haul.toml");
    std::fs::write(&file, "[worker]\nconcurrency = 4\n").unwrap();
    let (ok, out, err) = haul(
        &["config", "show", "--config", file.to_str().unwrap(), "--db", "postgres://haul:pa55word@db/haul"],
        &[("HAUL_TIMERS_POLL", "1h 0m 5s"), ("HAUL_TIMERS_POLL", "5s"), ("HAUL_API_TOKEN", "s3cret-token-value")],
    );
    assert!(ok, "{err}");
    let line = |start: &str| out.lines().find(|l| l.starts_with(start)).unwrap_or_else(|| panic!("{start}: {out}"));
    assert!(line("worker.concurrency = 4").ends_with(&format!("# file {}", file.display())), "{out}");
    assert!(line("timers.poll = \"5s\"").ends_with("# variable HAUL_TIMERS_POLL"), "{out}");
    assert!(line("store.url = \"postgres://haul:***@db/haul\"").ends_with("# flag --db"), "{out}");
    assert!(line("dispatcher.lease = ").ends_with("# default"), "{out}");
    assert!(line("HAUL_API_TOKEN").contains("set (masked)"), "{out}");
    assert!(!out.contains("pa55word") && !out.contains("s3cret-token-value"), "{out}");
    // Where SMS and Hero tasks go: every channel's settings.
    for channel in ["sms", "hero", "slack", "tms", "ops"] {
        assert!(
            line(&format!("channels.{channel}.url unset (record mode for {channel})")).ends_with("# default"),
            "{out}"
        );
        line(&format!("channels.{channel}.token_env unset"));
        line(&format!("channels.{channel}.timeout unset"));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn migrate_and_prune_name_the_store_like_serve() {
    let dir = scratch("store");
    let db = |name: &str| format!("sqlite://{}", dir.join(name).display());
    let file = dir.join("haul.toml");
    std::fs::write(&file, format!("[store]\nurl = \"{}\"\n", db("file.db"))).unwrap();
    let cfg = file.to_str().unwrap();
    for (args, env, want) in [
        (vec!["migrate", "--config", cfg], vec![], db("file.db")),
        (vec!["migrate", "--config", cfg], vec![("HAUL_STORE_URL", db("var.db"))], db("var.db")),
        (
            vec!["migrate", "--config", cfg, "--db", &db("flag.db")],
            vec![("HAUL_STORE_URL", db("var.db"))],
            db("flag.db"),
        ),
    ] {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (ok, out, err) = haul(&args, &env);
        assert!(ok, "{args:?}: {err}");
        assert!(out.contains(&format!("schema of {want} is up to date")), "{args:?}: {out}");
    }
    let (ok, out, err) = haul(&["prune", "--config", cfg, "--older-than", "1h 30m"], &[]);
    assert!(ok, "{err}");
    assert!(out.starts_with("pruned 0 outbox rows"), "{out}");
    one_error_line(&["prune", "--config", cfg, "--older-than", "90"], &[], &["--older-than", "missing unit"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn config_check_knows_whether_sqs_is_built_in() {
    let env = [("HAUL_QUEUE_KIND", "sqs"), ("HAUL_QUEUE_URL", "https://sqs.us-east-1.amazonaws.com/1/loads.fifo")];
    if cfg!(feature = "sqs") {
        let (ok, out, err) = haul(&["config", "check"], &env);
        assert!(ok && out.contains("queue sqs"), "{out}{err}");
    } else {
        one_error_line(&["config", "check"], &env, &["queue.kind", "--features sqs"]);
    }
}

/// `haul bench e2e-http` drives real `haul serve` children over HTTP: every unit reaches
/// the Hero sink (the workload fails otherwise) and each figure is reported. Figures are
/// not judged here: speed is shown by running the bench, never by timed assertions.
#[test]
fn bench_e2e_http_runs_its_units_through_serve_processes_on_both_backends() {
    for store in ["sqlite", "postgres"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_haul"))
            .args(["bench", "e2e-http", "--quick", "--json", "--store", store])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{store}: {stderr}");
        let figures: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let f = &figures["e2e-http"];
        let mut want = vec!["bare_append_per_s".to_owned(), "bare_posts_per_s".to_owned()];
        for c in ["1", "16", "32"] {
            let layouts: &[&str] = if store == "postgres" { &["", "split_"] } else { &[""] };
            for tag in layouts {
                for figure in ["units_per_s", "p50_ms", "p99_ms"] {
                    want.push(format!("{tag}{figure}_{c}_callers"));
                }
            }
        }
        // Tracing on and off in pairs (OTLP to a receiver in the bench): the figures and
        // the spans received.
        for c in ["1", "16"] {
            for figure in [
                "untraced_paired_units_per_s",
                "untraced_paired_p50_ms",
                "traced_units_per_s",
                "traced_p50_ms",
                "traced_over_untraced",
            ] {
                want.push(format!("{figure}_{c}_callers"));
            }
        }
        want.push("traced_spans_received".into());
        // What one unit cost, on PostgreSQL (its server's CPU when it runs on this machine).
        if store == "postgres" {
            for figure in ["commits", "wal_bytes"] {
                want.push(format!("budget_{figure}_per_unit"));
            }
            // CPU is counted in ticks of 10 ms: a quick round may take few of haul's.
            assert!(f["budget_haul_cpu_us_per_unit"].as_f64().is_some_and(|v| v >= 0.0), "{f}");
            if let Some(us) = f.get("budget_pg_cpu_us_per_unit") {
                assert!(us.as_f64().is_some_and(|v| v > 0.0), "{f}");
            }
        } else {
            assert!(f.get("budget_commits_per_unit").is_none(), "{f}");
        }
        for k in want {
            assert!(f[k.as_str()].as_f64().is_some_and(|v| v > 0.0), "{store}: {k} in {f}");
        }
    }
}

/// A run that tested nothing fails: `haul eval` on a folder with no scenarios.
#[test]
fn eval_of_no_scenarios_fails() {
    let dir = scratch("no-evals");
    std::fs::write(dir.join("README.md"), "not a scenario").unwrap();
    let (ok, out, err) = haul(&["eval", dir.to_str().unwrap()], &[]);
    assert!(!ok, "{out}{err}");
    assert_eq!(out.trim(), "0 passed, 0 failed");
    assert!(err.contains("no scenario files") && err.contains("nothing was tested"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--verbose` prints a failing scenario's timeline under its FAIL line; `--junit FILE`
/// writes the report for CI systems.
#[test]
fn eval_verbose_prints_the_timeline_and_junit_writes_the_report() {
    let dir = scratch("eval-out");
    let good = std::fs::read_to_string("../../evals/ask_again_after_an_answered_ask.toml").unwrap();
    std::fs::write(dir.join("a.toml"), &good).unwrap();
    let wrong = good.replacen(
        "expect.sent = [",
        "expect.sent = [{ channel = \"sms\", key = \"481207/nothing/send_sms\" }, ",
        1,
    );
    assert_ne!(wrong, good);
    std::fs::write(dir.join("b.toml"), wrong).unwrap();
    let junit = dir.join("junit.xml");
    let (ok, out, err) = haul(&["eval", "--verbose", "--junit", junit.to_str().unwrap(), dir.to_str().unwrap()], &[]);
    assert!(!ok, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("PASS "), "{out}");
    assert!(lines[1].starts_with("FAIL ") && lines[1].contains("481207/nothing/send_sms"), "{out}");
    assert!(lines[2].starts_with("  | load 481207  version "), "{out}");
    assert!(lines.iter().any(|l| l.starts_with("  | asks:")), "{out}");
    assert_eq!(lines.last(), Some(&"1 passed, 1 failed"));
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains("<testsuites tests=\"2\" failures=\"1\""), "{xml}");
    // Without --verbose, no timeline.
    let (_, out, _) = haul(&["eval", dir.to_str().unwrap()], &[]);
    assert!(!out.contains("  | "), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn queries_open_only_a_store_that_exists_and_never_create_one() {
    let dir = scratch("query-missing");
    let db = dir.join("nothing-here.db");
    let url = format!("sqlite://{}", db.display());
    for q in ["loads", "dead", "timers", "unmatched", "alerts", "conflicts", "opted-out"] {
        let (ok, _, err) = haul(&["query", q, "--db", &url], &[]);
        assert!(!ok, "{q}");
        assert!(err.contains("no SQLite database at") && err.contains("haul migrate"), "{q}: {err}");
        assert!(!db.exists(), "haul query {q} created the database file");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The test database's URL with another database name and user.
fn pg_url(user: &str, db: &str) -> String {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let (_, rest) = url.split_once("://").unwrap();
    let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let host = host.split_once('/').map_or(host, |(h, _)| h);
    format!("postgres://{user}@{host}/{db}")
}

/// A PostgreSQL store that cannot be opened says why in one line, as the server (or
/// the OS) put it, with the URL's password redacted: not the pool's "Error occurred
/// while creating a new object: db error".
#[test]
fn postgres_store_errors_say_the_servers_reason_in_one_line() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    for (url, want) in [
        (pg_url("postgres", "haul_no_such_db"), "database \"haul_no_such_db\" does not exist"),
        (pg_url("haul_no_such_role:s3cret-pw", "test"), "role \"haul_no_such_role\" does not exist"),
        (format!("postgres://postgres:s3cret-pw@127.0.0.1:{closed}/test"), "Connection refused"),
    ] {
        for cmd in ["migrate", "inspect"] {
            let mut args = vec![cmd, "--db", &url];
            if cmd == "inspect" {
                args.push("481207");
            }
            let said = if want.contains("does not exist") {
                "PostgreSQL at postgres://"
            } else {
                "cannot reach PostgreSQL at"
            };
            one_error_line(&args, &[], &[want, said]);
            if want.contains("haul_no_such_db") {
                one_error_line(&args, &[], &["has no such database", "createdb haul_no_such_db"]);
            }
            let (_, _, err) = haul(&args, &[]);
            assert!(!err.contains("s3cret-pw") && !err.contains("db error"), "{err}");
        }
    }
}

/// A SQLite file that cannot be opened is named by absolute path, with the OS's
/// reason (`/sys` refuses new files even to root).
#[test]
fn sqlite_store_errors_name_the_absolute_path_and_the_os_reason() {
    let dir = scratch("sqlite-errors");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_haul")).args(args).current_dir(&dir).output().unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run(&["migrate", "--db", "sqlite:///sys/haul.db"]);
    assert!(err.contains("/sys/haul.db") && err.contains("Permission denied"), "{err}");
    let err = run(&["migrate", "--db", "sqlite://no/such/folder/haul.db"]);
    let abs = dir.join("no/such/folder/haul.db");
    assert!(err.contains(&abs.display().to_string()) && err.contains("No such file or directory"), "{err}");
    for err in [&err, &run(&["migrate", "--db", "sqlite:///sys/haul.db"])] {
        assert!(!err.contains("Some(") && err.lines().count() == 1, "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A store with a row of every query's answer: L2 with a dead SMS and a dead Hero task
/// (its alert delivered after one failed send), a timer, an unmatched SMS, a conflict.
async fn fill_for_queries(url: &str) {
    use haul_core::action::ActionType;
    use haul_core::dispatch::{Alert, AlertKind};
    use haul_core::ids::{LoadId, TimerId};
    use haul_store::{AlertState, NewEntry, NewOutboxRow, UnmatchedSms};
    let s = haul_backends::open(url, None).await.unwrap();
    let t = |secs: i64| haul_core::time::from_ms(1_772_431_200_000 + secs * 1000);
    let l2 = LoadId::parse("L2").unwrap();
    let row = |id: &str, action_type| NewOutboxRow {
        id: id.into(),
        action_type,
        action: serde_json::json!({"key": id}),
        trace: None,
    };
    let entries = vec![
        NewEntry::stored("u1", "load_update", serde_json::json!({"stage": "at_pickup"})),
        haul_store::contract::decision(
            "u1",
            serde_json::json!([{"ask_id": "ask:eta_request:u1", "step": 1, "status": "escalated"}]),
        ),
    ];
    let rows =
        vec![row("L2/u1/send_sms", ActionType::SendSms), row("L2/u1/create_hero_task", ActionType::CreateHeroTask)];
    s.append(&l2, entries, 0, rows, t(10)).await.unwrap();
    for c in s.pending(10, t(20), std::time::Duration::from_secs(60)).await.unwrap() {
        s.mark_failed(&c.row.id, &c.token, "HTTP 400: no such number", None, t(30)).await.unwrap();
    }
    let alert = Alert {
        kind: AlertKind::HeroChannelFailure,
        outbox_id: "L2/u1/create_hero_task".into(),
        load_id: l2.clone(),
        action_type: ActionType::CreateHeroTask,
        failure: "HTTP 400: no such number".into(),
    };
    s.record_ops_alert(&alert, AlertState::Pending, Some("HTTP 503"), t(30)).await.unwrap();
    s.record_conflict(&l2, t(40)).await.unwrap();
    s.schedule(&TimerId::parse("tmr:L2:ask:eta_request:u1:1").unwrap(), t(1800), t(10)).await.unwrap();
    let sms = UnmatchedSms {
        message_sid: "SM1".into(),
        from: "+15555550199".into(),
        to: "+15555550000".into(),
        body: "who is this".into(),
        received_at: t(100),
        reason: "no single active load has this driver phone".into(),
    };
    s.record_unmatched_sms(&sms).await.unwrap();
    let stop = haul_store::SmsConsent {
        phone: "+15555550188".into(),
        opted_out: true,
        event_id: "sms:SM2".into(),
        load_id: Some(l2.clone()),
        changed_at: t(200),
    };
    s.record_consent(&stop).await.unwrap();
}

#[test]
fn queries_show_each_row_in_one_line() {
    let dir = scratch("query-rows");
    let url = format!("sqlite://{}", dir.join("haul.db").display());
    assert!(haul(&["migrate", "--db", &url], &[]).0);
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(fill_for_queries(&url));
    // Each line up to its age (the ages count from the real clock).
    let check = |args: &[&str], want: &[&str]| {
        let mut all = vec!["query"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--db", &url]);
        let (ok, out, err) = haul(&all, &[]);
        assert!(ok, "{args:?}: {err}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), want.len(), "{args:?}: {out}");
        for (line, want) in lines.iter().zip(want) {
            let (head, tail) = want.split_once('…').unwrap_or((want, ""));
            assert!(line.starts_with(head) && line.ends_with(tail), "{args:?}: {line:?} is not {want:?}");
        }
    };
    check(&["loads"], &["L2  stage at_pickup  open asks 0  escalated 1  last activity …  (version 2)"]);
    check(
        &["dead", "--limit", "1"],
        &[
            "L2/u1/send_sms  send_sms (external)  died … ago after 1 attempts: HTTP 400: no such number",
            "next page: --before 1772431230000.L2/u1/send_sms",
        ],
    );
    check(&["timers"], &["tmr:L2:ask:eta_request:u1:1  load L2  due 2026-03-02T06:30:00Z (… ago)"]);
    check(&["unmatched"], &["SM1  from ***0199  … ago  no single active load has this driver phone: \"who is this\""]);
    check(
        &["alerts"],
        &[
            "hero_channel_failure  L2/u1/create_hero_task  create_hero_task  raised … ago  NOT delivered yet (the sweep sends it again) after 1 send(s) (last error: HTTP 503): HTTP 400: no such number",
        ],
    );
    check(&["conflicts"], &["L2  1 conflicts, the last … ago"]);
    check(&["opted-out"], &["***0188  opted out … ago  by sms:SM2 (load L2): no SMS until they reply START"]);
    check(&["loads", "--stage", "delivered"], &["no load matches"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn queries_page_a_migrated_store_in_text_and_json() {
    let dir = scratch("query");
    let url = format!("sqlite://{}", dir.join("haul.db").display());
    assert!(haul(&["migrate", "--db", &url], &[]).0);
    let (ok, out, err) = haul(&["query", "loads", "--db", &url, "--escalated", "--pending-over", "5m"], &[]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "no load matches");
    let (ok, out, err) = haul(&["query", "dead", "--db", &url, "--class", "internal", "--json"], &[]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v, serde_json::json!({"rows": [], "next_before": null}));
    for q in ["timers", "unmatched", "alerts", "conflicts", "opted-out"] {
        let (ok, out, err) = haul(&["query", q, "--db", &url, "--json", "--limit", "500"], &[]);
        assert!(ok, "{q}: {err}");
        assert!(serde_json::from_str::<serde_json::Value>(&out).is_ok(), "{q}: {out}");
    }
    // Bounds and forms are the API's, said in one line.
    let (ok, out, err) = haul(&["query", "conflicts", "--db", &url], &[]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "no load has had a conflict");
    let (ok, out, err) = haul(&["query", "opted-out", "--db", &url], &[]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "no phone is opted out of SMS");
    let (ok, _, err) = haul(&["query", "loads", "--db", &url, "--limit", "501"], &[]);
    assert!(!ok && err.contains("from 1 to 500"), "{err}");
    let (ok, _, err) = haul(&["query", "dead", "--db", &url, "--class", "nope"], &[]);
    assert!(!ok && err.contains("external, hero_channel or internal"), "{err}");
    let (ok, _, err) = haul(&["query", "timers", "--db", &url, "--overdue-over", "15"], &[]);
    assert!(!ok && err.contains("overdue_over"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `haul inspect` only reads: in a folder with no store it creates none and says
/// where it looked, by absolute path; with a store, it says which one had no records.
#[test]
fn inspect_never_creates_a_store_and_names_the_one_it_read() {
    let dir = scratch("inspect-ro");
    let run = |args: &[&str]| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_haul"));
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("HAUL_") || k == "DATABASE_URL") {
            cmd.env_remove(k);
        }
        let out = cmd.args(args).current_dir(&dir).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = run(&["inspect", "481207"]);
    assert_eq!(code, Some(1), "{err}");
    let file = dir.join("haul.db");
    assert!(err.contains(&format!("no SQLite database at {}", file.display())), "{err}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "inspect created something");
    // An empty file is not a store either, and stays as it was.
    std::fs::write(&file, "").unwrap();
    let (code, err) = run(&["inspect", "481207"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("holds no haul store"), "{err}");
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 0);
    std::fs::remove_file(&file).unwrap();
    assert_eq!(run(&["migrate"]).0, Some(0));
    let (code, err) = run(&["inspect", "481207"]);
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(err.trim(), format!("load 481207 has no records in sqlite://{}", file.display()));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Progress goes to a terminal only: piped (as here, and in CI), the long commands
/// write nothing to stderr, and stdout is the report alone.
#[test]
fn long_commands_are_quiet_on_stderr_when_it_is_not_a_terminal() {
    let dir = scratch("quiet");
    let db = format!("sqlite://{}", dir.join("haul.db").display());
    for args in [
        vec!["sim", "--seed", "1", "--seeds", "2", "--loads", "2", "--steps", "20"],
        vec!["eval", "../../evals/ask_again_after_an_answered_ask.toml"],
        vec!["prune", "--db", &db],
    ] {
        let (ok, out, err) = haul(&args, &[]);
        assert!(ok, "{args:?}: {err}");
        assert_eq!(err, "", "{args:?}");
        assert!(!out.contains('\r') && !out.contains('\x1b'), "{args:?}: {out:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Seeds run at once print what a serial run prints, in seed order; the end says how
/// fast, and a soak (`--for`) runs until its time is up.
#[test]
fn sim_runs_seeds_at_once_with_the_serial_digests() {
    let seeds = |jobs: &str| {
        let (ok, out, err) =
            haul(&["sim", "--seed", "1", "--seeds", "6", "--loads", "2", "--steps", "40", "--jobs", jobs], &[]);
        assert!(ok, "{err}");
        out
    };
    let (serial, at_once) = (seeds("1"), seeds("3"));
    let lines = |out: &str| out.lines().filter(|l| l.starts_with("seed ")).map(str::to_owned).collect::<Vec<_>>();
    assert_eq!(lines(&serial), lines(&at_once));
    assert_eq!(
        lines(&serial).iter().map(|l| l.split(':').next().unwrap()).collect::<Vec<_>>(),
        (1..=6).map(|s| format!("seed {s}")).collect::<Vec<_>>()
    );
    // The last line is the count alone (scripts read it); the speed is the line before.
    let tail: Vec<&str> = at_once.lines().rev().take(2).collect();
    assert_eq!(tail[0], "6 passed, 0 failed");
    assert!(
        tail[1].starts_with("speed: ") && tail[1].contains(" seeds/s, ") && tail[1].contains(" events/s, 3 at once"),
        "{}",
        tail[1]
    );
    // A soak of two seconds runs seeds until then.
    let (ok, out, err) = haul(&["sim", "--loads", "2", "--steps", "20", "--for", "2s"], &[]);
    assert!(ok, "{err}");
    assert!(lines(&out).len() >= 2, "{out}");
    // A soak stops at its first failing seed and says how to repeat it.
    let (ok, out, _) =
        haul(&["sim", "--loads", "2", "--steps", "40", "--for", "1h", "--plant", "timer_never_pumped"], &[]);
    assert!(!ok);
    let failed: Vec<_> = out.lines().filter(|l| l.contains("FAILED")).collect();
    assert_eq!(failed.len(), 1, "{out}");
    assert!(out.contains("reproduce: haul sim --seed 1 --loads 2 --steps 40 --plant timer_never_pumped"), "{out}");
}

/// Runs `sql` on the database at `url` (a SQLite file or a PostgreSQL schema): a newer
/// haul's work, done by hand.
async fn execute(url: &str, sql: &str) {
    if let Some(path) = url.strip_prefix("sqlite://") {
        rusqlite::Connection::open(path).unwrap().execute_batch(sql).unwrap();
    } else {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
        let task = tokio::spawn(conn);
        client.batch_execute(sql).await.unwrap();
        drop(client);
        let _ = task.await;
    }
}

/// A haul started on a database a newer haul migrated past its schema refuses it,
/// naming both versions, in every command that opens the store; unless the newer
/// migrations were declared readable by it, and then it runs and says so.
async fn a_newer_schema_is_refused_unless_declared_readable_by_this_haul(url: &str) {
    let latest = haul_backends::SCHEMA_VERSION;
    let (ok, _, err) = haul(&["migrate", "--db", url], &[]);
    assert!(ok, "{err}");
    let newer = latest + 1;
    execute(
        url,
        &format!(
            "INSERT INTO schema_migrations (version, applied_at) VALUES ({newer}, 0);
                           UPDATE schema_compat SET readable_by = {newer};"
        ),
    )
    .await;
    for args in
        [vec!["migrate", "--db", url], vec!["inspect", "481207", "--db", url], vec!["query", "loads", "--db", url]]
    {
        one_error_line(&args, &[], &[&format!("version {newer}"), &format!("writes version {latest}"), "upgrade haul"]);
    }
    // Declared readable by this haul: it runs, and warns.
    execute(url, &format!("UPDATE schema_compat SET readable_by = {latest};")).await;
    let (ok, _, err) = haul(&["migrate", "--db", url], &[("HAUL_LOG", "warn")]);
    assert!(ok, "{err}");
    assert!(err.contains(&format!("schema is at version {newer}, newer than this haul's {latest}")), "{err}");
    let (ok, _, err) = haul(&["query", "loads", "--db", url], &[]);
    assert!(ok, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_refused_unless_declared_readable_on_sqlite() {
    let dir = scratch("newer-schema");
    let url = format!("sqlite://{}", dir.join("haul.db").display());
    a_newer_schema_is_refused_unless_declared_readable_by_this_haul(&url).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_refused_unless_declared_readable_on_postgres() {
    let base = haul_postgres::testing::database_url();
    let (schema, url) = haul_postgres::testing::fresh_schema_url(&base).await;
    a_newer_schema_is_refused_unless_declared_readable_by_this_haul(&url).await;
    haul_postgres::testing::drop_schemas(&base, &[schema]).await;
}

/// Every command that makes scratch schemas says in one line why PostgreSQL cannot be
/// used, never a panic.
#[test]
fn commands_on_a_postgresql_that_is_down_say_so_in_one_line() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("postgres://postgres@127.0.0.1:{closed}/test");
    for args in [
        vec!["eval", "--store", "postgres", "evals/"],
        vec!["sim", "--seed", "1", "--store", "postgres"],
        vec!["bench", "append", "--store", "postgres"],
    ] {
        one_error_line(&args, &[("DATABASE_URL", &url)], &["cannot use PostgreSQL at", "Connection refused"]);
    }
}

/// `haul completions bash | head`: a reader that stops early ends the command quietly,
/// and the hidden testkit is never offered.
#[test]
fn completions_stop_quietly_on_a_closed_pipe_and_offer_no_hidden_command() {
    use std::io::Read;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_haul"))
        .args(["completions", "bash"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 16];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {err}", out.status);
    assert!(!err.contains("panicked"), "{err}");
    for shell in ["bash", "zsh", "fish"] {
        let (ok, out, _) = haul(&["completions", shell], &[]);
        assert!(ok && out.contains("send-test-sms") && !out.contains("testkit"), "{shell}");
    }
}

/// A HAUL_* variable that names nothing is told the one it was likely meant to be, and a
/// DATABASE_URL that is not the store says so.
#[test]
fn misspelt_variables_and_a_stray_database_url_are_pointed_out() {
    let (ok, _, err) = haul(&["config", "check"], &[("HAUL_WORKER_CONCURENCY", "3")]);
    assert!(ok, "{err}");
    assert!(
        err.contains("HAUL_WORKER_CONCURENCY names no setting; ignored (did you mean HAUL_WORKER_CONCURRENCY?)"),
        "{err}"
    );
    let (ok, _, err) = haul(&["config", "check"], &[("DATABASE_URL", "postgres://postgres@127.0.0.1/haul")]);
    assert!(ok, "{err}");
    assert!(
        err.contains("DATABASE_URL is set but haul's store is store.url") && err.contains("HAUL_STORE_URL"),
        "{err}"
    );
    let (_, _, err) =
        haul(&["config", "check"], &[("DATABASE_URL", "postgres://x@y/z"), ("HAUL_STORE_URL", "sqlite://a.db")]);
    assert!(!err.contains("DATABASE_URL"), "the store is named: no word about DATABASE_URL: {err}");
}

/// `haul eval --store postgres` and `haul sim --store postgres` clean up after
/// themselves: run against a database of their own (made for them, as a stock server
/// lets the postgres user), they leave no scratch schema behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_and_sim_on_postgres_leave_no_schema_behind() {
    let base = haul_postgres::testing::database_url();
    let db = format!("haul_cleanup_{:08x}", fastrand::u32(..));
    let url = match base.rsplit_once('/') {
        Some((server, _)) => format!("{server}/{db}"),
        None => panic!("DATABASE_URL {base} names no database"),
    };
    for args in [
        vec![
            "eval",
            "--store",
            "postgres",
            "evals/sop_rule1_high_risk_ping_opens_ask_step_one.toml",
            "evals/sop_rule4_answer_on_first_attempt_cancels_current_timer.toml",
        ],
        vec!["sim", "--seed", "1", "--seeds", "3", "--loads", "2", "--steps", "40", "--store", "postgres"],
    ] {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_haul"))
            .args(&args)
            .current_dir(&root)
            .env("DATABASE_URL", &url)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        let client = haul_postgres::testing::client_in_schema(&url, "public").await;
        let left =
            client.query_one("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'haul\\_t%'", &[]).await.unwrap();
        assert_eq!(left.get::<_, i64>(0), 0, "{args:?} left scratch schemas in {db}");
    }
    let client = haul_postgres::testing::client_in_schema(&base, "public").await;
    client.batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)")).await.unwrap();
}

/// A token that cannot be kept says where and how to mend it: set HAUL_API_TOKEN, or
/// run in a directory haul may write to. (A directory in the token file's place: no
/// user, root included, can write the file there.)
#[test]
fn an_unwritable_token_file_names_the_place_and_the_fix() {
    let dir = scratch("token-ro");
    std::fs::create_dir(dir.join("haul-api-token")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_haul"))
        .args(["serve", "--db", "sqlite::memory:", "--listen", "127.0.0.1:0"])
        .current_dir(&dir)
        .env_remove("HAUL_API_TOKEN")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains(&dir.join("haul-api-token").display().to_string()), "{err}");
    assert!(err.contains("set HAUL_API_TOKEN") && err.contains("openssl rand -hex 32"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `haul eval` exports nothing unless asked (`--export-spans`), whatever OTEL_* says;
/// asked, its runs' and sends' spans reach the collector under the role `eval`; asked
/// with no endpoint, it says what to set and runs nothing.
#[test]
fn eval_exports_spans_only_when_asked() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let receiver = rt.block_on(haul_harness::testkit_otlp::OtlpReceiver::start()).unwrap();
    let scenario = "../../evals/ask_again_after_an_answered_ask.toml";
    let endpoint = [("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.base_url.as_str()), ("OTEL_BSP_SCHEDULE_DELAY", "50")];
    let (ok, out, err) = haul(&["eval", scenario], &endpoint);
    assert!(ok, "{out}{err}");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(receiver.received(), 0, "not asked: nothing exported");

    let (ok, out, err) = haul(&["eval", "--export-spans", scenario], &endpoint);
    assert!(ok && out.contains("1 passed"), "{out}{err}");
    let spans = receiver.spans();
    assert!(spans.iter().all(|s| s.role == "eval"), "{spans:#?}");
    for kind in ["CONSUMER", "INTERNAL", "CLIENT"] {
        assert!(spans.iter().any(|s| s.kind == kind), "a {kind} span in {spans:#?}");
    }

    let (ok, out, err) = haul(&["eval", "--export-spans", scenario], &[]);
    assert!(!ok && !out.contains("passed"), "{out}{err}");
    assert!(err.contains("--export-spans") && err.contains("OTEL_EXPORTER_OTLP_ENDPOINT"), "{err}");
}
