//! What publishing needs from the manifests, beside `cargo package` itself (which
//! `.ci/run` runs, verifying that both crates build from their packages): the declared
//! `rust-version` is the toolchain CI builds and tests with (the only one this project
//! is checked on), and the license file is the license declared.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

fn read(relative: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn toml(relative: &str) -> toml::Table {
    read(relative).parse().unwrap()
}

#[test]
fn the_declared_rust_version_is_the_toolchain_ci_builds_with() {
    let toolchain = toml("rust-toolchain.toml");
    let channel = toolchain["toolchain"]["channel"].as_str().unwrap();
    let workspace = toml("Cargo.toml");
    let declared = workspace["workspace"]["package"]["rust-version"]
        .as_str()
        .unwrap();
    assert_eq!(
        declared, channel,
        "rust-version in Cargo.toml against rust-toolchain.toml's channel"
    );
    for manifest in ["Cargo.toml", "actors/Cargo.toml"] {
        let package = &toml(manifest)["package"];
        assert_eq!(
            package["rust-version"]["workspace"].as_bool(),
            Some(true),
            "{manifest} takes the workspace's rust-version"
        );
    }
}

#[test]
fn each_crate_ships_the_apache_license_it_declares_and_what_a_registry_shows() {
    let workspace = toml("Cargo.toml");
    assert_eq!(
        workspace["workspace"]["package"]["license"].as_str(),
        Some("Apache-2.0")
    );
    for license in ["LICENSE", "actors/LICENSE"] {
        let text = read(license);
        assert!(
            text.contains("Apache License") && text.contains("Version 2.0, January 2004"),
            "{license} is not the Apache License 2.0"
        );
    }
    for manifest in ["Cargo.toml", "actors/Cargo.toml"] {
        let package = &toml(manifest)["package"];
        for key in [
            "description",
            "readme",
            "documentation",
            "keywords",
            "categories",
        ] {
            assert!(package.get(key).is_some(), "{manifest}: no {key}");
        }
    }
}

/// Files of the repository a person reads or a tool runs (source, docs, manifests,
/// scripts), by path relative to the root: build outputs, the test servers and Git's
/// own files left out. The changelog is history: it names files as they were.
fn repository_texts() -> Vec<(String, String)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    let mut folders = vec![root.clone()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if ![".git", "target", ".test-servers", "node_modules"].contains(&name.as_str()) {
                    folders.push(path);
                }
                continue;
            }
            let relative = path
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let text_file = [".rs", ".md", ".toml", ".sh", ".py"]
                .iter()
                .any(|ext| name.ends_with(ext))
                || relative == ".ci/run";
            if text_file && relative != "CHANGELOG.md" {
                found.push((relative, std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    found.sort();
    found
}

/// The path-like words of a text (letters, digits, `_ . / - *`), with where each starts.
fn path_words(text: &str) -> Vec<(usize, &str)> {
    let is_path = |c: char| c.is_ascii_alphanumeric() || "_./-*".contains(c);
    let mut words = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices().chain([(text.len(), ' ')]) {
        match (is_path(c), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                words.push((s, text[s..i].trim_end_matches('.')));
                start = None;
            }
            _ => {}
        }
    }
    words
}

/// A clone of the repository alone passes its tests: nothing reads or points at a
/// folder beside it (the fixtures and the module-graph tool were once read from one),
/// and every file of the repository that a manifest, a doc or a comment names exists.
#[test]
fn the_repository_names_nothing_outside_it_and_no_file_it_lacks() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let inside = |path: PathBuf| {
        let mut resolved = PathBuf::new();
        for part in path.components() {
            match part {
                std::path::Component::ParentDir => {
                    resolved.pop();
                }
                other => resolved.push(other),
            }
        }
        resolved.starts_with(&root) && resolved.exists()
    };
    let tops = [
        "actors/",
        "src/",
        "tests/",
        "benches/",
        "examples/",
        "scripts/",
        "config/",
        "deploy/",
        ".ci/",
    ];
    let kinds = [
        ".rs",
        ".py",
        ".sh",
        ".toml",
        ".md",
        ".json",
        ".jsonl",
        ".java",
        ".yaml",
        ".yml",
        ".js",
        ".properties",
        ".html",
    ];
    let mut wrong = Vec::new();
    for (file, text) in repository_texts() {
        let here = root.join(&file).parent().unwrap().to_path_buf();
        // A path is read from its file's folder, its crate's, or the root.
        let crate_dir = if file.starts_with("actors/") {
            root.join("actors")
        } else {
            root.clone()
        };
        for (at, word) in path_words(&text) {
            let up = word.strip_prefix('/').unwrap_or(word);
            if up.starts_with("../")
                && ![&here, &crate_dir, &root]
                    .iter()
                    .any(|base| inside(base.join(up)))
            {
                wrong.push(format!("{file}: {word} is outside the repository"));
            }
            let names_a_file = tops.iter().any(|t| word.starts_with(t))
                && kinds.iter().any(|k| word.ends_with(k))
                && !word.contains('*')
                && !text[..at].ends_with(':');
            if names_a_file
                && ![
                    root.join(word),
                    root.join("actors").join(word),
                    here.join(word),
                ]
                .iter()
                .any(|p| p.exists())
            {
                wrong.push(format!("{file}: {word} does not exist"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
