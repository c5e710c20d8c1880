//! Copy bias: inside a string argument of a constrained call, phrases the
//! person wrote get a fixed bonus on their logits.
//!
//! A tiny model that has settled on the right tool often fills a free-text
//! argument with noise: asked to "find a waterproof backpack", it searches
//! for `"search_products"` or `"your_tool_name"` — the words nearest in its
//! prompt, not the person's. The right words are usually in its top twenty,
//! a few percent each. A bonus on the tokens that start or continue a phrase
//! from the person's messages lifts them above the noise, without forbidding
//! anything: once the model writes something that is not such a phrase, the
//! bonus stops and it writes freely, and a strong preference of its own
//! still wins.
//!
//! Of the tokens that would copy a phrase, only the longest gets the bonus:
//! the one a copy writes next. A one-letter token that merely starts a
//! phrase word would let the model begin it and then write anything.
//!
//! The loop chooses the phrases (`GenerateRequest::copy_phrases`, made by
//! `wma_agent::prompt::copy_phrases`); each counts as written and lowercased. The
//! closing quote gets the bonus where the value written so far is a whole
//! phrase. Only values get the bonus, never keys, and never a call's `name`
//! (the grammar decides that one).
//!
//! A phrase that is a JSON number ("2", "3.5", made from "two" by the loop)
//! is copied into number values too: asked to "add two of p-21", the model
//! otherwise writes the `1` it has seen in every example. Where the schema
//! wants a string, the grammar masks the digits, so the bonus cannot turn a
//! string into a number.

//!
//! The bonus is the request's `Decoding::copy_bias`. The small-model policy
//! sets 3.0: enough to lift a phrase the model gives a few percent over
//! noise it gives ten, not enough to override a clear choice.

use llguidance::toktrie::{TokEnv, TokTrie};

/// Phrases to copy, and the bonus for copying them.
#[derive(Debug, Clone)]
pub struct CopyBias {
    phrases: Vec<Vec<u8>>,
    /// The phrases that are JSON numbers, for number values.
    numbers: Vec<Vec<u8>>,
    bias: f32,
    /// Argument name → the characters a phrase must hold to be copied into
    /// its value (`Decoding::copy_shapes`).
    shapes: Vec<(Vec<u8>, Vec<u8>)>,
}

impl CopyBias {
    /// A bonus of `bias` for copying any of `phrases` (as written or
    /// lowercased). `None` when there is no phrase or the bias is not
    /// positive.
    pub fn new(phrases: &[String], bias: f32) -> Option<Self> {
        if bias <= 0.0 || !bias.is_finite() {
            return None;
        }
        // A set keeps the dedupe linear in the phrases (the loop sends up to
        // a few thousand); the list keeps their order.
        let mut seen = std::collections::HashSet::new();
        let mut all: Vec<Vec<u8>> = Vec::new();
        for phrase in phrases.iter().filter(|p| !p.is_empty()) {
            for variant in [phrase.clone(), phrase.to_lowercase()] {
                let bytes = variant.into_bytes();
                if seen.insert(bytes.clone()) {
                    all.push(bytes);
                }
            }
        }
        let numbers = all.iter().filter(|p| is_json_number(p)).cloned().collect();
        (!all.is_empty()).then_some(Self {
            phrases: all,
            numbers,
            bias,
            shapes: Vec::new(),
        })
    }

    /// The same bias, copying into a value of an argument named in
    /// `shapes` only the phrases that hold each of its characters
    /// (`Decoding::copy_shapes`: the schema shows such values by example,
    /// and a phrase of another shape is no such value).
    #[must_use]
    pub fn with_shapes(mut self, shapes: &[(String, String)]) -> Self {
        self.shapes = shapes
            .iter()
            .map(|(name, chars)| (name.as_bytes().to_vec(), chars.as_bytes().to_vec()))
            .collect();
        self
    }

    /// The characters a phrase must hold to be copied at `position`, when
    /// the value there is of an argument with a shape.
    fn shape_at(&self, output: &[u8], position: Position) -> Option<&[u8]> {
        if self.shapes.is_empty() {
            return None;
        }
        let end = match position {
            Position::Before => output.len(),
            Position::Inside(start) => start.checked_sub(1)?,
            Position::InsideNumber(_) => return None,
        };
        let key = key_before(&output[..end])?;
        self.shapes
            .iter()
            .find(|(name, _)| name.as_slice() == key)
            .map(|(_, chars)| chars.as_slice())
    }

