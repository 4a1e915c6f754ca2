//! The guide holds together: README.md is the front door and docs/ an mdBook, so a
//! reader moves between files by relative links, and a moved section or a renamed
//! heading breaks them silently (GitHub shows a 404, mdbook builds anyway). Every
//! relative link of the Markdown a reader follows must name a file that exists, and a
//! `#fragment` a heading of it; the book's SUMMARY.md names every chapter and only
//! chapters that exist (CI's `mdbook build` fails on a missing one too, through
//! `create-missing = false`, but not on an orphan).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(relative: &str) -> String {
    let path = root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The book's Markdown files, `docs/NAME.md`, sorted (its build output, if any, is in a
/// folder and so never among them).
fn book_files() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    files.sort();
    files
}

/// Every Markdown file whose links are checked, relative to the root.
fn linking_files() -> Vec<String> {
    let mut files: Vec<String> = [
        "README.md",
        "ARCHITECTURE.md",
        "BENCHMARKS.md",
        "SIMULATION.md",
        "CHANGELOG.md",
        "deploy/README.md",
    ]
    .map(str::to_owned)
    .to_vec();
    files.extend(book_files());
    files
}

/// The text's lines outside fenced code blocks (a fence may be indented, inside a list
/// item), numbered from 1; a line inside a fence is blank, so that blocks keep their
/// bounds and lines their numbers.
fn prose_lines(text: &str) -> Vec<(usize, String)> {
    let mut fence: Option<(char, usize)> = None;
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = trimmed.chars().next().filter(|c| *c == '`' || *c == '~');
        let run = marker.map_or(0, |m| trimmed.chars().take_while(|c| *c == m).count());
        match (fence, marker) {
            (None, Some(m)) if run >= 3 => {
                fence = Some((m, run));
                lines.push((i + 1, String::new()));
            }
            (Some((m, open)), Some(c))
                if c == m && run >= open && trimmed.trim_end().chars().all(|x| x == m) =>
            {
                fence = None;
                lines.push((i + 1, String::new()));
            }
            (Some(_), _) => lines.push((i + 1, String::new())),
            (None, _) => lines.push((i + 1, line.to_owned())),
        }
    }
    lines
}

/// A block's text with its code spans blanked (a span may cross a line; a lone
/// backtick run stays as it is), so that `a[i](j)` in code is not taken for a link.
/// Every byte keeps its offset: a blanked character becomes as many spaces as it had
/// bytes, so that offsets into the result are offsets into the block.
fn blank_code_spans(block: &str) -> String {
    let chars: Vec<char> = block.chars().collect();
    let mut blank = vec![false; chars.len()];
    let run_at = |i: usize| chars[i..].iter().take_while(|c| **c == '`').count();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            i += 1;
            continue;
        }
        let open = run_at(i);
        let mut j = i + open;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let run = run_at(j);
                if run == open {
                    close = Some(j);
                    break;
                }
                j += run;
            } else {
                j += 1;
            }
        }
        match close {
            Some(j) => {
                blank[i..j + open].fill(true);
                i = j + open;
            }
            None => i += open,
        }
    }
    chars
        .iter()
        .zip(blank)
        .map(|(c, blank)| match (c, blank) {
            ('\n', _) | (_, false) => c.to_string(),
            (_, true) => " ".repeat(c.len_utf8()),
        })
        .collect()
}

/// A link found in prose: its line, its text and its target as written.
struct Link {
    line: usize,
    text: String,
    target: String,
}

/// Inline links and images (`[text](target "title")`) and reference definitions
/// (`[name]: target`) outside code.
fn links(text: &str) -> Vec<Link> {
    let lines = prose_lines(text);
    let mut found = Vec::new();
    // Blocks of consecutive non-blank lines: a code span or a link does not cross one.
    for block in lines.split(|(_, line)| line.trim().is_empty()) {
        let Some(&(first, _)) = block.first() else {
            continue;
        };
        let joined: String = block
            .iter()
            .map(|(_, l)| l.as_str())
            .collect::<Vec<_>>()
            .join("\n");
        let plain = blank_code_spans(&joined);
        let line_of = |at: usize| first + plain[..at].matches('\n').count();
        for (i, line) in plain.lines().enumerate() {
            if let Some(rest) = line.trim_start().strip_prefix('[')
                && let Some((name, target)) = rest.split_once("]:")
                && !name.contains(']')
            {
                found.push(Link {
                    line: first + i,
                    text: name.to_owned(),
                    target: target.trim().to_owned(),
                });
            }
        }
        let mut from = 0;
        while let Some(at) = plain[from..].find("](").map(|i| from + i) {
            from = at + 2;
            // The text: back to its opening bracket, nested brackets counted.
            let mut depth = 0;
            let mut start = None;
            for (i, c) in plain[..at].char_indices().rev() {
                match c {
                    ']' => depth += 1,
                    '[' if depth == 0 => {
                        start = Some(i);
                        break;
                    }
                    '[' => depth -= 1,
                    _ => {}
                }
            }
            let Some(start) = start else { continue };
            // The target: to its closing parenthesis, nested parentheses counted.
            let mut depth = 0;
            let mut end = None;
            for (i, c) in plain[from..].char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' if depth == 0 => {
                        end = Some(from + i);
                        break;
                    }
                    ')' => depth -= 1,
                    _ => {}
                }
            }
            let Some(end) = end else { continue };
            let written = plain[from..end].trim();
            let target = written
                .strip_prefix('<')
                .and_then(|t| t.split_once('>'))
                .map_or_else(
                    || written.split_whitespace().next().unwrap_or(""),
                    |(t, _)| t,
                );
            found.push(Link {
                line: line_of(start),
                text: joined[start + 1..at].replace('\n', " "),
                target: target.to_owned(),
            });
            from = end;
        }
    }
    found
}

