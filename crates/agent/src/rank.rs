//! Ranking tools against the person's request.
//!
//! Small models choose better from a short list, so each step shows the
//! model only the tools most likely to matter. The ranking is deliberately
//! plain, so that a host can show why a tool was chosen ([`score_tools`]) and
//! the same request always gives the same list:
//!
//! 1. **Terms.** Text is split into words at anything that is not a letter or
//!    digit, and inside words at `snake_case` and `camelCase` boundaries
//!    (`addToCart`, `add_to_cart` → `add`, `to`, `cart`). Words are
//!    lowercased and lightly stemmed so that `tents`/`tent`,
//!    `categories`/`category`, `adding`/`added`/`add` and
//!    `shipping`/`ship` meet: a plural `s` or `ies`, an `ing` or `ed`, a
//!    doubled final consonant and a final `e` are removed. Common English
//!    words (`the`, `please`, `my`, …) and one-letter words are dropped from
//!    the query.
//! 2. **Score.** For each distinct query term, a tool gains
//!    [`NAME_WEIGHT`] (3) if the term is in its name, and
//!    [`DESCRIPTION_WEIGHT`] (1) if it is in its description, its top-level
//!    argument names or their allowed (`enum`) string values; both when both.
//! 3. **Recency.** The tool used most recently gains [`RECENT_BONUS`] (2),
//!    the one before it half that, and so on, halving at each step back, for
//!    the last [`RECENT_WINDOW`] tools used. An agent that just searched is
//!    likely to open or add next, but a tool used long ago earns nothing.
//! 4. **Order.** Highest score first; ties keep the order the host listed the
//!    tools in. An empty query therefore keeps the host's order, with
//!    recently used tools moved up.
//!
//! Tokenising reuses one buffer and matches terms by bitmask, so ranking a
//! thousand tools takes well under a millisecond.

use std::fmt;

use serde_json::Value;

use crate::lexicon::STOP_WORDS;
use crate::tool::ToolDefinition;

/// Points for a query term found in a tool's name.
pub(crate) const NAME_WEIGHT: f32 = 3.0;

/// Points for a query term found in a tool's description, argument names or
/// allowed argument values.
pub(crate) const DESCRIPTION_WEIGHT: f32 = 1.0;

/// Points for the most recently used tool; each step further back is worth half.
pub(crate) const RECENT_BONUS: f32 = 2.0;

/// How many of the most recently used tools earn a bonus.
pub(crate) const RECENT_WINDOW: usize = 8;

/// Only this many distinct query terms count (one bit each in a mask); a
/// request longer than that is not a tool query anyway.
const MAX_QUERY_TERMS: usize = 64;

/// Why a tool ranked where it did.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolScore {
    /// The tool's position in the list that was scored.
    pub index: usize,
    /// The tool's name.
    pub name: String,
    /// The total: name and description points plus the recency bonus.
    pub score: f32,
    /// Query terms (stemmed) found in the tool's name, in query order.
    pub name_matches: Vec<String>,
    /// Query terms (stemmed) found in the description, argument names or
    /// allowed values, in query order.
    pub description_matches: Vec<String>,
    /// The bonus for having been used recently.
    pub recency_bonus: f32,
}

impl fmt::Display for ToolScore {
    /// `add_to_cart: 9 (name: add, cart; description: product; recent +2)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.name, self.score)?;
        let mut parts = Vec::new();
        if !self.name_matches.is_empty() {
            parts.push(format!("name: {}", self.name_matches.join(", ")));
        }
        if !self.description_matches.is_empty() {
            parts.push(format!(
                "description: {}",
                self.description_matches.join(", ")
            ));
        }
        if self.recency_bonus > 0.0 {
            parts.push(format!("recent +{}", self.recency_bonus));
        }
        if !parts.is_empty() {
            write!(f, " ({})", parts.join("; "))?;
        }
        Ok(())
    }
}

/// Keeps at most `max` tools, best first, ranked against `query`; tools named
/// in `recent` (most recent first) get a bonus. See the module docs for the
/// scoring.
pub fn rank_tools(
    tools: &[ToolDefinition],
    query: &str,
    recent: &[String],
    max: usize,
) -> Vec<ToolDefinition> {
    let scorer = Scorer::new(query, recent);
    let mut buffer = String::new();
    let mut ranked: Vec<(usize, f32)> = tools
        .iter()
        .enumerate()
        .map(|(index, tool)| {
            let (name_mask, description_mask) = scorer.masks(tool, &mut buffer);
            (index, scorer.total(tool, name_mask, description_mask))
        })
        .collect();
    // A stable sort: ties keep the host's order.
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    ranked
        .into_iter()
        .take(max)
        .map(|(index, _)| tools[index].clone())
        .collect()
}

