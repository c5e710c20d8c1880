//! The OpenAI chat-completion API as this provider writes and reads it:
//! the request body, the answer, and llama.cpp's additions (`timings`,
//! `/props`, `/tokenize`, `/apply-template`).

use serde::Deserialize;
use serde_json::{Map, Value, json};
use wma_agent::{
    Constraint, Decoding, PromptMessage, PromptRole, ToolDefinition, parse_tool_calls,
};

use crate::Dialect;
use crate::gbnf;

/// The `tools` array of a request.
pub(crate) fn tools_json(tools: &[ToolDefinition]) -> Value {
    Value::Array(
        tools
            .iter()
            .map(|t| {
                json!({
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.input_schema,
                    }
                })
            })
            .collect(),
    )
}

/// The prompt turns as chat messages.
///
/// With tools in the request (`structured`), an assistant turn's calls,
/// which the loop wrote back as text, become the message's `tool_calls`
/// again, and each tool turn after it answers one of them by id: servers
/// render both with the model's own template, and strict ones refuse a
/// tool message that answers no call. Without tools in the request the
/// turns go as the loop wrote them, calls and all, like the prompt an
/// on-device model gets.
pub(crate) fn messages_json(messages: &[PromptMessage], structured: bool) -> Vec<Value> {
    let mut out = Vec::with_capacity(messages.len());
    // The ids of the latest assistant turn's calls not answered yet.
    let mut pending: std::collections::VecDeque<String> = Default::default();
    let mut next_id = 0usize;
    for message in messages {
        match message.role {
            PromptRole::Assistant if structured => {
                let parsed = parse_tool_calls(&message.content);
                pending.clear();
                if parsed.calls.is_empty() {
                    out.push(json!({"role": "assistant", "content": message.content}));
                    continue;
                }
                let calls: Vec<Value> = parsed
                    .calls
                    .iter()
                    .map(|c| {
                        next_id += 1;
                        let id = format!("call_{next_id}");
                        pending.push_back(id.clone());
                        json!({
                            "id": id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": c.arguments.to_string()},
                        })
                    })
                    .collect();
                let content = if parsed.text.is_empty() {
                    Value::Null
                } else {
                    Value::String(parsed.text)
                };
                out.push(json!({"role": "assistant", "content": content, "tool_calls": calls}));
            }
            PromptRole::Tool if structured => match pending.pop_front() {
                Some(id) => out.push(json!({
                    "role": "tool",
                    "tool_call_id": id,
                    "content": message.content,
                })),
                // A result whose call is no longer in the window (the loop
                // cut the history): told as what it is, in a user turn.
                None => out.push(json!({
                    "role": "user",
                    "content": format!("Tool result:\n{}", message.content),
                })),
            },
            role => out.push(json!({"role": role.as_str(), "content": message.content})),
        }
    }
    out
}

/// A JSON Schema that one call to one of `tools` follows, in the loop's
/// JSON call format (`{"name": ..., "arguments": {...}}`).
pub(crate) fn call_schema(tools: &[ToolDefinition]) -> Value {
    let one: Vec<Value> = tools
        .iter()
        .map(|t| {
            let arguments = if t.input_schema.is_object() {
                t.input_schema.clone()
            } else {
                json!({"type": "object"})
            };
            json!({
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": arguments},
                "required": ["name", "arguments"],
                "additionalProperties": false,
            })
        })
        .collect();
    if one.len() == 1 {
        one.into_iter().next().unwrap_or(Value::Null)
    } else {
        json!({"anyOf": one})
    }
}

/// How a request's constraint is put to the server.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Mapped {
    /// No constraint: the request goes without.
    Ignored,
    /// A constraint this server cannot be held to: the request goes
    /// without, and the provider notes it once per kind (`what` names it,
    /// `why` says why).
    Unsent {
        what: &'static str,
        why: &'static str,
    },
    /// One JSON value following this schema.
    Schema(Value),
    /// A reply following this GBNF grammar.
    Grammar(String),
}

