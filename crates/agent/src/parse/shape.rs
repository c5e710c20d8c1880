//! Deciding whether a JSON value is a tool call, whatever keys the model chose.
//!
//! Models trained on different tool formats spell the same call differently:
//! `{"name", "arguments"}` (Hermes, Qwen, SmolLM2), `{"name", "parameters"}`
//! (Llama 3), `{"tool", "args"}`, `{"tool_name", "tool_input"}`, OpenAI's
//! `{"type": "function", "function": {"name", "arguments": "<json string>"}}`
//! and `{"tool_calls": [...]}`. All of them mean the same thing, so all are
//! read. A value with none of the name keys is not a call: it is prose that
//! happens to be JSON (`{"answer": 42}`).

use serde_json::{Map, Value};

use super::ParsedCall;
use super::json::{quote_snippet, read_whole};

/// Keys that hold the tool's name, in order of preference.
const NAME_KEYS: &[&str] = &["name", "tool_name", "tool", "function", "function_name"];

/// Keys that hold the arguments, in order of preference.
const ARGUMENT_KEYS: &[&str] = &[
    "arguments",
    "args",
    "parameters",
    "params",
    "tool_input",
    "input",
    "kwargs",
];

/// Keys that wrap the call itself (`{"tool_calls": [...]}`).
const WRAPPER_KEYS: &[&str] = &["tool_calls", "tool_call", "function_call"];

/// Keys that carry bookkeeping, never arguments, when a model flattens the
/// arguments into the call object (`{"name": "search", "query": "tents"}`).
const META_KEYS: &[&str] = &["type", "id", "call_id", "index"];

/// What a JSON value turned out to be.
#[derive(Debug, PartialEq)]
pub(super) enum Shape {
    /// One or more calls.
    Calls(Vec<ParsedCall>),
    /// Not a call: prose that happens to be JSON.
    NotACall,
    /// Meant as a call, but unusable; the reason is for the model.
    Broken(String),
}

/// Interprets `value` as calls.
pub(super) fn interpret(value: Value) -> Shape {
    match value {
        Value::Array(items) => interpret_list(items),
        Value::Object(object) => interpret_object(object, 0),
        _ => Shape::NotACall,
    }
}

fn interpret_list(items: Vec<Value>) -> Shape {
    let mut calls = Vec::new();
    let mut not_calls = Vec::new();
    for (index, item) in items.into_iter().enumerate() {
        match interpret(item) {
            Shape::Calls(found) => calls.extend(found),
            Shape::NotACall => not_calls.push(index + 1),
            broken @ Shape::Broken(_) => return broken,
        }
    }
    match (calls.is_empty(), not_calls.first()) {
        (true, _) => Shape::NotACall,
        (false, None) => Shape::Calls(calls),
        (false, Some(position)) => Shape::Broken(format!(
            "item {position} of the list is not a call; write each call as {{\"name\": ..., \"arguments\": {{...}}}}"
        )),
    }
}

