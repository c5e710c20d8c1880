//! Grounded identifiers: under a constraint, an argument that names a thing
//! by its identifier (`product_id`, `orderId`, `id`) may only take a value the
//! conversation has shown — one the person wrote or a tool returned.
//!
//! A small model asked to "add the backpack to my cart" before it has searched
//! writes a plausible-looking id (`"1234567890"`) and the call fails, again
//! and again. No grammar over the schema alone can stop that: the schema says
//! "a string". The conversation, though, knows every identifier the model
//! could rightly use. Narrowing identifier arguments to those values turns
//! the invented id into a choice the model cannot make: before a search it
//! has to search (or answer), after a search it picks one of the ids found.
//!
//! Grounding shapes only the constraint the provider decodes under. The
//! prompt still shows the tool's own schema, and a call is still validated
//! against it; providers without constraints are not affected.
//!
//! Free-text arguments get a softer form of the same idea: [`copy_phrases`]
//! lists the phrases of the person's messages that a call could quote (what
//! to search for, a city, a name), and a provider that decodes under a
//! constraint may favour copying them.

use std::collections::HashSet;

use serde_json::{Map, Value};

use crate::lexicon::{ASKING_HEADS, NUMBER_WORDS, STOP_WORDS, is_action_verb};
use crate::rank::for_each_term;
use crate::tool::{ToolDefinition, is_identifier_key};

/// The most words in one phrase of [`copy_phrases`].
pub(crate) const MAX_PHRASE_WORDS: usize = 6;

/// The most phrases [`copy_phrases`] gives: what a person writes to an agent
/// has far fewer, and a provider's copy bias does work per phrase and token.
pub(crate) const MAX_COPY_PHRASES: usize = 2048;

/// The most numbers kept of what the person wrote, for number arguments.
const MAX_NUMBERS: usize = 64;

/// The phrases of `texts` (what the person wrote) that a string argument
/// could quote: runs of up to six words, as written, that
/// start and end on a word that says something about the argument — not a
/// common word ("the", "my"), not a verb asking for the action ("find",
/// "add") and not a word of a tool's name. In "add the
/// tent to my cart" with `add_to_cart` shown, `add` and `cart` choose the
/// tool; `tent` is what goes in its arguments. A number word also gives
/// its digits ("two" gives `2`), for a number argument.
pub fn copy_phrases<'a>(
    texts: impl IntoIterator<Item = &'a str>,
    tools: &[ToolDefinition],
) -> Vec<String> {
    phrases_of(texts, tools, false)
}

/// The phrases of `texts` a free string argument may take whole (the
/// policy's `ground_strings`): those of [`copy_phrases`] whose every word,
/// not only the first and last, is no verb of the request and no word of a
/// shown tool's name ("I'd like to borrow Learning Rust" is a request, not
/// a title), with neither a date or time of day (those go to the arguments
/// for them: "2026-03-13 at 09:00" is no title) nor only digits or one
/// number word (a number goes to a number argument: "add one" is a count),
/// and without the digits of number words.
pub(crate) fn quotable_phrases<'a>(
    texts: impl IntoIterator<Item = &'a str>,
    tools: &[ToolDefinition],
) -> Vec<String> {
    phrases_of(texts, tools, true)
}

/// [`copy_phrases`], or with `strict` [`quotable_phrases`].
fn phrases_of<'a>(
    texts: impl IntoIterator<Item = &'a str>,
    tools: &[ToolDefinition],
    strict: bool,
) -> Vec<String> {
    let mut buffer = String::new();
    let mut tool_terms: Vec<String> = Vec::new();
    for tool in tools {
        for_each_term(&tool.name, &mut buffer, |t| tool_terms.push(t.to_string()));
    }
    // A verb of the request or a word of a tool's name chooses the tool; it
    // is not what goes in the arguments.
    let chooses_the_tool = |word: &str, buffer: &mut String| {
        if is_action_verb(&word.to_lowercase()) {
            return true;
        }
        let mut tool_word = false;
        for_each_term(word, buffer, |t| {
            tool_word |= tool_terms.iter().any(|n| n == t)
        });
        tool_word
    };
    let bounds = |word: &str, buffer: &mut String| {
        let lower = word.to_lowercase();
        // "a", "I": one letter says nothing; one digit may ("room 5").
        let one_letter = |w: &str| w.chars().count() == 1 && w.chars().all(char::is_alphabetic);
        // "I'd", "what's", "don't": a common word with its contraction.
        let head = lower.split('\'').next().unwrap_or("");
        let contracted = strict
            && lower.contains('\'')
            && (one_letter(head) || STOP_WORDS.contains(&head) || ASKING_HEADS.contains(&head));
        !(one_letter(&lower)
            || contracted
            || STOP_WORDS.contains(&lower.as_str())
            || chooses_the_tool(word, buffer))
    };
    let mut out: Vec<String> = Vec::new();
    // A set beside the list keeps the pass linear in the text: a long
    // message has many phrases, and a search of the list for each would make
    // it quadratic.
    let mut seen: HashSet<String> = HashSet::new();
    for text in texts {
        let words = word_spans(text);
        let ok: Vec<bool> = words
            .iter()
            .map(|&(s, e)| bounds(&text[s..e], &mut buffer))
            .collect();
        let mut push = |phrase: &str| {
            if out.len() < MAX_COPY_PHRASES && seen.insert(phrase.to_string()) {
                out.push(phrase.to_string());
            }
        };
        // Under `strict`, a phrase stops before a word that may not be in
        // one at all: a verb of the request or a word of a tool's name.
        let inner_ok: Vec<bool> = words
            .iter()
            .map(|&(s, e)| !strict || !chooses_the_tool(&text[s..e], &mut buffer))
            .collect();
        for i in (0..words.len()).filter(|&i| ok[i]) {
            for j in i..words.len().min(i + MAX_PHRASE_WORDS) {
                if !inner_ok[j] {
                    break;
                }
                if !ok[j] {
                    continue;
                }
                let phrase = &text[words[i].0..words[j].1];
                // A lone number word ("add one to the cart") is a count,
                // not a name.
                let when_or_number = phrase
                    .split_whitespace()
                    .any(|w| is_date_or_time(w.trim_matches(|c: char| !c.is_alphanumeric())))
                    || phrase.chars().all(|c| !c.is_alphabetic())
                    || number_of_word(phrase).is_some();
                if !(strict && when_or_number) {
                    push(phrase);
                }
            }
        }
        if strict {
            continue;
        }
        // "two" goes into a quantity as 2: the digits are a phrase too (a
        // provider copies a phrase that is a number into number values).
        for &(s, e) in &words {
            if let Some(number) = number_of_word(&text[s..e]) {
                push(number);
            }
        }
    }
    out
}

/// Byte ranges of the words of `text`: letters, digits, and `'`, `-`, `_`,
/// `.` inside a word (`don't`, `p-17`, `3.5`).
fn word_spans(text: &str) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut start: Option<usize> = None;
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    for (k, &(i, c)) in chars.iter().enumerate() {
        let inner = matches!(c, '\'' | '-' | '_' | '.')
            && start.is_some()
            && chars.get(k + 1).is_some_and(|&(_, n)| n.is_alphanumeric());
        if c.is_alphanumeric() || inner {
            start.get_or_insert(i);
        } else if let Some(s) = start.take() {
            spans.push((s, i));
        }
    }
    if let Some(s) = start {
        spans.push((s, text.len()));
    }
    spans
}

/// Most identifiers kept; the newest win, since a result usually lists the
/// ids the next call needs.
const MAX_IDENTIFIERS: usize = 200;

/// Longest string taken as an identifier.
const MAX_IDENTIFIER_CHARS: usize = 80;

/// Whether a word the person wrote looks like an identifier: it carries a
/// digit (`p-17`, `ORD-2231`, `42`) or joins parts with `_` (`john_doe`).
/// Hyphens alone do not make one: "two-person" is English; nor does a bare
/// number of one or two digits, which is a count ("add 2 of them"), nor a
/// date or a time of day, which says when, not which.
fn is_identifier_word(word: &str) -> bool {
    if word.len() <= 2 && word.chars().all(|c| c.is_ascii_digit()) {
        return false;
    }
    if is_date_or_time(word) || is_measure(word) {
        return false;
    }
    let has_alnum = word.chars().any(|c| c.is_alphanumeric());
    let has_digit = word.chars().any(|c| c.is_ascii_digit());
    let joined = word.trim_matches('_').contains('_');
    has_alnum && (has_digit || joined) && word.chars().count() <= MAX_IDENTIFIER_CHARS
}

/// Whether a word is an amount rather than a name: a number with a
/// fraction (`109.0`, a price) or with a unit written onto it (`30L`,
/// `3.5kg`, `500ml`, `10am`). A cart helper handed "Summit 30L Waterproof
/// Backpack (p-17), price: 109.0" put product `30L`, then `109.0`, in the
/// cart.
fn is_measure(word: &str) -> bool {
    let word = word.trim_start_matches(['$', '€', '£']);
    let unit_start = word
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(word.len());
    let (number, unit) = word.split_at(unit_start);
    let fraction = number
        .split_once('.')
        .is_some_and(|(whole, part)| !whole.is_empty() && !part.is_empty() && !part.contains('.'));
    number.starts_with(|c: char| c.is_ascii_digit())
        && ((unit.is_empty() && fraction)
            || ((1..=3).contains(&unit.chars().count()) && unit.chars().all(char::is_alphabetic)))
}

