//! The loop's "text or calls" constraint as a GBNF grammar (llama.cpp's
//! grammar dialect, which vLLM's `guided_grammar` also reads):
//!
//! ```text
//! root  ::= text | calls                  ("calls only" has no text)
//! text  ::= [^{ \t\n\r] [^{]*             prose that holds no call
//! calls ::= call (sep call){0,n-1} sep?   up to `max_calls`, a line apart
//! call  ::= call-0 | call-1 | …
//! call-0 ::= "{" ws "\"name\"" ws ":" ws "\"search\"" ws "," ws
//!            "\"arguments\"" ws ":" ws args-0 ws "}"
//! ```
//!
//! Calls are the loop's JSON call format (`{"name": ..., "arguments":
//! ...}`), the text this provider hands the loop: where the tools are in
//! the prompt the model writes them as text, and the loop parses that
//! text. Prose holds no `{` at all, as under the on-device grammar: the
//! loop's parser would read a JSON object in prose as a call the grammar
//! never checked.
//!
//! Each tool is an alternative of its own with its name as a literal, so a
//! call names only offered tools and its arguments follow the schema of the
//! tool it names. The schema is turned into rules where GBNF can say it
//! (`type`, `properties` in their order with `required`, `enum`, `const`,
//! `items`, `anyOf`/`oneOf`, string and array lengths); what it cannot
//! (`pattern`, `$ref`, `allOf`, bounds on numbers, …) is left to the loop,
//! which validates every call against the real schema: a value whose
//! schema cannot be followed becomes any JSON value of its type, or any
//! JSON value, with a debug line naming the keyword.
//!
//! The request's [`Decoding`] shapes a reply as on device where GBNF can:
//! `max_calls`, `one_tool_per_reply`, `max_string_chars` and
//! `max_array_items`. The token-level pulls (call threshold, copy bias,
//! avoided values) need the model's probabilities and are not sent.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde_json::Value;
use wma_agent::{Decoding, ToolDefinition};

/// Nesting beyond this becomes any JSON value: a recursive schema cannot
/// be unrolled for ever.
const MAX_DEPTH: usize = 12;

/// The fixed rules every grammar ends with. A run of whitespace between
/// two JSON tokens is bounded as on device (12: a newline and the
/// indentation of a pretty-printed call), so it cannot pad for ever.
const BASE_RULES: &str = r#"ws ::= [ \t\n]{0,12}
sep ::= [ \t]* "\n" [ \t\n]{0,3}
char ::= [^"\\\x7F\x00-\x1F] | [\\] (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
string ::= "\"" char* "\""
integer ::= "-"? ([0] | [1-9] [0-9]{0,15})
number ::= integer ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?
boolean ::= "true" | "false"
null ::= "null"
value ::= object | array | string | number | boolean | null
object ::= "{" ws (string ws ":" ws value (ws "," ws string ws ":" ws value)*)? ws "}"
array ::= "[" ws (value (ws "," ws value)*)? ws "]"
"#;

/// A GBNF grammar for a reply of prose (`text`) or calls to `tools`, in
/// the loop's JSON call format; with `text` false, calls only. With no
/// tools the reply is prose.
pub(crate) fn text_or_calls(tools: &[ToolDefinition], text: bool, decoding: &Decoding) -> String {
    let mut builder = Builder {
        rules: Vec::new(),
        named: HashMap::new(),
        decoding,
    };
    let mut out = String::new();
    let root = match (text, tools.is_empty()) {
        (_, true) => "text",
        (true, false) => "text | calls",
        (false, false) => "calls",
    };
    let _ = writeln!(out, "root ::= {root}");
    if text || tools.is_empty() {
        // Prose never starts with whitespace (a reply that opens with a
        // blank and then a call is still a call) and holds no `{`.
        out.push_str("text ::= [^{ \\t\\n\\r] [^{]*\n");
    }
    if !tools.is_empty() {
        let more = decoding
            .max_calls
            .map_or("*".to_string(), |n| format!("{{0,{}}}", n.max(1) - 1));
        if decoding.one_tool_per_reply {
            let each: Vec<String> = (0..tools.len()).map(|i| format!("calls-{i}")).collect();
            let _ = writeln!(out, "calls ::= {}", each.join(" | "));
            for i in 0..tools.len() {
                let _ = writeln!(out, "calls-{i} ::= call-{i} (sep call-{i}){more} sep?");
            }
        } else {
            let each: Vec<String> = (0..tools.len()).map(|i| format!("call-{i}")).collect();
            let _ = writeln!(out, "calls ::= call (sep call){more} sep?");
            let _ = writeln!(out, "call ::= {}", each.join(" | "));
        }
        for (i, tool) in tools.iter().enumerate() {
            let arguments = builder.arguments(tool);
            let _ = writeln!(
                out,
                "call-{i} ::= \"{{\" ws {} ws \":\" ws {} ws \",\" ws {} ws \":\" ws {arguments} ws \"}}\"",
                literal("\"name\""),
                literal(&Value::String(tool.name.clone()).to_string()),
                literal("\"arguments\""),
            );
        }
    }
    for (name, body) in &builder.rules {
        let _ = writeln!(out, "{name} ::= {body}");
    }
    out.push_str(BASE_RULES);
    out
}

/// Turns schemas into rules, each shape once.
struct Builder<'a> {
    /// Rules made so far, in order.
    rules: Vec<(String, String)>,
    /// A rule's body to its name, so that tools sharing a shape share a rule.
    named: HashMap<String, String>,
    decoding: &'a Decoding,
}