fn interpret_object(mut object: Map<String, Value>, depth: usize) -> Shape {
    // Wrappers nest at most a couple of levels; deeper is not a call.
    if depth > 3 {
        return Shape::NotACall;
    }
    for key in WRAPPER_KEYS {
        if let Some(inner) = object.remove(*key) {
            return match inner {
                Value::Array(items) => interpret_list(items),
                Value::Object(inner) => interpret_object(inner, depth + 1),
                _ => Shape::NotACall,
            };
        }
    }
    // OpenAI nesting: `{"type": "function", "function": {"name": ..., "arguments": ...}}`.
    if let Some(Value::Object(_)) = object.get("function")
        && let Some(Value::Object(inner)) = object.remove("function")
    {
        return interpret_object(inner, depth + 1);
    }

    let Some(name_key) = NAME_KEYS.iter().find(|k| object.contains_key(**k)) else {
        return Shape::NotACall;
    };
    let arguments_key = ARGUMENT_KEYS.iter().find(|k| object.contains_key(**k));
    let name = object.remove(*name_key).unwrap_or_default();
    let Value::String(name) = name else {
        return match arguments_key {
            Some(_) => Shape::Broken(format!(
                "\"{name_key}\" must be the tool's name as a string, got {}",
                quote_snippet(&name.to_string())
            )),
            None => Shape::NotACall,
        };
    };
    let name = name.trim().to_string();

    let arguments = match arguments_key {
        Some(key) => {
            if name.is_empty() {
                return Shape::Broken("the call has an empty tool name".to_string());
            }
            match arguments_object(object.remove(*key).unwrap_or_default()) {
                Ok(arguments) => arguments,
                Err(reason) => return Shape::Broken(reason),
            }
        }
        None => {
            // Without an arguments key, only an identifier-like name makes a
            // call: `{"name": "Tent X", "price": 20}` is data about a product.
            if !looks_like_tool_name(&name) {
                return Shape::NotACall;
            }
            for key in META_KEYS {
                object.remove(*key);
            }
            object
        }
    };
    if looks_like_schema(&arguments) {
        return Shape::Broken(format!(
            "that is the definition of \"{name}\", not a call; call it with {{\"name\": \"{name}\", \"arguments\": {{...}}}} filled with values"
        ));
    }
    Shape::Calls(vec![ParsedCall {
        name,
        arguments: Value::Object(arguments),
    }])
}

/// Turns what the model wrote under the arguments key into an object.
fn arguments_object(value: Value) -> Result<Map<String, Value>, String> {
    match value {
        Value::Object(map) => Ok(map),
        Value::Null => Ok(Map::new()),
        // `"arguments": "{\"q\": 1}"`, as OpenAI's format has it.
        Value::String(text) if text.trim().is_empty() => Ok(Map::new()),
        Value::String(text) => match read_whole(&text) {
            Ok(Value::Object(map)) => Ok(map),
            Ok(_) | Err(_) if !text.trim_start().starts_with(['{', '[']) => Err(format!(
                "the arguments must be a JSON object of named values, got {}",
                quote_snippet(&text)
            )),
            Ok(other) => Err(format!(
                "the arguments must be a JSON object of named values, got {}",
                quote_snippet(&other.to_string())
            )),
            Err(reason) => Err(format!("the arguments are not valid JSON: {reason}")),
        },
        other => Err(format!(
            "the arguments must be a JSON object of named values, got {}",
            quote_snippet(&other.to_string())
        )),
    }
}

/// Whether `name` could be a tool's name: one word of letters, digits and
/// `_ - . :`, starting with a letter or `_`.
pub(super) fn looks_like_tool_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'))
        && name.len() <= 128
}

