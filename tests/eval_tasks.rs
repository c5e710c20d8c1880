//! The task suite: every scenario in configs/tasks loads and validates,
//! every task is solvable (its gold solution, replayed through the real
//! tool sources, passes its checks), and the checks tell a right end state
//! from a wrong one (run with scripted models, so no model is needed).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::StreamExt;
use serde_json::json;
use webmcp_agents::agent::policy::Policy;
use webmcp_agents::eval::tasks::{
    Check, GoldStep, Half, Task, load_file, load_tasks, replay_gold, report, run_suite, run_task,
};
use webmcp_agents::usage::UsageMeter;
use wma_testkit::ScriptedProvider;

fn tasks_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/tasks")
}

static FILES: AtomicUsize = AtomicUsize::new(0);

/// A scenario file in a folder of its own, with this text.
fn scenario(text: &str) -> PathBuf {
    let n = FILES.fetch_add(1, Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!("wma-eval-test-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("scenario.toml");
    std::fs::write(&file, text).unwrap();
    file
}

fn one_task(text: &str) -> Task {
    let mut tasks = load_file(&scenario(text)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(tasks.len(), 1);
    tasks.remove(0)
}

/// A scripted model giving these replies, metered as the suite meters it.
fn model(replies: &[String]) -> Arc<UsageMeter<ScriptedProvider>> {
    Arc::new(UsageMeter::new(Arc::new(ScriptedProvider::new(
        replies.iter().cloned(),
    ))))
}

fn call(name: &str, arguments: serde_json::Value) -> String {
    json!({"name": name, "arguments": arguments}).to_string()
}

const TODO: &str = r#"
domain = "todo"
[tools.todo]
kind = "native"
builtins = ["todo"]
[agents.todo_agent]
tools = ["todo"]
"#;

#[test]
fn every_scenario_loads_and_the_suite_spans_its_domains() {
    let tasks = load_tasks(&tasks_dir()).unwrap_or_else(|e| panic!("{e}"));
    assert!(tasks.len() >= 100, "{} tasks", tasks.len());
    // Both halves are sizeable: neither is a token sample of the other.
    for half in Half::ALL {
        let n = tasks.iter().filter(|t| t.half == half).count();
        assert!(
            n * 3 >= tasks.len(),
            "{n} of {} tasks in {half}",
            tasks.len()
        );
    }
    for task in &tasks {
        assert!(task.has_gold(), "{} has no gold solution", task.name);
    }
    let mut domains: Vec<&str> = tasks.iter().map(|t| t.domain.as_str()).collect();
    domains.sort();
    domains.dedup();
    assert!(domains.len() >= 10, "{domains:?}");
    let shop = tasks.iter().filter(|t| t.domain == "shop").count();
    assert!(
        shop * 5 <= tasks.len(),
        "{shop} of {} are shop tasks",
        tasks.len()
    );
    for task in &tasks {
        assert!(!task.checks.is_empty(), "{}", task.name);
        assert!(!task.agent.is_empty(), "{}", task.name);
    }
    assert!(
        tasks.iter().any(|t| t.is_read_only()) && tasks.iter().any(|t| !t.is_read_only()),
        "read-only tasks and tasks that change things"
    );
    assert!(tasks.iter().any(|t| t.site.is_some()), "a WebMCP site");
}

#[test]
fn mistakes_in_a_scenario_name_the_task_and_the_key() {
    let typo = format!(
        "{TODO}[[task]]\nname = \"t\"\nrequest = \"add x\"\n[[task.check]]\nkind = \"tool\"\ncall = \"list_todos\"\ncontians = [\"x\"]\n"
    );
    let e = load_file(&scenario(&typo)).unwrap_err();
    assert!(e.contains("contians"), "{e}");

    let wrong_key = format!(
        "{TODO}[[task]]\nname = \"t\"\nrequest = \"add x\"\n[[task.check]]\nkind = \"answer\"\npath = \"a.txt\"\ncontains = [\"x\"]\n"
    );
    let e = load_file(&scenario(&wrong_key)).unwrap_err();
    assert!(
        e.contains("task `t`") && e.contains("`path` is not a setting of a answer check"),
        "{e}"
    );

    let no_tool = format!(
        "{TODO}[[task]]\nname = \"t\"\nrequest = \"add x\"\n[[task.check]]\nkind = \"tool\"\ncall = \"list_todo\"\n"
    );
    let e = load_file(&scenario(&no_tool)).unwrap_err();
    assert!(
        e.contains("no source of the file offers a tool `list_todo`"),
        "{e}"
    );

    let no_source = "domain = \"d\"\n[agents.a]\ntools = [\"nowhere\"]\n[[task]]\nname = \"t\"\nrequest = \"hi\"\n[[task.check]]\nkind = \"answer\"\ncontains = [\"x\"]\n";
    let e = load_file(&scenario(no_source)).unwrap_err();
    assert!(e.contains("nowhere"), "{e}");

    let with_model = format!(
        "{TODO}[providers.m]\nkind = \"onnx\"\n[[task]]\nname = \"t\"\nrequest = \"hi\"\n[[task.check]]\nkind = \"answer\"\ncontains = [\"x\"]\n"
    );
    let e = load_file(&scenario(&with_model)).unwrap_err();
    assert!(e.contains("the suite supplies the model"), "{e}");

    let only_read_only = format!(
        "{TODO}[[task]]\nname = \"t\"\nrequest = \"hi\"\n[[task.check]]\nkind = \"read-only\"\n"
    );
    let e = load_file(&scenario(&only_read_only)).unwrap_err();
    assert!(e.contains("a check that something happened"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_check_tells_the_right_content_from_the_wrong() {
    let file = |want: &str| {
        format!(
            "{TODO}[[task]]\nname = \"notes\"\nrequest = \"What is in notes.txt?\"\nfiles = {{ \"notes/today.txt\" = \"Call Dana at 3\\n\" }}\n[[task.check]]\nkind = \"file\"\npath = \"notes/today.txt\"\n{want}\n"
        )
    };
    let policy = Policy::small_model();
    let right = one_task(&file("equals = \"Call Dana at 3\""));
    let run = run_task(&right, &policy, &model(&["Call Dana at 3.".into()])).await;
    assert!(run.error.is_none(), "{:?}", run.error);
    assert!(run.solved, "{:?}", run.failures);

    let wrong = one_task(&file("equals = \"Call Sam at 4\""));
    let run = run_task(&wrong, &policy, &model(&["Call Dana at 3.".into()])).await;
    assert!(!run.solved);
    assert!(
        run.failures[0].contains("Call Dana at 3"),
        "{:?}",
        run.failures
    );

    let gone = one_task(&file("exists = false"));
    let run = run_task(&gone, &policy, &model(&["Done.".into()])).await;
    assert!(!run.solved);
    assert!(run.failures[0].contains("exists"), "{:?}", run.failures);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_check_reads_the_state_back_after_the_run() {
    let task = one_task(&format!(
        "{TODO}[[task]]\nname = \"plants\"\nrequest = \"Add water the plants to my list\"\n[[task.check]]\nkind = \"tool\"\ncall = \"list_todos\"\ncontains = [\"plants\"]\n[[task.check]]\nkind = \"called\"\ntool = \"add_todo\"\narguments_contain = [\"water\"]\n"
    ));
    let policy = Policy::reference();
    let added = model(&[
        call("add_todo", json!({"title": "Water the plants"})),
        "Added it.".into(),
    ]);
    let run = run_task(&task, &policy, &added).await;
    assert!(run.solved, "{:?} {:?}", run.failures, run.error);
    assert_eq!(run.steps, 2);
    assert_eq!(run.changes.len(), 1, "{:?}", run.changes);

    let other = model(&[
        call("add_todo", json!({"title": "Feed the cat"})),
        "Added it.".into(),
    ]);
    let run = run_task(&task, &policy, &other).await;
    assert!(!run.solved);
    assert_eq!(run.failures.len(), 2, "{:?}", run.failures);
    assert!(
        run.failures[0].contains("lacks \"plants\""),
        "{:?}",
        run.failures
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_read_only_check_catches_a_write() {
    let task = one_task(&format!(
        "{TODO}[[task]]\nname = \"open\"\nrequest = \"What is on my list?\"\n[[task.check]]\nkind = \"answer\"\ncontains = [\"milk\"]\n[[task.check]]\nkind = \"read-only\"\n"
    ));
    let policy = Policy::reference();
    let reads = model(&[
        call("list_todos", json!({})),
        "Buy milk, renew passport.".into(),
    ]);
    let run = run_task(&task, &policy, &reads).await;
    assert!(run.solved, "{:?}", run.failures);
    assert!(run.changes.is_empty());

    let writes = model(&[
        call("complete_todo", json!({"todo_id": "t-1"})),
        "Buy milk is done now.".into(),
    ]);
    let run = run_task(&task, &policy, &writes).await;
    assert!(!run.solved);
    assert!(
        run.changes[0].starts_with("complete_todo"),
        "{:?}",
        run.changes
    );
    assert!(
        run.failures
            .iter()
            .any(|f| f.contains("tools that change things")),
        "{:?}",
        run.failures
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_cannot_start_is_an_error_in_its_row_and_the_suite_goes_on() {
    let broken = one_task(
        "domain = \"files\"\n[tools.fs]\nkind = \"mcp-stdio\"\ncommand = \"/nonexistent/mcp-server\"\nargs = [\"{workdir}\"]\n[agents.a]\ntools = [\"fs\"]\n[[task]]\nname = \"broken\"\nrequest = \"list my files\"\n[[task.check]]\nkind = \"answer\"\ncontains = [\"x\"]\n",
    );
    let fine = one_task(&format!(
        "{TODO}[[task]]\nname = \"fine\"\nrequest = \"What is on my list?\"\n[[task.check]]\nkind = \"answer\"\ncontains = [\"milk\"]\n"
    ));
    let provider = Arc::new(ScriptedProvider::new(["Buy milk."]));
    let results = run_suite(
        &[broken, fine],
        &[Policy::small_model()],
        1,
        provider,
        |_, _, _, _| {},
    )
    .await;
    assert_eq!(results.len(), 2);
    let error = results[0].runs[0].error.as_deref().unwrap_or_default();
    assert!(error.contains("/nonexistent/mcp-server"), "{error}");
    assert!(
        results[1].runs[0].solved,
        "{:?}",
        results[1].runs[0].failures
    );
    let table = report(&results);
    assert!(
        table.contains(&format!(
            "| broken (files, {}) | 0/1 (1 error) |",
            Half::of("files", "broken")
        )),
        "{table}"
    );
    assert!(
        table.contains(&format!(
            "| fine (todo, {}) | 1/1 |",
            Half::of("todo", "fine")
        )),
        "{table}"
    );
    assert!(table.contains("small-model solved 1/2 (50%)"), "{table}");
}

/// The text of a task's answer checks that must be in the answer (their
/// `contains`).
fn answer_facts(task: &Task) -> Vec<String> {
    task.checks
        .iter()
        .filter_map(|c| match c {
            Check::Answer(text) => Some(text.contains.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

/// Every task is solvable by construction: its gold solution, replayed
/// with no model and no loop (`replay_gold`), runs through the task's real
/// sources (the MCP servers, Chromium, the Rust tool sets) and passes every
/// check. Each gold call succeeds with arguments its tool's schema takes,
/// and the facts an answer must contain come out of the tools' results (or
/// the request), not only out of the gold answer's own words. A task whose
/// check cannot pass, whose server is missing or answers otherwise, fails
/// here.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_task_is_solved_by_its_gold_solution() {
    let _chromium = crate::support::CHROMIUM.read().await;
    let tasks = load_tasks(&tasks_dir()).unwrap_or_else(|e| panic!("{e}"));
    // A few at a time: each run starts its own servers (and browser).
    let failures: Vec<String> = futures::stream::iter(tasks.iter())
        .map(|task| async move {
            let run = replay_gold(task).await;
            let mut wrong = Vec::new();
            if let Some(e) = &run.error {
                wrong.push(format!("could not run: {e}"));
            }
            wrong.extend(run.failures.iter().cloned());
            let gold_calls = task
                .gold
                .iter()
                .filter(|s| matches!(s, GoldStep::Call { .. }))
                .count();
            if run.calls.len() != gold_calls {
                wrong.push(format!(
                    "{} of {gold_calls} gold calls made: {:?}",
                    run.calls.len(),
                    run.calls
                ));
            }
            if !run.tool_errors.is_empty() {
                wrong.push(format!("gold calls failed: {:?}", run.tool_errors));
            }
            if gold_calls > 0 {
                let seen = format!("{}\n{}", task.request, run.results.join("\n")).to_lowercase();
                for fact in answer_facts(task) {
                    if !seen.contains(&fact.to_lowercase()) {
                        wrong.push(format!(
                            "the answer's {fact:?} is in no tool result: {:?}",
                            run.results
                        ));
                    }
                }
            }
            (!wrong.is_empty())
                .then(|| format!("{}/{}: {}", task.domain, task.name, wrong.join("; ")))
        })
        .buffer_unordered(3)
        .filter_map(|f| async move { f })
        .collect()
        .await;
    assert!(
        failures.is_empty(),
        "{} of {} tasks are not solved by their gold solution:\n{}",
        failures.len(),
        tasks.len(),
        failures.join("\n")
    );
}

/// A gold solution that does the wrong thing fails its task, and one that
/// calls a tool its agent does not have cannot be replayed: the replay is
/// a check, not a formality.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_gold_solution_fails_its_task() {
    let gold = |steps: &str| {
        one_task(&format!(
            "{TODO}[[task]]\nname = \"plants\"\nrequest = \"Add water the plants to my list\"\n{steps}[[task.check]]\nkind = \"tool\"\ncall = \"list_todos\"\ncontains = [\"plants\"]\n"
        ))
    };
    let right =
        gold("[[task.gold]]\ncall = \"add_todo\"\narguments = { title = \"Water the plants\" }\n");
    let run = replay_gold(&right).await;
    assert!(run.solved, "{:?} {:?}", run.failures, run.error);
    assert_eq!(run.calls.len(), 1, "{:?}", run.calls);

    let wrong =
        gold("[[task.gold]]\ncall = \"add_todo\"\narguments = { title = \"Feed the cat\" }\n");
    let run = replay_gold(&wrong).await;
    assert!(!run.solved);
    assert!(
        run.failures[0].contains("lacks \"plants\""),
        "{:?}",
        run.failures
    );

    let bad_arguments =
        gold("[[task.gold]]\ncall = \"add_todo\"\narguments = { name = \"Water the plants\" }\n");
    let run = replay_gold(&bad_arguments).await;
    assert!(!run.solved);
    assert!(run.calls.is_empty(), "{:?}", run.calls);
    assert_eq!(run.tool_errors.len(), 1, "{:?}", run.tool_errors);

    let e = load_file(&scenario(&format!(
        "{TODO}[[task]]\nname = \"t\"\nrequest = \"hi\"\n[[task.gold]]\ncall = \"add_todos\"\n[[task.check]]\nkind = \"answer\"\ncontains = [\"x\"]\n"
    )))
    .unwrap_err();
    assert!(e.contains("gold 1") && e.contains("add_todos"), "{e}");
}

/// In a team, a helper's gold steps run with the helper's tools, and its
/// reply is what its parent's call of it returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gold_solution_delegates_through_the_helpers_tools() {
    let team = "domain = \"team\"\n[tools.todo]\nkind = \"native\"\nbuiltins = [\"todo\"]\n[agents.boss]\nsub_agents = [\"helper\"]\n[agents.helper]\ndescription = \"Keeps the list.\"\ntools = [\"todo\"]\n[[task]]\nname = \"t\"\nagent = \"boss\"\nrequest = \"Add milk\"\n";
    let checks = "[[task.check]]\nkind = \"tool\"\ncall = \"list_todos\"\ncontains = [\"oat milk\"]\n[[task.check]]\nkind = \"called\"\ntool = \"helper\"\narguments_contain = [\"oat\"]\n";
    let task = one_task(&format!(
        "{team}[[task.gold]]\ncall = \"helper\"\narguments = {{ task = \"Add oat milk\" }}\n[[task.gold]]\ncall = \"add_todo\"\narguments = {{ title = \"Oat milk\" }}\n[[task.gold]]\nreply = \"Added.\"\n{checks}"
    ));
    let run = replay_gold(&task).await;
    assert!(run.solved, "{:?} {:?}", run.failures, run.error);
    assert_eq!(run.results.len(), 2, "{:?}", run.results);
    assert!(run.results[0].contains("\"t-5\""), "{:?}", run.results);
    assert_eq!(run.results[1], "Added.");

    // The parent has no tools of its own: the same call made by it fails.
    let task = one_task(&format!(
        "{team}[[task.gold]]\ncall = \"add_todo\"\narguments = {{ title = \"Oat milk\" }}\n{checks}"
    ));
    let run = replay_gold(&task).await;
    assert!(!run.solved);
    assert!(
        run.tool_errors[0].contains("no tool or helper"),
        "{:?}",
        run.tool_errors
    );
}

/// `called` with `tool = "*"` and `absent = true` passes only when no tool
/// and no helper was called: a question answered from what the model knows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_call_at_all_is_checked_with_the_any_tool_check() {
    let task = one_task(&format!(
        "{TODO}[[task]]\nname = \"capital\"\nrequest = \"What is the capital of France?\"\ngold_answer = \"Paris\"\n[[task.check]]\nkind = \"answer\"\ncontains = [\"Paris\"]\n[[task.check]]\nkind = \"called\"\ntool = \"*\"\nabsent = true\n"
    ));
    let policy = Policy::reference();
    let run = run_task(&task, &policy, &model(&["Paris.".into()])).await;
    assert!(run.solved, "{:?}", run.failures);

    let looked = model(&[
        call("find_todos", json!({"query": "France"})),
        "Paris.".into(),
    ]);
    let run = run_task(&task, &policy, &looked).await;
    assert!(!run.solved);
    assert!(
        run.failures[0].contains("a tool was called (find_todos"),
        "{:?}",
        run.failures
    );

    let e = load_file(&scenario(&format!(
        "{TODO}[[task]]\nname = \"t\"\nrequest = \"hi\"\n[[task.check]]\nkind = \"called\"\ntool = \"*\"\n"
    )))
    .unwrap_err();
    assert!(e.contains("only goes with `absent = true`"), "{e}");
}
