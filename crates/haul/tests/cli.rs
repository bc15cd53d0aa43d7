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
        (vec!["--db", "sqlite::memory:", "--listen", &taken], vec![], "server.listen"),
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
