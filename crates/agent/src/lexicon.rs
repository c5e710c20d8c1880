//! The loop's words of one language, English, in one place.
//!
//! A few of the loop's decisions read the person's words: whether a request
//! asks a question or for a change, which words of it are verbs and which
//! are worth copying into an argument, whether a reply admits a failure or
//! hands the work back to the person. Those words are English, and they are
//! all here, so that what depends on English is visible in one file.
//!
//! A request in another language does not match them, and a rule that
//! reads them would then decide on nothing: it would take every request for
//! a question, or for none. So the loop asks [`speaks_english`] once per
//! request, and every rule that needs these words stands down for a request
//! that is not English, and says so in the ledger (a `Rule` event per rule
//! that stood down). What holds in any language (schemas, annotations,
//! identifiers, digits, the model's own probabilities) stays on.

/// Words too common to say anything about which tool is wanted.
pub(crate) const STOP_WORDS: &[&str] = &[
    "about", "all", "also", "am", "an", "and", "any", "are", "as", "at", "be", "been", "but", "by",
    "can", "could", "did", "do", "does", "for", "from", "had", "has", "have", "he", "her", "here",
    "him", "his", "how", "if", "in", "into", "is", "it", "its", "just", "let", "like", "me",
    "might", "my", "no", "not", "now", "of", "on", "or", "our", "please", "she", "should", "so",
    "some", "than", "that", "the", "their", "them", "then", "there", "these", "they", "this",
    "those", "to", "up", "us", "was", "we", "were", "what", "when", "where", "which", "who", "why",
    "will", "with", "would", "you", "your",
];

/// Verbs that ask for a change and are also actions ("add", "book"): one
/// list for both [`is_action_verb`] and [`is_change_verb`].
const CHANGING_ACTIONS: &[&str] = &[
    "add",
    "buy",
    "purchase",
    "order",
    "put",
    "remove",
    "delete",
    "apply",
    "book",
    "set",
    "change",
    "update",
    "create",
    "make",
    "send",
    "cancel",
    "subscribe",
    "save",
    "fill",
    "submit",
];

/// Verbs that ask for an action that changes nothing ("find", "show").
const LOOKING_ACTIONS: &[&str] = &[
    "open", "show", "search", "find", "look", "get", "check", "go", "navigate", "pick", "choose",
    "select", "compare", "list", "view", "call",
];

/// Verbs that ask for a change that are not said of an action request
/// ("rename", "run").
const OTHER_CHANGES: &[&str] = &[
    "erase",
    "write",
    "unsubscribe",
    "move",
    "rename",
    "copy",
    "edit",
    "append",
    "replace",
    "insert",
    "post",
    "reply",
    "pay",
    "checkout",
    "register",
    "sign",
    "reserve",
    "schedule",
    "enable",
    "disable",
    "turn",
    "mark",
    "assign",
    "upload",
    "store",
    "record",
    "log",
    "empty",
    "clear",
    "reset",
    "increment",
    "decrement",
    "toggle",
    "install",
    "start",
    "stop",
    "run",
    "modify",
    "transfer",
    "mkdir",
];

/// Whether `word` (lowercased) asks for an action ("add", "find", "show"):
/// a request with one is an action request, and these words say what to
/// do, not what to do it to.
pub(crate) fn is_action_verb(word: &str) -> bool {
    CHANGING_ACTIONS.contains(&word) || LOOKING_ACTIONS.contains(&word)
}

/// Whether `word` (lowercased) asks for something to change. A request
/// without one asks for information.
pub(crate) fn is_change_verb(word: &str) -> bool {
    CHANGING_ACTIONS.contains(&word) || OTHER_CHANGES.contains(&word)
}

/// Question words that begin a contraction ("what's", "where's"): no
/// phrase to quote begins or ends with one.
pub(crate) const ASKING_HEADS: &[&str] = &[
    "what", "where", "who", "when", "how", "that", "there", "here", "let",
];

/// Number words a request may use for a count, with the number each
/// stands for when it goes into a number argument ("half" has none: half
/// of what is not the word's to say).
pub(crate) const NUMBER_WORDS: &[(&str, Option<&str>)] = &[
    ("one", Some("1")),
    ("two", Some("2")),
    ("three", Some("3")),
    ("four", Some("4")),
    ("five", Some("5")),
    ("six", Some("6")),
    ("seven", Some("7")),
    ("eight", Some("8")),
    ("nine", Some("9")),
    ("ten", Some("10")),
    ("eleven", Some("11")),
    ("twelve", Some("12")),
    ("dozen", Some("12")),
    ("couple", Some("2")),
    ("pair", Some("2")),
    ("half", None),
    ("once", Some("1")),
    ("twice", Some("2")),
];

/// Words that ask about something.
pub(crate) const ASKING: &[&str] = &[
    "what", "when", "where", "which", "who", "whom", "whose", "why", "how",
];

/// Verbs that ask to be told or shown something.
pub(crate) const TELLING: &[&str] = &[
    "tell", "show", "list", "find", "check", "look", "read", "see", "search",
];

