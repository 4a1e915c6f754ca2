//! Loads a worker's settings in layers, each overriding the one before: the defaults
//! ([`Settings::default`], which `config/default.toml` documents), a TOML file, then
//! environment variables `FLOTILLA__SECTION__KEY`. The result must pass
//! [`Settings::validate`].
//!
//! The `flotilla` binary and an embedding service call the same [`Settings::load`], so
//! both accept the same files and variables and fail with the same messages.
//!
//! The file and each variable are also read on their own before the merge, so an unknown
//! key or a bad value is reported with where it came from (the file's path, the
//! variable's name), not only with the key it reached.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use config::{Config, ConfigBuilder, Environment, File, FileFormat, Map, builder::DefaultState};

use super::{Settings, SettingsError};

/// `FLOTILLA__LEASE__FAILOVER_TIME` sets `lease.failover_time`. The double underscore
/// separates levels because keys themselves contain single ones.
const ENV_PREFIX: &str = "FLOTILLA";
const ENV_SEPARATOR: &str = "__";

/// The variable naming a settings file when the caller names none (`--config` in the
/// binary reads it too).
pub const CONFIG_FILE_VAR: &str = "FLOTILLA_CONFIG";

/// Why settings could not be loaded. Each message says where the bad value came from
/// (the file's path or the variable's name) and, where there is one, the key.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The settings file could not be read (missing, unreadable); fix the path or its permissions.
    #[error("cannot read settings file {}", path.display())]
    ReadFile {
        /// The file as named by the caller or `FLOTILLA_CONFIG`.
        path: PathBuf,
        /// The I/O error reading it.
        #[source]
        source: std::io::Error,
    },
    /// Not TOML, an unknown key, or a value of the wrong type.
    #[error("settings file {}: {why}", path.display())]
    File {
        /// The settings file.
        path: PathBuf,
        /// What is wrong, with the key where the parser names one.
        why: String,
    },
    /// A `FLOTILLA__…` or `FLOTILLA_CONFIG` variable whose value is not UTF-8.
    #[error("environment variable {name}: its value is not UTF-8")]
    NotUtf8 {
        /// The variable's name.
        name: String,
    },
    /// A `FLOTILLA__…` variable that names no setting.
    #[error("environment variable {name}: no setting {key}; {known}")]
    UnknownVariable {
        /// The variable's name.
        name: String,
        /// The dotted key it would set.
        key: String,
        /// What there is instead: the keys of its section, or the sections.
        known: String,
    },
    /// A variable whose value its setting does not accept.
    #[error("environment variable {name}={value:?}: {why}")]
    Variable {
        /// The variable's name.
        name: String,
        /// Its value as found.
        value: String,
        /// Why the setting does not accept it.
        why: String,
    },
    /// The layers together do not make settings (each one alone did).
    #[error("settings: {why}")]
    Merge {
        /// What does not fit, as the parser says it.
        why: String,
    },
    /// A value of the base layer a caller gave (`Settings::load_over`): `origin` names
    /// where it came from (e.g. a MultiLang properties file).
    #[error("{origin}: setting {key} = {value:?}: {why}")]
    Base {
        /// Where the base came from (e.g. the MultiLang properties file's path).
        origin: String,
        /// The dotted key of the base value (`worker.stream`).
        key: String,
        /// The value as given, as text.
        value: String,
        /// Why the setting does not accept it.
        why: String,
    },
    /// The settings parse but cannot work ([`Settings::validate`]).
    #[error(transparent)]
    Invalid(#[from] SettingsError),
}

impl LoadError {
    /// The dotted key at fault, when the error is about one.
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::UnknownVariable { key, .. } => Some(key),
            Self::Invalid(error) => Some(error.key()),
            _ => None,
        }
    }
}

