//! Checking a call's arguments against the tool's input schema.
//!
//! The schema check itself is the `jsonschema` crate's; what this module adds
//! is the wording. A small model cannot act on `"two" is not of type
//! "integer"` at `/quantity`, but it can act on
//! `argument "quantity" must be an integer, got "two"`. Each error names the
//! argument by its path (`order.items[0].id`) and says what was expected; at
//! most [`MAX_ERRORS`] are reported, joined with `"; "`, so the correction
//! stays short enough for a small context.
//!
//! Compiling a schema costs far more than checking against it, so a loop
//! that validates every step should keep a [`ValidatorCache`] (or a
//! [`CompiledSchema`] per tool) instead of calling [`validate_args`].

use std::collections::HashMap;
use std::sync::Arc;

use jsonschema::error::{TypeKind, ValidationErrorKind};
use jsonschema::paths::{Location, LocationSegment};
use jsonschema::{JsonType, ValidationError, Validator};
use parking_lot::Mutex;
use serde_json::Value;

/// Why arguments were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ArgsError {
    /// The arguments break the schema; the message names the argument and
    /// what was expected.
    #[error("{0}")]
    Invalid(String),
    /// The tool's schema itself is not a valid JSON Schema.
    #[error("the tool's input schema is invalid: {0}")]
    BadSchema(String),
}

/// At most this many problems are reported for one call: the first few are
/// what the model needs to fix, and a long list drowns a small model.
pub(crate) const MAX_ERRORS: usize = 3;

/// Checks `arguments` against `schema`.
///
/// This compiles the schema on every call; the loop keeps compiled schemas in a cache instead.
pub fn validate_args(schema: &Value, arguments: &Value) -> Result<(), ArgsError> {
    CompiledSchema::new(schema)?.check(arguments)
}

/// A tool's input schema, compiled once and checked many times.
#[derive(Debug, Clone)]
pub struct CompiledSchema {
    /// The compiled schema.
    validator: Validator,
    /// The schema as given, to name the known arguments when an unknown one
    /// is used.
    schema: Value,
    /// Whether the arguments must be an object even though the schema does
    /// not say `"type": "object"` (it lists properties or required ones).
    implied_object: bool,
}

impl CompiledSchema {
    /// Compiles `schema`; a schema that is not valid JSON Schema is
    /// [`ArgsError::BadSchema`].
    pub fn new(schema: &Value) -> Result<Self, ArgsError> {
        let validator =
            jsonschema::validator_for(schema).map_err(|e| ArgsError::BadSchema(e.to_string()))?;
        let implied_object = schema.as_object().is_some_and(|s| {
            !s.contains_key("type")
                && ["properties", "required", "additionalProperties"]
                    .iter()
                    .any(|k| s.contains_key(*k))
        });
        Ok(Self {
            validator,
            schema: schema.clone(),
            implied_object,
        })
    }

    /// Checks `arguments`; the error says what to fix, in words for the model.
    pub fn check(&self, arguments: &Value) -> Result<(), ArgsError> {
        if self.implied_object && !arguments.is_object() {
            return Err(ArgsError::Invalid(format!(
                "the arguments must be an object, got {}",
                show(arguments)
            )));
        }
        let mut messages: Vec<String> = Vec::new();
        for error in self.validator.iter_errors(arguments) {
            let message = describe(&error, &self.schema);
            if !messages.contains(&message) {
                messages.push(message);
            }
            if messages.len() == MAX_ERRORS {
                break;
            }
        }
        if messages.is_empty() {
            Ok(())
        } else {
            Err(ArgsError::Invalid(messages.join("; ")))
        }
    }
}

/// Compiled schemas, keyed by the schema's JSON text, so the loop can check
/// every step's calls without compiling the same schema again.
///
/// It is shared by reference (`&self`) and safe to use from several tasks.
/// When it holds [`ValidatorCache::CAPACITY`] schemas it starts over, which
/// bounds its memory on hosts whose tools change all the time.
#[derive(Debug, Default)]
pub(crate) struct ValidatorCache {
    /// Schema text to compiled schema.
    compiled: Mutex<HashMap<String, Arc<CompiledSchema>>>,
}

