//! The Berkeley Function Calling Leaderboard's data: loading its records,
//! turning its schema dialect into JSON Schema, and scoring calls the way its
//! AST checker does.
//!
//! A data file holds one JSON record a line (`id`, `question`, `function`);
//! its `possible_answer/` twin holds the ground truth: for every expected
//! call, each argument's allowed values (`""` among them means the argument
//! may be left out). A file without an answer file is scored as
//! irrelevance (the right reply is no call at all), except a relevance
//! category (`live_relevance`: a file whose name ends in `relevance` but not
//! `irrelevance`), where any call is right: BFCL checks there only that the
//! model saw a tool could serve the request.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use wma_agent::{ChatMessage, ToolDefinition};

// The conversion is a file of its own, needing nothing but serde_json, so
// that the grammar's schema sweep (crates/provider-ort/tests/schema_validity.rs)
// converts BFCL's schemas with this very code.
mod schema;

pub use schema::{TYPE_NAMES, to_json_schema};

/// One evaluation record.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// The record's id (`simple_python_0`).
    pub id: String,
    /// The conversation: the first turn's messages.
    pub messages: Vec<ChatMessage>,
    /// The functions offered, as tools with JSON Schemas.
    pub tools: Vec<ToolDefinition>,
    /// What the right reply is.
    pub expected: Expected,
}

/// What a record's right reply is.
#[derive(Debug, Clone, PartialEq)]
pub enum Expected {
    /// These calls, each argument among its allowed values.
    Calls(Vec<ExpectedCall>),
    /// No call at all (irrelevance: no tool fits).
    NoCall,
    /// At least one call, whatever it is (relevance: a tool fits).
    AnyCall,
}

impl Expected {
    /// How a category of such records is scored, for tables.
    pub fn kind(&self) -> &'static str {
        match self {
            Expected::Calls(_) => "exact call",
            Expected::NoCall => "irrelevance",
            Expected::AnyCall => "relevance",
        }
    }
}

/// One expected call: the function and, per argument, the allowed values.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpectedCall {
    /// Function name.
    pub name: String,
    /// Argument → allowed values (`""` allows leaving it out).
    pub arguments: Map<String, Value>,
}

/// Errors reading evaluation data.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// A file could not be read.
    #[error("could not read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A line is not a record.
    #[error("{path}, line {line}: {reason}")]
    Record {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
}

/// The default categories of `wma eval bfcl`.
pub const DEFAULT_CATEGORIES: [&str; 4] = ["simple_python", "multiple", "parallel", "irrelevance"];

/// The data file of a category in a BFCL data folder.
pub fn category_file(dir: &Path, category: &str) -> PathBuf {
    dir.join(format!("BFCL_v4_{category}.json"))
}

/// The data files a run scores, each with its name: the files of
/// `categories` in `dir` (of [`DEFAULT_CATEGORIES`] when neither
/// categories nor files are given), then `files`, each named by its stem.
/// A category without its file in `dir` is an error.
pub fn sources(
    dir: &Path,
    categories: &[String],
    files: &[PathBuf],
) -> Result<Vec<(String, PathBuf)>, String> {
    let mut sources: Vec<(String, PathBuf)> = Vec::new();
    let categories: Vec<String> = if categories.is_empty() && files.is_empty() {
        DEFAULT_CATEGORIES.iter().map(|c| c.to_string()).collect()
    } else {
        categories.to_vec()
    };
    for category in categories {
        let file = category_file(dir, &category);
        if !file.exists() {
            return Err(format!(
                "no data for category {category} at {} (run scripts/setup.sh, or pass --data)",
                file.display()
            ));
        }
        sources.push((category, file));
    }
    for file in files {
        let name = file
            .file_stem()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_default();
        sources.push((name, file.clone()));
    }
    Ok(sources)
}

/// Loads a data file and, when it exists, its `possible_answer/` twin.
pub fn load(data: &Path) -> Result<Vec<Record>, DataError> {
    let answers_path = data.parent().map(|d| {
        d.join("possible_answer")
            .join(data.file_name().unwrap_or_default())
    });
    let answers: Option<Vec<(String, Value)>> = match answers_path.filter(|p| p.exists()) {
        Some(path) => Some(
            lines(&path)?
                .into_iter()
                .map(|(_, v)| {
                    (
                        v["id"].as_str().unwrap_or("").to_string(),
                        v["ground_truth"].clone(),
                    )
                })
                .collect(),
        ),
        None => None,
    };
    let stem = data
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default()
        .to_lowercase();
    let relevance = stem.ends_with("relevance") && !stem.ends_with("irrelevance");
    let mut records = Vec::new();
    for (line, value) in lines(data)? {
        let bad = |reason: &str| DataError::Record {
            path: data.to_path_buf(),
            line,
            reason: reason.to_string(),
        };
        let id = value["id"]
            .as_str()
            .ok_or_else(|| bad("no id"))?
            .to_string();
        let turns = value["question"]
            .get(0)
            .and_then(Value::as_array)
            .ok_or_else(|| bad("no question"))?;
        let messages = turns
            .iter()
            .filter_map(|m| {
                let content = m["content"].as_str()?.to_string();
                Some(match m["role"].as_str()? {
                    "assistant" => ChatMessage::assistant(content),
                    _ => ChatMessage::user(content),
                })
            })
            .collect();
        let tools = value["function"]
            .as_array()
            .ok_or_else(|| bad("no function list"))?
            .iter()
            .map(|f| {
                ToolDefinition::new(
                    f["name"].as_str().unwrap_or_default(),
                    f["description"].as_str().unwrap_or_default(),
                    to_json_schema(&f["parameters"]),
                )
            })
            .collect();
        let expected = match &answers {
            None if relevance => Expected::AnyCall,
            None => Expected::NoCall,
            Some(answers) => {
                let truth = answers
                    .iter()
                    .find(|(aid, _)| *aid == id)
                    .map(|(_, t)| t)
                    .ok_or_else(|| bad("no ground truth for this id"))?;
                Expected::Calls(
                    expected_calls(truth).ok_or_else(|| bad("unreadable ground truth"))?,
                )
            }
        };
        records.push(Record {
            id,
            messages,
            tools,
            expected,
        });
    }
    Ok(records)
}

