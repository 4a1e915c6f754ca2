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
