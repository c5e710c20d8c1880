//! Rust-native tool sets the task suite runs against besides the demo shop:
//! a to-do list and a calendar, each starting from the same fixed data on
//! every run, so a task's end state can be checked exactly.
//!
//! A scenario names them as built-ins of a native source
//! (`kind = "native"`, `builtins = ["todo"]`); the suite hosts them itself
//! (see [`EVAL_BUILTINS`]), since the config's own built-ins are the
//! calculator and the clock.

use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::{Value, json};
use wma_agent::{ToolAnnotations, ToolDefinition, ToolError, ToolErrorCode};
use wma_tools::NativeTools;

/// The tool sets the suite hosts in-process, by the built-in name a scenario
/// gives them.
pub const EVAL_BUILTINS: &[&str] = &["todo", "calendar"];

/// The tools of one of [`EVAL_BUILTINS`], with fresh state; `None` for
/// another name.
pub fn eval_builtin(name: &str) -> Option<NativeTools> {
    match name {
        "todo" => Some(TodoList::new().tools()),
        "calendar" => Some(Calendar::new().tools()),
        _ => None,
    }
}

fn read_only() -> ToolAnnotations {
    ToolAnnotations {
        read_only: true,
        ..ToolAnnotations::default()
    }
}

fn invalid(message: impl Into<String>) -> ToolError {
    ToolError::new(ToolErrorCode::InvalidArguments, message)
}

fn failed(message: impl Into<String>) -> ToolError {
    ToolError::new(ToolErrorCode::ToolFailed, message)
}

fn string_arg<'a>(args: &'a Value, key: &str) -> Result<&'a str, ToolError> {
    args[key]
        .as_str()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| invalid(format!("`{key}` is required")))
}

/// `YYYY-MM-DD`, checked for shape and a plausible month and day.
fn check_date(date: &str) -> Result<(), ToolError> {
    let parts: Vec<&str> = date.split('-').collect();
    let ok = parts.len() == 3
        && parts[0].len() == 4
        && parts[1].len() == 2
        && parts[2].len() == 2
        && parts.iter().all(|p| p.chars().all(|c| c.is_ascii_digit()))
        && (1..=12).contains(&parts[1].parse::<u32>().unwrap_or(0))
        && (1..=31).contains(&parts[2].parse::<u32>().unwrap_or(0));
    if ok {
        Ok(())
    } else {
        Err(invalid(format!("`{date}` is not a date like 2026-03-12")))
    }
}

/// `HH:MM` on a 24-hour clock.
fn check_time(time: &str) -> Result<(), ToolError> {
    let ok = time.len() == 5
        && time.as_bytes()[2] == b':'
        && time[..2].parse::<u32>().is_ok_and(|h| h < 24)
        && time[3..].parse::<u32>().is_ok_and(|m| m < 60);
    if ok {
        Ok(())
    } else {
        Err(invalid(format!("`{time}` is not a time like 14:30")))
    }
}

/// One item of the to-do list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Todo {
    /// `t-N`.
    pub id: String,
    /// What to do.
    pub title: String,
    /// When it is due, `YYYY-MM-DD`, if it has a date.
    pub due: Option<String>,
    /// Whether it is done.
    pub done: bool,
}

impl Todo {
    fn json(&self) -> Value {
        json!({"id": self.id, "title": self.title, "due": self.due, "done": self.done})
    }
}

/// A to-do list that starts with four items (three open, one done).
#[derive(Debug, Clone)]
pub struct TodoList {
    items: Arc<Mutex<Vec<Todo>>>,
}

impl Default for TodoList {
    fn default() -> Self {
        Self::new()
    }
}

impl TodoList {
    /// The list with its starting items.
    pub fn new() -> Self {
        let item = |id: &str, title: &str, due: Option<&str>, done: bool| Todo {
            id: id.to_string(),
            title: title.to_string(),
            due: due.map(str::to_string),
            done,
        };
        Self {
            items: Arc::new(Mutex::new(vec![
                item("t-1", "Buy milk", None, false),
                item(
                    "t-2",
                    "Call the plumber about the kitchen sink",
                    Some("2026-03-12"),
                    false,
                ),
                item("t-3", "Renew passport", Some("2026-04-30"), false),
                item("t-4", "Send the quarterly report to Dana", None, true),
            ])),
        }
    }

    /// The items now.
    pub fn items(&self) -> Vec<Todo> {
        self.items.lock().clone()
    }