/// The anchor mdBook and GitHub give a heading: its text without inline markup,
/// lowercased, with alphanumerics, `-` and `_` kept, whitespace made `-`, the rest
/// dropped.
fn slug(heading: &str) -> String {
    // A link's text stands for the link.
    let mut text = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        match rest[open..].find("](").map(|i| open + i) {
            Some(mid) => match rest[mid..].find(')').map(|i| mid + i) {
                Some(close) => {
                    text.push_str(&rest[..open]);
                    text.push_str(&rest[open + 1..mid]);
                    rest = &rest[close + 1..];
                }
                None => break,
            },
            None => break,
        }
    }
    text.push_str(rest);
    text.chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '-' || c == '_' {
                Some(c.to_lowercase().collect::<String>())
            } else if c.is_whitespace() {
                Some("-".to_owned())
            } else {
                None
            }
        })
        .collect()
}

/// The anchors of a Markdown text's headings (ATX, outside code), a repeated one
/// numbered `-1`, `-2`, … as mdBook and GitHub number them.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let trimmed = line.trim_start();
        if line.len() - trimmed.len() > 3 {
            continue;
        }
        let level = trimmed.chars().take_while(|c| *c == '#').count();
        let Some(heading) = trimmed[level..].strip_prefix([' ', '\t']) else {
            continue;
        };
        if !(1..=6).contains(&level) {
            continue;
        }
        // A closing run of `#` after a space is not part of the heading.
        let heading = heading.trim();
        let unclosed = heading.trim_end_matches('#');
        let heading = if unclosed.is_empty() || unclosed.ends_with([' ', '\t']) {
            unclosed.trim_end()
        } else {
            heading
        };
        let base = slug(heading);
        let count = seen.entry(base.clone()).or_default();
        anchors.insert(match *count {
            0 => base,
            n => format!("{base}-{n}"),
        });
        *count += 1;
    }
    anchors
}

