//! The service image (`deploy/Dockerfile`) built and started, where a container engine
//! answers (docker, or podman). Where none does, or the base images cannot be pulled,
//! the test says so past libtest's capture (`container-image: ...`, which scripts/test.sh
//! repeats in its summary) instead of passing silently.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Output};

/// Written straight to the process's stderr, so it shows in every run.
fn report(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "container-image: {line}");
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).trim().to_owned()
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The first engine whose `info` answers, and what the others said.
fn engine() -> Result<&'static str, String> {
    let mut said = Vec::new();
    for engine in ["docker", "podman"] {
        match Command::new(engine).arg("info").output() {
            Ok(out) if out.status.success() => return Ok(engine),
            Ok(out) => said.push(format!(
                "{engine} info: {}",
                text(&out.stderr).lines().last().unwrap_or("failed")
            )),
            Err(err) => said.push(format!("{engine}: {err}")),
        }
    }
    Err(said.join("; "))
}

fn run(engine: &str, args: &[&str]) -> Output {
    Command::new(engine)
        .args(args)
        .current_dir(root())
        .output()
        .unwrap()
}

/// The `FROM` images, which the build pulls.
fn base_images() -> Vec<String> {
    std::fs::read_to_string(root().join("deploy/Dockerfile"))
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("FROM "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_image_builds_and_runs_the_demo_where_a_container_engine_is() {
    let engine = match engine() {
        Ok(engine) => engine,
        Err(why) => {
            report(&format!("not built: no container engine answers ({why})"));
            return;
        }
    };
    for image in base_images() {
        let pulled = run(engine, &["pull", &image]);
        if !pulled.status.success() {
            report(&format!(
                "not built: {engine} cannot pull the base image {image} ({})",
                text(&pulled.stderr).lines().last().unwrap_or("failed")
            ));
            return;
        }
    }
    let tag = "flotilla-ci:test";
    let built = run(
        engine,
        &["build", "-f", "deploy/Dockerfile", "-t", tag, "."],
    );
    assert!(
        built.status.success(),
        "{engine} build failed:\n{}",
        text(&built.stderr)
    );
    let size = run(engine, &["image", "inspect", "--format", "{{.Size}}", tag]);
    let bytes: u64 = text(&size.stdout).parse().unwrap_or(0);
    // Started: the demo needs no AWS, so it runs the real binary end to end.
    let demo = run(
        engine,
        &["run", "--rm", tag, "flotilla", "demo", "--duration", "5"],
    );
    let summary = text(&demo.stdout);
    assert!(
        demo.status.success() && summary.contains("lost=0"),
        "the image's demo failed ({}):\n{summary}\n{}",
        demo.status,
        text(&demo.stderr)
    );
    report(&format!(
        "built with {engine}: {:.1} MB; the demo in it: {}",
        bytes as f64 / 1e6,
        summary.lines().last().unwrap_or("")
    ));
}