/// Scores every tool against `query` and `recent`, in the order given, with
/// what earned each point: for a host that shows why a tool was chosen.
/// Sorting by `score` (stably, highest first) gives [`rank_tools`]'s order.
pub(crate) fn score_tools(
    tools: &[ToolDefinition],
    query: &str,
    recent: &[String],
) -> Vec<ToolScore> {
    let scorer = Scorer::new(query, recent);
    let terms_in = |mask: u64| -> Vec<String> {
        scorer
            .terms
            .iter()
            .enumerate()
            .filter(|(bit, _)| mask & (1 << bit) != 0)
            .map(|(_, term)| term.clone())
            .collect()
    };
    let mut buffer = String::new();
    tools
        .iter()
        .enumerate()
        .map(|(index, tool)| {
            let (name_mask, description_mask) = scorer.masks(tool, &mut buffer);
            ToolScore {
                index,
                name: tool.name.clone(),
                score: scorer.total(tool, name_mask, description_mask),
                name_matches: terms_in(name_mask),
                description_matches: terms_in(description_mask),
                recency_bonus: scorer.recency(tool),
            }
        })
        .collect()
}

/// The query's terms and the recent tools, ready to score tools against.
struct Scorer<'a> {
    /// Distinct query terms, in query order; term `i` is bit `i` of a mask.
    terms: Vec<String>,
    /// The most recently used tool names, most recent first.
    recent: &'a [String],
    /// Rules out tool words that cannot match a term.
    prefilter: Prefilter,
}

impl<'a> Scorer<'a> {
    fn new(query: &str, recent: &'a [String]) -> Self {
        let mut terms: Vec<String> = Vec::new();
        let mut buffer = String::new();
        for_each_term(query, &mut buffer, |term| {
            if terms.len() < MAX_QUERY_TERMS
                && is_query_term(term)
                && !terms.iter().any(|t| t == term)
            {
                terms.push(term.to_string());
            }
        });
        Self {
            prefilter: Prefilter::new(&terms),
            terms,
            recent: &recent[..recent.len().min(RECENT_WINDOW)],
        }
    }

    /// Which query terms occur in the tool's name, and which in the rest.
    fn masks(&self, tool: &ToolDefinition, buffer: &mut String) -> (u64, u64) {
        if self.terms.is_empty() {
            return (0, 0);
        }
        let admit = |raw: &str| self.prefilter.admits(raw);
        let mut name_mask = 0;
        for_each_term_where(&tool.name, buffer, admit, |term| {
            name_mask |= self.mask_of(term);
        });
        let mut description_mask = 0;
        let mut add = |text: &str, buffer: &mut String| {
            for_each_term_where(text, buffer, admit, |term| {
                description_mask |= self.mask_of(term);
            });
        };
        add(&tool.description, buffer);
        if let Some(properties) = tool
            .input_schema
            .get("properties")
            .and_then(Value::as_object)
        {
            for (name, property) in properties {
                add(name, buffer);
                if let Some(values) = property.get("enum").and_then(Value::as_array) {
                    for value in values.iter().filter_map(Value::as_str) {
                        add(value, buffer);
                    }
                }
            }
        }
        (name_mask, description_mask)
    }

    fn mask_of(&self, term: &str) -> u64 {
        self.terms
            .iter()
            .position(|t| t == term)
            .map_or(0, |bit| 1 << bit)
    }

    fn recency(&self, tool: &ToolDefinition) -> f32 {
        self.recent
            .iter()
            .position(|name| *name == tool.name)
            .map_or(0.0, |steps_back| RECENT_BONUS / (1u32 << steps_back) as f32)
    }

    fn total(&self, tool: &ToolDefinition, name_mask: u64, description_mask: u64) -> f32 {
        NAME_WEIGHT * name_mask.count_ones() as f32
            + DESCRIPTION_WEIGHT * description_mask.count_ones() as f32
            + self.recency(tool)
    }
}

/// Whether a term of a query counts: not a common word, and longer than one
/// letter.
pub(crate) fn is_query_term(term: &str) -> bool {
    !STOP_WORDS.contains(&term) && term.chars().count() > 1
}

