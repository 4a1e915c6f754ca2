//! The Java properties-file syntax the KCL MultiLangDaemon reads its settings in
//! (`java.util.Properties::load`), so that an application's existing file is read
//! exactly as the daemon read it.
//!
//! * A comment line starts (after blanks) with `#` or `!`; blank lines are skipped.
//! * A line ending in an odd number of backslashes continues on the next, whose leading
//!   blanks are dropped.
//! * The key ends at the first unescaped `=`, `:` or blank; blanks, then at most one
//!   `=` or `:`, then blanks separate it from the value.
//! * Escapes in keys and values: `\t`, `\n`, `\r`, `\f`, `\uXXXX`; any other escaped
//!   character stands for itself (`\=`, `\:`, `\ `, `\\`).
//!
//! Pure: text in, pairs out, in file order (a key given twice: the last one wins, as in
//! Java, which [`Properties::get`] follows).

use std::fmt;

/// The pairs of one file, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Properties {
    pairs: Vec<(String, String)>,
}

/// A line the Java loader would also refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {what}")]
pub struct PropertiesError {
    /// 1-based, the line the logical line starts on.
    pub line: usize,
    /// What is wrong (e.g. a malformed `\uXXXX` escape).
    pub what: String,
}

impl Properties {
    /// Reads a file's text as `java.util.Properties::load` reads it; an error only where Java's
    /// loader would refuse the line too.
    pub fn parse(text: &str) -> Result<Self, PropertiesError> {
        let mut pairs = Vec::new();
        let lines: Vec<&str> = text.lines().collect();
        let mut i = 0;
        while i < lines.len() {
            let start = i;
            let first = lines[i].trim_start_matches(is_blank);
            i += 1;
            if first.is_empty() || first.starts_with('#') || first.starts_with('!') {
                continue;
            }
            // Join continuation lines.
            let mut logical = String::from(first);
            while ends_in_continuation(&logical) {
                logical.pop();
                match lines.get(i) {
                    Some(next) => {
                        logical.push_str(next.trim_start_matches(is_blank));
                        i += 1;
                    }
                    None => break,
                }
            }
            let (key, value) = split(&logical);
            let key = unescape(key).map_err(|what| PropertiesError {
                line: start + 1,
                what,
            })?;
            let value = unescape(value).map_err(|what| PropertiesError {
                line: start + 1,
                what,
            })?;
            pairs.push((key, value));
        }
        Ok(Self { pairs })
    }

    /// The value of `key` (the last one given).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every pair, in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.pairs.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

fn is_blank(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\u{c}')
}

fn ends_in_continuation(line: &str) -> bool {
    line.chars().rev().take_while(|c| *c == '\\').count() % 2 == 1
}

/// Splits a logical line into its raw (still escaped) key and value.
fn split(line: &str) -> (&str, &str) {
    let mut escaped = false;
    let mut key_end = line.len();
    for (i, c) in line.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' => escaped = true,
            '=' | ':' => {
                key_end = i;
                let rest = line[i + 1..].trim_start_matches(is_blank);
                return (&line[..key_end], rest);
            }
            c if is_blank(c) => {
                key_end = i;
                break;
            }
            _ => {}
        }
    }
    let rest = line[key_end..].trim_start_matches(is_blank);
    let rest = match rest.strip_prefix(['=', ':']) {
        Some(after) => after.trim_start_matches(is_blank),
        None => rest,
    };
    (&line[..key_end], rest)
}

fn unescape(raw: &str) -> Result<String, String> {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('f') => out.push('\u{c}'),
            Some('u') => {
                let hex: String = chars.by_ref().take(4).collect();
                let code = (hex.len() == 4)
                    .then(|| u32::from_str_radix(&hex, 16).ok())
                    .flatten()
                    .and_then(char::from_u32)
                    .ok_or_else(|| format!("malformed \\uxxxx escape: \\u{hex}"))?;
                out.push(code);
            }
            Some(other) => out.push(other),
            None => {}
        }
    }
    Ok(out)
}

impl fmt::Display for Properties {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (k, v) in &self.pairs {
            writeln!(f, "{k} = {v}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_java_syntax() {
        let text = "# a comment\n\
                    ! another\n\
                    \n\
                    executableName = node sample_kcl_app.js\n\
                    streamName:kclnodejssample\n\
                    applicationName    kclnodejssample\n\
                    \t  regionName=us-east-1  \n\
                    empty=\n\
                    bare\n\
                    long = one \\\n    two \\\n   three\n\
                    key\\ with\\ blanks = a\\=b\\:c\n\
                    unicode = caf\\u00e9\\ttab\n\
                    escaped\\\\ = back\\\\\n\
                    regionName = eu-west-1\n";
        let p = Properties::parse(text).unwrap();
        let table = [
            ("executableName", "node sample_kcl_app.js"),
            ("streamName", "kclnodejssample"),
            ("applicationName", "kclnodejssample"),
            // Trailing blanks belong to the value, as in Java; the last one given wins.
            ("regionName", "eu-west-1"),
            ("empty", ""),
            ("bare", ""),
            ("long", "one two three"),
            ("key with blanks", "a=b:c"),
            ("unicode", "caf\u{e9}\ttab"),
            ("escaped\\", "back\\"),
        ];
        for (key, want) in table {
            assert_eq!(p.get(key), Some(want), "{key}");
        }
        assert_eq!(p.iter().filter(|(k, _)| *k == "regionName").count(), 2);
        assert_eq!(
            p.iter().find(|(k, _)| *k == "regionName").map(|(_, v)| v),
            Some("us-east-1  ")
        );
        assert_eq!(p.get("missing"), None);
    }

    #[test]
    fn a_bad_unicode_escape_names_its_line() {
        let err = Properties::parse("ok = 1\n\nbad = \\u12g4\n").unwrap_err();
        assert_eq!(err.line, 3);
        assert!(err.what.contains("\\u12g4"), "{err}");
    }

    #[test]
    fn an_even_number_of_backslashes_does_not_continue() {
        let p = Properties::parse("a = x\\\\\nb = y\n").unwrap();
        assert_eq!(p.get("a"), Some("x\\"));
        assert_eq!(p.get("b"), Some("y"));
    }
}