/// Whether a word is an ISO date (`2026-03-13`), a time of day (`14:30`,
/// `9:05:00`) or both (`2026-03-13T14:30:00Z`). Asked to "move the yoga
/// class on 2026-03-13", a small model otherwise passed the date as the
/// event's id, and grounding let it, since the person wrote it.
fn is_date_or_time(word: &str) -> bool {
    fn digits(part: &str, min: usize, max: usize) -> bool {
        (min..=max).contains(&part.len()) && part.chars().all(|c| c.is_ascii_digit())
    }
    let date = |d: &str| {
        let parts: Vec<&str> = d.split('-').collect();
        parts.len() == 3
            && digits(parts[0], 4, 4)
            && digits(parts[1], 1, 2)
            && digits(parts[2], 1, 2)
    };
    let time = |t: &str| {
        let t = t.trim_end_matches('Z');
        let t = t.split(['+', '.']).next().unwrap_or(t);
        let parts: Vec<&str> = t.split(':').collect();
        (2..=3).contains(&parts.len())
            && digits(parts[0], 1, 2)
            && parts[1..].iter().all(|p| digits(p, 2, 2))
    };
    match word.split_once(['T', 't']) {
        Some((d, t)) => date(d) && time(t),
        None => date(word) || time(word),
    }
}

/// Whether a word inside a result's text names an id (`ORD-7`, `p-17`,
/// `user_42`): it joins letters or digits with `-` or `_` and carries a
/// digit. Text that tools (and sub-agents) write is full of sizes, prices
/// and model names ("30L", "$109") that are not ids.
fn is_result_identifier_word(word: &str) -> bool {
    let joined = word.trim_matches(['-', '_']).contains(['-', '_']);
    joined && is_identifier_word(word) && word.chars().any(|c| c.is_ascii_digit())
}

/// The number `word` states, in digits: `2`, `$20`, `5%`, `3.5kg`, "two"
/// (as `2`); `None` for other words, identifiers with digits (`p-17`)
/// included, since those name a thing rather than count it.
fn number_in(word: &str) -> Option<String> {
    if let Some(n) = number_of_word(word) {
        return Some(n.to_string());
    }
    // "-11" is a coefficient, "$-5" a loss: the sign is the number's.
    let (sign, rest) = match word.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", word),
    };
    let digits = rest.trim_start_matches(['$', '€', '£', '#', '+']);
    let end = digits
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(digits.len());
    let (number, unit) = digits.split_at(end);
    let number = number.trim_end_matches('.');
    let plain_unit = unit.chars().all(|c| c.is_alphabetic() || c == '%');
    (!number.is_empty()
        && number.starts_with(|c: char| c.is_ascii_digit())
        && number.parse::<f64>().is_ok()
        && plain_unit)
        .then(|| format!("{sign}{number}"))
}

/// The number a number word stands for.
fn number_of_word(word: &str) -> Option<&'static str> {
    let lower = word.to_lowercase();
    NUMBER_WORDS
        .iter()
        .find(|(w, _)| *w == lower)
        .and_then(|(_, n)| *n)
}

/// The identifiers a conversation has shown, oldest first, and the numbers
/// the person wrote.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Identifiers {
    values: Vec<Value>,
    /// The distinct numbers the person wrote, in digits ("two" as `2`).
    numbers: Vec<String>,
    /// Those of them written as an amount, with a unit on the number
    /// (`30L`): no count.
    measured: Vec<String>,
    /// The distinct dates and times of day the conversation shows (the
    /// person's words and the tools' results), as written.
    when: Vec<String>,
    /// Whether a successful result showed a number (not an identifier).
    result_numbers: bool,
    /// What the person wrote, message by message, oldest first (a delegated
    /// run's task among them): free strings quote its phrases.
    said: Vec<String>,
    /// The pieces of the successful results a free string may quote (their
    /// short values and lines, and the parts of those), oldest first.
    found: Vec<String>,
    /// The values the agent's instructions state (see
    /// [`Identifiers::add_stated`]): what they quote, and the paths they
    /// hold.
    stated: Vec<String>,
    /// The identifiers of the items that the person's newest words pick out
    /// of the newest result that brought new ones (see
    /// [`crate::prompt::picked_items`]); none when it picked none.
    picked: Vec<Value>,
}

impl Identifiers {
    /// No identifiers yet.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The identifiers, oldest first.
    pub(crate) fn values(&self) -> &[Value] {
        &self.values
    }

    /// The same identifiers less `used`.
    pub(crate) fn without(&self, used: &[Value]) -> Identifiers {
        Identifiers {
            values: self
                .values
                .iter()
                .filter(|v| !used.contains(v))
                .cloned()
                .collect(),
            numbers: self.numbers.clone(),
            measured: self.measured.clone(),
            when: self.when.clone(),
            result_numbers: self.result_numbers,
            said: self.said.clone(),
            found: self.found.clone(),
            stated: self.stated.clone(),
            picked: self
                .picked
                .iter()
                .filter(|v| !used.contains(v))
                .cloned()
                .collect(),
        }
    }

    /// Notes a date or time of day (see [`is_date_or_time`]).
    fn note_when(&mut self, word: &str) {
        if is_date_or_time(word)
            && self.when.len() < MAX_NUMBERS
            && !self.when.iter().any(|w| w == word)
        {
            self.when.push(word.to_string());
        }
    }

    /// The identifier values of a call's arguments (top level, and the
    /// items of identifier lists).
    pub(crate) fn of_call(arguments: &Value) -> Vec<Value> {
        let mut out = Vec::new();
        if let Some(map) = arguments.as_object() {
            for (_, value) in map.iter().filter(|(k, _)| is_identifier_key(k)) {
                match value {
                    Value::Array(items) => out.extend(items.iter().cloned()),
                    other => out.push(other.clone()),
                }
            }
        }
        out
    }

    /// Whether the person wrote a number (in digits or as a word).
    pub(crate) fn has_numbers(&self) -> bool {
        !self.numbers.is_empty()
    }

    /// How many different numbers the person wrote.
    pub(crate) fn number_count(&self) -> usize {
        self.numbers.len()
    }

    /// How many of them were written whole: no fraction (`109.0`) and no
    /// unit on the number (`30L`), as a count is written.
    pub(crate) fn whole_count(&self) -> usize {
        self.numbers
            .iter()
            .filter(|n| !n.contains('.') && !self.measured.contains(n))
            .count()
    }

    /// Adds one identifier; whether it was new.
    fn push(&mut self, value: Value) -> bool {
        let ok = match &value {
            Value::String(s) => !s.trim().is_empty() && s.chars().count() <= MAX_IDENTIFIER_CHARS,
            Value::Number(n) => n.is_i64() || n.is_u64(),
            _ => false,
        };
        if !ok {
            return false;
        }
        // Seen again: it moves to the newest end, so trimming keeps it.
        let before = self.values.len();
        self.values.retain(|v| v != &value);
        let new = self.values.len() == before;
        self.values.push(value);
        if self.values.len() > MAX_IDENTIFIERS {
            let extra = self.values.len() - MAX_IDENTIFIERS;
            self.values.drain(..extra);
        }
        new
    }

    /// Takes the values a text of the operator's states (the agent's
    /// instructions): what it quotes, and each word written like a path
    /// ("/srv/repo", "notes.db"). The instructions often name what a tool needs and the
    /// person never says: the repository folder, the database, the sheet.
    /// They are evidence a free string may copy, never a limit on it.
    pub(crate) fn add_stated(&mut self, text: &str) {
        let mut push = |piece: &str| {
            let piece = trim_piece(piece);
            if !piece.is_empty()
                && piece.chars().count() <= MAX_PIECE_CHARS
                && !self.stated.iter().any(|s| s == piece)
            {
                self.stated.push(piece.to_string());
            }
        };
        // A quoted template ("Add <id> to the cart") shows a form, not a
        // value: its placeholder is for the model to fill, never to copy.
        for piece in quoted_runs(text).into_iter().filter(|p| !p.contains('<')) {
            push(piece);
        }
        for word in text.split_whitespace() {
            let word =
                word.trim_matches(|c: char| matches!(c, ',' | ';' | '(' | ')' | '"' | '\'' | '`'));
            let word = word.strip_suffix('.').unwrap_or(word);
            // Paths, not ids: an id the instructions give ("ids like b-4")
            // is an example of the form, and ids are evidence only where
            // a result or the person gave them (see `ground_identifiers`).
            if looks_like_path(word) {
                push(word);
            }
        }
    }

    /// Takes the identifier-shaped words and the numbers of something the
    /// person wrote; how many identifiers were new.
    pub(crate) fn add_user_text(&mut self, text: &str) -> usize {
        let text = text.trim();
        if !text.is_empty() && !self.said.iter().any(|s| s == text) {
            self.said.push(text.to_string());
            if self.said.len() > MAX_SAID {
                self.said.remove(0);
            }
        }
        self.add_words(text, true)
    }