    /// The phrases, for tests and diagnostics.
    pub fn phrases(&self) -> impl Iterator<Item = &str> {
        self.phrases
            .iter()
            .filter_map(|p| std::str::from_utf8(p).ok())
    }

    /// Adds the bonus to the tokens that copy a phrase, when `output` (the
    /// reply so far) is about to write a value or ends inside a string or a
    /// number. A token copies when its bytes are a prefix of what would
    /// complete a phrase: the rest of the phrase and the closing quote, or,
    /// before the value, the opening quote too (tokenizers merge `"` with the
    /// word after it); for a number phrase, its digits. `quote_tokens` are
    /// the tokens that start with `"`; `control` has a bit set for each of
    /// the tokenizer's added tokens, which never get the bonus (a phrase is
    /// the person's text, never a control token, whatever it says).
    /// `position` is where `output` stands ([`value_position`]), read once
    /// per token for this and [`AvoidNames::apply`].
    pub(crate) fn apply(
        &self,
        output: &[u8],
        position: Position,
        logits: &mut [f32],
        env: &TokEnv,
        quote_tokens: &[u32],
        control: &[u32],
    ) {
        let trie = env.tok_trie();
        let mut boosted: Vec<u32> = Vec::new();
        let shape = self.shape_at(output, position);
        let fits = |phrase: &&Vec<u8>| shape.is_none_or(|s| s.iter().all(|c| phrase.contains(c)));
        match position {
            Position::Inside(start) => {
                let written = &output[start..];
                for phrase in self.phrases.iter().filter(fits) {
                    let Some(rest) = phrase.strip_prefix(written) else {
                        continue;
                    };
                    if rest.is_empty() {
                        boosted.extend_from_slice(quote_tokens);
                    } else {
                        let mut target = rest.to_vec();
                        target.push(b'"');
                        boosted.extend(longest_prefix(trie, &target));
                    }
                }
            }
            Position::InsideNumber(start) => {
                let written = &output[start..];
                for number in &self.numbers {
                    // A whole number gets nothing: where it ends is the
                    // model's to say ("1" may be the start of "12").
                    if let Some(rest) = number.strip_prefix(written).filter(|r| !r.is_empty()) {
                        boosted.extend(longest_prefix(trie, rest));
                    }
                }
            }
            Position::Before => {
                // A number as it is; a phrase as a string, in quotes.
                let values = self.numbers.iter().map(|n| (n, false));
                let phrases = self.phrases.iter().filter(fits).map(|p| (p, true));
                for (value, quoted) in values.chain(phrases) {
                    let mut target = Vec::with_capacity(value.len() + 3);
                    target.push(b' ');
                    if quoted {
                        target.push(b'"');
                    }
                    target.extend_from_slice(value);
                    if quoted {
                        target.push(b'"');
                    }
                    // With and without a space before the value.
                    boosted.extend(longest_prefix(trie, &target[1..]));
                    boosted
                        .extend(longest_prefix(trie, &target).filter(|&t| trie.token(t) != b" "));
                }
            }
        }
        let is_control = |t: u32| {
            control
                .get(t as usize / 32)
                .is_some_and(|w| w & (1 << (t % 32)) != 0)
        };
        boosted.retain(|&t| {
            !is_control(t) && trie.token(t).first() != Some(&TokTrie::SPECIAL_TOKEN_MARKER)
        });
        boosted.sort_unstable();
        boosted.dedup();
        for t in boosted {
            // Masked tokens stay masked: -inf plus a bonus is still -inf.
            if let Some(logit) = logits.get_mut(t as usize) {
                *logit += self.bias;
            }
        }
    }
}

/// The key whose value follows `before` (JSON text ending in `"key":` and
/// perhaps spaces), if it ends so: a value inside an array has none.
fn key_before(before: &[u8]) -> Option<&[u8]> {
    let trimmed = before.trim_ascii_end().strip_suffix(b":")?;
    let quoted = trimmed.trim_ascii_end().strip_suffix(b"\"")?;
    let open = (0..quoted.len())
        .rev()
        .find(|&i| quoted[i] == b'"' && (i == 0 || quoted[i - 1] != b'\\'))?;
    Some(&quoted[open + 1..])
}

/// Names a string value of a call may not begin with: the small-model
/// policy's `no_prompt_names_in_values` (tool names and the worked
/// example's placeholders, which a tiny model copies into values).
///
/// A token is masked when it would complete such a name at the start of a
/// value: inside a value whose text so far begins the name, the tokens that
/// write the rest of it; before a value, the tokens that write the opening
/// quote and the whole name. A name can still be begun and left (`write_`
/// then `up`): only its completion is refused. Where every token the
/// grammar allows would complete a name (an `enum` of just that value),
/// nothing is masked: the schema wins.
#[derive(Debug, Clone)]
pub struct AvoidNames {
    names: Vec<Vec<u8>>,
}