impl ValidatorCache {
    /// The most schemas kept before the cache starts over.
    pub(crate) const CAPACITY: usize = 256;

    /// An empty cache.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The compiled form of `schema`, compiling it on first use.
    pub(crate) fn get(&self, schema: &Value) -> Result<Arc<CompiledSchema>, ArgsError> {
        let key = schema.to_string();
        if let Some(found) = self.compiled.lock().get(&key) {
            return Ok(Arc::clone(found));
        }
        // Compile without holding the lock; a race only compiles twice.
        let compiled = Arc::new(CompiledSchema::new(schema)?);
        let mut map = self.compiled.lock();
        if map.len() >= Self::CAPACITY {
            map.clear();
        }
        map.insert(key, Arc::clone(&compiled));
        Ok(compiled)
    }

    /// Checks `arguments` against `schema`, like [`validate_args`].
    pub(crate) fn validate(&self, schema: &Value, arguments: &Value) -> Result<(), ArgsError> {
        self.get(schema)?.check(arguments)
    }

    /// How many schemas are cached.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.compiled.lock().len()
    }
}

/// Words for one validation error.
fn describe(error: &ValidationError<'_>, schema: &Value) -> String {
    let path = error.instance_path();
    let subject = subject(path);
    let instance = error.instance();
    match error.kind() {
        ValidationErrorKind::Type { kind } => {
            let expected = match kind {
                TypeKind::Single(t) => type_words(*t).to_string(),
                TypeKind::Multiple(set) => {
                    // "a string or null" reads better than "null or a string".
                    let mut types: Vec<JsonType> = set.iter().collect();
                    types.sort_by_key(|t| *t == JsonType::Null);
                    types
                        .into_iter()
                        .map(type_words)
                        .collect::<Vec<_>>()
                        .join(" or ")
                }
            };
            format!("{subject} must be {expected}, got {}", show(instance))
        }
        ValidationErrorKind::Required { property } => {
            let name = property
                .as_str()
                .map_or_else(|| property.to_string(), str::to_string);
            format!("missing required argument \"{}\"", join(path, &name))
        }
        ValidationErrorKind::AdditionalProperties { unexpected }
        | ValidationErrorKind::UnevaluatedProperties { unexpected } => {
            let names: Vec<String> = unexpected
                .iter()
                .map(|name| format!("\"{}\"", join(path, name)))
                .collect();
            let noun = if names.len() == 1 {
                "argument"
            } else {
                "arguments"
            };
            let mut message = format!("unknown {noun} {}", names.join(", "));
            if let Some(known) = known_properties(schema, error) {
                message.push_str(&format!(" (known: {known})"));
            }
            message
        }
        ValidationErrorKind::Enum { options } => {
            let options = match options.as_ref() {
                Value::Array(items) => list(items),
                other => show(other),
            };
            format!("{subject} must be one of {options}")
        }
        ValidationErrorKind::Constant { expected_value } => {
            format!("{subject} must be {}", show(expected_value))
        }
        ValidationErrorKind::Minimum { limit } => format!("{subject} must be at least {limit}"),
        ValidationErrorKind::Maximum { limit } => format!("{subject} must be at most {limit}"),
        ValidationErrorKind::ExclusiveMinimum { limit } => {
            format!("{subject} must be greater than {limit}")
        }
        ValidationErrorKind::ExclusiveMaximum { limit } => {
            format!("{subject} must be less than {limit}")
        }
        ValidationErrorKind::MultipleOf { multiple_of } => {
            format!("{subject} must be a multiple of {multiple_of}")
        }
        ValidationErrorKind::MinLength { limit } => {
            format!(
                "{subject} must be at least {limit} {}",
                plural(*limit, "character")
            )
        }
        ValidationErrorKind::MaxLength { limit } => {
            format!(
                "{subject} must be at most {limit} {}",
                plural(*limit, "character")
            )
        }
        ValidationErrorKind::MinItems { limit } => {
            format!(
                "{subject} must have at least {limit} {}",
                plural(*limit, "item")
            )
        }
        ValidationErrorKind::MaxItems { limit } => {
            format!(
                "{subject} must have at most {limit} {}",
                plural(*limit, "item")
            )
        }
        ValidationErrorKind::MinProperties { limit } => {
            format!(
                "{subject} must have at least {limit} {}",
                plural(*limit, "field")
            )
        }
        ValidationErrorKind::MaxProperties { limit } => {
            format!(
                "{subject} must have at most {limit} {}",
                plural(*limit, "field")
            )
        }
        ValidationErrorKind::UniqueItems => format!("{subject} must not repeat items"),
        ValidationErrorKind::Pattern { pattern } => {
            format!(
                "{subject} must match the pattern {pattern}, got {}",
                show(instance)
            )
        }
        ValidationErrorKind::Format { format } => {
            format!("{subject} must be a valid {format}, got {}", show(instance))
        }
        ValidationErrorKind::AnyOf { context } | ValidationErrorKind::OneOfNotValid { context } => {
            any_of(&subject, context, schema)
        }
        ValidationErrorKind::OneOfMultipleValid { .. } => {
            format!("{subject} matches more than one allowed form; make it match exactly one")
        }
        ValidationErrorKind::FalseSchema if !path.is_empty() => {
            format!("argument \"{}\" is not allowed", join_path(path))
        }
        _ => format!("{subject}: {error}"),
    }
}