    /// The list's tools: `list_todos` and `find_todos` read; `add_todo`,
    /// `complete_todo` and `delete_todo` change it.
    pub fn tools(&self) -> NativeTools {
        let mut tools = NativeTools::new();
        let list = self.clone();
        tools.add_fn(
            ToolDefinition::new(
                "list_todos",
                "List the to-do items with their id, title, due date and whether they are done.",
                json!({"type": "object", "properties": {
                    "status": {"type": "string", "enum": ["open", "done", "all"],
                               "description": "Which items (default: open)."}}}),
            )
            .with_annotations(read_only()),
            move |args| {
                let status = args["status"].as_str().unwrap_or("open");
                let items: Vec<Value> = list
                    .items
                    .lock()
                    .iter()
                    .filter(|t| match status {
                        "done" => t.done,
                        "all" => true,
                        _ => !t.done,
                    })
                    .map(Todo::json)
                    .collect();
                Ok(Value::Array(items).to_string())
            },
        );
        let list = self.clone();
        tools.add_fn(
            ToolDefinition::new(
                "find_todos",
                "Find to-do items whose title contains a word.",
                json!({"type": "object", "properties": {
                    "query": {"type": "string", "description": "A word of the title."}},
                    "required": ["query"]}),
            )
            .with_annotations(read_only()),
            move |args| {
                let query = string_arg(&args, "query")?.to_lowercase();
                let words: Vec<&str> = query.split_whitespace().collect();
                let items: Vec<Value> = list
                    .items
                    .lock()
                    .iter()
                    .filter(|t| {
                        let title = t.title.to_lowercase();
                        words.iter().any(|w| title.contains(w))
                    })
                    .map(Todo::json)
                    .collect();
                Ok(Value::Array(items).to_string())
            },
        );
        let list = self.clone();
        tools.add_fn(
            ToolDefinition::new(
                "add_todo",
                "Add an item to the to-do list.",
                json!({"type": "object", "properties": {
                    "title": {"type": "string", "description": "What to do."},
                    "due": {"type": "string", "description": "Due date, YYYY-MM-DD (optional)."}},
                    "required": ["title"]}),
            ),
            move |args| {
                let title = string_arg(&args, "title")?.to_string();
                let due = match args["due"].as_str().map(str::trim) {
                    Some(d) if !d.is_empty() => {
                        check_date(d)?;
                        Some(d.to_string())
                    }
                    _ => None,
                };
                let mut items = list.items.lock();
                let id = format!("t-{}", items.len() + 1);
                let todo = Todo {
                    id,
                    title,
                    due,
                    done: false,
                };
                let out = json!({"ok": true, "added": todo.json()}).to_string();
                items.push(todo);
                Ok(out)
            },
        );
        let list = self.clone();
        tools.add_fn(
            ToolDefinition::new(
                "complete_todo",
                "Mark a to-do item as done, by its id.",
                json!({"type": "object", "properties": {
                    "todo_id": {"type": "string", "description": "The item's id, like t-2."}},
                    "required": ["todo_id"]}),
            ),
            move |args| {
                let id = string_arg(&args, "todo_id")?;
                let mut items = list.items.lock();
                let todo = items
                    .iter_mut()
                    .find(|t| t.id == id)
                    .ok_or_else(|| failed(format!("there is no to-do item {id}")))?;
                todo.done = true;
                Ok(json!({"ok": true, "done": todo.json()}).to_string())
            },
        );
        let list = self.clone();
        tools.add_fn(
            ToolDefinition::new(
                "delete_todo",
                "Delete a to-do item, by its id.",
                json!({"type": "object", "properties": {
                    "todo_id": {"type": "string", "description": "The item's id, like t-2."}},
                    "required": ["todo_id"]}),
            ),
            move |args| {
                let id = string_arg(&args, "todo_id")?;
                let mut items = list.items.lock();
                let at = items
                    .iter()
                    .position(|t| t.id == id)
                    .ok_or_else(|| failed(format!("there is no to-do item {id}")))?;
                let gone = items.remove(at);
                Ok(json!({"ok": true, "deleted": gone.json()}).to_string())
            },
        );
        tools
    }
}

/// One calendar event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// `e-N`.
    pub id: String,
    /// What it is.
    pub title: String,
    /// `YYYY-MM-DD`.
    pub date: String,
    /// `HH:MM`.
    pub start: String,
    /// Length in minutes.
    pub minutes: u32,
}

