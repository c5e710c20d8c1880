//! `mcp_servers`: MCP servers from an `mcpServers` JSON file, the format
//! that Claude Desktop, Cursor, LM Studio and others write, each server made
//! a tool source of its own.
//!
//! The file is read as strictly as the config where it matters: a key that
//! would change what a server does and that `wma` cannot honour (`headers`,
//! `envFile`, a transport it does not speak) is an error naming the entry,
//! and so is a key no client is known to write (a typo), so nothing is
//! dropped quietly. Keys other clients write for their own interface
//! ([`IGNORED`]) are accepted and ignored: they only make those clients ask
//! less or describe the server to a person.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use toml::Spanned;
use wma_tools::SourceOptions;

use crate::error::{ConfigError, Location, Source};
use crate::spec::{ToolSourceConfig, ToolSourceSpec};

type Result<T> = std::result::Result<T, ConfigError>;

/// The keys of an entry that are read.
const READ: &[&str] = &[
    "type",
    "command",
    "args",
    "env",
    "cwd",
    "url",
    "headers",
    "disabled",
    "disabledTools",
];

/// Keys other clients write that change nothing `wma` does, or only make
/// it ask a person more than that client would: accepted and ignored.
/// `description` is a note for people; `timeout` is another client's wait
/// for a request (a call's limit here is the source's default
/// `call_timeout_secs`); `alwaysAllow` and `autoApprove` list tools that
/// client runs without asking, where here the agent's `[approval]` table
/// decides.
pub(crate) const IGNORED: &[&str] = &["description", "timeout", "alwaysAllow", "autoApprove"];

/// The transports an entry's `type` may name, besides `stdio`: other
/// clients' names for streamable HTTP.
const HTTP_TYPES: &[&str] = &["http", "streamable-http", "streamableHttp"];

/// The servers of one `mcpServers` file.
#[derive(Debug)]
pub(crate) struct McpServers {
    /// The file, as the config's folder resolves it (for messages).
    pub(crate) file: PathBuf,
    /// One tool source per server that is not disabled, in the file's order.
    pub(crate) sources: Vec<ToolSourceConfig>,
    /// The entries marked `"disabled": true`: not started, but an agent
    /// that lists one is told why it is not there.
    pub(crate) disabled: Vec<String>,
}

/// Reads the file `path` names (relative to the config's folder) and makes
/// a tool source of each server in it.
pub(crate) fn read(config: &Source<'_>, path: &Spanned<String>) -> Result<McpServers> {
    if path.get_ref().trim().is_empty() {
        return Err(config.invalid(
            path.span(),
            "mcp_servers",
            "`mcp_servers` is empty; name an mcpServers JSON file, or leave the key out",
        ));
    }
    // Relative to the config's folder, as `[server] token_file` and
    // `[store] data_dir` are: the config and its servers travel together.
    let base = config.file.parent().unwrap_or(Path::new(""));
    let file = base.join(path.get_ref());
    let text = std::fs::read_to_string(&file).map_err(|e| {
        config.invalid(
            path.span(),
            "mcp_servers",
            format!("could not read the mcpServers file {}: {e}", file.display()),
        )
    })?;
    let json = Source {
        file: file.clone(),
        text: &text,
    };
    let value: Value = serde_json::from_str(&text).map_err(|e| {
        let message = e.to_string();
        let suffix = format!(" at line {} column {}", e.line(), e.column());
        ConfigError::Parse {
            at: Location {
                file: file.clone(),
                line: e.line(),
                column: e.column(),
                key: String::new(),
            },
            message: message
                .strip_suffix(&suffix)
                .unwrap_or(&message)
                .to_string(),
        }
    })?;
    let offsets = key_offsets(&text);
    let at = |path: &[&str], message: String| -> ConfigError {
        let start = offset_of(&offsets, path);
        json.invalid(start..start + 1, path.join("."), message)
    };
    if let Some(twice) = first_duplicate(&offsets) {
        let path: Vec<&str> = twice.iter().map(String::as_str).collect();
        return Err(at(
            &path,
            "this key is written twice in its object; JSON readers keep only one, so write it once"
                .to_string(),
        ));
    }
    let Some(servers) = value.get("mcpServers") else {
        return Err(at(
            &[],
            "the file has no `mcpServers` object; it should look like {\"mcpServers\": {\"NAME\": {\"command\": \"...\", \"args\": [...]}}}".to_string(),
        ));
    };
    let Some(servers) = servers.as_object() else {
        return Err(at(
            &["mcpServers"],
            "`mcpServers` should be an object of servers by name".to_string(),
        ));
    };
    let mut sources = Vec::new();
    let mut disabled = Vec::new();
    for (name, entry) in servers {
        let here = |key: &str, message: String| {
            if key.is_empty() {
                at(&["mcpServers", name], message)
            } else {
                at(&["mcpServers", name, key], message)
            }
        };
        let ok_name = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !ok_name {
            return Err(at(
                &["mcpServers", name],
                "a server's name is the name of its tool source, which may use only letters, digits, `_` and `-`: rename it".to_string(),
            ));
        }
        let Some(entry) = entry.as_object() else {
            return Err(at(
                &["mcpServers", name],
                "a server should be an object ({\"command\": ...} or {\"url\": ...})".to_string(),
            ));
        };
        match entry.get("disabled") {
            None | Some(Value::Bool(false)) => {}
            Some(Value::Bool(true)) => {
                // Skipped whole: a switched-off entry may be half written.
                disabled.push(name.clone());
                continue;
            }
            Some(_) => {
                return Err(here(
                    "disabled",
                    "`disabled` should be true or false".into(),
                ));
            }
        }
        let server = Entry::read(entry, &here)?;
        sources.push(server.source(name, &here)?);
    }
    Ok(McpServers {
        file,
        sources,
        disabled,
    })
}