/// `anyOf`/`oneOf` with no match. When every alternative only failed on its
/// type, the types are listed ("must be a string or an integer"); otherwise
/// the problem of the closest alternative is given.
fn any_of(subject: &str, context: &[Vec<ValidationError<'static>>], schema: &Value) -> String {
    let mut types = Vec::new();
    for branch in context {
        match branch.as_slice() {
            [only] => match only.kind() {
                ValidationErrorKind::Type {
                    kind: TypeKind::Single(t),
                } => types.push(type_words(*t)),
                ValidationErrorKind::Type {
                    kind: TypeKind::Multiple(set),
                } => types.extend(set.iter().map(type_words)),
                _ => {
                    types.clear();
                    break;
                }
            },
            _ => {
                types.clear();
                break;
            }
        }
    }
    if !types.is_empty() {
        types.dedup();
        return format!("{subject} must be {}", types.join(" or "));
    }
    match context
        .iter()
        .filter(|branch| !branch.is_empty())
        .min_by_key(|branch| branch.len())
    {
        Some(closest) => format!(
            "{subject} does not match any allowed form; for example: {}",
            describe(&closest[0], schema)
        ),
        None => format!("{subject} does not match any allowed form"),
    }
}

/// The names a model may use where it used an unknown one, from the
/// `properties` beside the `additionalProperties` that refused it.
fn known_properties(schema: &Value, error: &ValidationError<'_>) -> Option<String> {
    let keyword_path = error.schema_path().as_str();
    let parent = keyword_path
        .rsplit_once('/')
        .map_or("", |(parent, _)| parent);
    let properties = schema.pointer(parent)?.get("properties")?.as_object()?;
    if properties.is_empty() {
        return None;
    }
    const MAX_NAMES: usize = 12;
    let mut names: Vec<String> = properties
        .keys()
        .take(MAX_NAMES)
        .map(|k| format!("\"{k}\""))
        .collect();
    if properties.len() > MAX_NAMES {
        names.push("…".to_string());
    }
    Some(names.join(", "))
}

/// How a message refers to the value at `path`.
fn subject(path: &Location) -> String {
    if path.is_empty() {
        "the arguments".to_string()
    } else {
        format!("argument \"{}\"", join_path(path))
    }
}

/// `order.items[0].id` for the JSON pointer `/order/items/0/id`.
fn join_path(path: &Location) -> String {
    let mut out = String::new();
    for segment in path.segments() {
        match segment {
            LocationSegment::Property(name) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(&name);
            }
            LocationSegment::Index(index) => out.push_str(&format!("[{index}]")),
        }
    }
    out
}

