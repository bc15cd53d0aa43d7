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