impl AvoidNames {
    /// `None` when there is no name to avoid.
    pub fn new(names: &[String]) -> Option<Self> {
        let names: Vec<Vec<u8>> = names
            .iter()
            .filter(|n| !n.is_empty())
            .map(|n| n.as_bytes().to_vec())
            .collect();
        (!names.is_empty()).then_some(Self { names })
    }

    /// Masks the tokens that would make the value being written (or about
    /// to be written) after `output` begin with one of the names;
    /// `position` is where `output` stands ([`value_position`]).
    pub(crate) fn apply(
        &self,
        output: &[u8],
        position: Position,
        logits: &mut [f32],
        env: &TokEnv,
    ) {
        // What each allowed token must not start with: the rest of a name
        // the value so far begins, or a quote and a whole name.
        let mut targets: Vec<Vec<u8>> = Vec::new();
        match position {
            Position::Inside(start) => {
                let written = &output[start..];
                for name in &self.names {
                    if let Some(rest) = name.strip_prefix(written).filter(|r| !r.is_empty()) {
                        targets.push(rest.to_vec());
                    }
                }
            }
            Position::Before => {
                for name in &self.names {
                    for lead in [&b"\""[..], b" \""] {
                        let mut target = lead.to_vec();
                        target.extend_from_slice(name);
                        targets.push(target);
                    }
                }
            }
            Position::InsideNumber(_) => return,
        }
        if targets.is_empty() {
            return;
        }
        let trie = env.tok_trie();
        let masked: Vec<usize> = logits
            .iter()
            .enumerate()
            .filter(|(t, logit)| {
                logit.is_finite() && {
                    let bytes = trie.token(*t as u32);
                    targets.iter().any(|target| bytes.starts_with(target))
                }
            })
            .map(|(t, _)| t)
            .collect();
        mask_unless_all(logits, &masked);
    }
}

/// Masks the tokens `masked`, unless they are every token still allowed:
/// a pull on the model's choice never leaves it nothing to write, so there
/// the grammar wins.
pub(crate) fn mask_unless_all(logits: &mut [f32], masked: &[usize]) {
    let allowed = logits.iter().filter(|l| l.is_finite()).count();
    if masked.is_empty() || masked.len() == allowed {
        return;
    }
    for &t in masked {
        logits[t] = f32::NEG_INFINITY;
    }
}

/// The longest token that is a prefix of `target`: the one a copy would
/// write next. Shorter ones ("F" of "Find") are left alone, since after them
/// the model is free to write any word with that start.
fn longest_prefix(trie: &TokTrie, target: &[u8]) -> Option<u32> {
    trie.all_prefixes(target).last().copied()
}

/// Whether `bytes` is a JSON number: an optional minus, digits without a
/// leading zero, an optional fraction.
fn is_json_number(bytes: &[u8]) -> bool {
    let digits = bytes.strip_prefix(b"-").unwrap_or(bytes);
    let (whole, fraction) = match digits.iter().position(|&b| b == b'.') {
        Some(dot) => (&digits[..dot], Some(&digits[dot + 1..])),
        None => (digits, None),
    };
    let all_digits = |d: &[u8]| !d.is_empty() && d.iter().all(u8::is_ascii_digit);
    all_digits(whole) && (whole == b"0" || whole[0] != b'0') && fraction.is_none_or(all_digits)
}

/// Where a reply stands with respect to a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Position {
    /// A value comes next (after `:`, or in an array), not yet begun.
    Before,
    /// Inside a string value whose text starts at this byte.
    Inside(usize),
    /// Inside a number value that starts at this byte.
    InsideNumber(usize),
}

