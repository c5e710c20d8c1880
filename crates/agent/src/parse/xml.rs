//! Calls written as XML elements inside a call block:
//! `<tool_call><name>area</name><arguments><base>10</base></arguments></tool_call>`.
//!
//! Models trained on the Hermes tags sometimes fill the block with elements
//! instead of JSON (Qwen2.5-Coder does when it opens a Markdown fence
//! first). Only the body of a block that is already meant as calls is read
//! this way, so an element in prose is never taken for a call. An element's
//! text is read as JSON where it is a JSON scalar or value (`10`, `true`,
//! `[1, 2]`), and as a string otherwise; an element holding elements is an
//! object; an element written more than once is the list of its values.
//! Nothing here guesses at the schema: the loop validates and
//! repairs the arguments as it does for any call.

use serde_json::{Map, Value};

use super::ParsedCall;

/// Element names a call's name and its arguments come in.
const NAME_TAGS: &[&str] = &["name", "function", "tool"];
const ARGUMENT_TAGS: &[&str] = &["arguments", "parameters", "args"];

/// The deepest nesting of argument elements read.
const MAX_DEPTH: usize = 8;

/// Reads one call at `reply[pos..end]` (after leading whitespace); gives it
/// and the offset after it, or `None` when the text there is not such a call.
pub(super) fn read_call(reply: &str, pos: usize, end: usize) -> Option<(ParsedCall, usize)> {
    let mut at = skip_space(reply, pos, end);
    let (tag, body, after) = element(reply, at, end)?;
    if !NAME_TAGS.contains(&tag) {
        return None;
    }
    let name = unescape(body.trim());
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_alphanumeric() || "_-.:/".contains(c))
    {
        return None;
    }
    at = after;
    let mut arguments = Value::Object(Map::new());
    let next = skip_space(reply, at, end);
    if let Some((tag, _, after)) = element(reply, next, end)
        && ARGUMENT_TAGS.contains(&tag)
    {
        let open = next + tag.len() + 2;
        let close = after - tag.len() - 3;
        arguments = Value::Object(children(reply, open, close, 0)?);
        at = after;
    }
    Some((ParsedCall { name, arguments }, at))
}

/// The elements between `from` and `to` as an object; `None` when
/// something other than elements and whitespace is there.
fn children(reply: &str, from: usize, to: usize, depth: usize) -> Option<Map<String, Value>> {
    let mut out = Map::new();
    // Tags already turned into a list of their values.
    let mut repeated: Vec<&str> = Vec::new();
    let mut at = skip_space(reply, from, to);
    while at < to {
        let (tag, body, after) = element(reply, at, to)?;
        let value = if depth < MAX_DEPTH && body.trim_start().starts_with('<') {
            let open = at + tag.len() + 2;
            match children(reply, open, open + body.len(), depth + 1) {
                Some(object) => Value::Object(object),
                None => scalar(body),
            }
        } else {
            scalar(body)
        };
        // An element written again is a list of its values, as XML has
        // it (`<duration>20</duration><duration>15</duration>`, where a
        // model meant two calls): keeping only one would drop what the
        // model wrote without a word, and validation says what is wrong
        // with a list where the schema wants one value.
        match out.get_mut(tag) {
            Some(Value::Array(items)) if repeated.contains(&tag) => items.push(value),
            Some(first) => {
                *first = Value::Array(vec![first.take(), value]);
                repeated.push(tag);
            }
            None => {
                out.insert(tag.to_string(), value);
            }
        }
        at = skip_space(reply, after, to);
    }
    Some(out)
}

/// An element's text: JSON where it reads as JSON, a string otherwise.
fn scalar(text: &str) -> Value {
    let text = unescape(text.trim());
    match serde_json::from_str::<Value>(&text) {
        Ok(value) if !value.is_string() => value,
        _ => Value::String(text),
    }
}

/// The element opening at `at`: its tag, its body and the offset after its
/// closing tag. Attributes are not taken; the closing tag is the first one
/// of the same name, so an element does not hold another of its own name.
fn element(reply: &str, at: usize, end: usize) -> Option<(&str, &str, usize)> {
    let rest = reply.get(at..end)?;
    let inner = rest.strip_prefix('<')?;
    let close_angle = inner.find('>')?;
    let tag = &inner[..close_angle];
    if tag.is_empty()
        || !tag
            .chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == '-')
    {
        return None;
    }
    let body_start = 1 + close_angle + 1;
    let closing = format!("</{tag}>");
    let body_len = rest[body_start..].find(&closing)?;
    let body = &rest[body_start..body_start + body_len];
    Some((tag, body, at + body_start + body_len + closing.len()))
}

fn skip_space(reply: &str, mut at: usize, end: usize) -> usize {
    let bytes = reply.as_bytes();
    while at < end && bytes[at].is_ascii_whitespace() {
        at += 1;
    }
    at
}

/// XML's five entities, as a model writes them.
fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}
