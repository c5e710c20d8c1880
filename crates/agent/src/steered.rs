//! The decoding's pulls as rule events: where a constrained generation's
//! call threshold (or the neutral baseline that held it back), copy bias, avoided names, finish of a cut call or limits
//! changed what the model wrote, the loop reports the rule that asked for
//! it, as it reports every other rule. The provider says where a pull
//! changed the model's first choice ([`Steered`]); the limits are read
//! from the reply itself, where a value or the reply reached one.

use serde_json::Value;

use crate::parse::ParsedReply;
use crate::policy::{Fired, Rule};
use crate::provider::{Decoding, Generation, Steered};
use crate::tool::ToolDefinition;

/// The rule events of one constrained attempt's decoding: `generation` as
/// the provider reported it, under `decoding`, read as `reply`, whose calls
/// name tools of `offered`. `prompt_names` says whether the avoided names
/// were the prompt's names (`Policy::no_prompt_names_in_values`) or only
/// the worked example's placeholders (every policy).
pub(crate) fn decoding_events(
    generation: &Generation,
    decoding: &Decoding,
    reply: &ParsedReply,
    offered: &[ToolDefinition],
    prompt_names: bool,
) -> Vec<Fired> {
    let mut fired = Vec::new();
    // A push of the call threshold that the neutral baseline held back.
    if let (Some(p), Some(neutral), Some(threshold)) = (
        generation.call_probability,
        generation.call_baseline,
        decoding.call_threshold,
    ) && p >= threshold
        && p < neutral
    {
        fired.push(Fired {
            rule: Rule::CallBaseline,
            detail: format!(
                "no push to a call: it had {:.2}%, and {:.2}% without the request's words",
                p * 100.0,
                neutral * 100.0
            ),
        });
    }
    let Steered {
        call_threshold,
        copy_bias,
        avoided_names,
        finished_cut_call,
    } = generation.steered;
    if call_threshold {
        fired.push(Fired {
            rule: Rule::CallThreshold,
            detail: format!(
                "a call where the model ranked prose first: it gave a call {:.2}%",
                generation.call_probability.unwrap_or_default() * 100.0
            ),
        });
    }
    if copy_bias > 0 {
        fired.push(Fired {
            rule: Rule::CopyBias,
            detail: format!("it chose {copy_bias} token(s) of the arguments over the model's own"),
        });
    }
    if avoided_names > 0 {
        fired.push(Fired {
            rule: if prompt_names {
                Rule::NoPromptNamesInValues
            } else {
                Rule::NoPlaceholderValues
            },
            detail: format!(
                "it kept {avoided_names} token(s) of a value from beginning with a name of the prompt"
            ),
        });
    }
    if finished_cut_call > 0 {
        fired.push(Fired {
            rule: Rule::FinishCutCalls,
            detail: format!("the token limit cut a call: {finished_cut_call} token(s) finished it"),
        });
    }
    let mut strings = 0;
    let mut arrays = 0;
    for call in &reply.calls {
        let schema = offered
            .iter()
            .find(|t| t.name == call.name)
            .map_or(&Value::Null, |t| &t.input_schema);
        count_limits(&call.arguments, schema, decoding, &mut strings, &mut arrays);
    }
    if strings > 0
        && let Some(max) = decoding.max_string_chars
    {
        fired.push(Fired {
            rule: Rule::MaxStringChars,
            detail: format!("{strings} string argument(s) reached {max} characters"),
        });
    }
    if arrays > 0
        && let Some(max) = decoding.max_array_items
    {
        fired.push(Fired {
            rule: Rule::MaxArrayItems,
            detail: format!("{arrays} array argument(s) reached {max} items"),
        });
    }
    if let Some(max) = decoding.max_calls
        && reply.calls.len() >= max as usize
        && max > 0
    {
        fired.push(Fired {
            rule: Rule::MaxCalls,
            detail: format!("the reply held {max} calls, as many as one may"),
        });
    }
    fired
}

