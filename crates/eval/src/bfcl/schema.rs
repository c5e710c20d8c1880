//! BFCL's schema dialect as JSON Schema.
//!
//! This file needs nothing but `serde_json`: the evaluation declares it as
//! a module (`wma eval bfcl` converts every record's functions with it), and
//! the provider's grammar sweep (`crates/provider-ort/tests/schema_validity.rs`)
//! includes it by path, so both convert the same schemas the same way.

use serde_json::{Map, Value};

/// BFCL's type names and the JSON Schema type each stands for: Python's
/// (`dict`, `float`, `tuple`, ...) and, for the Java and JavaScript
/// categories, those languages' (`String`, `HashMap`, `long`, `Boolean`,
/// ...). `any` is a string: BFCL passes such values as their source text.
pub const TYPE_NAMES: &[(&str, &str)] = &[
    ("dict", "object"),
    ("HashMap", "object"),
    ("float", "number"),
    ("double", "number"),
    ("tuple", "array"),
    ("list", "array"),
    ("Array", "array"),
    ("ArrayList", "array"),
    ("any", "string"),
    ("str", "string"),
    ("String", "string"),
    ("char", "string"),
    ("int", "integer"),
    ("long", "integer"),
    ("bool", "boolean"),
    ("Boolean", "boolean"),
];

/// BFCL's schema dialect as JSON Schema: its type names become JSON
/// Schema's ([`TYPE_NAMES`]), recursively; an empty type is no type.
pub fn to_json_schema(schema: &Value) -> Value {
    let Value::Object(map) = schema else {
        return schema.clone();
    };
    let mut out = Map::new();
    for (key, value) in map {
        let converted = match key.as_str() {
            "type" if value.as_str() == Some("") => continue,
            "type" => match value.as_str() {
                Some(name) => TYPE_NAMES
                    .iter()
                    .find(|(bfcl, _)| *bfcl == name)
                    .map_or_else(|| value.clone(), |(_, json)| Value::from(*json)),
                None => value.clone(),
            },
            "properties" => match value {
                Value::Object(props) => Value::Object(
                    props
                        .iter()
                        .map(|(k, v)| (k.clone(), to_json_schema(v)))
                        .collect(),
                ),
                other => other.clone(),
            },
            "items" | "additionalProperties" => to_json_schema(value),
            // BFCL writes optional defaults as strings of Python values;
            // JSON Schema's `default` is informational, so drop it.
            "default" | "optional" => continue,
            _ => value.clone(),
        };
        out.insert(key.clone(), converted);
    }
    Value::Object(out)
}