/// Calls `emit` with each term of `text`, lowercased and stemmed, using
/// `buffer` as scratch space so that no term allocates.
pub(crate) fn for_each_term(text: &str, buffer: &mut String, emit: impl FnMut(&str)) {
    for_each_term_where(text, buffer, |_| true, emit);
}

/// [`for_each_term`], skipping ASCII words for which `admit` is false before
/// any work is spent on them (see [`Prefilter`]).
fn for_each_term_where(
    text: &str,
    buffer: &mut String,
    admit: impl Fn(&str) -> bool,
    mut emit: impl FnMut(&str),
) {
    if text.is_ascii() {
        for_each_ascii_term(text, buffer, &admit, &mut emit);
        return;
    }
    buffer.clear();
    let mut chars = text.chars().peekable();
    let mut previous: Option<char> = None;
    while let Some(c) = chars.next() {
        if !c.is_alphanumeric() {
            flush(buffer, &mut emit);
            previous = None;
            continue;
        }
        if let Some(p) = previous {
            let next_lower = chars.peek().is_some_and(|n| n.is_lowercase());
            // `addToCart` splits before `T`; `HTMLParser` splits before `P`.
            let camel = c.is_uppercase()
                && (p.is_lowercase() || p.is_numeric() || (p.is_uppercase() && next_lower));
            if camel {
                flush(buffer, &mut emit);
            }
        }
        buffer.extend(c.to_lowercase());
        previous = Some(c);
    }
    flush(buffer, &mut emit);
}

/// The same splitting for ASCII text (nearly all tool text), on bytes, with
/// words that cannot match skipped before they are copied and stemmed.
fn for_each_ascii_term(
    text: &str,
    buffer: &mut String,
    admit: &impl Fn(&str) -> bool,
    emit: &mut impl FnMut(&str),
) {
    let bytes = text.as_bytes();
    let mut part = |start: usize, end: usize| {
        let raw = &text[start..end];
        if admit(raw) {
            buffer.clear();
            buffer.push_str(raw);
            buffer.make_ascii_lowercase();
            flush(buffer, emit);
        }
    };
    let class = |i: usize| BYTE_CLASS[usize::from(bytes[i])];
    let mut i = 0;
    while i < bytes.len() {
        if class(i) == SEPARATOR {
            i += 1;
            continue;
        }
        let mut part_start = i;
        i += 1;
        while i < bytes.len() {
            let c = class(i);
            if c == SEPARATOR {
                break;
            }
            // `addToCart` splits before `T`; `HTMLParser` splits before `P`.
            if c == UPPER {
                let previous = class(i - 1);
                let next_lower = i + 1 < bytes.len() && class(i + 1) == LOWER;
                if previous != UPPER || next_lower {
                    part(part_start, i);
                    part_start = i;
                }
            }
            i += 1;
        }
        part(part_start, i);
    }
}

/// Byte classes for the ASCII tokenizer.
const SEPARATOR: u8 = 0;
const LOWER: u8 = 1;
const UPPER: u8 = 2;
const DIGIT: u8 = 3;

/// The class of every byte, built once at compile time; one lookup per
/// byte keeps the tokenizer's inner loop short.
const BYTE_CLASS: [u8; 256] = {
    let mut table = [SEPARATOR; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = match b as u8 {
            b'a'..=b'z' => LOWER,
            b'A'..=b'Z' => UPPER,
            b'0'..=b'9' => DIGIT,
            _ => SEPARATOR,
        };
        b += 1;
    }
    table
};

/// A cheap test that rules out most words of a tool's text before they are
/// copied, stemmed and compared. Stemming only removes letters from the end
/// of a word and always leaves at least two, so a word whose first two
/// letters start no query term cannot match one.
struct Prefilter {
    /// For each lowercase ASCII first byte, the set of second bytes (as
    /// bits) that some query term starts with.
    pairs: [u128; 128],
    /// Whether some query term starts with a non-ASCII char; the filter then
    /// admits every word.
    any_non_ascii: bool,
}

impl Prefilter {
    fn new(terms: &[String]) -> Self {
        let mut filter = Self {
            pairs: [0; 128],
            any_non_ascii: false,
        };
        for term in terms {
            match term.as_bytes() {
                [a, b, ..] if a.is_ascii() && b.is_ascii() => {
                    filter.pairs[usize::from(*a)] |= 1 << b;
                }
                // Query terms have two bytes at least; a shorter one would
                // only make the filter admit everything, which is still right.
                _ => filter.any_non_ascii = true,
            }
        }
        filter
    }