/// Whether arguments are really a JSON Schema: models often echo the tool
/// definition they were shown instead of calling the tool.
fn looks_like_schema(arguments: &Map<String, Value>) -> bool {
    arguments.get("type").and_then(Value::as_str) == Some("object")
        && arguments.get("properties").is_some_and(Value::is_object)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn call(name: &str, arguments: Value) -> ParsedCall {
        ParsedCall {
            name: name.to_string(),
            arguments,
        }
    }

    #[test]
    fn reads_every_key_variant() {
        let cases: &[(Value, &str, Value)] = &[
            (
                json!({"name": "s", "arguments": {"q": 1}}),
                "s",
                json!({"q": 1}),
            ),
            (json!({"tool": "s", "args": {"q": 1}}), "s", json!({"q": 1})),
            (
                json!({"function": "s", "parameters": {"q": 1}}),
                "s",
                json!({"q": 1}),
            ),
            (
                json!({"tool_name": "s", "tool_input": {"q": 1}}),
                "s",
                json!({"q": 1}),
            ),
            (
                json!({"function_name": "s", "params": {"q": 1}}),
                "s",
                json!({"q": 1}),
            ),
            (
                json!({"name": "s", "input": {"q": 1}}),
                "s",
                json!({"q": 1}),
            ),
            (
                json!({"type": "function", "function": {"name": "s", "arguments": "{\"q\": 1}"}}),
                "s",
                json!({"q": 1}),
            ),
            (
                json!({"function": {"name": "s", "arguments": {"q": 1}}}),
                "s",
                json!({"q": 1}),
            ),
            (
                json!({"type": "function", "name": "s", "parameters": {"q": 1}}),
                "s",
                json!({"q": 1}),
            ),
            (
                json!({"name": " s ", "arguments": "{'q': 1,}"}),
                "s",
                json!({"q": 1}),
            ),
            (json!({"name": "s"}), "s", json!({})),
            (json!({"name": "s", "arguments": null}), "s", json!({})),
            (json!({"name": "s", "arguments": ""}), "s", json!({})),
            (
                json!({"name": "s", "query": "tents", "id": "c1"}),
                "s",
                json!({"query": "tents"}),
            ),
            (
                json!({"function_call": {"name": "s", "arguments": "{}"}}),
                "s",
                json!({}),
            ),
        ];
        for (value, name, arguments) in cases {
            assert_eq!(
                interpret(value.clone()),
                Shape::Calls(vec![call(name, arguments.clone())]),
                "{value}"
            );
        }
    }

    #[test]
    fn reads_lists_and_wrappers_in_order() {
        let value = json!({"tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "a", "arguments": "{}"}},
            {"name": "b", "arguments": {"x": true}},
        ]});
        assert_eq!(
            interpret(value),
            Shape::Calls(vec![call("a", json!({})), call("b", json!({"x": true}))])
        );
        assert_eq!(
            interpret(json!([{"name": "a"}, [{"name": "b"}]])),
            Shape::Calls(vec![call("a", json!({})), call("b", json!({}))])
        );
    }

    #[test]
    fn leaves_json_that_is_not_a_call() {
        let cases = [
            json!({"answer": 42}),
            json!([1, 2, 3]),
            json!([]),
            json!("name"),
            json!({"name": "Tent X", "price": 20}),
            json!({"name": {"first": "Ada"}}),
            json!({"tool_calls": "none"}),
        ];
        for value in cases {
            assert_eq!(interpret(value.clone()), Shape::NotACall, "{value}");
        }
    }

    #[test]
    fn explains_broken_calls() {
        let cases = [
            (
                json!({"name": "s", "arguments": "tents"}),
                "the arguments must be a JSON object of named values, got \"tents\"",
            ),
            (
                json!({"name": "s", "arguments": [1]}),
                "the arguments must be a JSON object of named values, got \"[1]\"",
            ),
            (
                json!({"name": "s", "arguments": "{\"q\" 1}"}),
                "the arguments are not valid JSON: expected ':' after \"q\"",
            ),
            (
                json!({"name": "", "arguments": {}}),
                "the call has an empty tool name",
            ),
            (
                json!({"name": 3, "arguments": {}}),
                "\"name\" must be the tool's name as a string, got \"3\"",
            ),
            (
                json!([{"name": "a"}, {"answer": 1}]),
                "item 2 of the list is not a call; write each call as {\"name\": ..., \"arguments\": {...}}",
            ),
            (
                json!({"name": "s", "parameters": {"type": "object", "properties": {"q": {}}}}),
                "that is the definition of \"s\", not a call; call it with {\"name\": \"s\", \"arguments\": {...}} filled with values",
            ),
        ];
        for (value, reason) in cases {
            assert_eq!(
                interpret(value.clone()),
                Shape::Broken(reason.to_string()),
                "{value}"
            );
        }
    }

    #[test]
    fn tool_names_are_single_words() {
        let cases = [
            ("search", true),
            ("add_to_cart", true),
            ("shop.search-v2", true),
            ("_private", true),
            ("Tent X", false),
            ("2fast", false),
            ("", false),
            ("é", false),
        ];
        for (name, expected) in cases {
            assert_eq!(looks_like_tool_name(name), expected, "{name}");
        }
    }
}