/// One entry's settings, each checked for its type.
#[derive(Default)]
struct Entry {
    kind: Option<String>,
    command: Option<String>,
    args: Option<Vec<String>>,
    env: Vec<(String, String)>,
    cwd: Option<String>,
    url: Option<String>,
    disabled_tools: Vec<String>,
}

impl Entry {
    fn read(
        entry: &Map<String, Value>,
        here: &dyn Fn(&str, String) -> ConfigError,
    ) -> Result<Self> {
        let string = |key: &str, value: &Value| -> Result<String> {
            match value {
                Value::String(s) => literal(key, s, here),
                _ => Err(here(key, format!("`{key}` should be a string"))),
            }
        };
        let strings = |key: &str, value: &Value| -> Result<Vec<String>> {
            let wrong = || here(key, format!("`{key}` should be a list of strings"));
            value
                .as_array()
                .ok_or_else(wrong)?
                .iter()
                .map(|v| {
                    v.as_str()
                        .ok_or_else(wrong)
                        .and_then(|s| literal(key, s, here))
                })
                .collect()
        };
        let mut read = Entry::default();
        for (key, value) in entry {
            match key.as_str() {
                "type" => read.kind = Some(string(key, value)?),
                "command" => read.command = Some(string(key, value)?),
                "args" => read.args = Some(strings(key, value)?),
                "cwd" => read.cwd = Some(string(key, value)?),
                "url" => read.url = Some(string(key, value)?),
                "disabledTools" => read.disabled_tools = strings(key, value)?,
                "disabled" => {}
                "env" => {
                    let wrong = || here(key, "`env` should be an object of strings".into());
                    for (var, value) in value.as_object().ok_or_else(wrong)? {
                        let value = value.as_str().ok_or_else(wrong)?;
                        read.env.push((var.clone(), literal(key, value, here)?));
                    }
                }
                "headers" => {
                    let wrong = || here(key, "`headers` should be an object".into());
                    if !value.as_object().ok_or_else(wrong)?.is_empty() {
                        return Err(here(
                            key,
                            "wma sends no extra headers to an MCP server, so a server that needs them (an API key, a token) would not get them: leave this server out, or put it behind a proxy that adds them".into(),
                        ));
                    }
                }
                "envFile" => {
                    return Err(here(
                        key,
                        "wma does not read env files: write the variables in `env`".into(),
                    ));
                }
                other if IGNORED.contains(&other) => {}
                other => {
                    return Err(here(
                        other,
                        format!(
                            "wma does not know `{other}`: it reads {}, and ignores {} (docs/configuration.md)",
                            quoted(READ),
                            quoted(IGNORED)
                        ),
                    ));
                }
            }
        }
        Ok(read)
    }

