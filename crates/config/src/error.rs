//! Config errors, each pointing at the file, line and key of the mistake.

use std::fmt;
use std::ops::Range;
use std::path::PathBuf;

use toml::de::{DeTable, DeValue};

/// Where in a config file a mistake is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The file.
    pub file: PathBuf,
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
    /// The dotted key the mistake is in (`agents.shopper.max_steps`);
    /// empty when the file does not parse far enough to tell.
    pub key: String,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file.display(), self.line, self.column)?;
        if !self.key.is_empty() {
            write!(f, ": `{}`", self.key)?;
        }
        Ok(())
    }
}

/// What is wrong with a config.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("could not read the config {}: {source}", file.display())]
    Read {
        /// The file.
        file: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML, has a key no setting has, or a value of
    /// the wrong type.
    #[error("{at}: {message}")]
    Parse {
        /// Where.
        at: Location,
        /// What the parser says.
        message: String,
    },
    /// The settings parse but do not fit together (a name that does not
    /// exist, a delegation cycle, a setting of another kind).
    #[error("{at}: {message}")]
    Invalid {
        /// Where.
        at: Location,
        /// What is wrong and what would be right.
        message: String,
    },
    /// No data folder for the store: the config names none and the cache
    /// folder cannot be found.
    #[error("the store has no data folder: {0} (name one with `[store] data_dir`)")]
    Store(String),
}

impl ConfigError {
    /// Where the mistake is, when it is in the file.
    pub fn location(&self) -> Option<&Location> {
        match self {
            Self::Parse { at, .. } | Self::Invalid { at, .. } => Some(at),
            Self::Read { .. } | Self::Store(_) => None,
        }
    }
}

/// Turns byte offsets into lines and keys of one file.
pub(crate) struct Source<'a> {
    pub(crate) file: PathBuf,
    pub(crate) text: &'a str,
}

impl Source<'_> {
    /// The location of a byte span, naming the innermost key around it.
    pub(crate) fn locate(&self, span: Range<usize>) -> Location {
        let start = span.start.min(self.text.len());
        let before = &self.text[..start];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        Location {
            file: self.file.clone(),
            line,
            column,
            key: key_at(self.text, span).unwrap_or_default(),
        }
    }

    /// A validation error at `span`, whose key is `key` (validation knows it exactly).
    pub(crate) fn invalid(
        &self,
        span: Range<usize>,
        key: impl Into<String>,
        message: impl Into<String>,
    ) -> ConfigError {
        let mut at = self.locate(span);
        at.key = key.into();
        ConfigError::Invalid {
            at,
            message: message.into(),
        }
    }

    /// A parse error from `toml`, located, with the key named.
    pub(crate) fn parse_error(&self, error: toml::de::Error) -> ConfigError {
        let message = error.message().trim().to_string();
        let span = error.span().unwrap_or(0..0);
        let mut at = self.locate(span.clone());
        // serde names an unknown key in its message but toml points at the
        // table around it; point at the key itself.
        if let Some(unknown) = quoted_after(&message, "unknown field `")
            && let Some(found) = find_key(self.text, &span, &at.key, unknown)
        {
            at = self.locate(found);
        }
        ConfigError::Parse { at, message }
    }
}

fn quoted_after<'m>(message: &'m str, prefix: &str) -> Option<&'m str> {
    let rest = &message[message.find(prefix)? + prefix.len()..];
    Some(&rest[..rest.find('`')?])
}

/// The dotted path of the innermost key whose key or value covers `span`.
fn key_at(text: &str, span: Range<usize>) -> Option<String> {
    let table = DeTable::parse(text).ok()?;
    let mut entries = Vec::new();
    collect_table(table.get_ref(), "", &mut entries);
    // The smallest covering span is the innermost; a longer path wins a tie
    // (a table header covers the same text as its first key, say).
    entries
        .into_iter()
        .filter(|(_, s)| covers(s, &span))
        .min_by(|a, b| {
            (a.1.end - a.1.start)
                .cmp(&(b.1.end - b.1.start))
                .then(b.0.len().cmp(&a.0.len()))
        })
        .map(|(path, _)| path)
}

fn covers(outer: &Range<usize>, inner: &Range<usize>) -> bool {
    outer.start <= inner.start && inner.end <= outer.end.max(outer.start + 1)
}

/// Every key and value of the document with its dotted path and span.
/// Tables made by headers (`[agents.shopper]`) have spans that need not
/// cover their keys, so nothing is pruned on the way down.
fn collect_table(table: &DeTable<'_>, prefix: &str, out: &mut Vec<(String, Range<usize>)>) {
    for (key, value) in table.iter() {
        let path = if prefix.is_empty() {
            key.get_ref().to_string()
        } else {
            format!("{prefix}.{}", key.get_ref())
        };
        out.push((path.clone(), key.span()));
        out.push((path.clone(), value.span()));
        collect_value(value.get_ref(), &path, out);
    }
}

fn collect_value(value: &DeValue<'_>, path: &str, out: &mut Vec<(String, Range<usize>)>) {
    match value {
        DeValue::Table(table) => collect_table(table, path, out),
        DeValue::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let path = format!("{path}[{i}]");
                out.push((path.clone(), item.span()));
                collect_value(item.get_ref(), &path, out);
            }
        }
        _ => {}
    }
}

/// The span of key `name` in the table at `table_key` (dotted), searching
/// within `near` first.
fn find_key(text: &str, near: &Range<usize>, table_key: &str, name: &str) -> Option<Range<usize>> {
    let root = DeTable::parse(text).ok()?;
    let mut table = root.get_ref();
    if !table_key.is_empty() {
        for part in table_key.split('.') {
            let (_, value) = table.iter().find(|(k, _)| k.get_ref() == part)?;
            match value.get_ref() {
                DeValue::Table(inner) => table = inner,
                _ => return None,
            }
        }
    }
    let found = table
        .iter()
        .find(|(k, _)| k.get_ref() == name)
        .map(|(k, _)| k.span());
    found.or_else(|| (near.start < near.end).then(|| near.clone()))
}