fn lines(path: &Path) -> Result<Vec<(usize, Value)>, DataError> {
    let text = std::fs::read_to_string(path).map_err(|source| DataError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map(|v| (i + 1, v))
                .map_err(|e| DataError::Record {
                    path: path.to_path_buf(),
                    line: i + 1,
                    reason: e.to_string(),
                })
        })
        .collect()
}

fn expected_calls(truth: &Value) -> Option<Vec<ExpectedCall>> {
    truth
        .as_array()?
        .iter()
        .map(|call| {
            let (name, arguments) = call.as_object()?.iter().next()?;
            Some(ExpectedCall {
                name: name.clone(),
                arguments: arguments.as_object()?.clone(),
            })
        })
        .collect()
}

/// A call as the model made it.
#[derive(Debug, Clone, PartialEq)]
pub struct MadeCall {
    /// Function name.
    pub name: String,
    /// Arguments.
    pub arguments: Value,
}

/// Scores the calls of one record as BFCL's checker does: the same number of
/// calls as expected, each matched (in any order) to one expected call with
/// the same name, no argument the ground truth does not know, every argument
/// that may not be left out present, and every value among the allowed ones.
/// For irrelevance the right answer is no call; for relevance, any call.
pub fn score(made: &[MadeCall], expected: &Expected) -> bool {
    let expected = match expected {
        Expected::Calls(calls) => calls,
        Expected::NoCall => return made.is_empty(),
        Expected::AnyCall => return !made.is_empty(),
    };
    if made.len() != expected.len() {
        return false;
    }
    let mut used = vec![false; made.len()];
    for want in expected {
        let found = made
            .iter()
            .enumerate()
            .position(|(i, call)| !used[i] && call_matches(call, want));
        match found {
            Some(i) => used[i] = true,
            None => return false,
        }
    }
    true
}

fn call_matches(call: &MadeCall, want: &ExpectedCall) -> bool {
    if call.name != want.name {
        return false;
    }
    let empty = Map::new();
    let args = call.arguments.as_object().unwrap_or(&empty);
    if args.keys().any(|k| !want.arguments.contains_key(k)) {
        return false;
    }
    want.arguments.iter().all(|(name, allowed)| {
        let allowed = allowed
            .as_array()
            .cloned()
            .unwrap_or_else(|| vec![allowed.clone()]);
        match args.get(name) {
            None => allowed.iter().any(|v| v == ""),
            Some(value) => allowed.iter().any(|a| value_matches(value, a)),
        }
    })
}

/// BFCL's comparison: strings ignoring case, spaces and `,./-_*^`; an
/// integer where a float is allowed; lists element by element; objects key
/// by key, each against its own allowed values.
fn value_matches(value: &Value, allowed: &Value) -> bool {
    match (value, allowed) {
        (Value::String(a), Value::String(b)) => normalize(a) == normalize(b),
        (Value::Number(a), Value::Number(b)) => match (a.as_f64(), b.as_f64()) {
            (Some(x), Some(y)) => (x - y).abs() < 1e-9,
            _ => false,
        },
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| value_matches(x, y))
        }
        (Value::Object(a), Value::Object(b)) => {
            a.keys().all(|k| b.contains_key(k))
                && b.iter().all(|(k, options)| {
                    let options = options
                        .as_array()
                        .cloned()
                        .unwrap_or_else(|| vec![options.clone()]);
                    match a.get(k) {
                        None => options.iter().any(|o| o == ""),
                        Some(v) => options.iter().any(|o| value_matches(v, o)),
                    }
                })
        }
        (a, b) => a == b,
    }
}