impl Builder<'_> {
    /// The rule of `tool`'s arguments: its schema where GBNF can say it,
    /// else any JSON object.
    fn arguments(&mut self, tool: &ToolDefinition) -> String {
        let schema = &tool.input_schema;
        let is_object = schema.get("type").and_then(Value::as_str) == Some("object")
            || (schema.get("type").is_none() && schema.get("properties").is_some());
        if !is_object {
            tracing::debug!(
                tool = %tool.name,
                "the grammar takes any JSON object for the arguments: the schema is not an object schema"
            );
            return "object".to_string();
        }
        self.value(schema, &tool.name, 0)
    }

    /// A rule name (or a base rule) for a value following `schema`.
    fn value(&mut self, schema: &Value, at: &str, depth: usize) -> String {
        let Value::Object(map) = schema else {
            // `true` (or a schema that is no object): anything.
            return "value".to_string();
        };
        if depth > MAX_DEPTH {
            tracing::debug!(at, "the grammar takes any JSON value here: nested too deep");
            return "value".to_string();
        }
        for keyword in ["$ref", "allOf", "not", "if", "patternProperties"] {
            if map.contains_key(keyword) {
                tracing::debug!(
                    at,
                    keyword,
                    "the grammar takes any JSON value here: GBNF cannot follow this keyword"
                );
                return "value".to_string();
            }
        }
        if let Some(value) = map.get("const") {
            return self.rule(literal(&value.to_string()));
        }
        if let Some(Value::Array(values)) = map.get("enum") {
            if values.is_empty() {
                return "value".to_string();
            }
            let body = values
                .iter()
                .map(|v| literal(&v.to_string()))
                .collect::<Vec<_>>()
                .join(" | ");
            return self.rule(body);
        }
        for keyword in ["anyOf", "oneOf"] {
            if let Some(Value::Array(options)) = map.get(keyword) {
                if options.is_empty() {
                    return "value".to_string();
                }
                let body = options
                    .iter()
                    .map(|o| self.value(o, at, depth + 1))
                    .collect::<Vec<_>>()
                    .join(" | ");
                return self.rule(body);
            }
        }
        match map.get("type") {
            Some(Value::String(kind)) => self.typed(kind, map, at, depth),
            Some(Value::Array(kinds)) => {
                let body = kinds
                    .iter()
                    .filter_map(Value::as_str)
                    .map(|k| self.typed(k, map, at, depth))
                    .collect::<Vec<_>>();
                if body.is_empty() {
                    return "value".to_string();
                }
                self.rule(body.join(" | "))
            }
            _ if map.contains_key("properties") => self.typed("object", map, at, depth),
            _ if map.contains_key("items") => self.typed("array", map, at, depth),
            _ => "value".to_string(),
        }
    }

    /// A value of one JSON type, as `map` bounds it.
    fn typed(
        &mut self,
        kind: &str,
        map: &serde_json::Map<String, Value>,
        at: &str,
        depth: usize,
    ) -> String {
        for keyword in ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"] {
            if map.contains_key(keyword) {
                tracing::debug!(
                    at,
                    keyword,
                    "the grammar leaves this bound to the loop's validation"
                );
            }
        }
        match kind {
            "string" => self.string(map, at),
            "integer" => "integer".to_string(),
            "number" => "number".to_string(),
            "boolean" => "boolean".to_string(),
            "null" => "null".to_string(),
            "array" => self.array(map, at, depth),
            "object" => self.object(map, at, depth),
            other => {
                tracing::debug!(
                    at,
                    kind = other,
                    "the grammar takes any JSON value here: unknown type"
                );
                "value".to_string()
            }
        }
    }

    fn string(&mut self, map: &serde_json::Map<String, Value>, at: &str) -> String {
        if map.contains_key("pattern") || map.contains_key("format") {
            tracing::debug!(
                at,
                "the grammar takes any string here: GBNF cannot follow `pattern` or `format`"
            );
        }
        let min = map.get("minLength").and_then(Value::as_u64).unwrap_or(0);
        let max = map
            .get("maxLength")
            .and_then(Value::as_u64)
            .or(self.decoding.max_string_chars.map(u64::from));
        match max {
            None if min == 0 => "string".to_string(),
            None => self.rule(format!("\"\\\"\" char{{{min},}} \"\\\"\"")),
            Some(max) => self.rule(format!("\"\\\"\" char{{{min},{}}} \"\\\"\"", max.max(min))),
        }
    }

    fn array(&mut self, map: &serde_json::Map<String, Value>, at: &str, depth: usize) -> String {
        let item = match map.get("items") {
            Some(items @ Value::Object(_)) => self.value(items, at, depth + 1),
            _ => "value".to_string(),
        };
        let min = map.get("minItems").and_then(Value::as_u64).unwrap_or(0);
        let max = map
            .get("maxItems")
            .and_then(Value::as_u64)
            .or(self.decoding.max_array_items.map(u64::from));
        let more = match max {
            Some(max) => format!("{{{},{}}}", min.saturating_sub(1), max.max(1) - 1),
            None => format!("{{{},}}", min.saturating_sub(1)),
        };
        let items = format!("{item} (ws \",\" ws {item}){more}");
        let body = if min == 0 {
            format!("\"[\" ws ({items})? ws \"]\"")
        } else {
            format!("\"[\" ws {items} ws \"]\"")
        };
        self.rule(body)
    }

    /// An object with the schema's properties in their order, the required
    /// ones always there and the others each there or not; with no
    /// properties named, any object.
    fn object(&mut self, map: &serde_json::Map<String, Value>, at: &str, depth: usize) -> String {
        let Some(Value::Object(properties)) = map.get("properties") else {
            return "object".to_string();
        };
        if properties.is_empty() {
            return "object".to_string();
        }
        let required: Vec<&str> = map
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let members: Vec<(String, bool)> = properties
            .iter()
            .map(|(name, schema)| {
                let value = self.value(schema, &format!("{at}.{name}"), depth + 1);
                let member = format!(
                    "{} ws \":\" ws {value}",
                    literal(&Value::String(name.clone()).to_string())
                );
                (member, required.contains(&name.as_str()))
            })
            .collect();
        // `after[i]`: members i.. once one member is written (each begins
        // with a comma); `first[i]`: members i.. with none written yet.
        let n = members.len();
        let mut after = vec![String::new(); n + 1];
        let mut first = vec![String::new(); n + 1];
        for i in (0..n).rev() {
            let (member, is_required) = &members[i];
            let rest = after[i + 1].clone();
            let rest = &rest;
            let step = join_seq(&format!("ws \",\" ws {member}"), rest);
            after[i] = if *is_required {
                self.rule(step)
            } else if rest.is_empty() {
                self.rule(format!("({step})?"))
            } else {
                self.rule(format!("({step}) | {rest}"))
            };
            let take = join_seq(member, rest);
            first[i] = if *is_required {
                self.rule(take)
            } else if first[i + 1].is_empty() {
                self.rule(format!("({take})?"))
            } else {
                self.rule(format!("({take}) | {}", first[i + 1]))
            };
        }
        self.rule(format!("\"{{\" ws {} ws \"}}\"", first[0]))
    }

    /// The name of a rule with `body`, made once per body.
    fn rule(&mut self, body: String) -> String {
        if let Some(name) = self.named.get(&body) {
            return name.clone();
        }
        let name = format!("r{}", self.rules.len());
        self.named.insert(body.clone(), name.clone());
        self.rules.push((name.clone(), body));
        name
    }
}