/// Maps a constraint onto what a server of `dialect` takes.
///
/// - "Text or calls" is a GBNF grammar of prose or calls
///   ([`crate::gbnf`]) where the server takes one (llama.cpp, vLLM) and
///   the tools are in the prompt (`structured` false). With the tools in
///   the request, llama.cpp refuses a grammar beside them, and the
///   server's own tool calling decodes the calls (llama.cpp under a lazy
///   grammar of its own), so none is sent.
/// - "Calls only" is a JSON schema of one call in the loop's JSON call
///   format, which every dialect takes: servers turn a schema into a
///   grammar whatever the model's template knows of tools, where
///   `tool_choice: "required"` is dropped by llama.cpp for a template
///   without tools (the default model's).
/// - A JSON-schema constraint is that schema; an llguidance (Lark) grammar
///   is not a dialect servers share, and goes unsent.
pub(crate) fn map_constraint(
    constraint: Option<&Constraint>,
    dialect: Dialect,
    structured: bool,
    decoding: &Decoding,
) -> Mapped {
    match constraint {
        None => Mapped::Ignored,
        Some(Constraint::TextOrCalls { tools }) if tools.is_empty() => Mapped::Ignored,
        Some(Constraint::TextOrCalls { .. }) if structured => Mapped::Unsent {
            what: "text-or-calls",
            why: "the tools go in the request, where the server's own tool calling decodes calls \
                  (llama.cpp takes no grammar beside tools)",
        },
        Some(Constraint::TextOrCalls { tools }) => match dialect {
            Dialect::LlamaCpp | Dialect::Vllm => {
                Mapped::Grammar(gbnf::text_or_calls(tools, true, decoding))
            }
            Dialect::OpenAi => Mapped::Unsent {
                what: "text-or-calls",
                why: "the server takes no grammar, only a JSON schema (response_format), \
                      and prose is no JSON",
            },
        },
        Some(Constraint::CallsOnly { tools }) if tools.is_empty() => Mapped::Ignored,
        Some(Constraint::CallsOnly { tools }) => Mapped::Schema(call_schema(tools)),
        Some(Constraint::JsonSchema { schema }) => Mapped::Schema(schema.clone()),
        Some(Constraint::Grammar { .. }) => Mapped::Unsent {
            what: "grammar",
            why: "an llguidance (Lark) grammar is no dialect servers share",
        },
    }
}

/// Puts a mapped constraint into a request `body` in the fields a server
/// of `dialect` reads. Returns whether something was put there.
pub(crate) fn put_constraint(body: &mut Value, mapped: &Mapped, dialect: Dialect) -> bool {
    match (mapped, dialect) {
        (Mapped::Ignored | Mapped::Unsent { .. }, _) => return false,
        (Mapped::Schema(schema), Dialect::LlamaCpp) => body["json_schema"] = schema.clone(),
        (Mapped::Schema(schema), Dialect::Vllm) => body["guided_json"] = schema.clone(),
        (Mapped::Schema(schema), Dialect::OpenAi) => {
            body["response_format"] = response_format(schema)
        }
        (Mapped::Grammar(grammar), Dialect::LlamaCpp) => body["grammar"] = json!(grammar),
        (Mapped::Grammar(grammar), Dialect::Vllm) => body["guided_grammar"] = json!(grammar),
        // `map_constraint` makes no grammar for a server that takes none.
        (Mapped::Grammar(_), Dialect::OpenAi) => return false,
    }
    true
}

/// `response_format` for a schema.
pub(crate) fn response_format(schema: &Value) -> Value {
    json!({
        "type": "json_schema",
        "json_schema": {"name": "reply", "schema": schema, "strict": true},
    })
}