/// Verbs of a request that ask to be told or shown something, when the
/// request is asked as a question: an auxiliary that opens it ("Is it…",
/// "Do I…") asks.
pub(crate) const AUXILIARY: &[&str] = &[
    "is", "are", "am", "was", "were", "do", "does", "did", "has", "have", "had",
];

/// Words that open a polite request rather than a question ("Could you
/// renew my book?").
pub(crate) const POLITE: &[&str] = &[
    "can", "could", "would", "will", "shall", "may", "might", "please",
];

/// What a plain reply says when it admits that the last call failed (the
/// reference's "Don't say it worked" correction looks for one).
pub(crate) const FAILURE_MARKERS: &[&str] = &[
    "error",
    "fail",
    "couldn't",
    "could not",
    "can't",
    "cannot",
    "unable",
    "sorry",
    "not possible",
    "didn't",
    "did not",
    "problem",
    "wasn't",
    "was not",
    "isn't",
    "not available",
];

/// Phrases that hand the work back to the person (the reference's "you do
/// it. Call now" correction looks for one). "you can" is broad, but in a
/// plain reply to an action request it almost always means "you can do it
/// yourself".
pub(crate) const HAND_BACK_MARKERS: &[&str] = &[
    "click",
    "tap ",
    "press ",
    "you can",
    "you could",
    "use the",
    "go to",
    "navigate to",
    "select the",
    "button",
    "you should",
    "you need to",
    "you will need",
    "follow these",
    "following steps",
    "steps:",
];

/// Function words of other languages that English text does not use. A
/// request holding more of them than of English's [`STOP_WORDS`] is not
/// English. Words English shares (`in`, `a`, `was`, `an`) are left out of
/// both sides of the count.
const FOREIGN_FUNCTION_WORDS: &[&str] = &[
    // Spanish, Portuguese
    "el", "la", "los", "las", "del", "que", "y", "es", "por", "para", "con", "una", "un", "mi",
    "mis", "muy", "pero", "como", "esta", "este", "o", "os", "não", "uma", "com", "meu", "minha",
    "em", "qué", "cuál", "dónde", "cuándo", "quiero", // French
    "le", "les", "des", "du", "et", "est", "je", "mon", "ma", "mes", "pour", "avec", "une", "dans",
    "sur", "pas", "qui", "vous", "nous", "ce", "cette", "moi", "quel", "quelle",
    // German
    "der", "die", "das", "und", "ist", "ich", "mein", "meine", "meinen", "bitte", "nicht", "mit",
    "für", "ein", "eine", "einen", "zu", "auf", "dem", "im", "wie", "ob", "wann", "wo", "welche",
    "mir", "mich", "sie", "es", "heute", "morgen", // Italian, Dutch
    "il", "di", "che", "è", "per", "non", "gli", "della", "het", "een", "van", "ik", "niet",
    "mijn", "wat", "voor",
];

/// Words English shares with the languages above, which say nothing either
/// way.
const SHARED_WORDS: &[&str] = &["a", "an", "in", "was", "so", "also", "no", "me", "on", "is"];

/// Whether `text` reads as English, as far as the rules that use these
/// words need to know: letters mostly outside ASCII (another script, or a
/// language written with many accents), or more function words of another
/// language than of English, say it is not. Text too short to tell
/// ("Thanks!", "p-17") counts as English: the words it lacks change nothing.
pub(crate) fn speaks_english(text: &str) -> bool {
    let letters = text.chars().filter(|c| c.is_alphabetic()).count();
    let foreign_letters = text
        .chars()
        .filter(|c| c.is_alphabetic() && !c.is_ascii_alphabetic())
        .count();
    if letters > 0 && foreign_letters * 5 > letters {
        return false;
    }
    let (mut english, mut foreign) = (0usize, 0usize);
    for word in text
        .split(|c: char| !(c.is_alphanumeric() || c == '\''))
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
    {
        if SHARED_WORDS.contains(&word.as_str()) {
            continue;
        }
        if STOP_WORDS.contains(&word.as_str()) {
            english += 1;
        } else if FOREIGN_FUNCTION_WORDS.contains(&word.as_str()) {
            foreign += 1;
        }
    }
    foreign <= english
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn english_is_told_from_other_languages() {
        for english in [
            "What's on my calendar on 2026-03-12?",
            "Please remember that Olga has a spare key",
            "Add p-17 to cart",
            "Book haircut tomorrow",
            "Thanks!",
            "",
        ] {
            assert!(speaks_english(english), "{english:?}");
        }
        for other in [
            "Füge bitte zwei Rucksäcke in meinen Warenkorb ein",
            "¿Qué hora es en Tokio?",
            "Ajoute le sac à dos dans mon panier, s'il te plaît",
            "Wie spät ist es in Tokio?",
            "東京は今何時ですか",
            "Какая погода в Москве?",
        ] {
            assert!(!speaks_english(other), "{other:?}");
        }
    }
}
