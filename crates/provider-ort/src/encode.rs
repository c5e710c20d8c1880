//! Text to token ids where only the chat template may write control tokens.
//!
//! A tokenizer reads its added tokens (`<|im_start|>`, `<|im_end|>`,
//! `<tool_call>`…) out of any text it is given. The template's own text
//! needs that; the strings the template was given (see
//! [`RenderedPrompt`]) must never get it, or a tool result could open a
//! system turn. [`PromptEncoder`] tokenizes a rendered prompt so that no
//! added token comes from inside a given string, for any tokenizer: the
//! added tokens are the tokenizer's own list, not a list per model family.

use std::collections::HashSet;
use std::ops::Range;

use tokenizers::Tokenizer;

use crate::error::OrtError;
use crate::model::common_prefix;
use crate::template::RenderedPrompt;

/// Tokenizes prompts, with added tokens read only from the template's text.
#[derive(Clone)]
pub struct PromptEncoder {
    /// The model's tokenizer, reading added tokens from text.
    tokenizer: Tokenizer,
    /// The same tokenizer with its special tokens read as plain text.
    plain: Tokenizer,
    /// The ids of every added token (special or not).
    control_ids: HashSet<u32>,
    /// Their texts.
    control_texts: Vec<String>,
}

impl std::fmt::Debug for PromptEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptEncoder")
            .field("control_texts", &self.control_texts)
            .finish_non_exhaustive()
    }
}

impl PromptEncoder {
    /// An encoder for a model's tokenizer.
    pub fn new(tokenizer: Tokenizer) -> Self {
        let mut added: Vec<(u32, String)> = tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            .map(|(id, token)| (id, token.content))
            .collect();
        added.sort();
        let control_ids = added.iter().map(|(id, _)| *id).collect();
        let control_texts = added.into_iter().map(|(_, text)| text).collect();
        let mut plain = tokenizer.clone();
        plain.set_encode_special_tokens(true);
        Self {
            tokenizer,
            plain,
            control_ids,
            control_texts,
        }
    }

    /// The texts of the tokenizer's added tokens: what a given string must
    /// never turn into.
    pub fn control_texts(&self) -> &[String] {
        &self.control_texts
    }

    /// Whether `id` is one of the tokenizer's added tokens.
    pub fn is_control(&self, id: u32) -> bool {
        self.control_ids.contains(&id)
    }

    /// Tokenizes a rendered prompt: added tokens where the template wrote
    /// them, plain text inside the given strings. When no added token
    /// touches a given string (every ordinary prompt) the ids are exactly
    /// those of tokenizing the whole text; otherwise the template's pieces
    /// and the strings are tokenized apart.
    pub fn encode_prompt(&self, prompt: &RenderedPrompt) -> Result<Vec<u32>, OrtError> {
        let encoding = self
            .tokenizer
            .encode(prompt.text.as_str(), false)
            .map_err(tokenizer_error)?;
        let overlaps = |span: &(usize, usize)| {
            prompt
                .content
                .iter()
                .any(|c| span.0 < c.end && c.start < span.1)
        };
        let intruded = encoding
            .get_ids()
            .iter()
            .zip(encoding.get_offsets())
            .any(|(id, span)| self.is_control(*id) && overlaps(span));
        if !intruded {
            return Ok(encoding.get_ids().to_vec());
        }
        tracing::debug!("control-token text inside given strings is tokenized as plain text");
        let mut ids = Vec::new();
        let mut at = 0;
        let text = prompt.text.as_str();
        for span in &prompt.content {
            if span.start > at {
                ids.extend(self.encode_text(&text[at..span.start])?);
            }
            ids.extend(self.encode_plain(&text[span.clone()])?);
            at = span.end;
        }
        if at < text.len() {
            ids.extend(self.encode_text(&text[at..])?);
        }
        Ok(ids)
    }

    /// Tokenizes text the way a template's own text is: added tokens read
    /// from it. For hand-written prompts and benchmarks; never for text
    /// that comes from people, tools or pages.
    pub fn encode_text(&self, text: &str) -> Result<Vec<u32>, OrtError> {
        self.tokenizer
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(tokenizer_error)
    }