    fn add_words(&mut self, text: &str, from_person: bool) -> usize {
        let mut new = 0;
        for raw in text.split(|c: char| c.is_whitespace() || ",;()[]{}<>\"'`".contains(c)) {
            // Sentence punctuation around a word is not part of it.
            let word = raw.trim_matches(|c: char| ".:!?".contains(c));
            self.note_when(word);
            if !from_person && number_in(word).is_some() {
                self.result_numbers = true;
            }
            if from_person
                && self.numbers.len() < MAX_NUMBERS
                && let Some(number) = number_in(word)
                && !self.numbers.contains(&number)
            {
                if is_measure(word) && !self.measured.contains(&number) {
                    self.measured.push(number.clone());
                }
                self.numbers.push(number);
            }
            let id = if from_person {
                is_identifier_word(word)
            } else {
                is_result_identifier_word(word)
            };
            if id {
                new += usize::from(self.push(Value::String(word.to_string())));
                if let Ok(n) = word.parse::<i64>() {
                    new += usize::from(self.push(Value::from(n)));
                }
            }
        }
        new
    }

    /// Takes the identifiers of a successful tool result: the values of its
    /// identifier keys when it is JSON, its identifier-shaped words when it is
    /// text; how many were new.
    pub(crate) fn add_result(&mut self, result: &str) -> usize {
        match serde_json::from_str::<Value>(result.trim()) {
            Ok(value) => {
                let mut texts = Vec::new();
                string_leaves(&value, &mut texts);
                for text in texts {
                    self.note_found(text);
                }
                let new = self.add_json(&value, false);
                if new > 0 {
                    self.picked = self.picked_in(&value);
                }
                new
            }
            Err(_) => {
                for line in result.lines() {
                    self.note_found(line);
                }
                self.add_words(result, false)
            }
        }
    }

    /// The identifiers of the items of a listed result (an array, or the
    /// array of an object of a few fields) that the person's newest words
    /// pick out: "Stars Over the Desert" picks b-7 of the books a search
    /// for it found, not the others that only share "the".
    fn picked_in(&self, value: &Value) -> Vec<Value> {
        let items = match value {
            Value::Array(items) => items,
            Value::Object(map) if map.len() <= 3 => match map.values().find_map(Value::as_array) {
                Some(items) => items,
                None => return Vec::new(),
            },
            _ => return Vec::new(),
        };
        let Some(said) = self.said.last() else {
            return Vec::new();
        };
        let wanted = crate::prompt::query_terms(said);
        let mut ids = Identifiers::default();
        let picked = match items.as_slice() {
            // A list of one that the words name is picked too ("Put two of
            // the Daytrip 20L backpacks in my basket" found one backpack):
            // its id, not a size the person wrote, is the one meant.
            [_] if crate::prompt::item_scores(items, &wanted)[0] > 0 => vec![0],
            _ => crate::prompt::picked_items(items, &wanted),
        };
        for i in picked {
            ids.add_json(&items[i], false);
        }
        ids.values
    }

    /// Notes a value or line of a result, and its parts, as pieces a free
    /// string may quote; the newest are kept.
    fn note_found(&mut self, text: &str) {
        for piece in std::iter::once(text).chain(text.split([',', ';', ':'])) {
            let piece = trim_piece(piece);
            if piece.is_empty() || piece.chars().count() > MAX_PIECE_CHARS {
                continue;
            }
            self.found.retain(|f| f != piece);
            self.found.push(piece.to_string());
        }
        if self.found.len() > MAX_FOUND {
            let extra = self.found.len() - MAX_FOUND;
            self.found.drain(..extra);
        }
    }

    /// The phrases a free string argument may take (see
    /// [`ground_string_values`]): the person's phrases that could be quoted
    /// beside `tools` ([`quotable_phrases`]), what the person dictated (quoted,
    /// or after a colon), then the pieces of the results, newest first; at
    /// most [`MAX_STRING_CHOICES`].
    pub(crate) fn string_choices(&self, tools: &[ToolDefinition]) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let mut seen: HashSet<String> = HashSet::new();
        let mut push = |piece: &str, out: &mut Vec<String>| {
            let piece = trim_piece(piece);
            if !piece.is_empty()
                && piece.chars().count() <= MAX_PIECE_CHARS
                && out.len() < MAX_STRING_CHOICES
                && seen.insert(piece.to_string())
            {
                out.push(piece.to_string());
            }
        };
        for said in self.said.iter().rev() {
            for piece in dictated(said) {
                push(piece, &mut out);
            }
        }
        for phrase in quotable_phrases(self.said.iter().rev().map(String::as_str), tools) {
            push(&phrase, &mut out);
        }
        for piece in self.found.iter().rev() {
            push(piece, &mut out);
        }
        for piece in &self.stated {
            push(piece, &mut out);
        }
        out
    }

    fn add_json(&mut self, value: &Value, under_id_key: bool) -> usize {
        let mut new = 0;
        match value {
            Value::Object(map) => {
                for (key, inner) in map {
                    new += self.add_json(inner, is_identifier_key(key));
                }
            }
            Value::Array(items) => {
                for item in items {
                    new += self.add_json(item, under_id_key);
                }
            }
            Value::String(s) if under_id_key => {
                new += usize::from(self.push(Value::String(s.clone())));
                if let Ok(n) = s.parse::<i64>() {
                    new += usize::from(self.push(Value::from(n)));
                }
            }
            Value::Number(_) if !under_id_key => {
                self.result_numbers = true;
            }
            Value::Number(n) if under_id_key => {
                new += usize::from(self.push(Value::Number(n.clone())));
                new += usize::from(self.push(Value::String(n.to_string())));
            }
            // Text inside a result may name ids too ("order ORD-7 placed"):
            // words that join letters or digits with `-` or `_` and carry a
            // digit, so sizes and model names ("30L") are not taken.
            Value::String(s) if s.len() <= 400 => {
                for word in s.split_whitespace() {
                    let word = word.trim_matches(|c: char| ".,:;!?()\"'".contains(c));
                    self.note_when(word);
                    if is_result_identifier_word(word) {
                        new += usize::from(self.push(Value::String(word.to_string())));
                    }
                }
            }
            _ => {}
        }
        new
    }

    /// The identifiers a property of the given JSON type may take.
    fn of_type(&self, ty: &str) -> Vec<Value> {
        self.values
            .iter()
            .filter(|v| match ty {
                "string" => v.is_string(),
                "integer" | "number" => v.is_number(),
                _ => false,
            })
            .cloned()
            .collect()
    }
}

/// The most messages of the person's kept for [`Identifiers::string_choices`].
const MAX_SAID: usize = 8;

/// The most result pieces kept for [`Identifiers::string_choices`].
const MAX_FOUND: usize = 200;

/// The longest piece a free string may take, in characters: a longer value
/// is a document, not something to pass on whole.
const MAX_PIECE_CHARS: usize = 100;

/// The most phrases one free string may choose from: enough for a request
/// and a few results, few enough for a grammar compiled every step.
const MAX_STRING_CHOICES: usize = 400;

/// A piece without the white space and sentence punctuation around it.
fn trim_piece(piece: &str) -> &str {
    piece
        .trim()
        .trim_matches(|c: char| "\"'`".contains(c))
        .trim_end_matches(['.', '!', '?', ',', ';', ':'])
        .trim()
}

/// What the person dictated in `text`, to be passed on as written: each
/// quoted run ('…', "…", `…`) and what follows a colon to the end of its
/// sentence ("a file that says: Pick up the dry cleaning on Friday.").
fn dictated(text: &str) -> Vec<&str> {
    let mut out = quoted_runs(text);
    if let Some(colon) = text.find(": ") {
        let after = &text[colon + 2..];
        let end = after
            .char_indices()
            .find(|&(i, c)| {
                matches!(c, '.' | '!' | '?')
                    && after[i + 1..]
                        .chars()
                        .next()
                        .is_none_or(char::is_whitespace)
            })
            .map_or(after.len(), |(i, _)| i);
        out.push(&after[..end]);
    }
    out
}

/// Each quoted run of `text` ('…', "…", `…`, “…”).
fn quoted_runs(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for quote in ['\'', '"', '`', '“'] {
        let close = if quote == '“' { '”' } else { quote };
        let mut rest = text;
        while let Some(open) = rest.find(quote) {
            // An apostrophe inside a word ("what's") opens nothing.
            let before = rest[..open].chars().next_back();
            if quote == '\'' && before.is_some_and(char::is_alphanumeric) {
                rest = &rest[open + 1..];
                continue;
            }
            let inner = &rest[open + quote.len_utf8()..];
            let Some(end) = inner.find(close) else {
                break;
            };
            if end > 0 {
                out.push(&inner[..end]);
            }
            rest = &inner[end + close.len_utf8()..];
        }
    }
    out
}

/// The string values inside a result, at any depth (not its keys).
fn string_leaves<'a>(value: &'a Value, out: &mut Vec<&'a str>) {
    match value {
        Value::String(s) => out.push(s),
        Value::Array(items) => items.iter().for_each(|v| string_leaves(v, out)),
        Value::Object(map) => map.values().for_each(|v| string_leaves(v, out)),
        _ => {}
    }
}

/// Whether a property holds free text: a string that is not an identifier,
/// not a date or time and that lists no values, pattern or format.
pub(crate) fn is_free_string(key: Option<&str>, prop: &Value) -> bool {
    scalar_type(prop) == Some("string")
        && !key.is_some_and(is_identifier_key)
        && ["enum", "const", "pattern", "format"]
            .iter()
            .all(|k| prop.get(*k).is_none())
        && when_kind(prop).is_none()
}