/// The path of a property `name` of the object at `path`.
fn join(path: &Location, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{}.{name}", join_path(path))
    }
}

fn type_words(t: JsonType) -> &'static str {
    match t {
        JsonType::Array => "a list",
        JsonType::Boolean => "true or false",
        JsonType::Integer => "an integer",
        JsonType::Null => "null",
        JsonType::Number => "a number",
        JsonType::Object => "an object",
        JsonType::String => "a string",
    }
}

/// A value as JSON, cut short for a message.
fn show(value: &Value) -> String {
    const MAX_CHARS: usize = 40;
    let text = value.to_string();
    match text.char_indices().nth(MAX_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// Up to ten values, comma-separated.
fn list(items: &[Value]) -> String {
    const MAX_ITEMS: usize = 10;
    let mut shown: Vec<String> = items.iter().take(MAX_ITEMS).map(show).collect();
    if items.len() > MAX_ITEMS {
        shown.push("…".to_string());
    }
    shown.join(", ")
}

fn plural(n: u64, noun: &str) -> String {
    if n == 1 {
        noun.to_string()
    } else {
        format!("{noun}s")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn shop_schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "product_id": {"type": "string"},
                "quantity": {"type": "integer", "minimum": 1, "maximum": 10},
                "category": {"enum": ["tents", "backpacks"]},
                "note": {"type": "string", "minLength": 2, "maxLength": 5},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 1, "uniqueItems": true},
                "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
                "gift": {"type": ["boolean", "null"]},
                "size": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
                "order": {
                    "type": "object",
                    "properties": {
                        "items": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {"id": {"type": "string"}},
                                "required": ["id"],
                            },
                        },
                    },
                },
            },
            "required": ["product_id"],
            "additionalProperties": false,
        })
    }

    #[test]
    fn accepts_valid_arguments() {
        let cases = [
            json!({"product_id": "p-1"}),
            json!({"product_id": "p-1", "quantity": 2, "category": "tents", "gift": null}),
            json!({"product_id": "p-1", "size": 3, "order": {"items": [{"id": "a"}]}}),
        ];
        for arguments in cases {
            assert_eq!(
                validate_args(&shop_schema(), &arguments),
                Ok(()),
                "{arguments}"
            );
        }
    }

    #[test]
    fn names_the_argument_and_what_was_expected() {
        let cases = [
            (
                json!({"product_id": "p", "quantity": "two"}),
                r#"argument "quantity" must be an integer, got "two""#,
            ),
            (json!({}), r#"missing required argument "product_id""#),
            (
                json!({"product_id": "p", "category": "boats"}),
                r#"argument "category" must be one of "tents", "backpacks""#,
            ),
            (
                json!({"product_id": "p", "colour": "red"}),
                r#"unknown argument "colour" (known: "product_id", "quantity", "category", "note", "tags", "code", "gift", "size", "order")"#,
            ),
            (
                json!({"product_id": "p", "quantity": 0}),
                r#"argument "quantity" must be at least 1"#,
            ),
            (
                json!({"product_id": "p", "quantity": 11}),
                r#"argument "quantity" must be at most 10"#,
            ),
            (
                json!({"product_id": "p", "note": "x"}),
                r#"argument "note" must be at least 2 characters"#,
            ),
            (
                json!({"product_id": "p", "note": "xxxxxx"}),
                r#"argument "note" must be at most 5 characters"#,
            ),
            (
                json!({"product_id": "p", "tags": ["a", "b"]}),
                r#"argument "tags" must have at most 1 item"#,
            ),
            (
                json!({"product_id": "p", "tags": [1]}),
                r#"argument "tags[0]" must be a string, got 1"#,
            ),
            (
                json!({"product_id": "p", "code": "abc"}),
                r#"argument "code" must match the pattern ^[A-Z]{3}$, got "abc""#,
            ),
            (
                json!({"product_id": "p", "gift": "yes"}),
                r#"argument "gift" must be true or false or null, got "yes""#,
            ),
            (
                json!({"product_id": "p", "size": 1.5}),
                r#"argument "size" must be a string or an integer"#,
            ),
            (
                json!({"product_id": "p", "order": {"items": [{"id": 7}, {}]}}),
                r#"argument "order.items[0].id" must be a string, got 7; missing required argument "order.items[1].id""#,
            ),
            (
                json!("p-1"),
                r#"the arguments must be an object, got "p-1""#,
            ),
        ];
        for (arguments, message) in cases {
            assert_eq!(
                validate_args(&shop_schema(), &arguments),
                Err(ArgsError::Invalid(message.to_string())),
                "{arguments}"
            );
        }
    }

    #[test]
    fn caps_the_number_of_problems() {
        let arguments = json!({"quantity": "x", "category": 1, "note": 2, "code": 3});
        let Err(ArgsError::Invalid(message)) = validate_args(&shop_schema(), &arguments) else {
            panic!("expected an error");
        };
        assert_eq!(message.split("; ").count(), MAX_ERRORS, "{message}");
    }

    #[test]
    fn objects_are_required_when_the_schema_lists_properties() {
        let schema = json!({"properties": {"q": {"type": "string"}}});
        let cases = [
            (json!({"q": "x"}), Ok(())),
            (
                json!([]),
                Err(ArgsError::Invalid(
                    "the arguments must be an object, got []".into(),
                )),
            ),
            (
                json!(null),
                Err(ArgsError::Invalid(
                    "the arguments must be an object, got null".into(),
                )),
            ),
        ];
        for (arguments, expected) in cases {
            assert_eq!(validate_args(&schema, &arguments), expected, "{arguments}");
        }
        // A schema that constrains nothing accepts anything.
        assert_eq!(validate_args(&json!({}), &json!("x")), Ok(()));
    }

    #[test]
    fn refuses_invalid_schemas() {
        let cases = [
            json!({"type": "whatever"}),
            json!({"properties": {"q": {"minimum": "one"}}}),
            json!({"$ref": "#/definitions/missing"}),
        ];
        for schema in cases {
            let result = validate_args(&schema, &json!({}));
            assert!(
                matches!(result, Err(ArgsError::BadSchema(_))),
                "{schema}: {result:?}"
            );
        }
    }

    #[test]
    fn the_cache_compiles_each_schema_once() {
        let cache = ValidatorCache::new();
        let schema = shop_schema();
        let first = cache.get(&schema).expect("compiles");
        let second = cache.get(&schema.clone()).expect("compiles");
        assert!(Arc::ptr_eq(&first, &second));
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.validate(&schema, &json!({"product_id": "p"})), Ok(()));
        assert_eq!(
            cache.validate(&schema, &json!({})),
            Err(ArgsError::Invalid(
                "missing required argument \"product_id\"".into()
            ))
        );
        assert!(matches!(
            cache.validate(&json!({"type": 1}), &json!({})),
            Err(ArgsError::BadSchema(_))
        ));
        assert_eq!(cache.len(), 1, "bad schemas are not cached");
    }

    #[test]
    fn paths_read_like_code() {
        let cases = [
            ("", ""),
            ("/quantity", "quantity"),
            ("/order/items/0/id", "order.items[0].id"),
            ("/0/1", "[0][1]"),
            ("/a~1b", "a/b"),
        ];
        for (pointer, expected) in cases {
            let location: Location = pointer
                .split('/')
                .filter(|s| !s.is_empty())
                .map(|s| match s.parse::<usize>() {
                    Ok(i) => LocationSegment::Index(i),
                    Err(_) => LocationSegment::Property(s.replace("~1", "/").into()),
                })
                .collect();
            assert_eq!(join_path(&location), expected, "{pointer}");
        }
    }
}