/// `path` with `.` and `..` resolved, without touching the file system.
fn normalized(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// What is wrong with one link of `file` (relative to the root), if anything.
fn check(file: &str, link: &Link) -> Option<String> {
    let target = link.target.as_str();
    if target.is_empty() {
        return Some("empty target".to_owned());
    }
    // Another scheme (https:, mailto:, …) is not a file of this repository.
    let scheme = target.split(['/', '#', '?']).next().unwrap_or("");
    if scheme.contains(':') {
        return None;
    }
    let (path, fragment) = match target.split_once('#') {
        Some((path, fragment)) => (path, Some(fragment)),
        None => (target, None),
    };
    let root = root();
    let resolved = if path.is_empty() {
        root.join(file)
    } else {
        normalized(&root.join(file).parent().unwrap().join(path))
    };
    if !resolved.starts_with(&root) {
        return Some(format!("{} is outside the repository", resolved.display()));
    }
    let shown = resolved.strip_prefix(&root).unwrap().display().to_string();
    if !resolved.exists() {
        return Some(format!("{shown} does not exist"));
    }
    let fragment = fragment?;
    if resolved.extension().is_none_or(|e| e != "md") {
        return Some(format!(
            "#{fragment}: {shown} is not Markdown, whose headings are the only anchors checked"
        ));
    }
    let headings = anchors(&std::fs::read_to_string(&resolved).unwrap());
    if headings.contains(fragment) {
        None
    } else {
        Some(format!(
            "{shown} has no heading whose anchor is #{fragment}"
        ))
    }
}

#[test]
fn every_relative_link_names_a_file_and_a_heading_that_exist() {
    let mut wrong = Vec::new();
    let mut checked = 0;
    for file in linking_files() {
        for link in links(&read(&file)) {
            checked += 1;
            if let Some(what) = check(&file, &link) {
                wrong.push(format!(
                    "{file}:{}: [{}]({}): {what}",
                    link.line, link.text, link.target
                ));
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} links found: is the parser blind?"
    );
    assert!(wrong.is_empty(), "broken links:\n{}", wrong.join("\n"));
}

#[test]
fn the_summary_names_every_chapter_and_only_chapters_that_exist() {
    let summary = read("docs/SUMMARY.md");
    let mut named = BTreeSet::new();
    let mut wrong = Vec::new();
    for link in links(&summary) {
        let chapter = format!("docs/{}", link.target.trim_start_matches("./"));
        if !root().join(&chapter).is_file() {
            wrong.push(format!(
                "docs/SUMMARY.md:{}: [{}]({}): {chapter} does not exist",
                link.line, link.text, link.target
            ));
        }
        if !named.insert(chapter.clone()) {
            wrong.push(format!(
                "docs/SUMMARY.md:{}: [{}]({}): {chapter} is named twice",
                link.line, link.text, link.target
            ));
        }
    }
    for file in book_files() {
        if file != "docs/SUMMARY.md" && !named.contains(&file) {
            wrong.push(format!(
                "{file} is not named in docs/SUMMARY.md: an orphan chapter the book leaves out"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The build settings the two checks above lean on: the chapters are docs/ itself, and
/// a missing chapter fails `mdbook build` rather than being created empty.
#[test]
fn the_book_is_built_from_docs_and_refuses_missing_chapters() {
    let book: toml::Table = read("docs/book.toml").parse().unwrap();
    assert_eq!(
        book["book"]["src"].as_str(),
        Some("."),
        "docs/book.toml: book.src"
    );
    assert_eq!(
        book["build"]["create-missing"].as_bool(),
        Some(false),
        "docs/book.toml: build.create-missing"
    );
}

/// README.md is the front door, not the manual: what it grows by belongs in a chapter.
#[test]
fn the_readme_stays_a_front_door() {
    let lines = read("README.md").lines().count();
    assert!(
        lines <= 300,
        "README.md has {lines} lines: move the detail into a chapter of docs/ (at most 300)"
    );
}

/// The parts of the checks, on cases the repository's files may not have today.
/// README's embedding example is `actors/examples/readme_embedding.rs` below its doc
/// lines, so every build compiles what a newcomer copies.
#[test]
fn the_readme_example_is_the_compiled_one() {
    let readme = read("README.md");
    let shown = readme
        .split("```rust\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("README.md shows a ```rust block");
    let example = read("actors/examples/readme_embedding.rs");
    let compiled: String = example
        .lines()
        .skip_while(|line| line.starts_with("//!") || line.is_empty())
        .map(|line| format!("{line}\n"))
        .collect();
    assert_eq!(
        shown, compiled,
        "README.md's embedding example differs from actors/examples/readme_embedding.rs"
    );
}

#[test]
fn links_and_anchors_are_read_as_mdbook_and_github_read_them() {
    assert_eq!(
        slug("P10 — the MultiLang pipe (issue 17)"),
        "p10--the-multilang-pipe-issue-17"
    );
    assert_eq!(
        slug("KCL — the Java KCL 2.5.8 beside flotilla"),
        "kcl--the-java-kcl-258-beside-flotilla"
    );
    assert_eq!(
        slug("The library's suites (`actors/tests/`)"),
        "the-librarys-suites-actorstests"
    );
    assert_eq!(slug("See [the guide](x.md#y) now"), "see-the-guide-now");
    let text = "# The model\n\n```sh\n# not a heading\n```\n\n## The model\n## the_key\n";
    let found = anchors(text);
    assert_eq!(
        found,
        ["the-model", "the-model-1", "the_key"]
            .map(str::to_owned)
            .into()
    );
    let text = "See [a](a.md#x) and `[b](not-a-link)`, [c\nd](up/c.md \"title\").\n\n\
                ```\n[e](in-code.md)\n```\n   ```sh\n   [f](in-indented-code.md)\n   ```\n\
                [g]: g.md\n![h](<h i.png>)\n";
    let found: Vec<(usize, String, String)> = links(text)
        .into_iter()
        .map(|l| (l.line, l.text, l.target))
        .collect();
    assert_eq!(
        found,
        [
            (1, "a", "a.md#x"),
            (1, "c d", "up/c.md"),
            (10, "g", "g.md"),
            (11, "h", "h i.png"),
        ]
        .map(|(n, t, g)| (n, t.to_owned(), g.to_owned()))
    );
}