/// Whether a free string names a file or folder: its property name says
/// path, file, folder or directory, or its description says path.
fn names_a_path(key: Option<&str>, prop: &Value) -> bool {
    let key = key.unwrap_or("").to_lowercase();
    let described = prop
        .get("description")
        .and_then(Value::as_str)
        .is_some_and(|d| {
            d.split(|c: char| !c.is_alphanumeric())
                .any(|w| w.eq_ignore_ascii_case("path"))
        });
    ["path", "file", "folder", "dir"]
        .iter()
        .any(|w| key.contains(w))
        || described
}

/// Whether a phrase is written like a path: one word with a slash, or a
/// name with an extension of letters ("agenda.txt", "reports/jan.csv").
fn looks_like_path(phrase: &str) -> bool {
    if phrase.is_empty() || phrase.contains(char::is_whitespace) {
        return false;
    }
    if phrase.contains('/') || phrase.contains('\\') {
        return true;
    }
    phrase.rsplit_once('.').is_some_and(|(stem, ext)| {
        !stem.is_empty()
            && (1..=5).contains(&ext.len())
            && ext.chars().all(|c| c.is_ascii_alphanumeric())
            && ext.chars().any(|c| c.is_ascii_alphabetic())
    })
}

/// The tool with its free string arguments narrowed to `choices` (the
/// conversation's phrases, [`Identifiers::string_choices`]), for a
/// constraint (the policy's `ground_strings`). A free string (see
/// [`is_free_string`]; at any depth of objects and arrays) may only take a
/// choice that fits its length bounds; one that none fit keeps its schema.
pub(crate) fn ground_string_values(tool: &ToolDefinition, choices: &[String]) -> ToolDefinition {
    if choices.is_empty() {
        return tool.clone();
    }
    let mut schema = tool.input_schema.clone();
    narrow_strings(&mut schema, None, choices, 0);
    ToolDefinition {
        input_schema: schema,
        ..tool.clone()
    }
}

/// Narrows the free strings inside `schema` (see [`ground_string_values`]);
/// `key` is the property name it sits under.
fn narrow_strings(schema: &mut Value, key: Option<&str>, choices: &[String], depth: usize) {
    // Deeper than any tool's arguments go in practice: leave it as it is.
    if depth > 8 {
        return;
    }
    if is_free_string(key, schema) {
        let bound = |k: &str| schema.get(k).and_then(Value::as_u64).map(|n| n as usize);
        let (min, max) = (bound("minLength").unwrap_or(0), bound("maxLength"));
        // A path takes a path when the conversation wrote one: the default
        // model wrote a file to "Project kickoff", a title it had read,
        // when the person had named agenda.txt.
        let paths_only = names_a_path(key, schema) && choices.iter().any(|c| looks_like_path(c));
        let fit: Vec<Value> = choices
            .iter()
            .filter(|c| {
                let n = c.chars().count();
                n >= min && max.is_none_or(|m| n <= m) && (!paths_only || looks_like_path(c))
            })
            .map(|c| Value::String(c.clone()))
            .collect();
        if !fit.is_empty()
            && let Some(map) = schema.as_object_mut()
        {
            map.insert("enum".to_string(), Value::Array(fit));
        }
        return;
    }
    if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        for (name, prop) in props.iter_mut() {
            narrow_strings(prop, Some(name), choices, depth + 1);
        }
    }
    if let Some(items) = schema.get_mut("items") {
        narrow_strings(items, key, choices, depth + 1);
    }
}

/// The property's single JSON type, when it has one we can ground.
fn scalar_type(schema: &Value) -> Option<&str> {
    match schema.get("type")? {
        Value::String(t) => Some(t.as_str()),
        Value::Array(types) => {
            let mut real = types
                .iter()
                .filter_map(Value::as_str)
                .filter(|t| *t != "null");
            let first = real.next()?;
            real.next().is_none().then_some(first)
        }
        _ => None,
    }
}

/// Narrows one identifier property to `ids`; `None` when no value fits.
fn ground_property(prop: &Value, ids: &Identifiers) -> Option<Value> {
    // The schema already lists its values: nothing to add.
    if prop.get("enum").is_some() || prop.get("const").is_some() {
        return Some(prop.clone());
    }
    let mut out = prop.as_object().cloned().unwrap_or_default();
    match scalar_type(prop)? {
        ty @ ("string" | "integer" | "number") => {
            let mut values = ids.of_type(ty);
            if values.is_empty() {
                return None;
            }
            // The items the person's words pick out of the newest list are
            // the ones meant; the list's other ids are not.
            let picked: Vec<Value> = ids
                .picked
                .iter()
                .filter(|v| values.contains(v))
                .cloned()
                .collect();
            if !picked.is_empty() {
                values = picked;
            }
            out.remove("pattern");
            out.remove("format");
            out.insert("enum".to_string(), Value::Array(values));
        }
        "array" => {
            let items = prop.get("items")?;
            let grounded = ground_property(items, ids)?;
            out.insert("items".to_string(), grounded);
        }
        _ => return Some(prop.clone()),
    }
    Some(Value::Object(out))
}

/// Whether one of the tool's top-level arguments is free text: a string that
/// is not an identifier and lists no allowed values.
pub(crate) fn takes_free_text(tool: &ToolDefinition) -> bool {
    tool.input_schema
        .get("properties")
        .and_then(Value::as_object)
        .is_some_and(|props| {
            props.iter().any(|(k, p)| {
                !is_identifier_key(k)
                    && scalar_type(p) == Some("string")
                    && p.get("enum").is_none()
                    && p.get("const").is_none()
            })
        })
}

/// Whether the tool requires a number (see [`requires_a_number`]) while the
/// conversation shows none: neither the person's words nor a result.
pub(crate) fn waits_for_a_number(tool: &ToolDefinition, ids: &Identifiers) -> bool {
    requires_a_number(tool) && !ids.has_numbers() && !ids.result_numbers
}

/// Whether a top-level argument of the tool lists (`enum`) a string value
/// of three or more characters that `request` holds as words of its own,
/// in any case ("Chicago" for a `location` of `New York`, `Chicago` and
/// `Los Angeles`).
pub(crate) fn lists_a_written_value(tool: &ToolDefinition, request: &str) -> bool {
    let lower = request.to_lowercase();
    let holds = |value: &str| {
        let value = value.to_lowercase();
        lower.match_indices(&value).any(|(at, _)| {
            let before = lower[..at].chars().next_back();
            let after = lower[at + value.len()..].chars().next();
            !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric)
        })
    };
    properties_of(tool).is_some_and(|(props, _)| {
        props.values().any(|p| {
            p.get("enum")
                .and_then(Value::as_array)
                .is_some_and(|values| {
                    values
                        .iter()
                        .filter_map(Value::as_str)
                        .any(|v| v.chars().count() >= 3 && holds(v))
                })
        })
    })
}

/// Whether the tool requires a number that is not an identifier (a sum's
/// terms, a quantity it cannot do without).
pub(crate) fn requires_a_number(tool: &ToolDefinition) -> bool {
    required_numbers(tool) > 0
}

/// How many numbers that are not identifiers (nor picked from an `enum`)
/// the tool requires.
fn required_numbers(tool: &ToolDefinition) -> usize {
    properties_of(tool).map_or(0, |(props, required)| {
        props
            .iter()
            .filter(|(k, p)| {
                required.contains(&k.as_str())
                    && !is_identifier_key(k)
                    && matches!(scalar_type(p), Some("integer" | "number"))
                    && p.get("enum").is_none()
            })
            .count()
    })
}

/// Whether the tool requires more numbers than the conversation gives it:
/// the person wrote fewer distinct numbers (in words, or any run of digits
/// in `request`, a formula's too) than it has required number arguments,
/// and no result showed one. A call would have to make the rest up: "the
/// final price after a 25% discount and 10% tax" gives
/// `calculateFinalPrice` its rates but no price.
pub(crate) fn short_of_numbers(tool: &ToolDefinition, ids: &Identifiers, request: &str) -> bool {
    let needed = required_numbers(tool);
    if needed == 0 || ids.result_numbers {
        return false;
    }
    let mut runs = digit_runs(request);
    runs.sort_unstable();
    runs.dedup();
    ids.number_count().max(runs.len()) < needed
}

/// Whether the tool, in the form a step offers it (its free strings
/// narrowed to the conversation's phrases by [`ground_string_values`]),
/// still requires a free string: no phrase of the conversation fits it, so
/// a call would have to make one up. "What is a holy book?" gives
/// `search_holy_books` no `book`: its only words name the tool.
pub(crate) fn short_of_strings(offered: &ToolDefinition) -> bool {
    properties_of(offered).is_some_and(|(props, required)| {
        props
            .iter()
            .any(|(k, p)| required.contains(&k.as_str()) && is_free_string(Some(k), p))
    })
}

/// The runs of digits in `text`, in order and without their leading
/// zeros ("-$100, 40" gives 100 and 40; "07" is 7).
pub(crate) fn digit_runs(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_ascii_digit())
        .filter(|r| !r.is_empty())
        .map(without_leading_zeros)
        .collect()
}

/// Digits without their leading zeros ("007" and "7" are one number).
pub(crate) fn without_leading_zeros(digits: &str) -> String {
    match digits.trim_start_matches('0') {
        "" => "0".to_string(),
        rest => rest.to_string(),
    }
}