/// `a b`, or `a` alone when `b` is empty.
fn join_seq(a: &str, b: &str) -> String {
    if b.is_empty() {
        a.to_string()
    } else {
        format!("{a} {b}")
    }
}

/// `text` as a GBNF string literal.
pub(crate) fn literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\x{:02X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    //! The grammars are read by a small GBNF recognizer of the forms this
    //! module writes, so that the tests check the language, not the text.

    use std::collections::{BTreeSet, HashMap};

    use serde_json::json;

    use super::*;

    #[derive(Debug, Clone)]
    enum Node {
        Literal(Vec<char>),
        Class {
            negated: bool,
            ranges: Vec<(char, char)>,
        },
        Rule(String),
        Seq(Vec<Node>),
        Alt(Vec<Node>),
        Repeat(Box<Node>, usize, Option<usize>),
    }

    struct Grammar {
        rules: HashMap<String, Node>,
    }

    struct Reader<'a> {
        chars: Vec<char>,
        at: usize,
        line: &'a str,
    }

    impl Reader<'_> {
        fn peek(&self) -> Option<char> {
            self.chars.get(self.at).copied()
        }
        fn skip_blanks(&mut self) {
            while self.peek() == Some(' ') {
                self.at += 1;
            }
        }
        fn escaped(&mut self) -> char {
            let c = self.chars[self.at];
            self.at += 1;
            if c != '\\' {
                return c;
            }
            let e = self.chars[self.at];
            self.at += 1;
            match e {
                'n' => '\n',
                't' => '\t',
                'r' => '\r',
                'x' => {
                    let hex: String = self.chars[self.at..self.at + 2].iter().collect();
                    self.at += 2;
                    char::from_u32(u32::from_str_radix(&hex, 16).unwrap()).unwrap()
                }
                other => other,
            }
        }
        fn alt(&mut self) -> Node {
            let mut options = vec![self.seq()];
            while self.peek() == Some('|') {
                self.at += 1;
                options.push(self.seq());
            }
            if options.len() == 1 {
                options.pop().unwrap()
            } else {
                Node::Alt(options)
            }
        }
        fn seq(&mut self) -> Node {
            let mut items = Vec::new();
            loop {
                self.skip_blanks();
                match self.peek() {
                    None | Some('|') | Some(')') => break,
                    _ => {}
                }
                let atom = self.atom();
                items.push(self.postfix(atom));
            }
            Node::Seq(items)
        }
        fn atom(&mut self) -> Node {
            match self.peek().unwrap() {
                '"' => {
                    self.at += 1;
                    let mut text = Vec::new();
                    while self.peek() != Some('"') {
                        text.push(self.escaped());
                    }
                    self.at += 1;
                    Node::Literal(text)
                }
                '[' => {
                    self.at += 1;
                    let negated = self.peek() == Some('^');
                    if negated {
                        self.at += 1;
                    }
                    let mut ranges = Vec::new();
                    while self.peek() != Some(']') {
                        let from = self.escaped();
                        let to = if self.peek() == Some('-') && self.chars[self.at + 1] != ']' {
                            self.at += 1;
                            self.escaped()
                        } else {
                            from
                        };
                        ranges.push((from, to));
                    }
                    self.at += 1;
                    Node::Class { negated, ranges }
                }
                '(' => {
                    self.at += 1;
                    let inner = self.alt();
                    assert_eq!(self.peek(), Some(')'), "{}", self.line);
                    self.at += 1;
                    inner
                }
                _ => {
                    let start = self.at;
                    while self
                        .peek()
                        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '-')
                    {
                        self.at += 1;
                    }
                    assert!(self.at > start, "a name at {start}: {}", self.line);
                    Node::Rule(self.chars[start..self.at].iter().collect())
                }
            }
        }
        fn postfix(&mut self, atom: Node) -> Node {
            let (min, max) = match self.peek() {
                Some('?') => (0, Some(1)),
                Some('*') => (0, None),
                Some('+') => (1, None),
                Some('{') => {
                    let end = self.at
                        + self.chars[self.at..]
                            .iter()
                            .position(|c| *c == '}')
                            .unwrap();
                    let inside: String = self.chars[self.at + 1..end].iter().collect();
                    self.at = end;
                    match inside.split_once(',') {
                        None => {
                            let n = inside.parse().unwrap();
                            (n, Some(n))
                        }
                        Some((m, "")) => (m.parse().unwrap(), None),
                        Some((m, n)) => (m.parse().unwrap(), Some(n.parse().unwrap())),
                    }
                }
                _ => return atom,
            };
            self.at += 1;
            Node::Repeat(Box::new(atom), min, max)
        }
    }

    impl Grammar {
        fn parse(text: &str) -> Self {
            let mut rules = HashMap::new();
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                let (name, body) = line.split_once(" ::= ").expect("a rule a line");
                let mut reader = Reader {
                    chars: body.chars().collect(),
                    at: 0,
                    line,
                };
                let node = reader.alt();
                assert_eq!(reader.at, reader.chars.len(), "all of: {line}");
                assert!(
                    rules.insert(name.to_string(), node).is_none(),
                    "{name} twice"
                );
            }
            let grammar = Self { rules };
            for node in grammar.rules.values() {
                grammar.check_refs(node);
            }
            grammar
        }

        fn check_refs(&self, node: &Node) {
            match node {
                Node::Rule(name) => assert!(self.rules.contains_key(name), "no rule {name}"),
                Node::Seq(items) | Node::Alt(items) => {
                    items.iter().for_each(|n| self.check_refs(n))
                }
                Node::Repeat(inner, _, _) => self.check_refs(inner),
                _ => {}
            }
        }

        fn accepts(&self, text: &str) -> bool {
            let input: Vec<char> = text.chars().collect();
            self.ends(&Node::Rule("root".into()), &input, 0)
                .contains(&input.len())
        }

        /// Every position where `node` can end when it starts at `at`.
        fn ends(&self, node: &Node, input: &[char], at: usize) -> BTreeSet<usize> {
            match node {
                Node::Literal(text) => {
                    let end = at + text.len();
                    if input.get(at..end) == Some(text.as_slice()) {
                        BTreeSet::from([end])
                    } else {
                        BTreeSet::new()
                    }
                }
                Node::Class { negated, ranges } => match input.get(at) {
                    Some(c) if ranges.iter().any(|(a, b)| a <= c && c <= b) != *negated => {
                        BTreeSet::from([at + 1])
                    }
                    _ => BTreeSet::new(),
                },
                Node::Rule(name) => self.ends(&self.rules[name], input, at),
                Node::Alt(options) => options
                    .iter()
                    .flat_map(|o| self.ends(o, input, at))
                    .collect(),
                Node::Seq(items) => items.iter().fold(BTreeSet::from([at]), |from, item| {
                    from.iter()
                        .flat_map(|&p| self.ends(item, input, p))
                        .collect()
                }),
                Node::Repeat(inner, min, max) => {
                    let mut out = BTreeSet::new();
                    let mut current = BTreeSet::from([at]);
                    let mut seen = BTreeSet::new();
                    if *min == 0 {
                        out.insert(at);
                    }
                    let limit = max.unwrap_or(input.len() + 1);
                    for count in 1..=limit {
                        let next: BTreeSet<usize> = current
                            .iter()
                            .flat_map(|&p| self.ends(inner, input, p))
                            .collect();
                        if count >= *min {
                            out.extend(next.iter().copied());
                        }
                        // Unbounded: stop once nothing new is reached.
                        if next.is_empty() || (max.is_none() && next.is_subset(&seen)) {
                            break;
                        }
                        seen.extend(next.iter().copied());
                        current = next;
                    }
                    out
                }
            }
        }
    }

    fn tools() -> Vec<ToolDefinition> {
        vec![
            ToolDefinition::new(
                "get_weather",
                "Weather of a city.",
                json!({
                    "type": "object",
                    "properties": {
                        "city": {"type": "string"},
                        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                        "days": {"type": "integer"},
                    },
                    "required": ["city"],
                }),
            ),
            ToolDefinition::new(
                "add_items",
                "Adds items to the cart.",
                json!({
                    "type": "object",
                    "properties": {
                        "ids": {"type": "array", "items": {"type": "integer"}, "minItems": 1},
                        "gift": {"type": "boolean"},
                        "note": {"type": ["string", "null"]},
                        "address": {
                            "type": "object",
                            "properties": {"street": {"type": "string"}, "zip": {"type": "string"}},
                            "required": ["zip"],
                        },
                    },
                    "required": ["ids", "gift"],
                }),
            ),
        ]
    }

    fn grammar(text: bool, decoding: &Decoding) -> Grammar {
        Grammar::parse(&text_or_calls(&tools(), text, decoding))
    }

    #[test]
    fn prose_or_a_call_that_validates_is_accepted() {
        let g = grammar(true, &Decoding::default());
        for reply in [
            "I cannot look that up, but Paris is lovely in spring.",
            r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#,
            r#"{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius", "days": 3}}"#,
            r#"{"name": "get_weather", "arguments": {"city": "Paris", "days": -2}}"#,
            // Compact and pretty-printed JSON, and a last newline.
            "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Rome\"}}\n",
            "{\n  \"name\": \"add_items\",\n  \"arguments\": {\n    \"ids\": [1, 2],\n    \"gift\": false\n  }\n}",
            r#"{"name": "add_items", "arguments": {"ids": [7], "gift": true, "note": null, "address": {"zip": "75001"}}}"#,
            r#"{"name": "add_items", "arguments": {"ids": [7], "gift": true, "address": {"street": "Rue \"A\" \u00e9", "zip": "1"}}}"#,
            // Several calls, a line apart.
            "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n{\"name\": \"add_items\", \"arguments\": {\"ids\": [1], \"gift\": true}}",
        ] {
            assert!(g.accepts(reply), "rejected: {reply}");
        }
    }

    #[test]
    fn calls_name_only_offered_tools_and_follow_their_schemas() {
        let g = grammar(true, &Decoding::default());
        for reply in [
            // A tool not offered.
            r#"{"name": "send_email", "arguments": {"to": "a"}}"#,
            r#"{"name": "get_weather2", "arguments": {"city": "Paris"}}"#,
            // A required argument missing, a wrong type, an unknown value.
            r#"{"name": "get_weather", "arguments": {}}"#,
            r#"{"name": "get_weather", "arguments": {"city": 3}}"#,
            r#"{"name": "get_weather", "arguments": {"city": "Paris", "unit": "kelvin"}}"#,
            r#"{"name": "get_weather", "arguments": {"city": "Paris", "days": 2.5}}"#,
            r#"{"name": "add_items", "arguments": {"ids": [], "gift": true}}"#,
            r#"{"name": "add_items", "arguments": {"ids": [1], "gift": true, "address": {"street": "x"}}}"#,
            // A property the schema does not name.
            r#"{"name": "get_weather", "arguments": {"city": "Paris", "when": "now"}}"#,
            // Prose that holds a JSON object, or starts with a blank.
            r#"Here you go: {"name": "get_weather", "arguments": {"city": "Paris"}}"#,
            " Hello",
            // A cut call.
            r#"{"name": "get_weather", "arguments": {"city": "Par"#,
        ] {
            assert!(!g.accepts(reply), "accepted: {reply}");
        }
    }

    #[test]
    fn calls_only_has_no_prose_and_the_reply_shape_is_bounded() {
        let decoding = Decoding {
            max_calls: Some(2),
            one_tool_per_reply: true,
            max_string_chars: Some(5),
            max_array_items: Some(2),
            ..Decoding::default()
        };
        let g = grammar(false, &decoding);
        let call = r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#;
        assert!(g.accepts(call));
        assert!(!g.accepts("Sure."));
        assert!(g.accepts(&format!("{call}\n{call}")));
        assert!(!g.accepts(&format!("{call}\n{call}\n{call}")), "max_calls");
        let other = r#"{"name": "add_items", "arguments": {"ids": [1, 2], "gift": true}}"#;
        assert!(g.accepts(other));
        assert!(!g.accepts(&format!("{call}\n{other}")), "one tool a reply");
        assert!(!g.accepts(r#"{"name": "get_weather", "arguments": {"city": "Parisian"}}"#));
        assert!(
            !g.accepts(r#"{"name": "add_items", "arguments": {"ids": [1, 2, 3], "gift": true}}"#)
        );
    }

    #[test]
    fn schemas_gbnf_cannot_follow_fall_back_to_any_json() {
        let tools = vec![
            ToolDefinition::new(
                "lookup",
                "Looks up.",
                json!({
                    "type": "object",
                    "properties": {"q": {"$ref": "#/$defs/query"}, "n": {"type": "integer"}},
                    "required": ["q"],
                    "$defs": {"query": {"type": "string"}},
                }),
            ),
            // No object schema at all.
            ToolDefinition::new("ping", "Pings.", json!(true)),
        ];
        let g = Grammar::parse(&text_or_calls(&tools, true, &Decoding::default()));
        assert!(g.accepts(r#"{"name": "lookup", "arguments": {"q": "tents"}}"#));
        assert!(
            g.accepts(r#"{"name": "lookup", "arguments": {"q": {"any": [1, "json"]}, "n": 2}}"#)
        );
        assert!(!g.accepts(r#"{"name": "lookup", "arguments": {"n": 2}}"#));
        assert!(g.accepts(r#"{"name": "ping", "arguments": {"anything": "goes"}}"#));
        assert!(g.accepts(r#"{"name": "ping", "arguments": {}}"#));
    }

    #[test]
    fn without_tools_the_reply_is_prose() {
        let g = Grammar::parse(&text_or_calls(&[], true, &Decoding::default()));
        assert!(g.accepts("Hello there."));
        assert!(!g.accepts(r#"{"name": "x", "arguments": {}}"#));
    }

    #[test]
    fn literals_escape_what_gbnf_reads() {
        assert_eq!(literal(r#""a\b""#), r#""\"a\\b\"""#);
        assert_eq!(literal("a\nb\u{1}"), r#""a\nb\x01""#);
    }
}
