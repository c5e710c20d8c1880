//! Properties of config parsing under hostile input: `Config::parse` never
//! panics, on text that is barely TOML or on TOML documents made of the
//! config's own keys with values of the wrong type, and every error it
//! gives points at a line of the file (the line of the mistake, where the
//! mistake is one key).
//!
//! The HTTP API's request bodies have properties of their own, in
//! [`http_bodies`].
//!
//! `PROPTEST_CASES` raises the number of cases (`scripts/fuzz.sh` does);
//! without it each property runs few, so the suite stays fast.

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::Config as ProptestConfig;
use webmcp_agents::config::{Config, ConfigError};

mod http_bodies;

/// The file name errors are reported against.
const FILE: &str = "props.toml";

/// A hang detector's limit, far above what parsing any of these needs.
const HANG_LIMIT: Duration = Duration::from_secs(10);

/// `default` cases unless `PROPTEST_CASES` is set; no failure files.
fn config(default: u32) -> ProptestConfig {
    let mut config = ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = default;
    }
    config
}

/// Parses `text` on a thread of its own, failing if it does not finish.
fn parse(text: String) -> Result<Config, ConfigError> {
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        let _ = tx.send(Config::parse(&text, FILE));
    });
    match rx.recv_timeout(HANG_LIMIT) {
        Ok(result) => {
            let _ = handle.join();
            result
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => unreachable!("the thread sends before it ends"),
        },
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("Config::parse did not finish within {HANG_LIMIT:?}")
        }
    }
}

/// The line an error names, checked to be a line of `text` and to lead
/// the message as `file:line:column`.
fn error_line(error: &ConfigError, text: &str) -> Result<usize, TestCaseError> {
    let at = error.location();
    prop_assert!(at.is_some(), "no location in {}", error);
    let at = at.expect("checked");
    let lines = text.matches('\n').count() + 1;
    prop_assert!(
        (1..=lines).contains(&at.line),
        "line {} of {} in {}",
        at.line,
        lines,
        error
    );
    prop_assert!(at.column >= 1, "column {} in {}", at.column, error);
    let prefix = format!("{FILE}:{}:{}", at.line, at.column);
    prop_assert!(
        error.to_string().starts_with(&prefix),
        "{} does not start with {}",
        error,
        prefix
    );
    Ok(at.line)
}

/// Fragments of TOML and of the config's vocabulary.
const PIECES: &[&str] = &[
    "[",
    "]",
    "[[",
    "]]",
    "=",
    " = ",
    "\"",
    "'",
    "\"\"\"",
    "'''",
    "\n",
    "\r\n",
    "#",
    ".",
    ",",
    "{",
    "}",
    "\\",
    "\\u",
    "\\U0010FFFF",
    "providers",
    "providers.p",
    "tools.t",
    "agents.a",
    "agents.a.rules",
    "delegation",
    "server",
    "cluster",
    "telemetry",
    "kind",
    "\"scripted\"",
    "\"onnx\"",
    "\"native\"",
    "\"webmcp\"",
    "replies",
    "provider",
    "\"p\"",
    "max_steps",
    "sub_agents",
    "[\"a\"]",
    "listen",
    "\"127.0.0.1:0\"",
    "cookie_env",
    "1",
    "-1",
    "0",
    "4294967296",
    "1e400",
    "inf",
    "nan",
    "true",
    "1979-05-27T07:32:00Z",
    "é",
    "🦀",
    "\u{0}",
    "\u{7f}",
    "\u{feff}",
];

fn tomlish() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        prop::collection::vec(prop::sample::select(PIECES), 0..64).prop_map(|p| p.concat()),
    ]
}