impl Settings {
    /// The settings of the built-in defaults, then `file` (or, when `None`, the file the
    /// `FLOTILLA_CONFIG` variable names, if any), then the process's `FLOTILLA__…`
    /// variables; validated. What `flotilla run --config FILE` does.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), flotilla_actors::settings::LoadError> {
    /// let settings = flotilla_actors::Settings::load(Some("my-app.toml".as_ref()))?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn load(file: Option<&Path>) -> Result<Settings, LoadError> {
        Self::load_from(file, Self::environment()?)
    }

    /// The process's variables that settings read: `FLOTILLA_CONFIG` and the
    /// `FLOTILLA__…` ones (for [`Settings::load_over`]).
    pub fn environment() -> Result<Vec<(String, String)>, LoadError> {
        let mut env = Vec::new();
        for (name, value) in std::env::vars_os() {
            // Names that are not UTF-8 cannot be ours, which are ASCII.
            let Ok(name) = name.into_string() else {
                continue;
            };
            if !is_ours(&name) && name != CONFIG_FILE_VAR {
                continue;
            }
            let value = value
                .into_string()
                .map_err(|_| LoadError::NotUtf8 { name: name.clone() })?;
            env.push((name, value));
        }
        Ok(env)
    }

    /// [`Settings::load`] with the environment given instead of the process's (for tests,
    /// or a service that keeps its own). Variables other than `FLOTILLA_CONFIG` and the
    /// `FLOTILLA__…` ones are ignored.
    pub fn load_from(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Settings, LoadError> {
        let settings = merge(&[], "", file, env)?;
        settings.validate()?;
        Ok(settings)
    }

    /// [`Settings::load_from`] over a base layer of settings by dotted key
    /// (`("worker.stream", "orders")`, values as text the settings accept), which the
    /// file and the variables override: how `flotilla multilang` puts a MultiLang
    /// properties file under flotilla's own settings. `origin` names the base in errors.
    pub fn load_over(
        base: &[(String, String)],
        origin: &str,
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Settings, LoadError> {
        let settings = merge(base, origin, file, env)?;
        settings.validate()?;
        Ok(settings)
    }
}

/// The layers merged, not yet validated.
fn merge(
    base: &[(String, String)],
    origin: &str,
    file: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<Settings, LoadError> {
    let mut config_file = None;
    let mut vars = Map::new();
    for (name, value) in env {
        if name == CONFIG_FILE_VAR {
            config_file = Some(value);
        } else if is_ours(&name) {
            vars.insert(name, value);
        }
    }
    let file = file
        .map(Path::to_path_buf)
        .or_else(|| config_file.filter(|f| !f.is_empty()).map(PathBuf::from));

    // The defaults are the fields' own (`#[serde(default)]`): nothing to add for them.
    // The base is the config crate's "defaults": under every source.
    let mut layers = Config::builder();
    for (key, value) in base {
        let base_error = |why: String| LoadError::Base {
            origin: origin.to_owned(),
            key: key.clone(),
            value: value.clone(),
            why,
        };
        let alone = Config::builder()
            .set_default(key.as_str(), value.as_str())
            .map_err(|e| base_error(error_text(&e)))?;
        deserialize(alone).map_err(base_error)?;
        layers = layers
            .set_default(key.as_str(), value.as_str())
            .map_err(|e| base_error(error_text(&e)))?;
    }
    if let Some(path) = file {
        let text = std::fs::read_to_string(&path).map_err(|source| LoadError::ReadFile {
            path: path.clone(),
            source,
        })?;
        let layer = File::from_str(&text, FileFormat::Toml);
        deserialize(Config::builder().add_source(layer.clone())).map_err(|why| {
            LoadError::File {
                path: path.clone(),
                why,
            }
        })?;
        layers = layers.add_source(layer);
    }

    let keys = setting_keys().map_err(|why| LoadError::Merge { why })?;
    for (name, value) in &vars {
        check_variable(&keys, name, value)?;
    }
    layers = layers.add_source(environment(vars));

    deserialize(layers).map_err(|why| LoadError::Merge { why })
}

/// One variable on its own: it must name a setting and hold a value that setting accepts.
fn check_variable(keys: &BTreeSet<String>, name: &str, value: &str) -> Result<(), LoadError> {
    let key = env_key(name);
    if !keys.contains(&key) {
        let section = key.split('.').next().unwrap_or_default();
        let in_section: Vec<&str> = keys
            .iter()
            .filter_map(|k| k.strip_prefix(section)?.strip_prefix('.'))
            .collect();
        let known = if in_section.is_empty() {
            let sections: BTreeSet<&str> =
                keys.iter().filter_map(|k| k.split('.').next()).collect();
            format!("the sections are {}", Vec::from_iter(sections).join(", "))
        } else {
            format!("[{section}] has {}", in_section.join(", "))
        };
        return Err(LoadError::UnknownVariable {
            name: name.to_owned(),
            key,
            known,
        });
    }
    let one = Map::from_iter([(name.to_owned(), value.to_owned())]);
    deserialize(Config::builder().add_source(environment(one))).map_err(|why| {
        LoadError::Variable {
            name: name.to_owned(),
            value: value.to_owned(),
            why,
        }
    })?;
    Ok(())
}

fn is_ours(name: &str) -> bool {
    // The config crate compares names case-insensitively; so does this filter.
    let prefix = format!("{ENV_PREFIX}{ENV_SEPARATOR}");
    name.len() > prefix.len()
        && name.is_char_boundary(prefix.len())
        && name[..prefix.len()].eq_ignore_ascii_case(&prefix)
}

/// The dotted key a variable sets, as the config crate derives it.
fn env_key(name: &str) -> String {
    let prefix_len = ENV_PREFIX.len() + ENV_SEPARATOR.len();
    name.get(prefix_len..)
        .unwrap_or_default()
        .to_lowercase()
        .replace(ENV_SEPARATOR, ".")
}

/// Values are left as text for serde to convert by the field's type: guessing types
/// (`try_parsing`) would turn a worker id "007" into "7".
fn environment(vars: Map<String, String>) -> Environment {
    Environment::with_prefix(ENV_PREFIX)
        .prefix_separator(ENV_SEPARATOR)
        .separator(ENV_SEPARATOR)
        .source(Some(vars))
}

/// The config crate's error as text with its causes: its type is not part of this
/// crate's API.
fn deserialize(layers: ConfigBuilder<DefaultState>) -> Result<Settings, String> {
    let built = layers.build().map_err(|e| error_text(&e))?;
    built.try_deserialize().map_err(|e| error_text(&e))
}

fn error_text(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

impl Settings {
    /// The dotted keys (`lease.max_leases`) whose values differ between `self` and
    /// `other`, in order: what a re-read file changed. A key of a list (`worker.streams`)
    /// is the list's.
    pub fn changed_keys(&self, other: &Settings) -> Vec<String> {
        let (Ok(mine), Ok(theirs)) = (serde_json::to_value(self), serde_json::to_value(other))
        else {
            // Settings always serialize; were they not to, nothing is known to differ.
            return Vec::new();
        };
        let (mut before, mut after) = (BTreeMap::new(), BTreeMap::new());
        collect_values("", &mine, &mut before);
        collect_values("", &theirs, &mut after);
        let keys: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
        keys.into_iter()
            .filter(|key| before.get(*key) != after.get(*key))
            .cloned()
            .collect()
    }
}

/// The leaves of a serialized `Settings` by dotted key, as [`collect_keys`] finds them.
fn collect_values(
    prefix: &str,
    value: &serde_json::Value,
    values: &mut BTreeMap<String, serde_json::Value>,
) {
    match value {
        serde_json::Value::Object(fields) => {
            for (name, value) in fields {
                let key = if prefix.is_empty() {
                    name.clone()
                } else {
                    format!("{prefix}.{name}")
                };
                collect_values(&key, value, values);
            }
        }
        leaf => {
            values.insert(prefix.to_owned(), leaf.clone());
        }
    }
}

/// Every dotted key `Settings` has, optional ones included: taken from the type itself,
/// so a new field is known here (and must be documented in default.toml) at once.
fn setting_keys() -> Result<BTreeSet<String>, String> {
    let tree = serde_json::to_value(Settings::default())
        .map_err(|e| format!("cannot list the settings: serializing the defaults failed: {e}"))?;
    let mut keys = BTreeSet::new();
    collect_keys("", &tree, &mut keys);
    Ok(keys)
}

/// Leaves only: a section is not a setting. `None` serializes as null, so optional
/// settings count as leaves too.
fn collect_keys(prefix: &str, value: &serde_json::Value, keys: &mut BTreeSet<String>) {
    match value {
        serde_json::Value::Object(fields) => {
            for (name, value) in fields {
                let key = if prefix.is_empty() {
                    name.clone()
                } else {
                    format!("{prefix}.{name}")
                };
                collect_keys(&key, value, keys);
            }
        }
        _ => {
            keys.insert(prefix.to_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::Duration;

    use super::*;
    use crate::settings::{CheckpointMode, InitialPosition, MetricsLevel};

    /// The documented defaults, in the workspace (not shipped with the crate: the
    /// defaults in force are `Settings::default()`, and these tests keep the two equal).
    const DEFAULTS: &str = include_str!("../../../config/default.toml");
    /// The configuration reference, a chapter of the guide.
    const REFERENCE: &str = include_str!("../../../docs/configuration.md");

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// The two settings without a default, from the environment.
    const REQUIRED: &[(&str, &str)] = &[
        ("FLOTILLA__WORKER__STREAM", "orders"),
        ("FLOTILLA__WORKER__APPLICATION", "orders-billing"),
    ];

    fn with_required(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut all = vars(REQUIRED);
        all.extend(vars(pairs));
        all
    }

    /// A file in the temp directory, unique per test and process.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(name: &str, text: &str) -> Self {
            let path = std::env::temp_dir().join(format!(
                "flotilla-settings-{}-{name}.toml",
                std::process::id()
            ));
            std::fs::write(&path, text).unwrap();
            Self(path)
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn config_file(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../config")
            .join(name)
    }

    fn error_text(result: Result<Settings, LoadError>) -> String {
        // As the binary prints it: the error and its causes.
        super::error_text(&result.unwrap_err())
    }

    fn load_from(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Settings, LoadError> {
        Settings::load_from(file, env)
    }

    /// `key = value` lines, and `# key = value` lines that are valid TOML once
    /// uncommented (the optional settings), by dotted key.
    fn documented_keys(text: &str) -> (BTreeSet<String>, BTreeSet<String>) {
        let (mut set, mut commented) = (BTreeSet::new(), BTreeSet::new());
        let mut section = String::new();
        for line in text.lines() {
            let line = line.trim();
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = name.to_owned();
            } else if let Some(rest) = line.strip_prefix("# ") {
                if let Ok(table) = rest.parse::<toml::Table>() {
                    for key in table.keys() {
                        commented.insert(format!("{section}.{key}"));
                    }
                }
            } else if let Ok(table) = line.parse::<toml::Table>() {
                for key in table.keys() {
                    set.insert(format!("{section}.{key}"));
                }
            }
        }
        (set, commented)
    }

    #[test]
    fn default_toml_is_exactly_the_defaults() {
        let parsed: Settings = toml::from_str(DEFAULTS).unwrap();
        assert_eq!(parsed, Settings::default());
        assert_eq!(merge(&[], "", None, []).unwrap(), Settings::default());
        // Loading the documented file changes nothing either.
        let file = TempFile::new("defaults", DEFAULTS);
        assert_eq!(
            merge(&[], "", Some(&file.0), []).unwrap(),
            Settings::default()
        );
    }

    #[test]
    fn default_toml_documents_every_setting() {
        let keys = setting_keys().unwrap();
        let (set, commented) = documented_keys(DEFAULTS);
        assert!(set.is_disjoint(&commented), "{set:?} / {commented:?}");
        let documented: BTreeSet<String> = set.union(&commented).cloned().collect();
        assert_eq!(
            documented, keys,
            "default.toml against the fields of Settings"
        );

        // The keys the TOML parser sees are the ones the line scan found set.
        let table: toml::Table = DEFAULTS.parse().unwrap();
        let mut parsed = BTreeSet::new();
        for (section, fields) in &table {
            for key in fields.as_table().unwrap().keys() {
                parsed.insert(format!("{section}.{key}"));
            }
        }
        assert_eq!(parsed, set);

        // Commented out means optional: exactly the settings whose default is None.
        let defaults = serde_json::to_value(Settings::default()).unwrap();
        let optional: BTreeSet<String> = keys
            .iter()
            .filter(|key| {
                let pointer = format!("/{}", key.replace('.', "/"));
                defaults.pointer(&pointer) == Some(&serde_json::Value::Null)
            })
            .cloned()
            .collect();
        assert_eq!(commented, optional);
    }

    /// The reference's rows, by the key in their first cell (``| `section.key` |``).
    fn reference_rows() -> Vec<String> {
        REFERENCE
            .lines()
            .filter_map(|line| line.strip_prefix("| `")?.split_once("` |"))
            .map(|(key, _)| key.to_owned())
            .collect()
    }

    /// Both ways: a setting without a row is undocumented, and a row without a setting
    /// (a typo, a renamed or removed key) documents something a worker refuses.
    /// `setting_keys` stands for default.toml: the test above keeps the two equal.
    #[test]
    fn the_configuration_reference_has_a_row_for_every_setting_and_only_settings() {
        let rows = reference_rows();
        let documented: BTreeSet<String> = rows.iter().cloned().collect();
        assert!(
            !rows.is_empty(),
            "docs/configuration.md has no setting rows"
        );
        assert_eq!(
            rows.len(),
            documented.len(),
            "docs/configuration.md has a key twice: {rows:?}"
        );
        let settings = setting_keys().unwrap();
        let missing: Vec<&String> = settings.difference(&documented).collect();
        let unknown: Vec<&String> = documented.difference(&settings).collect();
        assert!(
            missing.is_empty() && unknown.is_empty(),
            "docs/configuration.md has no row for {missing:?}, and rows for {unknown:?}, \
             which are not settings (config/default.toml)"
        );
    }

    #[test]
    fn default_toml_examples_of_optional_settings_parse() {
        let uncommented: String = DEFAULTS
            .lines()
            .map(|line| match line.strip_prefix("# ") {
                Some(rest) if rest.parse::<toml::Table>().is_ok() => rest,
                _ => line,
            })
            .collect::<Vec<_>>()
            .join("\n");
        let settings: Settings = toml::from_str(&uncommented).unwrap();
        assert!(settings.worker.worker_id.is_some());
        assert!(settings.worker.initial_timestamp.is_some());
        assert!(settings.aws.region.is_some());
        assert!(settings.aws.kinesis_endpoint.is_some());
        assert!(settings.aws.dynamodb_endpoint.is_some());
        assert!(settings.aws.cloudwatch_endpoint.is_some());
        assert!(settings.aws.sqs_endpoint.is_some());
        assert!(settings.worker.initial_timestamp().unwrap().is_some());
    }

    #[test]
    fn default_toml_has_a_comment_over_every_setting() {
        // A setting may share the comment of the setting just above it (a pair of bounds).
        let is_setting = |line: &str| {
            !line.is_empty() && !line.starts_with(['#', '[']) && line.parse::<toml::Table>().is_ok()
        };
        let mut previous = "";
        for line in DEFAULTS.lines().map(str::trim) {
            if is_setting(line) {
                let covered = previous.starts_with('#') || is_setting(previous);
                assert!(covered, "no comment above `{line}`");
            }
            previous = line;
        }
    }

    #[test]
    fn shipped_examples_load_and_validate() {
        let local = load_from(Some(&config_file("local.toml")), []).unwrap();
        assert_eq!(local.worker.stream, "flotilla-local");
        assert_eq!(local.worker.application, "flotilla-local");
        assert_eq!(local.aws.region.as_deref(), Some("us-east-1"));
        assert_eq!(
            local.aws.kinesis_endpoint.as_deref(),
            Some("http://127.0.0.1:4567")
        );
        assert_eq!(
            local.aws.dynamodb_endpoint.as_deref(),
            Some("http://127.0.0.1:8000")
        );
        assert_eq!(local.aws.cloudwatch_endpoint, None);
        assert_eq!(local.metrics.level, MetricsLevel::None);

        let prod = load_from(Some(&config_file("example-prod.toml")), []).unwrap();
        assert_eq!(prod.worker.stream, "orders");
        assert_eq!(prod.checkpoint.mode, CheckpointMode::Watermark);
    }

    #[test]
    fn a_base_layer_is_under_the_file_and_the_environment() {
        let base = vec![
            ("worker.stream".to_owned(), "from-base".to_owned()),
            ("worker.application".to_owned(), "app".to_owned()),
            ("reader.poll_interval".to_owned(), "250ms".to_owned()),
            ("reader.max_records".to_owned(), "2500".to_owned()),
        ];
        let file = TempFile::new("over-base", "[reader]\nmax_records = 100\n");
        let settings = Settings::load_over(
            &base,
            "app.properties",
            Some(&file.0),
            vars(&[("FLOTILLA__READER__POLL_INTERVAL", "1s")]),
        )
        .unwrap();
        assert_eq!(settings.worker.stream, "from-base");
        assert_eq!(settings.reader.max_records, 100, "the file over the base");
        assert_eq!(
            settings.reader.poll_interval,
            Duration::from_secs(1),
            "the variable over both"
        );
        let bad = vec![("reader.max_records".to_owned(), "many".to_owned())];
        let error = Settings::load_over(&bad, "app.properties", None, with_required(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("app.properties: setting reader.max_records = \"many\""),
            "{error}"
        );
    }

    #[test]
    fn no_file_and_no_environment_asks_for_the_stream() {
        let err = load_from(None, []).unwrap_err();
        assert!(matches!(err, LoadError::Invalid(_)), "{err:?}");
        assert_eq!(err.key(), Some("worker.stream"));
    }

    #[test]
    fn a_file_overrides_only_the_keys_it_sets() {
        let file = TempFile::new(
            "override",
            "[worker]\nstream = \"orders\"\napplication = \"orders-billing\"\n\
             [lease]\nfailover_time = \"30s\"\n",
        );
        let settings = load_from(Some(&file.0), []).unwrap();
        assert_eq!(settings.worker.stream, "orders");
        assert_eq!(settings.lease.failover_time, Duration::from_secs(30));
        let defaults = Settings::default();
        assert_eq!(settings.lease.fence_margin, defaults.lease.fence_margin);
        assert_eq!(settings.reader, defaults.reader);
    }

    #[test]
    fn the_environment_overrides_defaults_and_the_file() {
        let file = TempFile::new(
            "env-over-file",
            "[lease]\nfailover_time = \"30s\"\n[reader]\nmax_records = 100\n",
        );
        let env = with_required(&[
            ("FLOTILLA__LEASE__FAILOVER_TIME", "20s"),
            ("FLOTILLA__READER__MAX_RECORDS", "500"),
            ("FLOTILLA__WORKER__INITIAL_POSITION", "LATEST"),
            ("FLOTILLA__CHECKPOINT__MODE", "manual"),
            ("FLOTILLA__AWS__REGION", "eu-west-1"),
            ("FLOTILLA_LOG", "debug"),
            ("PATH", "/usr/bin"),
        ]);
        let settings = load_from(Some(&file.0), env).unwrap();
        assert_eq!(settings.lease.failover_time, Duration::from_secs(20));
        assert_eq!(settings.reader.max_records, 500);
        assert_eq!(settings.worker.initial_position, InitialPosition::Latest);
        assert_eq!(settings.checkpoint.mode, CheckpointMode::Manual);
        assert_eq!(settings.aws.region.as_deref(), Some("eu-west-1"));
    }

    #[test]
    fn flotilla_config_names_the_file_when_the_caller_names_none() {
        let file = TempFile::new(
            "from-variable",
            "[worker]\nstream = \"orders\"\napplication = \"orders-billing\"\n\
             [aws]\nkinesis_endpoint = \"http://127.0.0.1:4567\"\n",
        );
        let path = file.0.to_str().unwrap();
        let settings = load_from(None, vars(&[(CONFIG_FILE_VAR, path)])).unwrap();
        assert_eq!(
            settings.aws.kinesis_endpoint.as_deref(),
            Some("http://127.0.0.1:4567")
        );
        // A file named by the caller wins over the variable.
        let other = TempFile::new("named", "[worker]\nstream = \"other\"\n");
        let err = load_from(Some(&other.0), vars(&[(CONFIG_FILE_VAR, path)])).unwrap_err();
        assert_eq!(err.key(), Some("worker.application"), "{err}");
        // Empty is unset.
        let err = load_from(None, vars(&[(CONFIG_FILE_VAR, "")])).unwrap_err();
        assert_eq!(err.key(), Some("worker.stream"), "{err}");
    }

    #[test]
    fn environment_text_is_not_reinterpreted() {
        let env = with_required(&[
            ("FLOTILLA__WORKER__WORKER_ID", "007"),
            ("FLOTILLA__METRICS__NAMESPACE", "1e3"),
        ]);
        let settings = load_from(None, env).unwrap();
        assert_eq!(settings.worker.worker_id.as_deref(), Some("007"));
        assert_eq!(settings.metrics.namespace, "1e3");
    }

    /// `[failure]` from a file and from variables, as an operator writes it; a
    /// destination that is not one is refused naming the key and what it must be.
    #[test]
    fn the_failure_policy_loads_from_a_file_and_from_variables() {
        let file = TempFile::new(
            "failure",
            "[failure]\nmax_retries = 3\nbisect = true\nmax_record_age = \"1h\"\n\
             destination = \"sqs:https://sqs.eu-west-1.amazonaws.com/1/dl\"\n",
        );
        let settings = load_from(Some(&file.0), vars(REQUIRED)).unwrap();
        assert_eq!(settings.failure.max_retries, Some(3));
        assert!(settings.failure.bisect);
        assert_eq!(
            settings.failure.max_record_age,
            Some(std::time::Duration::from_secs(3600))
        );
        assert_eq!(
            settings.failure.destination,
            Some(crate::settings::Destination::Sqs(
                "https://sqs.eu-west-1.amazonaws.com/1/dl".into()
            ))
        );
        let env = with_required(&[
            ("FLOTILLA__FAILURE__MAX_RETRIES", "0"),
            (
                "FLOTILLA__FAILURE__DESTINATION",
                "file:/var/lib/flotilla/dl.jsonl",
            ),
        ]);
        let settings = load_from(None, env).unwrap();
        assert_eq!(settings.failure.max_retries, Some(0));
        assert_eq!(
            settings.failure.destination,
            Some(crate::settings::Destination::File(
                "/var/lib/flotilla/dl.jsonl".into()
            ))
        );
        let env = with_required(&[("FLOTILLA__FAILURE__DESTINATION", "s3:bucket")]);
        let text = error_text(load_from(None, env));
        assert!(text.contains("failure.destination"), "{text}");
        assert!(text.contains("kinesis:, sqs: or file:"), "{text}");
    }

    #[test]
    fn a_missing_file_is_named() {
        let path = std::env::temp_dir().join("flotilla-settings-no-such-file.toml");
        let result = load_from(Some(&path), vars(REQUIRED));
        assert!(
            matches!(result, Err(LoadError::ReadFile { .. })),
            "{result:?}"
        );
        let text = error_text(result);
        assert!(text.contains("cannot read settings file"), "{text}");
        assert!(
            text.contains("flotilla-settings-no-such-file.toml"),
            "{text}"
        );
    }

    #[test]
    fn load_reads_the_file_first() {
        // Independent of the process environment: the file is read before any variable.
        let path = std::env::temp_dir().join("flotilla-settings-load-no-such-file.toml");
        let text = error_text(Settings::load(Some(&path)));
        assert!(text.contains("cannot read settings file"), "{text}");
    }

    #[test]
    fn an_unparseable_file_is_named() {
        let file = TempFile::new("unparseable", "[lease\nfailover_time = 10s\n");
        let text = error_text(load_from(Some(&file.0), vars(REQUIRED)));
        assert!(text.contains(&file.0.display().to_string()), "{text}");
    }

    #[test]
    fn an_unknown_key_in_a_file_is_named() {
        let file = TempFile::new("unknown-key", "[lease]\nfailover_tme = \"20s\"\n");
        let text = error_text(load_from(Some(&file.0), vars(REQUIRED)));
        assert!(text.contains(&file.0.display().to_string()), "{text}");
        assert!(text.contains("failover_tme"), "{text}");

        let file = TempFile::new("unknown-section", "[leases]\nfailover_time = \"20s\"\n");
        let text = error_text(load_from(Some(&file.0), vars(REQUIRED)));
        assert!(text.contains("leases"), "{text}");
    }

    #[test]
    fn an_unknown_environment_variable_is_named() {
        let err = load_from(None, with_required(&[("FLOTILLA__LEASE__BOGUS", "1")])).unwrap_err();
        assert_eq!(err.key(), Some("lease.bogus"));
        let text = err.to_string();
        assert!(text.contains("FLOTILLA__LEASE__BOGUS"), "{text}");
        assert!(text.contains("lease.bogus"), "{text}");
        assert!(text.contains("failover_time"), "{text}");

        let text = error_text(load_from(None, with_required(&[("FLOTILLA__LEASES", "x")])));
        assert!(text.contains("FLOTILLA__LEASES"), "{text}");
        assert!(text.contains("the sections are"), "{text}");
    }

    #[test]
    fn a_bad_duration_names_the_key_and_the_value() {
        let file = TempFile::new("bad-duration", "[lease]\nfailover_time = \"soon\"\n");
        let text = error_text(load_from(Some(&file.0), vars(REQUIRED)));
        assert!(text.contains("failover_time"), "{text}");
        assert!(text.contains("\"soon\""), "{text}");

        let env = with_required(&[("FLOTILLA__LEASE__FAILOVER_TIME", "20")]);
        let text = error_text(load_from(None, env));
        assert!(text.contains("FLOTILLA__LEASE__FAILOVER_TIME"), "{text}");
        assert!(text.contains("\"20\""), "{text}");
    }

    /// A value serde refuses, in a file or a variable: the message names the key, what
    /// is wrong and what to write (a unit for a duration, the words of a choice, the
    /// keys of a stream's table).
    #[test]
    fn a_refused_value_says_what_to_write_instead() {
        type Case = (&'static str, &'static str, &'static [&'static str]);
        let files: &[Case] = &[
            (
                "lease",
                "failover_time = \"10 parsecs\"",
                &[
                    "\"10 parsecs\" is not a duration: \"parsecs\" is not a unit (ns, us, ms, s, min",
                    "write e.g. \"10s\" or \"250ms\"",
                    "lease.failover_time",
                ],
            ),
            (
                "lease",
                "failover_time = 20",
                &[
                    "20 is not a duration: it has no unit; write it as text with one, e.g. \"20s\"",
                    "lease.failover_time",
                ],
            ),
            (
                "reader",
                "poll_interval = 0.5",
                &["0.5 is not a duration: it has no unit", "\"0.5s\""],
            ),
            (
                "aws",
                "attempt_timeout = \"soon\"",
                &[
                    "\"soon\" is not a duration (expected number at 0); write e.g. \"10s\" or \"250ms\"",
                    "aws.attempt_timeout",
                ],
            ),
            (
                "aws",
                "attempt_timeout = 3",
                &["3 is not a duration: it has no unit", "aws.attempt_timeout"],
            ),
            (
                "metrics",
                "level = \"loud\"",
                &[
                    "\"loud\" is not one of the choices: write one of \"none\", \"summary\", \"detailed\"",
                    "metrics.level",
                ],
            ),
            (
                "reader",
                "mode = \"fan-out\"",
                &["write one of \"polling\", \"fanout\"", "reader.mode"],
            ),
            (
                "reader",
                "trimmed_checkpoint = \"skip\"",
                &[
                    "write one of \"fail\", \"trim_horizon\"",
                    "reader.trimmed_checkpoint",
                ],
            ),
            (
                "worker",
                "initial_position = \"OLDEST\"",
                &[
                    "write one of \"TRIM_HORIZON\", \"LATEST\", \"AT_TIMESTAMP\"",
                    "worker.initial_position",
                ],
            ),
            (
                "lease",
                "balance = \"even\"",
                &["write one of \"throughput\", \"count\"", "lease.balance"],
            ),
            (
                "checkpoint",
                "mode = \"Auto\"",
                &[
                    "write one of \"auto\", \"manual\", \"watermark\"",
                    "checkpoint.mode",
                ],
            ),
            (
                "worker",
                "streams = [\"a\", { name = \"b\", initial_postion = \"LATEST\" }]",
                &[
                    "unknown field `initial_postion`, expected one of `arn`, `name`, \
                     `initial_position`, `initial_timestamp`",
                    "worker.streams[1]",
                ],
            ),
            (
                "worker",
                "streams = [{ name = \"b\", initial_position = \"NOW\" }]",
                &["write one of \"TRIM_HORIZON\", \"LATEST\", \"AT_TIMESTAMP\""],
            ),
            (
                "worker",
                "streams = [7]",
                &["expected a stream's name or ARN, or a table such as"],
            ),
        ];
        for (section, line, want) in files {
            let file = TempFile::new("refused", &format!("[{section}]\n{line}\n"));
            let text = error_text(load_from(Some(&file.0), vars(REQUIRED)));
            for want in *want {
                assert!(text.contains(want), "{line}: {text}");
            }
            assert!(!text.contains("variant constructor"), "{line}: {text}");
            assert!(!text.contains("expected a duration"), "{line}: {text}");
        }

        let variables: &[(&str, &str, &[&str])] = &[
            (
                "FLOTILLA__LEASE__FAILOVER_TIME",
                "20",
                &["\"20\" is not a duration: it has no unit; write e.g. \"20s\" or \"20ms\""],
            ),
            (
                "FLOTILLA__READER__POLL_INTERVAL",
                "200 parsecs",
                &["\"parsecs\" is not a unit"],
            ),
            (
                "FLOTILLA__METRICS__LEVEL",
                "verbose",
                &["write one of \"none\", \"summary\", \"detailed\""],
            ),
            (
                "FLOTILLA__READER__MODE",
                "FANOUT",
                &["write one of \"polling\", \"fanout\""],
            ),
        ];
        for (name, value, want) in variables {
            let text = error_text(load_from(None, with_required(&[(name, value)])));
            assert!(text.contains(name), "{text}");
            for want in *want {
                assert!(text.contains(want), "{name}={value}: {text}");
            }
        }
    }

    #[test]
    fn changed_keys_name_each_setting_that_differs() {
        let base = Settings::default();
        type Change = fn(&mut Settings);
        let cases: &[(Change, &[&str])] = &[
            (|_| {}, &[]),
            (|s| s.lease.max_leases = 7, &["lease.max_leases"]),
            (
                |s| {
                    s.reader.mode = crate::settings::ReadMode::Fanout;
                    s.metrics.level = MetricsLevel::None;
                    s.aws.attempt_timeout = Some(Duration::from_secs(1));
                },
                &["aws.attempt_timeout", "metrics.level", "reader.mode"],
            ),
            (
                |s| s.worker.streams = vec![crate::settings::StreamEntry::Name("a".into())],
                &["worker.streams"],
            ),
        ];
        for (change, want) in cases {
            let mut changed = base.clone();
            change(&mut changed);
            assert_eq!(base.changed_keys(&changed), *want);
            assert_eq!(changed.changed_keys(&base), *want);
        }
    }

    #[test]
    fn a_bad_number_in_the_environment_is_named() {
        let env = with_required(&[("FLOTILLA__READER__MAX_RECORDS", "lots")]);
        let text = error_text(load_from(None, env));
        assert!(text.contains("FLOTILLA__READER__MAX_RECORDS"), "{text}");
        assert!(text.contains("lots"), "{text}");
    }

    #[test]
    fn validation_failures_surface_with_their_key() {
        let env = with_required(&[("FLOTILLA__LEASE__HEARTBEAT_INTERVAL", "12s")]);
        let err = load_from(None, env).unwrap_err();
        assert_eq!(err.key(), Some("lease.heartbeat_interval"));
        assert!(
            err.to_string()
                .starts_with("settings: lease.heartbeat_interval = 12s: must be below"),
            "{err}"
        );
    }
}