    /// Tokenizes text as plain text: the result holds no added token,
    /// whatever the text says.
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>, OrtError> {
        let encoding = self.plain.encode(text, false).map_err(tokenizer_error)?;
        let ids = encoding.get_ids();
        if !ids.iter().any(|id| self.is_control(*id)) {
            return Ok(ids.to_vec());
        }
        // Added tokens that are not special are still read from the text;
        // their text is tokenized one character at a time instead.
        let mut out = Vec::with_capacity(ids.len());
        for (&id, &(start, end)) in ids.iter().zip(encoding.get_offsets()) {
            if self.is_control(id) {
                out.extend(self.encode_chars(&text[Range { start, end }])?);
            } else {
                out.push(id);
            }
        }
        Ok(out)
    }

    /// `text` one character at a time; a character that is itself an added
    /// token becomes the replacement character.
    fn encode_chars(&self, text: &str) -> Result<Vec<u32>, OrtError> {
        let mut out = Vec::new();
        let mut buf = [0u8; 4];
        for c in text.chars() {
            let ids = self.plain_ids(c.encode_utf8(&mut buf))?;
            if ids.iter().any(|id| self.is_control(*id)) {
                out.extend(
                    self.plain_ids("\u{FFFD}")?
                        .into_iter()
                        .filter(|id| !self.is_control(*id)),
                );
            } else {
                out.extend(ids);
            }
        }
        Ok(out)
    }

    fn plain_ids(&self, text: &str) -> Result<Vec<u32>, OrtError> {
        self.plain
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(tokenizer_error)
    }

    /// Whether two token lists spell the same text with the same added
    /// tokens in the same places: the plain tokens between added tokens may
    /// differ, as long as they decode to the same text. Used to check that
    /// ids taken from the KV cache for a prompt are that prompt, with
    /// control tokens exactly where its own tokenization has them.
    pub fn same_text(&self, a: &[u32], b: &[u32]) -> Result<bool, OrtError> {
        // What both start with is the same; comparing from the last added
        // token in it keeps each decoded stretch whole.
        let shared = common_prefix(a, b);
        let start = a[..shared]
            .iter()
            .rposition(|id| self.is_control(*id))
            .map_or(0, |i| i + 1);
        Ok(self.pieces(&a[start..])? == self.pieces(&b[start..])?)
    }

    /// `ids` as its added tokens and the decoded text between them.
    fn pieces(&self, ids: &[u32]) -> Result<Vec<Piece>, OrtError> {
        let mut pieces = Vec::new();
        for run in ids.split_inclusive(|id| self.is_control(*id)) {
            let (plain, control) = match run.split_last() {
                Some((last, rest)) if self.is_control(*last) => (rest, Some(*last)),
                _ => (run, None),
            };
            if !plain.is_empty() {
                pieces.push(Piece::Text(self.decode(plain)?));
            }
            pieces.extend(control.map(Piece::Control));
        }
        Ok(pieces)
    }

    /// Turns ids back into text (added tokens kept).
    pub fn decode(&self, ids: &[u32]) -> Result<String, OrtError> {
        self.tokenizer.decode(ids, false).map_err(tokenizer_error)
    }

    /// The tokenizer, reading added tokens from text.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }
}

/// A stretch of a tokenized text: an added token, or the text of the plain
/// tokens between two of them.
#[derive(Debug, PartialEq, Eq)]
enum Piece {
    Control(u32),
    Text(String),
}

/// The part of a rendered prompt from byte `at` on, with its given strings
/// (clipped to it) where they were.
pub(crate) fn prompt_from(prompt: &RenderedPrompt, at: usize) -> RenderedPrompt {
    RenderedPrompt {
        text: prompt.text[at..].to_string(),
        content: prompt
            .content
            .iter()
            .filter(|c| c.end > at)
            .map(|c| c.start.max(at) - at..c.end - at)
            .collect(),
        exact: prompt.exact,
    }
}

fn tokenizer_error(e: tokenizers::Error) -> OrtError {
    OrtError::Tokenizer(e.to_string())
}