/// Whether one of the tool's top-level arguments is an identifier.
pub(crate) fn takes_identifier(tool: &ToolDefinition) -> bool {
    tool.input_schema
        .get("properties")
        .and_then(Value::as_object)
        .is_some_and(|props| props.keys().any(|k| is_identifier_key(k)))
}

/// A tool's top-level properties and the names its schema requires; `None`
/// when the schema has no properties.
fn properties_of(tool: &ToolDefinition) -> Option<(&Map<String, Value>, Vec<&str>)> {
    let props = tool
        .input_schema
        .get("properties")
        .and_then(Value::as_object)?;
    Some((props, required_of(&tool.input_schema)))
}

/// The names an object schema's `required` lists.
pub(crate) fn required_of(schema: &Value) -> Vec<&str> {
    schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The tool with its identifier arguments narrowed to `ids`, for a
/// constraint. An optional identifier with no value to take is left out of
/// the constrained schema; a required one makes the tool uncallable for now
/// (`None`). An optional number (a quantity, a limit) is left out too when
/// the person wrote no number: the tool's default is a better guess than
/// the one a tiny model makes up. When the person wrote more numbers than
/// the tool requires, as many optional numbers become required (in the
/// schema's order). Tools without such arguments come back unchanged.
/// `identifiers` and `numbers` switch the two halves (the policy's
/// `ground_identifiers` and `ground_numbers`).
pub(crate) fn ground_tool(
    tool: &ToolDefinition,
    ids: &Identifiers,
    identifiers: bool,
    numbers: bool,
) -> Option<ToolDefinition> {
    let Some((props, required)) = properties_of(tool) else {
        return Some(tool.clone());
    };
    let is_count = |name: &str, prop: &Value| {
        matches!(scalar_type(prop), Some("integer" | "number")) && !is_identifier_key(name)
    };
    // Every number the person wrote is there to go somewhere: those the
    // required numbers do not take go to the optional ones, which become
    // required ("put three of p-17 in the cart" sets the quantity, which a
    // tiny model otherwise leaves out).
    let required_counts = props
        .iter()
        .filter(|(name, prop)| required.contains(&name.as_str()) && is_count(name, prop))
        .count();
    let mut surplus = ids.number_count().saturating_sub(required_counts);
    let mut now_required: Vec<String> = Vec::new();
    let mut new_props = Map::new();
    let mut changed = false;
    for (name, prop) in props {
        let optional = !required.contains(&name.as_str());
        if numbers && optional && is_count(name, prop) {
            // A count is written whole: a number with a fraction (`109.0`,
            // a price) or a unit on it (`30L`, a size) is an amount. With
            // none written whole, an integer is left to the tool's default.
            let written = match scalar_type(prop) {
                Some("integer") => ids.whole_count(),
                _ => ids.number_count(),
            };
            if written == 0 {
                changed = true;
                continue;
            }
            if surplus > 0 {
                surplus -= 1;
                now_required.push(name.clone());
            }
        }
        if !identifiers || !is_identifier_key(name) || scalar_type(prop).is_none() {
            new_props.insert(name.clone(), prop.clone());
            continue;
        }
        match ground_property(prop, ids) {
            Some(grounded) => {
                changed |= &grounded != prop;
                new_props.insert(name.clone(), grounded);
            }
            None if !optional => return None,
            None => changed = true,
        }
    }
    if !changed && now_required.is_empty() {
        return Some(tool.clone());
    }
    let mut schema = tool.input_schema.clone();
    if let Some(map) = schema.as_object_mut() {
        map.insert("properties".to_string(), Value::Object(new_props));
        if !now_required.is_empty() {
            let mut all: Vec<Value> = required.iter().map(|&r| Value::from(r)).collect();
            all.extend(now_required.into_iter().map(Value::from));
            map.insert("required".to_string(), Value::Array(all));
        }
    }
    Some(ToolDefinition {
        input_schema: schema,
        ..tool.clone()
    })
}

/// What a string argument holds when its schema says it is a date or a
/// time of day: its `format`, or a description that spells the form out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WhenKind {
    Date,
    Time,
    DateTime,
}

fn when_kind(prop: &Value) -> Option<WhenKind> {
    if scalar_type(prop) != Some("string")
        || prop.get("enum").is_some()
        || prop.get("const").is_some()
    {
        return None;
    }
    match prop.get("format").and_then(Value::as_str) {
        Some("date") => return Some(WhenKind::Date),
        Some("time") => return Some(WhenKind::Time),
        Some("date-time") => return Some(WhenKind::DateTime),
        _ => {}
    }
    let description = prop
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_uppercase();
    match (
        description.contains("YYYY-MM-DD"),
        description.contains("HH:MM"),
    ) {
        (true, true) => Some(WhenKind::DateTime),
        (true, false) => Some(WhenKind::Date),
        (false, true) => Some(WhenKind::Time),
        (false, false) => None,
    }
}

/// Whether a date or time `word` (see [`is_date_or_time`]) is of `kind`.
fn is_of_kind(word: &str, kind: WhenKind) -> bool {
    let has_date = word
        .get(..5)
        .is_some_and(|head| head[..4].chars().all(|c| c.is_ascii_digit()) && head.ends_with('-'));
    let has_time = word.contains(':');
    match kind {
        WhenKind::Date => has_date && !has_time,
        WhenKind::Time => has_time && !has_date,
        WhenKind::DateTime => has_date && has_time,
    }
}

/// The tool with its date and time arguments narrowed to the dates and
/// times the conversation shows, for a constraint (the policy's
/// `ground_dates`). A top-level string argument whose schema says it holds
/// a date, a time of day or both (`format`, or a description that spells
/// `YYYY-MM-DD` / `HH:MM`) may only take one of those of its kind; an
/// optional one with none to take is left out (the tool's default beats an
/// invented day), a required one keeps its schema.
pub(crate) fn ground_when_values(tool: &ToolDefinition, ids: &Identifiers) -> ToolDefinition {
    let Some((props, required)) = properties_of(tool) else {
        return tool.clone();
    };
    let mut new_props = Map::new();
    let mut changed = false;
    for (name, prop) in props {
        let Some(kind) = when_kind(prop) else {
            new_props.insert(name.clone(), prop.clone());
            continue;
        };
        let values: Vec<Value> = ids
            .when
            .iter()
            .filter(|w| is_of_kind(w, kind))
            .map(|w| Value::String(w.clone()))
            .collect();
        if !values.is_empty() {
            let mut narrowed = prop.clone();
            if let Some(map) = narrowed.as_object_mut() {
                map.insert("enum".to_string(), Value::Array(values));
            }
            new_props.insert(name.clone(), narrowed);
            changed = true;
        } else if required.contains(&name.as_str()) {
            new_props.insert(name.clone(), prop.clone());
        } else {
            changed = true;
        }
    }
    if !changed {
        return tool.clone();
    }
    let mut schema = tool.input_schema.clone();
    if let Some(map) = schema.as_object_mut() {
        map.insert("properties".to_string(), Value::Object(new_props));
    }
    ToolDefinition {
        input_schema: schema,
        ..tool.clone()
    }
}

/// The characters a value's shape is read from: those that join the
/// parts of an identifier-like value (a zone, a path, an address, a time).
const SHAPE_CHARS: [char; 5] = ['/', '_', '@', ':', '.'];

/// The shapes the shown tools' schemas give their string arguments by
/// example (see `Decoding::copy_shapes`): argument name → the characters of
/// [`SHAPE_CHARS`] that every one of its two examples or more holds. The
/// examples are a string argument's `examples` and the runs its description
/// quotes (`'…'`, `"…"` or `` `…` ``); an argument whose examples share no
/// such character, or that two tools shape differently, has no shape.
pub(crate) fn example_shapes(tools: &[ToolDefinition]) -> Vec<(String, String)> {
    fn walk(schema: &Value, out: &mut Vec<(String, Option<String>)>, depth: usize) {
        if depth > 16 {
            return;
        }
        let Some(map) = schema.as_object() else {
            return;
        };
        if let Some(props) = map.get("properties").and_then(Value::as_object) {
            for (name, prop) in props {
                if scalar_type(prop) == Some("string") {
                    out.push((name.clone(), shape_of(prop)));
                }
                walk(prop, out, depth + 1);
            }
        }
        if let Some(items) = map.get("items") {
            walk(items, out, depth + 1);
        }
    }
    let mut found: Vec<(String, Option<String>)> = Vec::new();
    for tool in tools {
        walk(&tool.input_schema, &mut found, 0);
    }
    let mut shapes: Vec<(String, String)> = Vec::new();
    for (name, shape) in &found {
        let Some(shape) = shape else { continue };
        // One name, one shape: a name some tool leaves free, or shapes
        // differently, is left free.
        let agreed = found
            .iter()
            .filter(|(n, _)| n == name)
            .all(|(_, s)| s.as_ref() == Some(shape));
        if agreed && !shapes.iter().any(|(n, _)| n == name) {
            shapes.push((name.clone(), shape.clone()));
        }
    }
    shapes
}