/// The answer of `/v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub(crate) struct Completion {
    #[serde(default)]
    pub(crate) choices: Vec<Choice>,
    #[serde(default)]
    pub(crate) usage: Option<Usage>,
    /// llama.cpp's own timings.
    #[serde(default)]
    pub(crate) timings: Option<Timings>,
    /// The most likely first tokens and their log probabilities, when the
    /// request asked for them (`top_logprobs`).
    #[serde(skip)]
    pub(crate) first_tokens: Option<Vec<(String, f64)>>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Choice {
    #[serde(default)]
    pub(crate) message: ReplyMessage,
    #[serde(default)]
    pub(crate) finish_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ReplyMessage {
    #[serde(default)]
    pub(crate) content: Option<String>,
    #[serde(default)]
    pub(crate) tool_calls: Vec<WireCall>,
}

/// One call of `tool_calls`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct WireCall {
    #[serde(default)]
    pub(crate) function: WireFunction,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct WireFunction {
    #[serde(default)]
    pub(crate) name: String,
    /// A JSON text by the API's definition; some servers send the object.
    #[serde(default)]
    pub(crate) arguments: Value,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Usage {
    #[serde(default)]
    pub(crate) prompt_tokens: Option<u32>,
    #[serde(default)]
    pub(crate) completion_tokens: Option<u32>,
    #[serde(default)]
    pub(crate) prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct PromptDetails {
    #[serde(default)]
    pub(crate) cached_tokens: Option<u32>,
}

/// llama.cpp's `timings` object.
#[derive(Debug, Deserialize)]
pub(crate) struct Timings {
    /// Prompt tokens taken from the server's cache.
    #[serde(default)]
    pub(crate) cache_n: Option<u32>,
    /// Milliseconds spent on the prompt (the time to the first token).
    #[serde(default)]
    pub(crate) prompt_ms: Option<f64>,
}

/// A streamed answer (`"stream": true`, server-sent events of
/// `chat.completion.chunk`s) put back together as one [`Completion`].
#[derive(Debug, Default)]
pub(crate) struct Assembler {
    content: String,
    /// Calls by their `index`, their fragments joined.
    calls: Vec<(String, String)>,
    finish_reason: Option<String>,
    usage: Option<Usage>,
    timings: Option<Timings>,
    /// The first token's alternatives (`logprobs.content[0].top_logprobs`).
    first_tokens: Option<Vec<(String, f64)>>,
    /// `data: [DONE]` or a finish reason was seen.
    pub(crate) ended: bool,
    /// Something of the reply (text or a call) has arrived.
    pub(crate) started: bool,
    /// The bytes of a line not ended yet.
    partial: Vec<u8>,
}

impl Assembler {
    /// Takes the next bytes of the event stream; an error event is the
    /// server's own words.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.partial.extend_from_slice(bytes);
        while let Some(end) = self.partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            self.line(line.trim())?;
        }
        Ok(())
    }

    fn line(&mut self, line: &str) -> Result<(), String> {
        // Comments, event names and blank separators carry nothing here.
        let Some(data) = line.strip_prefix("data:") else {
            return Ok(());
        };
        let data = data.trim();
        if data == "[DONE]" {
            self.ended = true;
            return Ok(());
        }
        let chunk: Value =
            serde_json::from_str(data).map_err(|e| format!("an event that is not JSON ({e})"))?;
        if let Some(error) = chunk.get("error") {
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| error.to_string());
            return Err(message);
        }
        if let Some(usage) = chunk.get("usage").filter(|u| !u.is_null()) {
            self.usage = serde_json::from_value(usage.clone()).ok();
        }
        if let Some(timings) = chunk.get("timings").filter(|t| !t.is_null()) {
            self.timings = serde_json::from_value(timings.clone()).ok();
        }
        let Some(choice) = chunk.pointer("/choices/0") else {
            return Ok(());
        };
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish_reason = Some(reason.to_string());
            self.ended = true;
        }
        if self.first_tokens.is_none()
            && let Some(top) = choice
                .pointer("/logprobs/content/0/top_logprobs")
                .and_then(Value::as_array)
        {
            self.first_tokens = Some(
                top.iter()
                    .filter_map(|t| {
                        Some((
                            t.get("token")?.as_str()?.to_string(),
                            t.get("logprob")?.as_f64()?,
                        ))
                    })
                    .collect(),
            );
        }
        let Some(delta) = choice.get("delta") else {
            return Ok(());
        };
        if let Some(text) = delta.get("content").and_then(Value::as_str) {
            if !text.is_empty() {
                self.started = true;
            }
            self.content.push_str(text);
        }
        for call in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            self.started = true;
            let index = call
                .get("index")
                .and_then(Value::as_u64)
                .map_or(self.calls.len().saturating_sub(1), |i| i as usize);
            while self.calls.len() <= index {
                self.calls.push(Default::default());
            }
            let (name, arguments) = &mut self.calls[index];
            if let Some(part) = call.pointer("/function/name").and_then(Value::as_str) {
                name.push_str(part);
            }
            match call.pointer("/function/arguments") {
                Some(Value::String(part)) => arguments.push_str(part),
                Some(Value::Null) | None => {}
                Some(other) => arguments.push_str(&other.to_string()),
            }
        }
        Ok(())
    }

    /// The answer as one completion.
    pub(crate) fn finish(self) -> Completion {
        let tool_calls = self
            .calls
            .into_iter()
            .map(|(name, arguments)| WireCall {
                function: WireFunction {
                    name,
                    arguments: Value::String(arguments),
                },
            })
            .collect();
        Completion {
            choices: vec![Choice {
                message: ReplyMessage {
                    content: Some(self.content),
                    tool_calls,
                },
                finish_reason: self.finish_reason,
            }],
            usage: self.usage,
            timings: self.timings,
            first_tokens: self.first_tokens,
        }
    }
}