    /// Whether the raw (not yet lowercased or stemmed) ASCII word could match.
    fn admits(&self, raw: &str) -> bool {
        if self.any_non_ascii {
            return true;
        }
        match raw.as_bytes() {
            [a, b, ..] => {
                let (a, b) = (a.to_ascii_lowercase() & 0x7f, b.to_ascii_lowercase() & 0x7f);
                self.pairs[usize::from(a)] & (1 << b) != 0
            }
            _ => false,
        }
    }
}

/// Stems the word in `buffer`, hands it to `emit` and clears the buffer.
fn flush(buffer: &mut String, emit: &mut impl FnMut(&str)) {
    if !buffer.is_empty() {
        stem(buffer);
        emit(buffer);
        buffer.clear();
    }
}

/// Light suffix stripping for English words; other words are left alone.
fn stem(word: &mut String) {
    if !word.is_ascii() {
        return;
    }
    let replace = |word: &mut String, suffix: &str, with: &str| {
        word.truncate(word.len() - suffix.len());
        word.push_str(with);
    };
    // Plurals.
    if word.len() > 4 && word.ends_with("ies") {
        replace(word, "ies", "y");
    } else if word.ends_with("sses") {
        replace(word, "sses", "ss");
    } else if word.len() > 3
        && word.ends_with('s')
        && !word.ends_with("ss")
        && !word.ends_with("us")
        && !word.ends_with("is")
    {
        word.pop();
    }
    // Verb endings.
    if word.len() > 5 && word.ends_with("ing") {
        replace(word, "ing", "");
    } else if word.len() > 4 && word.ends_with("ied") {
        replace(word, "ied", "y");
    } else if word.len() > 4 && word.ends_with("ed") {
        replace(word, "ed", "");
    }
    // `shipp` (from shipping) and `ship` should meet; so should `add` and `ad`.
    let bytes = word.as_bytes();
    if let [.., a, b] = bytes
        && a == b
        && word.len() > 2
        && matches!(
            a,
            b'b' | b'd' | b'f' | b'g' | b'm' | b'n' | b'p' | b'r' | b't'
        )
    {
        word.pop();
    }
    // `remove`, `removing` and `removed` meet at `remov`.
    if word.len() > 3 && word.ends_with('e') {
        word.pop();
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn tool(name: &str, description: &str) -> ToolDefinition {
        ToolDefinition::new(
            name,
            description,
            json!({"type": "object", "properties": {}}),
        )
    }

    fn shop() -> Vec<ToolDefinition> {
        vec![
            tool(
                "get_page_info",
                "Read the title and path of the current page.",
            ),
            tool("searchProducts", "Find products in the catalog by keyword."),
            ToolDefinition::new(
                "open_product",
                "Open a product's page.",
                json!({"type": "object", "properties": {"product_id": {"type": "string"}}}),
            ),
            ToolDefinition::new(
                "add_to_cart",
                "Put a product in the shopping basket.",
                json!({"type": "object", "properties": {"quantity": {"type": "integer"}}}),
            ),
            ToolDefinition::new(
                "browse",
                "List what the shop sells.",
                json!({"type": "object", "properties": {"category": {"enum": ["tents", "backpacks"]}}}),
            ),
            tool("checkout", "Pay for the items in the cart."),
        ]
    }

    fn names(tools: &[ToolDefinition]) -> Vec<&str> {
        tools.iter().map(|t| t.name.as_str()).collect()
    }

    fn recent(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn ranks_by_query_recency_then_order() {
        let cases: Vec<(&str, Vec<String>, usize, Vec<&str>)> = vec![
            (
                "Please add two of these to my cart",
                vec![],
                3,
                vec!["add_to_cart", "checkout", "get_page_info"],
            ),
            (
                "search for products",
                vec![],
                2,
                vec!["searchProducts", "open_product"],
            ),
            ("show me tents", vec![], 1, vec!["browse"]),
            ("set the quantity", vec![], 1, vec!["add_to_cart"]),
            (
                "",
                vec![],
                3,
                vec!["get_page_info", "searchProducts", "open_product"],
            ),
            (
                "",
                recent(&["checkout", "browse"]),
                3,
                vec!["checkout", "browse", "get_page_info"],
            ),
            (
                "open the product page",
                recent(&["searchProducts"]),
                3,
                vec!["open_product", "searchProducts", "get_page_info"],
            ),
            ("zzz", vec![], 0, vec![]),
            (
                "zzz",
                vec![],
                100,
                vec![
                    "get_page_info",
                    "searchProducts",
                    "open_product",
                    "add_to_cart",
                    "browse",
                    "checkout",
                ],
            ),
        ];
        for (query, recent, max, expected) in cases {
            let ranked = rank_tools(&shop(), query, &recent, max);
            assert_eq!(names(&ranked), expected, "{query:?} recent {recent:?}");
        }
    }

    #[test]
    fn explains_each_score() {
        let scores = score_tools(
            &shop(),
            "add the product to my cart",
            &recent(&["open_product"]),
        );
        let add = &scores[3];
        assert_eq!(add.index, 3);
        assert_eq!(add.name_matches, vec!["ad", "cart"]);
        assert_eq!(add.description_matches, vec!["product"]);
        assert_eq!(add.score, 7.0);
        assert_eq!(
            add.to_string(),
            "add_to_cart: 7 (name: ad, cart; description: product)"
        );
        let open = &scores[2];
        assert_eq!(open.recency_bonus, 2.0);
        assert_eq!(
            open.to_string(),
            "open_product: 6 (name: product; description: product; recent +2)"
        );
        assert_eq!(scores[0].to_string(), "get_page_info: 0");
    }

    #[test]
    fn recency_halves_with_each_step_back() {
        let tools: Vec<ToolDefinition> = (0..10).map(|i| tool(&format!("t{i}"), "")).collect();
        let used: Vec<String> = (0..10).map(|i| format!("t{i}")).collect();
        let scores = score_tools(&tools, "", &used);
        let bonuses: Vec<f32> = scores.iter().map(|s| s.recency_bonus).collect();
        assert_eq!(
            bonuses,
            vec![
                2.0, 1.0, 0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0, 0.0
            ]
        );
    }

    #[test]
    fn splits_and_stems_terms() {
        let cases: &[(&str, &[&str])] = &[
            ("add_to_cart", &["ad", "to", "cart"]),
            ("addToCart", &["ad", "to", "cart"]),
            ("HTMLParser v2", &["html", "parser", "v2"]),
            ("Tents, TENT; tent's", &["tent", "tent", "tent", "s"]),
            ("categories category", &["category", "category"]),
            ("adding added adds", &["ad", "ad", "ad"]),
            ("shipping shipped ship", &["ship", "ship", "ship"]),
            ("remove removing removed", &["remov", "remov", "remov"]),
            ("status address glass", &["status", "address", "glass"]),
            ("Café über 日本語", &["café", "über", "日本語"]),
            ("", &[]),
        ];
        for (text, expected) in cases {
            let mut got = Vec::new();
            for_each_term(text, &mut String::new(), |t| got.push(t.to_string()));
            assert_eq!(got, *expected, "{text}");
        }
    }

    #[test]
    fn the_prefilter_never_hides_a_match() {
        let words = [
            "add",
            "adds",
            "adding",
            "added",
            "Add",
            "AD",
            "ship",
            "shipping",
            "Shipped",
            "tent",
            "tents",
            "Tents",
            "category",
            "categories",
            "remove",
            "removing",
            "use",
            "used",
            "status",
            "glasses",
            "carried",
            "carries",
            "x",
            "go",
            "goes",
            "ies",
            "sses",
            "eed",
        ];
        for word in words {
            let mut stemmed = Vec::new();
            for_each_term(word, &mut String::new(), |t| stemmed.push(t.to_string()));
            for term in stemmed.into_iter().filter(|t| t.len() > 1) {
                let filter = Prefilter::new(std::slice::from_ref(&term));
                assert!(
                    filter.admits(word),
                    "{word} stems to {term} but is filtered out"
                );
            }
        }
        let filter = Prefilter::new(&["tent".to_string()]);
        assert!(!filter.admits("table"));
        assert!(!filter.admits("t"));
        assert!(Prefilter::new(&["日本".to_string()]).admits("anything"));
    }

    #[test]
    fn ranks_a_thousand_tools() {
        // A smoke test of scale; the timing lives in the benchmarks.
        let tools: Vec<ToolDefinition> = (0..1000)
            .map(|i| {
                tool(
                    &format!("tool_{i}_search"),
                    "Find things in the catalog by keyword.",
                )
            })
            .collect();
        let ranked = rank_tools(
            &tools,
            "search the catalog",
            &recent(&["tool_999_search"]),
            8,
        );
        assert_eq!(ranked.len(), 8);
        assert_eq!(ranked[0].name, "tool_999_search");
        assert_eq!(ranked[1].name, "tool_0_search");
    }
}