/// The characters of [`SHAPE_CHARS`] that every example of a string
/// argument holds, if it has two examples or more and they share one.
fn shape_of(prop: &Value) -> Option<String> {
    let mut examples: Vec<&str> = prop
        .get("examples")
        .and_then(Value::as_array)
        .map(|e| e.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if let Some(description) = prop.get("description").and_then(Value::as_str) {
        examples.extend(quoted_examples(description));
    }
    // One example cannot tell its shape from its accidents (the `_` of
    // `America/New_York`); two or more can.
    if examples.len() < 2 {
        return None;
    }
    let mut shape: Option<Vec<char>> = None;
    for example in &examples {
        let has: Vec<char> = SHAPE_CHARS
            .iter()
            .copied()
            .filter(|c| example.contains(*c))
            .collect();
        shape = Some(match shape {
            None => has,
            Some(s) => s.into_iter().filter(|c| has.contains(c)).collect(),
        });
    }
    shape
        .filter(|s| !s.is_empty())
        .map(|s| s.into_iter().collect())
}

/// The runs a description quotes between `'`, `"` or `` ` `` that look like
/// values: two to sixty-four characters, no line break, no space at either
/// end. A quote mark between two letters is an apostrophe ("the person's
/// city"), neither an opening nor a closing one.
fn quoted_examples(description: &str) -> Vec<&str> {
    let chars: Vec<(usize, char)> = description.char_indices().collect();
    let word = |i: usize| chars.get(i).is_some_and(|(_, c)| c.is_alphanumeric());
    let mut out = Vec::new();
    let mut open: Option<(usize, char)> = None;
    for (i, &(at, c)) in chars.iter().enumerate() {
        if !matches!(c, '\'' | '"' | '`') || (i > 0 && word(i - 1) && word(i + 1)) {
            continue;
        }
        match open {
            Some((from, q)) if q == c => {
                let run = &description[from..at];
                let n = run.chars().count();
                if (2..=64).contains(&n) && !run.contains('\n') && run.trim() == run {
                    out.push(run);
                }
                open = None;
            }
            Some(_) => {}
            None => open = Some((at + c.len_utf8(), c)),
        }
    }
    out
}

/// The tool with every required array of its schema (at any depth of
/// objects and array items) made to hold at least one item, for a
/// constraint (the policy's `filled_lists`). An array whose schema sets its
/// own `minItems` keeps it, and one capped at none by `maxItems` is left
/// alone.
///
/// An empty list satisfies such a schema but asks the tool to do nothing:
/// under a constraint Qwen2.5-Coder wrote `create_entities {"entities":
/// []}` to remember a fact, and `request_planning` with `"tasks": []` to
/// plan a move.
pub(crate) fn fill_required_lists(tool: &ToolDefinition) -> ToolDefinition {
    let mut schema = tool.input_schema.clone();
    if !fill_lists(&mut schema, 0) {
        return tool.clone();
    }
    ToolDefinition {
        input_schema: schema,
        ..tool.clone()
    }
}

/// [`fill_required_lists`] on one schema; whether anything changed.
fn fill_lists(schema: &mut Value, depth: usize) -> bool {
    // Schemas nest as deep as their author likes; a real argument list is
    // a few levels deep.
    if depth > 16 {
        return false;
    }
    let required: Vec<String> = required_of(schema)
        .into_iter()
        .map(str::to_string)
        .collect();
    let Some(map) = schema.as_object_mut() else {
        return false;
    };
    let mut changed = false;
    if let Some(props) = map.get_mut("properties").and_then(Value::as_object_mut) {
        for (name, prop) in props.iter_mut() {
            if required.contains(name)
                && let Some(p) = prop.as_object_mut()
                && is_array_schema(p)
                && !p.contains_key("minItems")
                && p.get("maxItems").and_then(Value::as_u64) != Some(0)
            {
                p.insert("minItems".to_string(), Value::from(1));
                changed = true;
            }
            changed |= fill_lists(prop, depth + 1);
        }
    }
    if let Some(items) = map.get_mut("items") {
        changed |= fill_lists(items, depth + 1);
    }
    changed
}

/// Whether a schema is (only) an array's.
fn is_array_schema(schema: &Map<String, Value>) -> bool {
    match schema.get("type") {
        Some(Value::String(t)) => t == "array",
        Some(_) => false,
        None => schema.contains_key("items"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn examples_give_a_value_its_shape() {
        let time = ToolDefinition::new(
            "get_current_time",
            "",
            json!({"type": "object", "properties": {
                "timezone": {"type": "string", "description": "IANA timezone name (e.g., 'America/New_York', 'Europe/London'). Use 'Europe/London' if the person's city isn't given."},
                "note": {"type": "string", "description": "Anything, e.g. \"call Sam\" or \"buy milk\""},
                "url": {"type": "string", "description": "e.g. 'https://example.com/a_b'"},
                "path": {"type": "string", "examples": ["src/main.rs", "docs/a.md"]},
                "count": {"type": "integer", "description": "e.g. '1/2'"}
            }}),
        );
        let shapes = example_shapes(std::slice::from_ref(&time));
        assert!(
            shapes.contains(&("timezone".to_string(), "/".to_string())),
            "{shapes:?}"
        );
        assert!(
            shapes.contains(&("path".to_string(), "/.".to_string())),
            "{shapes:?}"
        );
        assert_eq!(
            shapes.len(),
            2,
            "no shape for plain words, a lone example or a number: {shapes:?}"
        );
        // A name another tool leaves free has no shape.
        let other = ToolDefinition::new(
            "set_zone",
            "",
            json!({"type": "object", "properties": {"timezone": {"type": "string"}}}),
        );
        let shapes = example_shapes(&[time, other]);
        assert!(!shapes.iter().any(|(n, _)| n == "timezone"), "{shapes:?}");
    }

    #[test]
    fn required_lists_take_an_item_and_optional_ones_stay_as_they_are() {
        let tool = ToolDefinition::new(
            "create_entities",
            "",
            json!({
                "type": "object",
                "properties": {
                    "entities": {"type": "array", "items": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string"},
                            "observations": {"type": "array", "items": {"type": "string"}},
                            "aliases": {"type": "array", "items": {"type": "string"}}
                        },
                        "required": ["name", "observations"]
                    }},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "keep": {"type": "array", "minItems": 0},
                    "none": {"type": "array", "maxItems": 0}
                },
                "required": ["entities", "keep", "none"]
            }),
        );
        let filled = fill_required_lists(&tool).input_schema;
        assert_eq!(filled["properties"]["entities"]["minItems"], json!(1));
        let item = &filled["properties"]["entities"]["items"]["properties"];
        assert_eq!(item["observations"]["minItems"], json!(1));
        assert!(
            item["aliases"].get("minItems").is_none(),
            "optional: {item}"
        );
        assert!(filled["properties"]["tags"].get("minItems").is_none());
        assert_eq!(filled["properties"]["keep"]["minItems"], json!(0));
        assert!(filled["properties"]["none"].get("minItems").is_none());
        // A tool without required arrays comes back as it was.
        let plain = ToolDefinition {
            input_schema: json!({"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}),
            ..tool.clone()
        };
        assert_eq!(fill_required_lists(&plain), plain);
    }

    #[test]
    fn quotable_phrases_hold_no_verb_tool_word_date_bare_number_or_number_word() {
        let borrow = [ToolDefinition::new("borrow_book", "", json!({}))];
        let p = quotable_phrases(["I'd like to borrow Learning Rust the Slow Way."], &borrow);
        assert!(
            p.contains(&"Learning Rust the Slow Way".to_string()),
            "{p:?}"
        );
        assert!(
            p.iter()
                .all(|w| !w.contains("borrow") && !w.starts_with("I'd")),
            "{p:?}"
        );
        let p = quotable_phrases(
            ["Put a haircut on my calendar for 2026-03-13 at 09:00."],
            &[],
        );
        assert!(p.contains(&"haircut".to_string()), "{p:?}");
        assert!(
            p.iter().all(|w| !w.contains("2026") && !w.contains("09")),
            "{p:?}"
        );
        let p = quotable_phrases(["I need a camp stove, could you add one?"], &[]);
        assert!(p.contains(&"camp stove".to_string()), "{p:?}");
        assert!(!p.contains(&"1".to_string()), "{p:?}");
        assert!(!p.contains(&"one".to_string()), "a count is no name: {p:?}");
        // copy_phrases, for the copy bias, keeps its looser phrases.
        let p = copy_phrases(["I'd like to borrow Learning Rust the Slow Way."], &borrow);
        assert!(
            p.contains(&"I'd like to borrow Learning Rust".to_string()),
            "{p:?}"
        );
    }

    #[test]
    fn a_tool_is_told_by_a_value_it_lists_or_the_numbers_it_needs() {
        let weather = ToolDefinition::new(
            "get-structured-content",
            "",
            json!({"type": "object", "properties": {"location": {"type": "string", "enum": ["New York", "Chicago", "Los Angeles"]}}}),
        );
        assert!(lists_a_written_value(
            &weather,
            "What's the weather like in Chicago right now?"
        ));
        assert!(lists_a_written_value(
            &weather,
            "How humid is it in los angeles today?"
        ));
        assert!(!lists_a_written_value(
            &weather,
            "Is it warm in Chicagoland?"
        ));
        let sum = ToolDefinition::new(
            "get-sum",
            "",
            json!({"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}),
        );
        let echo = ToolDefinition::new(
            "echo",
            "",
            json!({"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}),
        );
        assert!(requires_a_number(&sum));
        assert!(!requires_a_number(&echo));
        // A required number waits for one in the conversation.
        let mut ids = Identifiers::new();
        ids.add_user_text("What's the weather like in Chicago?");
        assert!(waits_for_a_number(&sum, &ids));
        assert!(!waits_for_a_number(&echo, &ids));
        ids.add_result(r#"{"temperature": 22.5}"#);
        assert!(!waits_for_a_number(&sum, &ids), "a result showed one");
        let mut written = Identifiers::new();
        written.add_user_text("What is 48 plus 27?");
        assert!(!waits_for_a_number(&sum, &written));
    }

    #[test]
    fn a_tool_is_short_of_numbers_while_the_conversation_gives_fewer_than_it_requires() {
        let price = ToolDefinition::new(
            "calculateFinalPrice",
            "",
            json!({"type": "object", "properties": {
                "price": {"type": "number"}, "discount_rate": {"type": "number"},
                "sales_tax": {"type": "number"}, "currency": {"type": "string"},
                "rounding": {"type": "integer", "enum": [0, 2]}
            }, "required": ["price", "discount_rate", "sales_tax", "currency", "rounding"]}),
        );
        let asked = |text: &str| {
            let mut ids = Identifiers::new();
            ids.add_user_text(text);
            short_of_numbers(&price, &ids, text)
        };
        // Two numbers for three: the price would be made up. An enum's
        // number is a choice, not one to be given.
        assert!(asked("The final price after a 25% discount and 10% tax?"));
        assert!(!asked(
            "The final price of $80 after a 25% discount and 10% tax?"
        ));
        assert!(!asked(
            "Price 80, discount of a quarter, tax ten percent: 80 25 10"
        ));
        assert!(asked("What's the final price?"));
        // Digits of a formula count as given.
        let area = ToolDefinition::new(
            "area_under_curve",
            "",
            json!({"type": "object", "properties": {
                "function": {"type": "string"}, "start": {"type": "number"}, "end": {"type": "number"}
            }, "required": ["function", "start", "end"]}),
        );
        let text = "Area under y=x^2 from x=1 to x=3";
        let mut ids = Identifiers::new();
        ids.add_user_text(text);
        assert!(!short_of_numbers(&area, &ids, text));
        // A result that showed a number may give the rest.
        let mut looked = Identifiers::new();
        looked.add_user_text("What's the final price?");
        looked.add_result(r#"{"price": 80}"#);
        assert!(!short_of_numbers(
            &price,
            &looked,
            "What's the final price?"
        ));
    }

    #[test]
    fn a_tool_is_short_of_strings_while_no_phrase_of_the_conversation_fits_one_it_requires() {
        let books = ToolDefinition::new(
            "search_holy_books",
            "Search content, chapters or authors of holy books.",
            json!({"type": "object", "properties": {
                "book": {"type": "string"}, "chapter": {"type": "integer"},
                "content": {"type": "string"}
            }, "required": ["book"]}),
        );
        let offered = |request: &str| {
            let mut ids = Identifiers::new();
            ids.add_user_text(request);
            let choices = ids.string_choices(std::slice::from_ref(&books));
            ground_string_values(&books, &choices)
        };
        // The request's only words name the tool: nothing to search for.
        assert!(short_of_strings(&offered("What is a holy book?")));
        assert!(!short_of_strings(&offered(
            "Find the chapter on charity in the Quran."
        )));
        // An optional free string, an id or an enum is never short.
        let optional = ToolDefinition::new(
            "search",
            "",
            json!({"type": "object", "properties": {
                "query": {"type": "string"}, "item_id": {"type": "string"},
                "sort": {"type": "string", "enum": ["new", "old"]}
            }, "required": ["item_id", "sort"]}),
        );
        assert!(!short_of_strings(&optional));
    }

    #[test]
    fn dictated_text_is_what_is_quoted_or_follows_a_colon() {
        assert_eq!(
            dictated(
                "Create a file called reminder.txt that says: Pick up the dry cleaning on Friday."
            ),
            vec!["Pick up the dry cleaning on Friday"]
        );
        assert_eq!(
            dictated("Add 'book a dentist appointment' to my to-do list."),
            vec!["book a dentist appointment"]
        );
        assert!(dictated("What's on it? I don't know.").is_empty());
    }

    #[test]
    fn phrases_start_and_end_on_words_about_the_arguments() {
        let p = copy_phrases(["Find a waterproof backpack and add it to my cart."], &[]);
        for want in ["waterproof", "waterproof backpack", "backpack", "cart"] {
            assert!(p.contains(&want.to_string()), "{want}: {p:?}");
        }
        for never in [
            "Find",
            "Find a waterproof",
            "a waterproof",
            "backpack and",
            "backpack and add",
            "my cart",
            "cart.",
        ] {
            assert!(!p.contains(&never.to_string()), "{never}: {p:?}");
        }
        let p = copy_phrases(["Weather in New York, NY?", "order p-17 and 3.5 kg"], &[]);
        assert!(p.contains(&"New York, NY".to_string()), "{p:?}");
        assert!(p.contains(&"p-17".to_string()), "{p:?}");
        assert!(p.contains(&"3.5 kg".to_string()), "{p:?}");
        assert!(p.contains(&"3.5".to_string()), "a number alone: {p:?}");
    }

    #[test]
    fn number_words_are_also_copied_as_digits() {
        let p = copy_phrases(["Add two of p-21, and a dozen eggs, half price"], &[]);
        assert!(p.contains(&"2".to_string()), "{p:?}");
        assert!(p.contains(&"12".to_string()), "{p:?}");
        assert!(!p.contains(&"0.5".to_string()), "half of what? {p:?}");
        let p = copy_phrases(["Add the tent"], &[]);
        assert!(p.iter().all(|w| w.parse::<f64>().is_err()), "{p:?}");
    }

    #[test]
    fn date_and_time_arguments_take_the_dates_and_times_shown() {
        let tool = ToolDefinition::new(
            "add_event",
            "Add an event.",
            json!({"type": "object", "properties": {
                "title": {"type": "string"},
                "date": {"type": "string", "description": "The day, YYYY-MM-DD."},
                "start": {"type": "string", "description": "Start time, HH:MM (24-hour)."},
                "at": {"type": "string", "format": "date-time"},
                "due": {"type": "string", "format": "date"}},
                "required": ["title", "date"]}),
        );
        let props = |t: &ToolDefinition| t.input_schema["properties"].clone();
        // Nothing shown: the optional ones are left out, the required date
        // keeps its schema.
        let grounded = ground_when_values(&tool, &Identifiers::new());
        let p = props(&grounded);
        assert_eq!(p["date"], tool.input_schema["properties"]["date"]);
        for gone in ["start", "at", "due"] {
            assert!(p.get(gone).is_none(), "{gone}: {p}");
        }
        assert!(p.get("title").is_some());
        // Each takes what was shown of its kind: the person's day and
        // time, a result's date-time.
        let mut ids = Identifiers::new();
        ids.add_user_text("Put a haircut on my calendar for 2026-03-13 at 09:00.");
        ids.add_result(r#"[{"id": "e-5", "at": "2026-03-14T18:00:00Z"}]"#);
        let p = props(&ground_when_values(&tool, &ids));
        assert_eq!(p["date"]["enum"], json!(["2026-03-13"]));
        assert_eq!(p["due"]["enum"], json!(["2026-03-13"]));
        assert_eq!(p["start"]["enum"], json!(["09:00"]));
        assert_eq!(p["at"]["enum"], json!(["2026-03-14T18:00:00Z"]));
        // A tool without such arguments is unchanged.
        let plain = ToolDefinition::new(
            "search",
            "Search.",
            json!({"type": "object", "properties": {"query": {"type": "string"}}}),
        );
        assert_eq!(ground_when_values(&plain, &ids), plain);
    }

    #[test]
    fn dates_and_times_are_not_identifiers() {
        let mut ids = Identifiers::new();
        let new = ids.add_user_text(
            "Move my 14:30 yoga class from 2026-03-13 to 2026-3-14T09:00:00Z, event e-5",
        );
        assert_eq!(new, 1, "{:?}", ids.values());
        assert_eq!(ids.values(), [json!("e-5")]);
        for word in ["ORD-2231", "2026-0001", "p-17", "v1.2:3"] {
            assert!(!is_date_or_time(word), "{word}");
        }
        // A size or an amount is no name either.
        let mut ids = Identifiers::new();
        ids.add_user_text(
            "add it: Summit 30L Waterproof Backpack (p-17), price: 109.0, 3.5kg, 500ml",
        );
        assert_eq!(ids.values(), [json!("p-17")]);
        // In a result's text too.
        let mut ids = Identifiers::new();
        ids.add_result("Budget review (e-1) on 2026-03-10 at 15:00");
        assert_eq!(ids.values(), [json!("e-1")]);
    }

    #[test]
    fn words_of_tool_names_do_not_bound_phrases() {
        let tools = [
            ToolDefinition::new("add_to_cart", "", json!({})),
            ToolDefinition::new("searchProducts", "", json!({})),
        ];
        let p = copy_phrases(
            ["Search products: add the waterproof backpacks to my cart"],
            &tools,
        );
        assert_eq!(p, ["waterproof", "waterproof backpacks", "backpacks"]);
    }

    #[test]
    fn identifier_keys() {
        for key in [
            "id",
            "ID",
            "product_id",
            "orderId",
            "userID",
            "item-id",
            "ids",
            "product_ids",
            "orderIds",
        ] {
            assert!(is_identifier_key(key), "{key}");
        }
        for key in [
            "paid", "valid", "idea", "width", "hidden", "query", "Id_card",
        ] {
            assert!(!is_identifier_key(key), "{key}");
        }
    }

    #[test]
    fn user_text_gives_identifier_shaped_words() {
        let mut ids = Identifiers::new();
        ids.add_user_text(
            "Add two of p-17 to my cart, and cancel order 4521. I'm john_doe, a well-known buyer.",
        );
        assert_eq!(
            ids.values(),
            &[json!("p-17"), json!("4521"), json!(4521), json!("john_doe")]
        );
    }

    #[test]
    fn results_give_the_values_of_identifier_keys() {
        let mut ids = Identifiers::new();
        ids.add_result(
            r#"[{"id":"p-17","title":"Summit 30L","price":109.0},{"id":"p-21","title":"Daytrip 20L"}]"#,
        );
        ids.add_result(r#"{"order": {"orderId": 991, "message": "Order ORD-7 placed"}}"#);
        ids.add_result("Created ticket T-88 for you");
        assert_eq!(
            ids.values(),
            &[
                json!("p-17"),
                json!("p-21"),
                json!(991),
                json!("991"),
                json!("ORD-7"),
                json!("T-88")
            ]
        );
    }

    #[test]
    fn an_identifier_takes_the_items_the_persons_words_pick_out() {
        let ret = ToolDefinition::new(
            "return_book",
            "Return",
            json!({"type": "object", "properties": {"book_id": {"type": "string"}},
                   "required": ["book_id"]}),
        );
        let id_enum = |ids: &Identifiers| {
            ground_tool(&ret, ids, true, true).unwrap().input_schema["properties"]["book_id"]
                ["enum"]
                .clone()
        };
        let books = r#"[{"id": "b-7", "title": "Stars Over the Desert"},
            {"id": "b-1", "title": "The Salt Road"}, {"id": "b-5", "title": "The Quiet Orchard"}]"#;
        let mut ids = Identifiers::new();
        ids.add_user_text("I've finished Stars Over the Desert, please return it.");
        ids.add_result(books);
        assert_eq!(id_enum(&ids), json!(["b-7"]));
        // Words that pick out none, or all alike: every id stays.
        let mut ids = Identifiers::new();
        ids.add_user_text("Return one of them.");
        ids.add_result(books);
        assert_eq!(id_enum(&ids), json!(["b-7", "b-1", "b-5"]));
        // A list of one that the words name is picked as well.
        let mut ids = Identifiers::new();
        ids.add_user_text("Put two of the Daytrip 20L backpacks in my basket.");
        ids.add_result(r#"[{"id": "p-21", "title": "Daytrip 20L Backpack"}]"#);
        let add = ToolDefinition::new(
            "add_to_cart",
            "Add",
            json!({"type": "object", "properties": {"product_id": {"type": "string"}},
                   "required": ["product_id"]}),
        );
        let grounded = ground_tool(&add, &ids, true, true).unwrap();
        assert_eq!(
            grounded.input_schema["properties"]["product_id"]["enum"],
            json!(["p-21"])
        );
        // A used id is no pick any more.
        let mut ids = Identifiers::new();
        ids.add_user_text("Return Stars Over the Desert.");
        ids.add_result(books);
        let rest = ids.without(&[json!("b-7")]);
        assert_eq!(id_enum(&rest), json!(["b-1", "b-5"]));
    }

    #[test]
    fn a_required_identifier_with_nothing_to_take_makes_the_tool_uncallable() {
        let add = ToolDefinition::new(
            "add_to_cart",
            "Add",
            json!({"type": "object", "properties": {"product_id": {"type": "string"},
                   "quantity": {"type": "integer"}}, "required": ["product_id"]}),
        );
        assert_eq!(ground_tool(&add, &Identifiers::new(), true, true), None);
        let mut ids = Identifiers::new();
        ids.add_result(r#"[{"id":"p-17"},{"id":"p-21"}]"#);
        let grounded = ground_tool(&add, &ids, true, true).unwrap();
        assert_eq!(
            grounded.input_schema["properties"]["product_id"],
            json!({"type": "string", "enum": ["p-17", "p-21"]})
        );
        assert_eq!(
            grounded.input_schema["properties"].get("quantity"),
            None,
            "no number was written: the quantity is left to its default"
        );
        ids.add_user_text("two of them, please");
        let grounded = ground_tool(&add, &ids, true, true).unwrap();
        assert_eq!(
            grounded.input_schema["properties"]["quantity"],
            json!({"type": "integer"}),
            "a count was written: the quantity is free"
        );
    }

    #[test]
    fn optional_identifiers_are_dropped_and_plain_tools_unchanged() {
        let list = ToolDefinition::new(
            "list_orders",
            "List",
            json!({"type": "object", "properties": {"customer_id": {"type": "integer"},
                   "status": {"type": "string"}}}),
        );
        let grounded = ground_tool(&list, &Identifiers::new(), true, true).unwrap();
        assert_eq!(
            grounded.input_schema["properties"],
            json!({"status": {"type": "string"}})
        );
        let search = ToolDefinition::new(
            "search",
            "Search",
            json!({"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}),
        );
        assert_eq!(
            ground_tool(&search, &Identifiers::new(), true, true),
            Some(search)
        );
    }

    #[test]
    fn numbers_the_person_wrote_are_counted_but_not_an_identifiers_digits() {
        let mut ids = Identifiers::new();
        ids.add_user_text("Add p-17 and SKU_9 to my cart");
        assert!(!ids.has_numbers(), "{ids:?}");
        ids.add_user_text("Put two of them, $20 each, 5% off, 3.5kg, 2 more");
        assert_eq!(ids.numbers, ["2", "20", "5", "3.5"]);
        let mut from_a_result = Identifiers::new();
        from_a_result.add_result("Found 12 tents under p-4");
        assert!(
            !from_a_result.has_numbers(),
            "a result's numbers are not the person's"
        );
    }

    #[test]
    fn a_number_no_required_argument_takes_makes_an_optional_one_required() {
        let add = ToolDefinition::new(
            "add_to_cart",
            "Add",
            json!({"type": "object", "properties": {
                "product_id": {"type": "string"},
                "quantity": {"type": "integer"},
                "gift_wrap_count": {"type": "integer"}},
                "required": ["product_id"]}),
        );
        let grounded = |text: &str| {
            let mut ids = Identifiers::new();
            ids.add_user_text(text);
            ground_tool(&add, &ids, true, true).unwrap().input_schema
        };
        let three = grounded("Put three of p-17 in my cart");
        assert_eq!(three["required"], json!(["product_id", "quantity"]));
        assert!(
            three["properties"].get("gift_wrap_count").is_some(),
            "still optional"
        );
        let none = grounded("Put p-17 in my cart");
        assert_eq!(none["required"], json!(["product_id"]));
        assert!(
            none["properties"].get("quantity").is_none(),
            "left to the default"
        );
        let area = ToolDefinition::new(
            "area",
            "Area",
            json!({"type": "object", "properties": {
                "base": {"type": "number"},
                "height": {"type": "number"},
                "scale": {"type": "number"}},
                "required": ["base", "height"]}),
        );
        let mut ids = Identifiers::new();
        ids.add_user_text("base 10 and height 5");
        assert_eq!(
            ground_tool(&area, &ids, true, true).unwrap().input_schema["required"],
            json!(["base", "height"]),
            "both numbers go to the required ones"
        );
    }

    #[test]
    fn enums_arrays_and_numbers() {
        let mut ids = Identifiers::new();
        ids.add_user_text("merge 120 and 150, 2 of them");
        let tool = ToolDefinition::new(
            "merge",
            "Merge",
            json!({"type": "object", "properties": {
                "ticket_ids": {"type": "array", "items": {"type": "integer"}},
                "kind_id": {"type": "string", "enum": ["a", "b"]}},
                "required": ["ticket_ids", "kind_id"]}),
        );
        let grounded = ground_tool(&tool, &ids, true, true).unwrap();
        assert_eq!(
            grounded.input_schema["properties"]["ticket_ids"]["items"],
            json!({"type": "integer", "enum": [120, 150]})
        );
        assert_eq!(
            grounded.input_schema["properties"]["kind_id"],
            json!({"type": "string", "enum": ["a", "b"]})
        );
    }

    #[test]
    fn a_path_takes_the_paths_the_conversation_wrote() {
        let tool = ToolDefinition::new(
            "write_file",
            "Write a file",
            json!({"type": "object", "properties": {
                "path": {"type": "string"},
                "content": {"type": "string"}}}),
        );
        let choices: Vec<String> = ["Project kickoff", "agenda.txt", "notes/march.md", "12.5"]
            .map(String::from)
            .to_vec();
        let grounded = ground_string_values(&tool, &choices);
        let props = &grounded.input_schema["properties"];
        assert_eq!(
            props["path"]["enum"],
            json!(["agenda.txt", "notes/march.md"])
        );
        assert_eq!(props["content"]["enum"], json!(choices));
        // With no path written, a path may take any phrase.
        let phrases: Vec<String> = vec!["reports".into(), "Project kickoff".into()];
        let grounded = ground_string_values(&tool, &phrases);
        assert_eq!(
            grounded.input_schema["properties"]["path"]["enum"],
            json!(phrases)
        );
    }
}