/// A TOML value of any type, a couple of levels deep.
fn toml_value() -> impl Strategy<Value = toml::Value> {
    let leaf = prop_oneof![
        any::<String>().prop_map(toml::Value::String),
        prop::sample::select(&["p", "a", "t", "scripted", "onnx", "auto", "127.0.0.1:0", ""][..])
            .prop_map(|s| toml::Value::String(s.to_string())),
        any::<i64>().prop_map(toml::Value::Integer),
        prop::sample::select(vec![-1i64, 0, 1, 2, 65_536, i64::from(u32::MAX) + 1])
            .prop_map(toml::Value::Integer),
        any::<f64>().prop_map(toml::Value::Float),
        any::<bool>().prop_map(toml::Value::Boolean),
    ];
    leaf.prop_recursive(2, 12, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(toml::Value::Array),
            prop::collection::vec(("[a-z_]{1,8}", inner), 0..4)
                .prop_map(|entries| toml::Value::Table(entries.into_iter().collect())),
        ]
    })
}

/// Every key the config's tables have, and a few they do not.
const KEYS: &[&str] = &[
    "kind",
    "model",
    "variant",
    "cache_dir",
    "hub_endpoint",
    "threads",
    "inter_threads",
    "temperature",
    "top_k",
    "top_p",
    "seed",
    "repetition_penalty",
    "max_new_tokens",
    "stop",
    "context_length",
    "context_reserve",
    "shared_kv_buffer",
    "reuse_prefix",
    "replies",
    "delay_ms",
    "tools_inline",
    "allow",
    "deny",
    "untrusted",
    "call_timeout_secs",
    "builtins",
    "command",
    "args",
    "env",
    "cwd",
    "url",
    "headless",
    "browser",
    "debugging_tools",
    "description",
    "remote",
    "provider",
    "instructions",
    "max_steps",
    "step_timeout_secs",
    "max_tools",
    "constraints",
    "policy",
    "rules",
    "max_concurrent_runs",
    "tools",
    "sub_agents",
    "max_depth",
    "listen",
    "node_name",
    "cookie",
    "cookie_env",
    "peers",
    "export",
    "max_stepz",
    "base",
];

/// A table of the config: `[providers.NAME]` and the like, or a top-level one.
const TABLES: &[&[&str]] = &[
    &["providers", "p"],
    &["providers", "q"],
    &["tools", "t"],
    &["agents", "a"],
    &["agents", "b"],
    &["agents", "a", "rules"],
    &["delegation"],
    &["server"],
    &["cluster"],
    &["telemetry"],
];

/// A TOML document made of the config's tables and keys, each with a value
/// of any type.
fn config_document() -> impl Strategy<Value = String> {
    prop::collection::vec(
        (
            prop::sample::select(TABLES),
            prop::collection::vec((prop::sample::select(KEYS), toml_value()), 0..6),
        ),
        0..6,
    )
    .prop_map(|tables| {
        let mut root = toml::Table::new();
        for (path, entries) in tables {
            insert_at(&mut root, path, entries);
        }
        toml::to_string(&root).unwrap_or_default()
    })
}

/// Sets `entries` in the table at `path`, making the tables on the way; a
/// value already where a table goes is left as it is.
fn insert_at(table: &mut toml::Table, path: &[&str], entries: Vec<(&str, toml::Value)>) {
    match path.split_first() {
        None => {
            for (key, value) in entries {
                table.insert(key.to_string(), value);
            }
        }
        Some((first, rest)) => {
            let next = table
                .entry(first.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if let toml::Value::Table(inner) = next {
                insert_at(inner, rest, entries);
            }
        }
    }
}

/// The kind of value a key takes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Text,
    Count,
    Flag,
    List,
}

/// Keys of the valid base file's tables, with the kind of value each takes.
const TYPED: &[(&str, &[(&str, Kind)])] = &[
    (
        "providers.p",
        &[
            ("model", Kind::Text),
            ("delay_ms", Kind::Count),
            ("tools_inline", Kind::Flag),
            ("replies", Kind::List),
        ],
    ),
    (
        "agents.a",
        &[
            ("description", Kind::Text),
            ("instructions", Kind::Text),
            ("max_steps", Kind::Count),
            ("step_timeout_secs", Kind::Count),
            ("max_tools", Kind::Count),
            ("max_concurrent_runs", Kind::Count),
            ("remote", Kind::Flag),
            ("tools", Kind::List),
            ("sub_agents", Kind::List),
        ],
    ),
    ("delegation", &[("max_depth", Kind::Count)]),
    ("server", &[("listen", Kind::Text)]),
];