impl Event {
    fn json(&self) -> Value {
        json!({"id": self.id, "title": self.title, "date": self.date,
               "start": self.start, "duration_minutes": self.minutes})
    }
}

/// A calendar that starts with five events in the week of 2026-03-09.
#[derive(Debug, Clone)]
pub struct Calendar {
    events: Arc<Mutex<Vec<Event>>>,
}

impl Default for Calendar {
    fn default() -> Self {
        Self::new()
    }
}

impl Calendar {
    /// The calendar with its starting events.
    pub fn new() -> Self {
        let event = |id: &str, title: &str, date: &str, start: &str, minutes| Event {
            id: id.to_string(),
            title: title.to_string(),
            date: date.to_string(),
            start: start.to_string(),
            minutes,
        };
        Self {
            events: Arc::new(Mutex::new(vec![
                event("e-1", "Budget review", "2026-03-10", "15:00", 30),
                event("e-2", "Dentist appointment", "2026-03-11", "14:30", 45),
                event(
                    "e-3",
                    "Project kickoff with Acme",
                    "2026-03-12",
                    "10:00",
                    90,
                ),
                event("e-4", "Lunch with Priya", "2026-03-12", "12:30", 60),
                event("e-5", "Yoga class", "2026-03-13", "18:00", 60),
            ])),
        }
    }

