//! A forgiving JSON reader for what small models write.
//!
//! `serde_json` is right to refuse `{'q': 'tents',}`, but a 135M-parameter
//! model writes that often, and refusing it costs a whole repair round trip.
//! This reader accepts the slips that have one obvious meaning:
//!
//! - trailing commas before `}` or `]`;
//! - single-quoted strings and unquoted identifier keys (`{name: 'x'}`);
//! - raw newlines and unknown escapes inside strings;
//! - Python's `True`, `False` and `None`;
//! - containers left open at the very end of the input, when the input is
//!   known to end there (the end of the reply, or of a `<tool_call>` block)
//!   and the last value is complete.
//!
//! Anything else fails with a short reason that names the last thing read
//! (`expected ',' or '}' after "query"`), so the model can find its mistake.
//! It works on bytes, and only ever stops on ASCII bytes, so every position it
//! reports is a char boundary of the input.

use serde_json::{Map, Number, Value};

/// Containers nested deeper than this are refused, so hostile input cannot
/// exhaust the stack. Real tool arguments are a few levels deep.
const MAX_DEPTH: usize = 64;

/// Keys whose presence says the text was meant as a tool call, even when it
/// cannot be read.
const CALL_KEYS: &[&str] = &[
    "name",
    "tool",
    "tool_name",
    "function",
    "function_name",
    "arguments",
    "tool_calls",
    "tool_call",
    "function_call",
];

/// A value read from the input.
#[derive(Debug)]
pub(super) struct Read {
    /// The value.
    pub(super) value: Value,
    /// Byte offset just past the value.
    pub(super) end: usize,
}

/// Why the input could not be read as JSON.
#[derive(Debug)]
pub(super) struct Failure {
    /// Byte offset where reading stopped.
    pub(super) at: usize,
    /// What was wrong, phrased for the model (`expected ':' after "query"`).
    pub(super) reason: String,
    /// Whether a call key (`"name"`, `"arguments"`, ...) was read before the
    /// failure: the text was then meant as a call, and the reply is malformed
    /// rather than prose.
    pub(super) looked_like_call: bool,
}

/// Reads one JSON value starting at `start` (which should hold `{` or `[`, or
/// any other value start), reading no further than `end`. When
/// `open_at_end` is set, containers still open when `end` is reached after a
/// complete value are closed there.
pub(super) fn read_value(
    src: &str,
    start: usize,
    end: usize,
    open_at_end: bool,
) -> Result<Read, Failure> {
    let end = end.min(src.len());
    let mut reader = Reader {
        src,
        bytes: src.as_bytes(),
        pos: start.min(end),
        end,
        open_at_end,
        depth: 0,
        last: None,
        looked_like_call: false,
    };
    match reader.value(None) {
        Ok(value) => Ok(Read {
            value,
            end: reader.pos,
        }),
        Err(reason) => Err(Failure {
            at: reader.pos,
            reason,
            looked_like_call: reader.looked_like_call,
        }),
    }
}

/// Reads `text` whole as one JSON value (used for arguments given as a
/// string). Text after the value is an error.
pub(super) fn read_whole(text: &str) -> Result<Value, String> {
    let start = text.len() - text.trim_start().len();
    let read = read_value(text, start, text.len(), true).map_err(|f| f.reason)?;
    let rest = text[read.end..].trim();
    if rest.is_empty() {
        Ok(read.value)
    } else {
        Err(format!(
            "unexpected text {} after the value",
            quote_snippet(rest)
        ))
    }
}

/// Cuts `text` to a short, char-safe snippet and quotes it for a message.
pub(super) fn quote_snippet(text: &str) -> String {
    const MAX_CHARS: usize = 24;
    let mut out = String::from("\"");
    let mut chars = text.chars();
    for c in chars.by_ref().take(MAX_CHARS) {
        match c {
            '\n' | '\r' | '\t' => out.push(' '),
            '"' => out.push('\''),
            _ => out.push(c),
        }
    }
    if chars.next().is_some() {
        out.push('…');
    }
    out.push('"');
    out
}