/// A value that is certainly not of `kind`.
fn wrong_value(kind: Kind) -> BoxedStrategy<String> {
    let text = any::<String>().prop_map(|s| toml::Value::String(s).to_string());
    let count = any::<u32>().prop_map(|n| n.to_string());
    let negative = (i64::MIN..0).prop_map(|n| n.to_string());
    let float =
        prop::sample::select(&["1.5", "-0.0", "inf", "nan", "1e300"][..]).prop_map(String::from);
    let flag = any::<bool>().prop_map(|b| b.to_string());
    let list =
        prop::sample::select(&["[]", "[1, 2]", "[\"x\", 3]", "[[1]]"][..]).prop_map(String::from);
    let table = prop::sample::select(&["{}", "{ a = 1 }"][..]).prop_map(String::from);
    match kind {
        Kind::Text => prop_oneof![count, negative, float, flag, list, table].boxed(),
        Kind::Count => prop_oneof![text, negative, float, flag, list, table].boxed(),
        Kind::Flag => prop_oneof![text, count, negative, float, list, table].boxed(),
        Kind::List => prop_oneof![text, count, negative, float, flag, table].boxed(),
    }
}

/// A valid file with one wrong line in one table: a key of that table with
/// a value of the wrong type, or a key the table does not have. Returns the
/// text and the line of the mistake.
fn one_mistake() -> impl Strategy<Value = (String, usize)> {
    let typed = prop::sample::select(TYPED).prop_flat_map(|(table, keys)| {
        prop::sample::select(keys).prop_flat_map(move |(key, kind)| {
            wrong_value(kind).prop_map(move |value| (table, format!("{key} = {value}")))
        })
    });
    let unknown = (
        prop::sample::select(TYPED).prop_map(|(table, _)| table),
        "[a-z]{1,6}_zz",
        prop::sample::select(&["1", "\"x\"", "true", "[]"][..]),
    )
        .prop_map(|(table, key, value)| (table, format!("{key} = {value}")));
    (prop_oneof![typed, unknown], any::<bool>()).prop_map(|((table, line), crlf)| {
        let mut lines: Vec<String> = Vec::new();
        let mut mistake = 0;
        for (name, body) in [
            (
                "providers.p",
                &["kind = \"scripted\"", "replies = [\"ok\"]"][..],
            ),
            ("agents.a", &["provider = \"p\""][..]),
            ("delegation", &[][..]),
            ("server", &[][..]),
        ] {
            lines.push(format!("[{name}]"));
            lines.extend(body.iter().map(|l| l.to_string()));
            if name == table {
                lines.push(line.clone());
                mistake = lines.len();
            }
            lines.push(String::new());
        }
        let newline = if crlf { "\r\n" } else { "\n" };
        (lines.join(newline), mistake)
    })
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn config_parse_never_panics_on_tomlish_text(text in tomlish()) {
        let checked = text.clone();
        if let Err(error) = parse(text) {
            error_line(&error, &checked)?;
        }
    }

    #[test]
    fn config_parse_never_panics_on_config_documents(text in config_document()) {
        let checked = text.clone();
        if let Err(error) = parse(text) {
            error_line(&error, &checked)?;
        }
    }

    /// One wrong key: the error is on its line.
    #[test]
    fn config_errors_name_the_line_of_the_mistake((text, line) in one_mistake()) {
        let checked = text.clone();
        match parse(text) {
            Ok(_) => prop_assert!(false, "accepted:\n{}", checked),
            Err(error) => {
                let at = error_line(&error, &checked)?;
                prop_assert_eq!(at, line, "{}\nin\n{}", error, checked);
            }
        }
    }
}