/// Counts the strings and arrays of `value` that reached the decoding's
/// limits where `schema` sets none of its own (`maxLength`, `maxItems`):
/// there the grammar closed them, not the model.
fn count_limits(
    value: &Value,
    schema: &Value,
    decoding: &Decoding,
    strings: &mut usize,
    arrays: &mut usize,
) {
    match value {
        Value::String(s)
            if schema.get("maxLength").is_none()
                && decoding
                    .max_string_chars
                    .is_some_and(|max| s.chars().count() >= max as usize) =>
        {
            *strings += 1;
        }
        Value::Array(items) => {
            if schema.get("maxItems").is_none()
                && decoding
                    .max_array_items
                    .is_some_and(|max| items.len() >= max as usize)
            {
                *arrays += 1;
            }
            let item_schema = schema.get("items").unwrap_or(&Value::Null);
            for item in items {
                count_limits(item, item_schema, decoding, strings, arrays);
            }
        }
        Value::Object(map) => {
            for (key, v) in map {
                let sub = schema
                    .get("properties")
                    .and_then(|p| p.get(key))
                    .unwrap_or(&Value::Null);
                count_limits(v, sub, decoding, strings, arrays);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse_tool_calls;
    use serde_json::json;

    fn tool(schema: Value) -> ToolDefinition {
        ToolDefinition::new("note", "Writes a note.", schema)
    }

    fn limits() -> Decoding {
        Decoding {
            max_string_chars: Some(5),
            max_array_items: Some(2),
            max_calls: Some(2),
            ..Decoding::default()
        }
    }

    fn rules(fired: &[Fired]) -> Vec<&'static str> {
        fired.iter().map(|f| f.rule.as_str()).collect()
    }

    #[test]
    fn each_pull_the_provider_reports_is_its_rules_event() {
        let generation = Generation {
            call_probability: Some(0.01),
            steered: Steered {
                call_threshold: true,
                copy_bias: 3,
                avoided_names: 1,
                finished_cut_call: 4,
            },
            ..Generation::default()
        };
        let reply = parse_tool_calls("{\"name\": \"note\", \"arguments\": {\"text\": \"hi\"}}");
        let offered = [tool(json!({"properties": {"text": {"type": "string"}}}))];
        let fired = decoding_events(&generation, &limits(), &reply, &offered, true);
        assert_eq!(
            rules(&fired),
            [
                "call-threshold",
                "copy-bias",
                "no-prompt-names-in-values",
                "finish-cut-calls"
            ]
        );
        assert!(fired[0].detail.contains("1.00%"), "{}", fired[0].detail);
        let fired = decoding_events(&generation, &limits(), &reply, &offered, false);
        assert_eq!(fired[2].rule.as_str(), "no-placeholder-values");
    }

    #[test]
    fn limits_are_events_where_a_value_reached_them_and_the_schema_set_none() {
        let offered = [tool(json!({"properties": {
            "text": {"type": "string"},
            "title": {"type": "string", "maxLength": 5},
            "tags": {"type": "array", "items": {"type": "string"}}
        }}))];
        let reply = parse_tool_calls(
            "{\"name\": \"note\", \"arguments\": {\"text\": \"hello\", \"title\": \"hello\", \"tags\": [\"a\", \"b\"]}}\n\
             {\"name\": \"note\", \"arguments\": {\"text\": \"hi\"}}",
        );
        assert_eq!(reply.calls.len(), 2);
        let fired = decoding_events(&Generation::default(), &limits(), &reply, &offered, true);
        assert_eq!(
            rules(&fired),
            ["max-string-chars", "max-array-items", "max-calls"]
        );
        // One string reached the limit: `title` has a bound of its own.
        assert!(
            fired[0].detail.starts_with("1 string"),
            "{}",
            fired[0].detail
        );
    }

    #[test]
    fn a_reply_short_of_every_limit_that_nothing_steered_reports_nothing() {
        let offered = [tool(json!({"properties": {"text": {"type": "string"}}}))];
        let reply = parse_tool_calls("{\"name\": \"note\", \"arguments\": {\"text\": \"hey\"}}");
        let fired = decoding_events(&Generation::default(), &limits(), &reply, &offered, true);
        assert!(fired.is_empty(), "{fired:?}");
        // Without limits, nothing is reached.
        let reply = parse_tool_calls(
            "{\"name\": \"note\", \"arguments\": {\"text\": \"a long enough text\"}}",
        );
        let fired = decoding_events(
            &Generation::default(),
            &Decoding::default(),
            &reply,
            &offered,
            true,
        );
        assert!(fired.is_empty(), "{fired:?}");
    }
}