/// A recursive-descent reader over a byte range of the input.
struct Reader<'a> {
    /// The whole input; positions index into it.
    src: &'a str,
    /// `src` as bytes, for cheap peeking.
    bytes: &'a [u8],
    /// The next byte to read.
    pos: usize,
    /// Reading never goes past this offset.
    end: usize,
    /// Whether containers may be left open at `end`.
    open_at_end: bool,
    /// Containers currently open.
    depth: usize,
    /// Source span of the last complete token, to name it in messages.
    last: Option<(usize, usize)>,
    /// Set once a call key has been read.
    looked_like_call: bool,
}

impl<'a> Reader<'a> {
    fn peek(&self) -> Option<u8> {
        (self.pos < self.end).then(|| self.bytes[self.pos])
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    /// Names the last complete token for a message: ` after "query"`.
    fn after_last(&self) -> String {
        match self.last {
            Some(span) => format!(" after {}", self.describe(span)),
            None => String::new(),
        }
    }

    /// Quotes the source text of a token, without its own quotes.
    fn describe(&self, (start, end): (usize, usize)) -> String {
        let raw = &self.src[start..end];
        let inner = raw
            .strip_prefix(['"', '\''])
            .and_then(|r| r.strip_suffix(['"', '\'']))
            .unwrap_or(raw);
        quote_snippet(inner)
    }

    /// The reason given when the input ends before the value does.
    fn cut_off(&self) -> String {
        format!("the call stops before its end{}", self.after_last())
    }

    /// Reads any value. `key` names the property being read, for messages.
    fn value(&mut self, key: Option<(usize, usize)>) -> Result<Value, String> {
        self.skip_ws();
        let Some(byte) = self.peek() else {
            return Err(self.cut_off());
        };
        match byte {
            b'{' => self.nested(Self::object),
            b'[' => self.nested(Self::array),
            b'"' | b'\'' => self.string().map(Value::String),
            b'-' | b'0'..=b'9' => self.number(),
            _ if is_ident_start(byte) => {
                let start = self.pos;
                let word = self.ident();
                let value = match word {
                    "true" | "True" => Value::Bool(true),
                    "false" | "False" => Value::Bool(false),
                    "null" | "None" => Value::Null,
                    _ => {
                        self.pos = start;
                        let what = match key {
                            Some(span) => format!(" for {}", self.describe(span)),
                            None => String::new(),
                        };
                        return Err(format!(
                            "expected a value{what}, got {}; put text in double quotes",
                            quote_snippet(word)
                        ));
                    }
                };
                self.last = Some((start, self.pos));
                Ok(value)
            }
            _ => {
                let what = match key {
                    Some(span) => format!(" for {}", self.describe(span)),
                    None => self.after_last(),
                };
                Err(format!(
                    "expected a value{what}, got {}",
                    quote_snippet(self.rest_of_token())
                ))
            }
        }
    }

    /// Runs a container reader one level deeper, refusing runaway nesting.
    fn nested(&mut self, read: fn(&mut Self) -> Result<Value, String>) -> Result<Value, String> {
        if self.depth >= MAX_DEPTH {
            return Err("the call is nested too deeply".to_string());
        }
        self.depth += 1;
        let result = read(self);
        self.depth -= 1;
        result
    }

    fn object(&mut self) -> Result<Value, String> {
        self.pos += 1; // '{'
        let mut map = Map::new();
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(Value::Object(map));
        }
        loop {
            self.skip_ws();
            let key_start = self.pos;
            let key = match self.peek() {
                Some(b'"' | b'\'') => self.string()?,
                Some(b) if is_ident_start(b) => {
                    let key = self.ident().to_string();
                    self.last = Some((key_start, self.pos));
                    key
                }
                Some(b'}') => {
                    // A trailing comma: `{"a": 1,}`.
                    self.pos += 1;
                    return Ok(Value::Object(map));
                }
                None => return Err(self.cut_off()),
                Some(_) => {
                    return Err(format!(
                        "expected a property name in double quotes{}, got {}",
                        self.after_last(),
                        quote_snippet(self.rest_of_token())
                    ));
                }
            };
            let key_span = (key_start, self.pos);
            if self.depth <= 3 && CALL_KEYS.contains(&key.as_str()) {
                self.looked_like_call = true;
            }
            self.skip_ws();
            match self.peek() {
                Some(b':') => self.pos += 1,
                None => return Err(self.cut_off()),
                Some(_) => return Err(format!("expected ':'{}", self.after_last())),
            }
            let value = self.value(Some(key_span))?;
            map.insert(key, value);
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(Value::Object(map));
                }
                None if self.open_at_end => return Ok(Value::Object(map)),
                None => return Err(format!("expected '}}'{}", self.after_last())),
                Some(_) => return Err(format!("expected ',' or '}}'{}", self.after_last())),
            }
        }
    }

    fn array(&mut self) -> Result<Value, String> {
        self.pos += 1; // '['
        let mut items = Vec::new();
        loop {
            self.skip_ws();
            match self.peek() {
                // Empty, or a trailing comma: `[1, 2,]`.
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Value::Array(items));
                }
                None => return Err(self.cut_off()),
                Some(_) => {}
            }
            items.push(self.value(None)?);
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Value::Array(items));
                }
                None if self.open_at_end => return Ok(Value::Array(items)),
                None => return Err(format!("expected ']'{}", self.after_last())),
                Some(_) => return Err(format!("expected ',' or ']'{}", self.after_last())),
            }
        }
    }

    /// Reads a string quoted with `"` or `'`.
    fn string(&mut self) -> Result<String, String> {
        let start = self.pos;
        let quote = self.bytes[start];
        self.pos += 1;
        let mut out = String::new();
        // Copy runs of plain bytes at once; only escapes need work.
        let mut run = self.pos;
        loop {
            let Some(byte) = self.peek() else {
                let reason = format!(
                    "the text {} has no closing quote",
                    quote_snippet(&self.src[start + 1..self.end])
                );
                // Report the failure at the quote, not at the end: a stray
                // apostrophe in prose must not hide a call written after it.
                self.pos = start + 1;
                return Err(reason);
            };
            if byte == quote {
                out.push_str(&self.src[run..self.pos]);
                self.pos += 1;
                self.last = Some((start, self.pos));
                return Ok(out);
            }
            if byte != b'\\' {
                self.pos += 1;
                continue;
            }
            out.push_str(&self.src[run..self.pos]);
            self.pos += 1;
            let Some(escaped) = self.peek() else {
                continue; // reported as an unclosed string above
            };
            match escaped {
                b'n' => out.push('\n'),
                b't' => out.push('\t'),
                b'r' => out.push('\r'),
                b'b' => out.push('\u{8}'),
                b'f' => out.push('\u{c}'),
                b'u' => {
                    self.pos += 1;
                    out.push(self.unicode_escape());
                    run = self.pos;
                    continue;
                }
                _ if escaped.is_ascii() => out.push(char::from(escaped)),
                // A backslash before a multi-byte char: keep both as written.
                _ => {
                    out.push('\\');
                    run = self.pos;
                    continue;
                }
            }
            self.pos += 1;
            run = self.pos;
        }
    }

    /// Reads the hex digits of a `\u` escape (the `\u` already read),
    /// joining surrogate pairs. Broken escapes become U+FFFD rather than
    /// failing the call.
    fn unicode_escape(&mut self) -> char {
        let Some(high) = self.hex4() else {
            return char::REPLACEMENT_CHARACTER;
        };
        if (0xD800..0xDC00).contains(&high) {
            let bytes = self.bytes;
            if self.pos + 2 <= self.end && &bytes[self.pos..self.pos + 2] == b"\\u" {
                let save = self.pos;
                self.pos += 2;
                if let Some(low) = self.hex4()
                    && (0xDC00..0xE000).contains(&low)
                {
                    let code = 0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00);
                    return char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER);
                }
                self.pos = save;
            }
            return char::REPLACEMENT_CHARACTER;
        }
        char::from_u32(high).unwrap_or(char::REPLACEMENT_CHARACTER)
    }

    fn hex4(&mut self) -> Option<u32> {
        if self.pos + 4 > self.end {
            return None;
        }
        let digits = &self.bytes[self.pos..self.pos + 4];
        if !digits.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        // All four are ASCII hex digits, so this slice is valid UTF-8.
        let value = u32::from_str_radix(&self.src[self.pos..self.pos + 4], 16).ok()?;
        self.pos += 4;
        Some(value)
    }

    fn number(&mut self) -> Result<Value, String> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        while let Some(b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-') = self.peek() {
            self.pos += 1;
        }
        let text = &self.src[start..self.pos];
        let number = text
            .parse::<Number>()
            .ok()
            .or_else(|| text.parse::<f64>().ok().and_then(Number::from_f64));
        match number {
            Some(number) => {
                self.last = Some((start, self.pos));
                Ok(Value::Number(number))
            }
            None => {
                self.pos = start;
                Err(format!("{} is not a number", quote_snippet(text)))
            }
        }
    }

    /// Reads an identifier (the caller checked its first byte).
    fn ident(&mut self) -> &'a str {
        let start = self.pos;
        while let Some(b) = self.peek() {
            if is_ident_byte(b) {
                self.pos += 1;
            } else {
                break;
            }
        }
        &self.src[start..self.pos]
    }

    /// The text from the current position to the next separator, for messages.
    fn rest_of_token(&self) -> &'a str {
        // Look a short way only: failures are frequent when scanning prose,
        // and reading to the end each time would make scanning quadratic.
        let mut limit = (self.pos + 64).min(self.end);
        while !self.src.is_char_boundary(limit) {
            limit -= 1;
        }
        let rest = &self.src[self.pos..limit];
        let stop = rest
            .find([' ', '\n', '\t', ',', '}', ']', ':'])
            .unwrap_or(rest.len());
        // Never an empty snippet: show at least the offending char.
        let stop = if stop == 0 {
            rest.chars().next().map_or(0, char::len_utf8)
        } else {
            stop
        };
        &rest[..stop]
    }
}