/// How many first tokens a "text or calls" request asks the probabilities
/// of: the OpenAI API's most.
pub(crate) const TOP_FIRST_TOKENS: u32 = 20;

/// The probability the model gave a call at its first token, from the
/// most likely first tokens: the mass of those that open a call (`{`), as
/// the on-device provider measures it over the whole vocabulary. Tokens
/// outside the list are counted as no call, so this is a lower bound.
pub(crate) fn call_probability(first_tokens: &[(String, f64)]) -> f32 {
    let p: f64 = first_tokens
        .iter()
        .filter(|(token, _)| token.starts_with('{'))
        .map(|(_, logprob)| logprob.exp())
        .sum();
    p.clamp(0.0, 1.0) as f32
}

/// Writes the server's calls as the loop's JSON call format reads them:
/// one `{"name": ..., "arguments": ...}` per line. Arguments that are not
/// JSON are written as the server sent them, so the loop reads a malformed
/// call and repairs it as it would an on-device model's.
pub(crate) fn calls_as_text(calls: &[WireCall]) -> String {
    calls
        .iter()
        .map(|call| {
            let name = Value::String(call.function.name.clone());
            let arguments = match &call.function.arguments {
                Value::String(text) => match serde_json::from_str::<Value>(text) {
                    Ok(value) => value.to_string(),
                    Err(_) if text.trim().is_empty() => "{}".to_string(),
                    Err(_) => text.clone(),
                },
                Value::Null => "{}".to_string(),
                other => other.to_string(),
            };
            format!("{{\"name\": {name}, \"arguments\": {arguments}}}")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The calls of an answer as (name, arguments) values, for scoring a
/// server's own tool calling; arguments that are not JSON come back as
/// `None`.
pub(crate) fn calls_as_values(calls: &[WireCall]) -> Vec<(String, Option<Value>)> {
    calls
        .iter()
        .map(|call| {
            let arguments = match &call.function.arguments {
                Value::String(text) if text.trim().is_empty() => Some(Value::Object(Map::new())),
                Value::String(text) => serde_json::from_str(text).ok(),
                Value::Null => Some(Value::Object(Map::new())),
                other => Some(other.clone()),
            };
            (call.function.name.clone(), arguments)
        })
        .collect()
}

/// Who `/v1/models` says owns `model` (or the only model served): vLLM
/// answers `vllm`.
pub(crate) fn models_owner(models: &Value, model: &str) -> Option<String> {
    let list = models.get("data").and_then(Value::as_array)?;
    let entry = list
        .iter()
        .find(|m| m.get("id").and_then(Value::as_str) == Some(model))
        .or(if list.len() == 1 { list.first() } else { None })?;
    entry
        .get("owned_by")
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// The context size a server tells: llama.cpp's `/props`
/// (`default_generation_settings.n_ctx`, or a top-level `n_ctx`).
pub(crate) fn props_context(props: &Value) -> Option<u32> {
    props
        .pointer("/default_generation_settings/n_ctx")
        .or_else(|| props.get("n_ctx"))
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| *n > 0)
}

/// What `/v1/models` tells of `model` (or of the only model served): the
/// context size (vLLM's `max_model_len`) and the parameter count
/// (llama.cpp's `meta.n_params`).
pub(crate) fn models_facts(models: &Value, model: &str) -> (Option<u32>, Option<u64>) {
    let Some(list) = models.get("data").and_then(Value::as_array) else {
        return (None, None);
    };
    let entry = list
        .iter()
        .find(|m| m.get("id").and_then(Value::as_str) == Some(model))
        .or(if list.len() == 1 { list.first() } else { None });
    let Some(entry) = entry else {
        return (None, None);
    };
    let context = entry
        .get("max_model_len")
        .or_else(|| entry.pointer("/meta/n_ctx_train"))
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok());
    let params = entry.pointer("/meta/n_params").and_then(Value::as_u64);
    (context, params)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str) -> ToolDefinition {
        ToolDefinition::new(
            name,
            "a tool",
            json!({"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}),
        )
    }

    #[test]
    fn calls_are_written_in_the_loops_json_format() {
        let calls: Vec<WireCall> = serde_json::from_value(json!([
            {"function": {"name": "search", "arguments": "{\"q\": \"tent\"}"}},
            {"function": {"name": "cart", "arguments": {"id": 3}}},
            {"function": {"name": "broken", "arguments": "{\"q\": "}},
        ]))
        .unwrap();
        let text = calls_as_text(&calls);
        let parsed = parse_tool_calls(&text);
        assert_eq!(parsed.calls.len(), 2, "{text}");
        assert_eq!(parsed.calls[0].name, "search");
        assert_eq!(parsed.calls[0].arguments, json!({"q": "tent"}));
        assert_eq!(parsed.calls[1].arguments, json!({"id": 3}));
        // The broken one is left for the loop's repair, not dropped unseen.
        assert!(parsed.malformed.is_some(), "{text}");
    }

    #[test]
    fn history_calls_go_back_as_tool_calls_with_ids() {
        let messages = vec![
            PromptMessage::new(PromptRole::System, "sys"),
            PromptMessage::new(PromptRole::User, "find a tent"),
            PromptMessage::new(
                PromptRole::Assistant,
                "{\"name\": \"search\", \"arguments\": {\"q\": \"tent\"}}",
            ),
            PromptMessage::new(PromptRole::Tool, "[\"Tent\"]"),
        ];
        let out = messages_json(&messages, true);
        assert_eq!(out[2]["tool_calls"][0]["function"]["name"], "search");
        assert_eq!(out[2]["content"], Value::Null);
        assert_eq!(out[3]["role"], "tool");
        assert_eq!(out[3]["tool_call_id"], out[2]["tool_calls"][0]["id"]);
        // Without tools in the request the turns go as written.
        let plain = messages_json(&messages, false);
        assert_eq!(plain[2]["content"], messages[2].content);
        assert!(plain[2].get("tool_calls").is_none());
    }

    #[test]
    fn constraints_map_onto_what_each_dialect_takes() {
        let tools = vec![tool("search"), tool("cart")];
        let decoding = Decoding::default();
        let text_or_calls = Constraint::TextOrCalls {
            tools: tools.clone(),
        };
        let calls_only = Constraint::CallsOnly {
            tools: tools.clone(),
        };
        let map = |c: Option<&Constraint>, d: Dialect| map_constraint(c, d, false, &decoding);
        for dialect in [Dialect::LlamaCpp, Dialect::Vllm, Dialect::OpenAi] {
            assert_eq!(map(None, dialect), Mapped::Ignored);
            // "Calls only" is a schema of one call everywhere.
            let Mapped::Schema(schema) = map(Some(&calls_only), dialect) else {
                panic!("calls only is a schema");
            };
            assert_eq!(schema["anyOf"][1]["properties"]["name"]["const"], "cart");
            assert!(matches!(
                map(
                    Some(&Constraint::Grammar {
                        lark: "start: /a/".into()
                    }),
                    dialect
                ),
                Mapped::Unsent {
                    what: "grammar",
                    ..
                }
            ));
        }

        // "Text or calls" is a grammar where the server takes one, naming
        // the offered tools.
        for dialect in [Dialect::LlamaCpp, Dialect::Vllm] {
            let Mapped::Grammar(grammar) = map(Some(&text_or_calls), dialect) else {
                panic!("text or calls is a grammar for {dialect:?}");
            };
            assert!(grammar.starts_with("root ::= text | calls\n"), "{grammar}");
            assert!(grammar.contains(r#""\"search\"""#), "{grammar}");
            assert!(grammar.contains(r#""\"cart\"""#), "{grammar}");
        }
        // A server that takes no grammar, and tools in the request, get
        // none, and say why.
        assert!(matches!(
            map(Some(&text_or_calls), Dialect::OpenAi),
            Mapped::Unsent {
                what: "text-or-calls",
                ..
            }
        ));
        assert!(matches!(
            map_constraint(Some(&text_or_calls), Dialect::LlamaCpp, true, &decoding),
            Mapped::Unsent {
                what: "text-or-calls",
                ..
            }
        ));
        assert_eq!(
            map(
                Some(&Constraint::TextOrCalls { tools: vec![] }),
                Dialect::LlamaCpp
            ),
            Mapped::Ignored
        );
    }

    #[test]
    fn each_dialect_reads_its_own_fields() {
        let schema = json!({"type": "object"});
        let put = |mapped: &Mapped, dialect| {
            let mut body = json!({});
            let sent = put_constraint(&mut body, mapped, dialect);
            (sent, body)
        };
        let grammar = Mapped::Grammar("root ::= \"a\"".into());
        let as_schema = Mapped::Schema(schema.clone());
        assert_eq!(
            put(&grammar, Dialect::LlamaCpp),
            (true, json!({"grammar": "root ::= \"a\""}))
        );
        assert_eq!(
            put(&as_schema, Dialect::LlamaCpp),
            (true, json!({"json_schema": schema}))
        );
        assert_eq!(
            put(&grammar, Dialect::Vllm),
            (true, json!({"guided_grammar": "root ::= \"a\""}))
        );
        assert_eq!(
            put(&as_schema, Dialect::Vllm),
            (true, json!({"guided_json": schema}))
        );
        assert_eq!(put(&grammar, Dialect::OpenAi), (false, json!({})));
        let (sent, body) = put(&as_schema, Dialect::OpenAi);
        assert!(sent);
        assert_eq!(body["response_format"]["json_schema"]["schema"], schema);
    }

    #[test]
    fn a_stream_is_put_back_together() {
        let events = concat!(
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"Hel\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"a\",\"function\":{\"name\":\"search\",\"arguments\":\"{\\\"q\\\"\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\": \\\"tent\\\"}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"tool_calls\"}],",
            "\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":7},\"timings\":{\"cache_n\":3,\"prompt_ms\":20.5}}\n\n",
            "data: [DONE]\n\n",
        );
        let mut assembler = Assembler::default();
        // Split anywhere: events arrive in pieces.
        for piece in events.as_bytes().chunks(7) {
            assembler.feed(piece).unwrap();
        }
        assert!(assembler.ended && assembler.started);
        let completion = assembler.finish();
        let choice = &completion.choices[0];
        assert_eq!(choice.message.content.as_deref(), Some("Hello"));
        assert_eq!(
            calls_as_text(&choice.message.tool_calls),
            r#"{"name": "search", "arguments": {"q":"tent"}}"#
        );
        assert_eq!(choice.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(completion.usage.unwrap().prompt_tokens, Some(12));
        assert_eq!(completion.timings.unwrap().cache_n, Some(3));

        // The first token's alternatives, where the request asked for them.
        let mut probed = Assembler::default();
        probed
            .feed(concat!(
                "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n",
                "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"},\"logprobs\":{\"content\":[",
                "{\"token\":\"Hi\",\"logprob\":-0.1,\"top_logprobs\":[{\"token\":\"Hi\",\"logprob\":-0.1},",
                "{\"token\":\"{\\\"\",\"logprob\":-2.0},{\"token\":\"{\",\"logprob\":-3.0}]}]}}]}\n\n",
                "data: {\"choices\":[{\"delta\":{\"content\":\"!\"},\"logprobs\":{\"content\":[",
                "{\"token\":\"!\",\"logprob\":-0.5,\"top_logprobs\":[{\"token\":\"{\",\"logprob\":-0.1}]}]}}]}\n\n",
            ).as_bytes())
            .unwrap();
        let first = probed
            .finish()
            .first_tokens
            .expect("the first token's alternatives");
        assert_eq!(first.len(), 3);
        let p = call_probability(&first);
        assert!(
            (p - ((-2.0f64).exp() + (-3.0f64).exp()) as f32).abs() < 1e-6,
            "{p}"
        );
        assert_eq!(call_probability(&[]), 0.0);

        let mut failing = Assembler::default();
        let err = failing
            .feed(b"data: {\"error\":{\"message\":\"the context is full\"}}\n")
            .unwrap_err();
        assert_eq!(err, "the context is full");
    }

    #[test]
    fn context_and_parameters_are_read_from_what_servers_tell() {
        let props = json!({"default_generation_settings": {"n_ctx": 2048}});
        assert_eq!(props_context(&props), Some(2048));
        assert_eq!(props_context(&json!({})), None);
        let models =
            json!({"data": [{"id": "m", "max_model_len": 4096, "meta": {"n_params": 134515008}}]});
        assert_eq!(
            models_facts(&models, "other"),
            (Some(4096), Some(134_515_008))
        );
        let vllm = json!({"data": [{"id": "m", "owned_by": "vllm"}]});
        assert_eq!(models_owner(&vllm, "m").as_deref(), Some("vllm"));
        assert_eq!(models_owner(&models, "m"), None);
    }
}