    /// The entry as a tool source: a stdio server for `command`, an HTTP
    /// one for `url`, as `type` says when it is there.
    fn source(
        self,
        name: &str,
        here: &dyn Fn(&str, String) -> ConfigError,
    ) -> Result<ToolSourceConfig> {
        let http = match self.kind.as_deref() {
            None => match (&self.command, &self.url) {
                (Some(_), Some(_)) => {
                    return Err(here(
                        "url",
                        "the server has both `command` (a program to start) and `url` (a server to reach): keep one".into(),
                    ));
                }
                (None, None) => {
                    return Err(here(
                        "",
                        "the server needs `command` (a program to start, spoken to over stdio) or `url` (a streamable-HTTP endpoint)".into(),
                    ));
                }
                (_, url) => url.is_some(),
            },
            Some("stdio") => false,
            Some(kind) if HTTP_TYPES.contains(&kind) => true,
            Some("sse") => {
                return Err(here(
                    "type",
                    format!(
                        "`{name}` is an SSE server, a transport wma does not speak (it speaks stdio and streamable HTTP): if the server also serves streamable HTTP (often at /mcp), give that address with \"type\": \"http\"; else leave it out, or mark it \"disabled\": true"
                    ),
                ));
            }
            Some(kind) => {
                return Err(here(
                    "type",
                    format!(
                        "unknown transport `{kind}`: wma speaks `stdio` and streamable HTTP (`http`, `streamable-http`)"
                    ),
                ));
            }
        };
        let spec = if http {
            for (key, set) in [
                ("command", self.command.is_some()),
                ("args", self.args.is_some()),
                ("env", !self.env.is_empty()),
                ("cwd", self.cwd.is_some()),
            ] {
                if set {
                    return Err(here(
                        key,
                        format!(
                            "`{key}` is a setting of a stdio server, and this one is reached over HTTP"
                        ),
                    ));
                }
            }
            let Some(url) = self.url else {
                return Err(here("type", "an HTTP server needs `url`".into()));
            };
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(here(
                    "url",
                    format!("`{url}` is not an http:// or https:// address"),
                ));
            }
            ToolSourceSpec::McpHttp { url }
        } else {
            if self.url.is_some() {
                return Err(here(
                    "url",
                    "`url` is a setting of an HTTP server, and this one is started with `command`"
                        .into(),
                ));
            }
            let command = self
                .command
                .filter(|c| !c.trim().is_empty())
                .ok_or_else(|| here("command", "a stdio server needs `command`".into()))?;
            ToolSourceSpec::McpStdio {
                command,
                args: self.args.unwrap_or_default(),
                env: self.env,
                cwd: self.cwd.map(PathBuf::from),
            }
        };
        Ok(ToolSourceConfig {
            name: name.to_string(),
            spec,
            policy: SourceOptions::default().deny(self.disabled_tools),
        })
    }
}

/// A value as written: other clients expand `${VAR}` in these files, `wma`
/// does not, and a server given the text `${API_KEY}` would fail in ways
/// far from the cause.
fn literal(key: &str, value: &str, here: &dyn Fn(&str, String) -> ConfigError) -> Result<String> {
    if value.contains("${") {
        return Err(here(
            key,
            format!(
                "`{value}`: wma does not expand `${{...}}` in this file; write the value itself"
            ),
        ));
    }
    Ok(value.to_string())
}

fn quoted(keys: &[&str]) -> String {
    let keys: Vec<String> = keys.iter().map(|k| format!("`{k}`")).collect();
    keys.join(", ")
}