/// Whether `byte` may start an unquoted key or a literal.
pub(super) fn is_ident_start(byte: u8) -> bool {
    byte.is_ascii_alphabetic() || byte == b'_' || byte == b'$'
}

/// Whether `byte` may continue an unquoted key or a literal.
pub(super) fn is_ident_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'$' || byte == b'-'
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn read(text: &str, open_at_end: bool) -> Result<Value, String> {
        let read = read_value(text, 0, text.len(), open_at_end).map_err(|f| f.reason)?;
        assert!(
            text[read.end..].trim().is_empty(),
            "unread tail in {text:?}: {:?}",
            &text[read.end..]
        );
        Ok(read.value)
    }

    #[test]
    fn reads_strict_and_lenient_json() {
        let cases: &[(&str, Value)] = &[
            (
                r#"{"a": 1, "b": [true, null, "x"]}"#,
                json!({"a": 1, "b": [true, null, "x"]}),
            ),
            (r#"{"a": 1,}"#, json!({"a": 1})),
            (r#"[1, 2, ]"#, json!([1, 2])),
            (r#"{'q': 'tents'}"#, json!({"q": "tents"})),
            (
                r#"{q: "tents", n_max: 2}"#,
                json!({"q": "tents", "n_max": 2}),
            ),
            (
                r#"{"a": True, "b": False, "c": None}"#,
                json!({"a": true, "b": false, "c": null}),
            ),
            ("{\"a\": \"line\nbreak\"}", json!({"a": "line\nbreak"})),
            (r#"{"a": "it\'s"}"#, json!({"a": "it's"})),
            (r#"{'a': "it's"}"#, json!({"a": "it's"})),
            (r#"{"a": "\u00e9\ud83e\udd80"}"#, json!({"a": "é🦀"})),
            (r#"{"a": "\ud83e"}"#, json!({"a": "\u{fffd}"})),
            (r#"{"a": "\q"}"#, json!({"a": "q"})),
            (
                r#"{"a": -1.5e3, "b": 18446744073709551615}"#,
                json!({"a": -1500.0, "b": 18446744073709551615u64}),
            ),
            (r#"{"日本": "語"}"#, json!({"日本": "語"})),
            ("{}", json!({})),
            ("[]", json!([])),
        ];
        for (text, expected) in cases {
            assert_eq!(read(text, false).as_ref(), Ok(expected), "{text}");
        }
    }

    #[test]
    fn closes_containers_only_when_allowed_and_complete() {
        let cases: &[(&str, Result<Value, &str>)] = &[
            (r#"{"a": {"b": 1}"#, Ok(json!({"a": {"b": 1}}))),
            (r#"{"a": [1, 2"#, Ok(json!({"a": [1, 2]}))),
            (r#"{"a": {"b": 1},"#, Err("the call stops before its end")),
            (r#"{"a": "#, Err("the call stops before its end")),
            (
                r#"{"a": "ten"#,
                Err("the text \"ten\" has no closing quote"),
            ),
            (r#"{"a""#, Err("the call stops before its end after \"a\"")),
        ];
        for (text, expected) in cases {
            let got = read(text, true);
            match expected {
                Ok(value) => assert_eq!(got.as_ref(), Ok(value), "{text}"),
                Err(start) => {
                    let err = got.expect_err(text);
                    assert!(err.starts_with(start), "{text}: {err}");
                }
            }
        }
        assert_eq!(
            read(r#"{"a": {"b": 1}"#, false),
            Err("expected '}' after \"1\"".into())
        );
    }

    #[test]
    fn failures_name_the_last_token() {
        let cases = [
            (r#"{"query" "tents"}"#, r#"expected ':' after "query""#),
            (
                r#"{"query": "tents" "n": 1}"#,
                r#"expected ',' or '}' after "tents""#,
            ),
            (r#"[1 2]"#, r#"expected ',' or ']' after "1""#),
            (
                r#"{"query": tents}"#,
                r#"expected a value for "query", got "tents"; put text in double quotes"#,
            ),
            (r#"{"q": @}"#, r#"expected a value for "q", got "@""#),
            (
                r#"{1: 2}"#,
                r#"expected a property name in double quotes, got "1""#,
            ),
            (r#"{"n": 1.2.3}"#, r#""1.2.3" is not a number"#),
        ];
        for (text, reason) in cases {
            assert_eq!(read(text, false), Err(reason.to_string()), "{text}");
        }
    }

    #[test]
    fn notices_call_keys_before_failing() {
        let cases = [
            (r#"{"name": "x", "arguments": {"q" 1}}"#, true),
            (r#"[{"tool": "x" "#, true),
            (r#"{"answer" 42}"#, false),
            (r#"{maybe}"#, false),
        ];
        for (text, expected) in cases {
            let failure = read_value(text, 0, text.len(), false).expect_err(text);
            assert_eq!(failure.looked_like_call, expected, "{text}");
        }
    }

    #[test]
    fn refuses_runaway_nesting_without_overflowing() {
        let deep = "[".repeat(100_000);
        let failure = read_value(&deep, 0, deep.len(), true).expect_err("too deep");
        assert_eq!(failure.reason, "the call is nested too deeply");
    }

    #[test]
    fn reads_whole_strings() {
        assert_eq!(read_whole(r#" {"q": 1} "#), Ok(json!({"q": 1})));
        assert_eq!(
            read_whole(r#"{"q": 1} extra"#),
            Err("unexpected text \"extra\" after the value".into())
        );
    }

    #[test]
    fn snippets_are_short_and_cut_on_char_boundaries() {
        assert_eq!(quote_snippet("short"), "\"short\"");
        let long = "é".repeat(40);
        assert_eq!(quote_snippet(&long), format!("\"{}…\"", "é".repeat(24)));
    }
}