fn normalize(s: &str) -> String {
    s.chars()
        .filter(|c| !matches!(c, ' ' | ',' | '.' | '/' | '-' | '_' | '*' | '^'))
        .flat_map(char::to_lowercase)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn want(name: &str, args: Value) -> ExpectedCall {
        ExpectedCall {
            name: name.into(),
            arguments: args.as_object().unwrap().clone(),
        }
    }

    fn made(name: &str, args: Value) -> MadeCall {
        MadeCall {
            name: name.into(),
            arguments: args,
        }
    }

    #[test]
    fn schema_dialect_becomes_json_schema() {
        let bfcl = json!({"type": "dict", "properties": {
            "x": {"type": "float"}, "pair": {"type": "tuple", "items": {"type": "integer"}},
            "opts": {"type": "dict", "properties": {"any": {"type": "any"}}}}, "required": ["x"]});
        assert_eq!(
            to_json_schema(&bfcl),
            json!({"type": "object", "properties": {
                "x": {"type": "number"}, "pair": {"type": "array", "items": {"type": "integer"}},
                "opts": {"type": "object", "properties": {"any": {"type": "string"}}}}, "required": ["x"]})
        );
    }

    #[test]
    fn java_and_javascript_type_names_become_json_schema() {
        let bfcl = json!({"type": "dict", "properties": {
            "name": {"type": "String"}, "limit": {"type": "long"}, "ok": {"type": "Boolean"},
            "tags": {"type": "ArrayList", "items": {"type": "String"}},
            "params": {"type": "HashMap"}, "x": {"type": "double"}, "blank": {"type": ""}}});
        assert_eq!(
            to_json_schema(&bfcl),
            json!({"type": "object", "properties": {
                "name": {"type": "string"}, "limit": {"type": "integer"}, "ok": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "params": {"type": "object"}, "x": {"type": "number"}, "blank": {}}})
        );
    }

    #[test]
    fn scoring_follows_the_checker() {
        let truth = [want(
            "area",
            json!({"base": [10], "height": [5], "unit": ["units", ""]}),
        )];
        let cases = [
            (vec![made("area", json!({"base": 10, "height": 5}))], true),
            (
                vec![made(
                    "area",
                    json!({"base": 10.0, "height": 5, "unit": "Units"}),
                )],
                true,
            ),
            (vec![made("area", json!({"base": 10}))], false),
            (vec![made("area", json!({"base": 10, "height": 6}))], false),
            (
                vec![made(
                    "area",
                    json!({"base": 10, "height": 5, "colour": "red"}),
                )],
                false,
            ),
            (
                vec![made("volume", json!({"base": 10, "height": 5}))],
                false,
            ),
            (vec![], false),
        ];
        let truth = Expected::Calls(truth.to_vec());
        for (calls, ok) in cases {
            assert_eq!(score(&calls, &truth), ok, "{calls:?}");
        }
    }

    #[test]
    fn parallel_calls_match_in_any_order_irrelevance_wants_none_and_relevance_any() {
        let truth = [
            want(
                "play",
                json!({"artist": ["Taylor Swift"], "duration": [20]}),
            ),
            want("play", json!({"artist": ["Maroon 5"], "duration": [15]})),
        ];
        let calls = [
            made("play", json!({"artist": "maroon 5", "duration": 15})),
            made("play", json!({"artist": "taylor swift", "duration": 20})),
        ];
        let truth = Expected::Calls(truth.to_vec());
        assert!(score(&calls, &truth));
        assert!(!score(&calls[..1], &truth));
        assert!(score(&[], &Expected::NoCall));
        assert!(!score(&calls[..1], &Expected::NoCall));
        assert!(score(&calls[..1], &Expected::AnyCall));
        assert!(!score(&[], &Expected::AnyCall));
    }

    #[test]
    fn loads_a_data_file_with_its_answers() {
        let dir = std::env::temp_dir().join(format!("wma-bfcl-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("possible_answer")).unwrap();
        let data = dir.join("BFCL_v4_tiny.json");
        std::fs::write(&data, r#"{"id": "t0", "question": [[{"role": "user", "content": "Area of 10 by 5?"}]], "function": [{"name": "area", "description": "Area.", "parameters": {"type": "dict", "properties": {"base": {"type": "integer"}}, "required": ["base"]}}]}"#).unwrap();
        std::fs::write(
            dir.join("possible_answer/BFCL_v4_tiny.json"),
            r#"{"id": "t0", "ground_truth": [{"area": {"base": [10]}}]}"#,
        )
        .unwrap();
        let records = load(&data).unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].tools[0].input_schema["type"], "object");
        assert!(matches!(&records[0].expected, Expected::Calls(c) if c[0].name == "area"));
        std::fs::remove_file(dir.join("possible_answer/BFCL_v4_tiny.json")).unwrap();
        assert_eq!(
            load(&data).unwrap()[0].expected,
            Expected::NoCall,
            "no answer file: irrelevance"
        );
        // A relevance category wants any call; an irrelevance one, none.
        for (name, expected) in [
            ("BFCL_v4_live_relevance.json", Expected::AnyCall),
            ("BFCL_v4_live_irrelevance.json", Expected::NoCall),
        ] {
            std::fs::copy(&data, dir.join(name)).unwrap();
            assert_eq!(
                load(&dir.join(name)).unwrap()[0].expected,
                expected,
                "{name}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