/// Whether `output` ends where a value comes next, or inside a string or
/// number value. Keys do not count, nor the value of a top-level `name` (the
/// tool's name in a call, which the grammar picks).
pub(crate) fn value_position(output: &[u8]) -> Option<Position> {
    let mut number: Option<usize> = None;
    let mut stack: Vec<u8> = Vec::new();
    let mut last = 0u8;
    let mut in_string = false;
    let mut escaped = false;
    let mut start = 0;
    let mut is_value = false;
    let mut key: &[u8] = b"";
    let mut value_key: &[u8] = b"";
    for (i, &b) in output.iter().enumerate() {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
                if !is_value {
                    key = &output[start..i];
                }
                last = b'"';
            }
            continue;
        }
        let number_byte = b.is_ascii_digit() || matches!(b, b'-' | b'.' | b'e' | b'E' | b'+');
        if !number_byte {
            number = None;
        } else if number.is_none() && expects_value(last, &stack) {
            number = Some(i);
        }
        match b {
            b'"' => {
                in_string = true;
                start = i + 1;
                is_value = expects_value(last, &stack);
                value_key = key;
            }
            b'{' | b'[' => {
                stack.push(b);
                last = b;
            }
            b'}' | b']' => {
                stack.pop();
                last = b;
            }
            b if b.is_ascii_whitespace() => {}
            _ => last = b,
        }
    }
    // Outside any object or array this is prose, not JSON.
    if stack.is_empty() {
        return None;
    }
    if let Some(start) = number.filter(|_| !in_string) {
        return Some(Position::InsideNumber(start));
    }
    if in_string {
        let top_level_name = stack.len() == 1 && value_key == b"name";
        return (is_value && !top_level_name).then_some(Position::Inside(start));
    }
    let top_level_name = stack.len() == 1 && key == b"name" && last == b':';
    (expects_value(last, &stack) && !top_level_name).then_some(Position::Before)
}

/// Whether a value comes after `last` (the last byte outside strings and
/// whitespace) in the open containers `stack`.
fn expects_value(last: u8, stack: &[u8]) -> bool {
    last == b':' || (matches!(last, b'[' | b',') && stack.last() == Some(&b'['))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_string_values_count() {
        fn open(s: &str) -> Option<&str> {
            match value_position(s.as_bytes()) {
                Some(Position::Inside(i)) => Some(&s[i..]),
                _ => None,
            }
        }
        assert_eq!(
            open(r#"{"name": "search", "arguments": {"query": "water"#),
            Some("water")
        );
        assert_eq!(open(r#"{"name": "sea"#), None, "the tool's name");
        assert_eq!(open(r#"{"name": "s", "arguments": {"que"#), None, "a key");
        assert_eq!(
            open(r#"{"name": "s", "arguments": {"q": "a"}"#),
            None,
            "closed"
        );
        assert_eq!(
            open(r#"{"name": "s", "arguments": {"tags": ["red", "blu"#),
            Some("blu")
        );
        assert_eq!(
            open(r#"{"name": "s", "arguments": {"person": {"name": "Ad"#),
            Some("Ad"),
            "a nested name is an argument"
        );
        assert_eq!(
            open(r#"<tool_call>{"name": "s", "arguments": {"q": "say \"hi"#),
            Some(r#"say \"hi"#)
        );
        assert_eq!(open("I can do that"), None);
        let before = |s: &str| value_position(s.as_bytes()) == Some(Position::Before);
        assert!(before(r#"{"name": "s", "arguments": {"query": "#));
        assert!(before(r#"{"name": "s", "arguments": {"tags": ["a", "#));
        assert!(!before(r#"{"name": "#), "the tool's name");
        assert!(!before(r#"{"name": "s", "#), "a key comes next");
        assert!(!before("Sure: "), "prose");
        assert_eq!(open(r#"He said: "hel"#), None, "prose");
    }

    #[test]
    fn a_number_value_is_found_where_it_starts() {
        fn at(s: &str) -> Option<&str> {
            match value_position(s.as_bytes()) {
                Some(Position::InsideNumber(i)) => Some(&s[i..]),
                _ => None,
            }
        }
        assert_eq!(
            at(r#"{"name": "a", "arguments": {"quantity": 1"#),
            Some("1")
        );
        assert_eq!(at(r#"{"name": "a", "arguments": {"x": -3.5"#), Some("-3.5"));
        assert_eq!(at(r#"{"name": "a", "arguments": {"xs": [1, 2"#), Some("2"));
        assert_eq!(
            at(r#"{"name": "a", "arguments": {"q": "p-17"#),
            None,
            "a string"
        );
        assert_eq!(at(r#"{"name": "a", "arguments": {"q": 12,"#), None, "ended");
        assert_eq!(at(r#"{"name": "a", "arguments": {"q": true"#), None);
        assert_eq!(at("I have 2"), None, "prose");
    }

    #[test]
    fn only_json_numbers_are_copied_as_numbers() {
        for yes in ["2", "0", "-4", "3.5", "0.25", "120"] {
            assert!(is_json_number(yes.as_bytes()), "{yes}");
        }
        for no in ["", "-", "02", "3.", ".5", "p-17", "1e5", "two", "1,000"] {
            assert!(!is_json_number(no.as_bytes()), "{no}");
        }
    }
}