    /// The events now.
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().clone()
    }

    /// The calendar's tools: `list_events` and `get_event` read;
    /// `add_event`, `move_event` and `cancel_event` change it.
    pub fn tools(&self) -> NativeTools {
        let mut tools = NativeTools::new();
        let cal = self.clone();
        tools.add_fn(
            ToolDefinition::new(
                "list_events",
                "List the calendar's events on a day, with id, title, start time and length.",
                json!({"type": "object", "properties": {
                    "date": {"type": "string", "description": "The day, YYYY-MM-DD."}},
                    "required": ["date"]}),
            )
            .with_annotations(read_only()),
            move |args| {
                let date = string_arg(&args, "date")?;
                check_date(date)?;
                let mut events: Vec<Event> = cal
                    .events
                    .lock()
                    .iter()
                    .filter(|e| e.date == date)
                    .cloned()
                    .collect();
                events.sort_by(|a, b| a.start.cmp(&b.start));
                Ok(Value::Array(events.iter().map(Event::json).collect()).to_string())
            },
        );
        let cal = self.clone();
        tools.add_fn(
            ToolDefinition::new(
                "get_event",
                "Get one calendar event by its id.",
                json!({"type": "object", "properties": {
                    "event_id": {"type": "string", "description": "The event's id, like e-3."}},
                    "required": ["event_id"]}),
            )
            .with_annotations(read_only()),
            move |args| {
                let id = string_arg(&args, "event_id")?;
                cal.events
                    .lock()
                    .iter()
                    .find(|e| e.id == id)
                    .map(|e| e.json().to_string())
                    .ok_or_else(|| failed(format!("there is no event {id}")))
            },
        );
        let cal = self.clone();
        tools.add_fn(
            ToolDefinition::new(
                "add_event",
                "Put a new event in the calendar.",
                json!({"type": "object", "properties": {
                    "title": {"type": "string", "description": "What it is."},
                    "date": {"type": "string", "description": "The day, YYYY-MM-DD."},
                    "start": {"type": "string", "description": "Start time, HH:MM (24-hour)."},
                    "duration_minutes": {"type": "integer", "minimum": 5,
                                         "description": "Length in minutes (default 60)."}},
                    "required": ["title", "date", "start"]}),
            ),
            move |args| {
                let title = string_arg(&args, "title")?.to_string();
                let date = string_arg(&args, "date")?.to_string();
                let start = string_arg(&args, "start")?.to_string();
                check_date(&date)?;
                check_time(&start)?;
                let minutes = args["duration_minutes"]
                    .as_u64()
                    .map_or(60, |m| m.min(24 * 60) as u32);
                let mut events = cal.events.lock();
                let event = Event {
                    id: format!("e-{}", events.len() + 1),
                    title,
                    date,
                    start,
                    minutes,
                };
                let out = json!({"ok": true, "added": event.json()}).to_string();
                events.push(event);
                Ok(out)
            },
        );
        let cal = self.clone();
        tools.add_fn(
            ToolDefinition::new(
                "move_event",
                "Move a calendar event to another day or time, by its id.",
                json!({"type": "object", "properties": {
                    "event_id": {"type": "string", "description": "The event's id, like e-3."},
                    "date": {"type": "string", "description": "The new day, YYYY-MM-DD (default: the same day)."},
                    "start": {"type": "string", "description": "The new start time, HH:MM (default: the same time)."}},
                    "required": ["event_id"]}),
            ),
            move |args| {
                let id = string_arg(&args, "event_id")?;
                let date = args["date"]
                    .as_str()
                    .map(str::trim)
                    .filter(|d| !d.is_empty());
                let start = args["start"]
                    .as_str()
                    .map(str::trim)
                    .filter(|s| !s.is_empty());
                if date.is_none() && start.is_none() {
                    return Err(invalid("give a new `date`, a new `start`, or both"));
                }
                if let Some(d) = date {
                    check_date(d)?;
                }
                if let Some(s) = start {
                    check_time(s)?;
                }
                let mut events = cal.events.lock();
                let event = events
                    .iter_mut()
                    .find(|e| e.id == id)
                    .ok_or_else(|| failed(format!("there is no event {id}")))?;
                if let Some(d) = date {
                    event.date = d.to_string();
                }
                if let Some(s) = start {
                    event.start = s.to_string();
                }
                Ok(json!({"ok": true, "moved": event.json()}).to_string())
            },
        );
        let cal = self.clone();
        tools.add_fn(
            ToolDefinition::new(
                "cancel_event",
                "Cancel (delete) a calendar event, by its id.",
                json!({"type": "object", "properties": {
                    "event_id": {"type": "string", "description": "The event's id, like e-3."}},
                    "required": ["event_id"]}),
            ),
            move |args| {
                let id = string_arg(&args, "event_id")?;
                let mut events = cal.events.lock();
                let at = events
                    .iter()
                    .position(|e| e.id == id)
                    .ok_or_else(|| failed(format!("there is no event {id}")))?;
                let gone = events.remove(at);
                Ok(json!({"ok": true, "cancelled": gone.json()}).to_string())
            },
        );
        tools
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_util::sync::CancellationToken;
    use wma_agent::ToolHost;

    async fn call(tools: &NativeTools, name: &str, args: Value) -> Result<String, ToolError> {
        tools.call_tool(name, args, CancellationToken::new()).await
    }

    #[tokio::test]
    async fn the_todo_list_adds_completes_and_refuses_unknown_ids() {
        let list = TodoList::new();
        let tools = list.tools();
        let open = call(&tools, "list_todos", json!({})).await.unwrap();
        assert!(open.contains("Buy milk") && !open.contains("quarterly"));
        call(&tools, "add_todo", json!({"title": "Water the plants"}))
            .await
            .unwrap();
        call(&tools, "complete_todo", json!({"todo_id": "t-1"}))
            .await
            .unwrap();
        let items = list.items();
        assert_eq!(items.len(), 5);
        assert!(items[0].done);
        assert_eq!(items[4].id, "t-5");
        let err = call(&tools, "delete_todo", json!({"todo_id": "t-9"}))
            .await
            .unwrap_err();
        assert_eq!(err.code, ToolErrorCode::ToolFailed);
        let err = call(&tools, "add_todo", json!({"title": "x", "due": "soon"}))
            .await
            .unwrap_err();
        assert_eq!(err.code, ToolErrorCode::InvalidArguments);
    }

    #[tokio::test]
    async fn the_calendar_lists_a_day_in_order_and_moves_events() {
        let cal = Calendar::new();
        let tools = cal.tools();
        let day = call(&tools, "list_events", json!({"date": "2026-03-12"}))
            .await
            .unwrap();
        let kickoff = day.find("kickoff").unwrap();
        let lunch = day.find("Lunch").unwrap();
        assert!(kickoff < lunch);
        call(
            &tools,
            "move_event",
            json!({"event_id": "e-5", "date": "2026-03-14"}),
        )
        .await
        .unwrap();
        assert_eq!(cal.events()[4].date, "2026-03-14");
        assert_eq!(cal.events()[4].start, "18:00");
        let err = call(
            &tools,
            "add_event",
            json!({"title": "x", "date": "2026-03-12", "start": "25:00"}),
        )
        .await
        .unwrap_err();
        assert_eq!(err.code, ToolErrorCode::InvalidArguments);
    }
}
