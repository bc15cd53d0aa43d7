//! Names the build in `haul --version`: the git commit it was built from (`unknown`
//! outside a git checkout or without git) and the optional features built in, so a
//! running binary can be matched to its source and to what it can do.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    // Build again when HEAD moves: the HEAD file (a branch switch), the branch's ref
    // and packed-refs (a commit), and the folder of loose branch refs (a fresh clone
    // keeps its branch in packed-refs until the first commit writes it there). Paths
    // are per worktree where git keeps them so.
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned(), "refs/heads".to_owned()];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(branch);
    }
    for name in watched {
        // A path that does not exist would make cargo run this script on every build.
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", &name])
            && std::path::Path::new(&path).exists()
        {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    let features: Vec<&str> = [("sqs", std::env::var_os("CARGO_FEATURE_SQS").is_some())]
        .iter()
        .filter(|(_, on)| *on)
        .map(|(name, _)| *name)
        .collect();
    let features = if features.is_empty() { "none".to_owned() } else { features.join(",") };
    // Cargo also sets these when it runs the binary and its tests: not `HAUL_*`, which
    // the binary reads as settings.
    println!("cargo:rustc-env=BUILD_HAUL_COMMIT={commit}");
    println!("cargo:rustc-env=BUILD_HAUL_FEATURES={features}");
}