/// The byte offset of every object key of a JSON text, with its path of
/// keys from the top; keys inside arrays are left out (nothing this file
/// says is in one). serde_json's `Value` keeps no positions, and a mistake
/// should point at its line. The text is valid JSON (it parsed), so the
/// scan only tracks strings and nesting.
fn key_offsets(text: &str) -> Vec<(Vec<String>, usize)> {
    enum Frame {
        Object {
            key: Option<String>,
            expect_key: bool,
        },
        Array,
    }
    let bytes = text.as_bytes();
    let mut stack: Vec<Frame> = Vec::new();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'{' => stack.push(Frame::Object {
                key: None,
                expect_key: true,
            }),
            b'[' => stack.push(Frame::Array),
            b'}' | b']' => {
                stack.pop();
            }
            b',' => {
                if let Some(Frame::Object { expect_key, .. }) = stack.last_mut() {
                    *expect_key = true;
                }
            }
            b'"' => {
                let start = i;
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    // An escape is a backslash and one ASCII character
                    // (`\uXXXX` goes on in plain characters).
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                let is_key = matches!(
                    stack.last(),
                    Some(Frame::Object {
                        expect_key: true,
                        ..
                    })
                );
                if is_key {
                    let name = text
                        .get(start..=i)
                        .and_then(|raw| serde_json::from_str::<String>(raw).ok())
                        .unwrap_or_default();
                    let below = &stack[..stack.len() - 1];
                    let path: Option<Vec<String>> = below
                        .iter()
                        .map(|frame| match frame {
                            Frame::Object { key: Some(key), .. } => Some(key.clone()),
                            _ => None,
                        })
                        .collect();
                    if let Some(mut path) = path {
                        path.push(name.clone());
                        out.push((path, start));
                    }
                    if let Some(Frame::Object { key, expect_key }) = stack.last_mut() {
                        *key = Some(name);
                        *expect_key = false;
                    }
                }
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// Where `path` is written, else the nearest key above it, else the start.
fn offset_of(offsets: &[(Vec<String>, usize)], path: &[&str]) -> usize {
    (0..=path.len())
        .rev()
        .find_map(|n| {
            offsets
                .iter()
                .find(|(p, _)| p.iter().map(String::as_str).eq(path[..n].iter().copied()))
                .map(|(_, at)| *at)
        })
        .unwrap_or(0)
}

/// The first key under `mcpServers` written twice in one object (the
/// rest of the file is other clients' settings, not ours to judge).
fn first_duplicate(offsets: &[(Vec<String>, usize)]) -> Option<&Vec<String>> {
    offsets.iter().enumerate().find_map(|(i, (path, _))| {
        (path.first().is_some_and(|p| p == "mcpServers")
            && offsets[..i].iter().any(|(earlier, _)| earlier == path))
        .then_some(path)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_found_with_their_paths_and_arrays_are_skipped() {
        let text = r#"{"a": {"b\"c": [{"x": 1}], "d": "}"}, "e": 2}"#;
        let found: Vec<(String, usize)> = key_offsets(text)
            .into_iter()
            .map(|(p, at)| (p.join("."), at))
            .collect();
        assert_eq!(
            found,
            [
                ("a".to_string(), 1),
                ("a.b\"c".to_string(), 7),
                ("a.d".to_string(), 27),
                ("e".to_string(), 38),
            ]
        );
        let offsets = key_offsets(text);
        assert_eq!(offset_of(&offsets, &["a", "d"]), 27);
        assert_eq!(
            offset_of(&offsets, &["a", "zz"]),
            1,
            "the nearest key above"
        );
        assert_eq!(offset_of(&offsets, &["q"]), 0);
    }

    #[test]
    fn a_key_written_twice_under_mcp_servers_is_found() {
        let twice = key_offsets(r#"{"mcpServers": {"a": {}, "a": {}}, "x": 1, "x": 2}"#);
        assert_eq!(
            first_duplicate(&twice).map(|p| p.join(".")),
            Some("mcpServers.a".to_string())
        );
        let other = key_offsets(r#"{"mcpServers": {"a": {"url": "u"}}, "x": 1, "x": 2}"#);
        assert_eq!(first_duplicate(&other), None, "not ours to judge");
    }
}
