//! A model hub on the loopback address that serves one folder as one
//! repository, in the layout and with the headers a Hugging Face-style hub
//! uses (`/{repo}/resolve/{revision}/{file}`, ranged answers, the commit
//! and etag headers), so tests of downloads never leave the machine.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

/// The revisions the hub knows and the commit each resolves to; any other
/// revision is a 404.
pub const HUB_REVISIONS: [(&str, &str); 2] = [
    ("main", "1111111111111111111111111111111111111111"),
    ("v2", "2222222222222222222222222222222222222222"),
];

/// One request the hub answered.
#[derive(Debug, Clone)]
pub struct HubRequest {
    /// The request's path (`/org/name/resolve/main/config.json`).
    pub path: String,
    /// Its `Range` header: which chunk of a file was asked for.
    pub range: Option<String>,
    /// Its `Authorization` header: whether the token was sent.
    pub auth: Option<String>,
}

/// What the hub was asked, and how it misbehaves.
#[derive(Default)]
struct HubState {
    seen: Vec<HubRequest>,
    /// `(file, offset)`: the first ranged request for `file` that starts
    /// at or past `offset` gets its connection closed without an answer.
    break_once: Option<(String, u64)>,
    /// When set, a request without `Authorization: Bearer TOKEN` gets a
    /// 401, as a gated repository's do.
    token: Option<String>,
}

/// A hub serving a folder as one repository until the process ends (its
/// threads are not joined: a test binary's hubs live as long as it).
pub struct FakeHub {
    endpoint: String,
    state: Arc<Mutex<HubState>>,
}

impl FakeHub {
    /// Serves `root` as the repository `repo` (`org/name`) at each of
    /// [`HUB_REVISIONS`].
    pub fn serve(root: impl Into<PathBuf>, repo: &str) -> Self {
        let root = root.into();
        let repo = repo.to_string();
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let endpoint = format!(
            "http://{}",
            listener.local_addr().expect("the listener's address")
        );
        let state = Arc::new(Mutex::new(HubState::default()));
        let shared = Arc::clone(&state);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (root, repo, shared) = (root.clone(), repo.clone(), Arc::clone(&shared));
                std::thread::spawn(move || answer(stream, &root, &repo, &shared));
            }
        });
        Self { endpoint, state }
    }

    /// The hub's address, for `HF_ENDPOINT` (`http://127.0.0.1:PORT`).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Every request answered so far, in order.
    pub fn requests(&self) -> Vec<HubRequest> {
        self.state.lock().seen.clone()
    }

    /// Closes, once, the connection of the first ranged request for `file`
    /// that starts at or past `offset`: a download broken midway.
    pub fn break_once(&self, file: &str, offset: u64) {
        self.state.lock().break_once = Some((file.to_string(), offset));
    }

    /// Makes the repository gated: only requests carrying `token` as their
    /// bearer token are answered, the others get a 401.
    pub fn require_token(&self, token: &str) {
        self.state.lock().token = Some(token.to_string());
    }
}

fn answer(mut stream: TcpStream, root: &Path, repo: &str, state: &Mutex<HubState>) {
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let mut headers = HashMap::new();
    let mut line = String::new();
    while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
        if let Some((k, v)) = line.trim_end().split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
        line.clear();
    }
    let path = request_line
        .split_whitespace()
        .nth(1)
        .unwrap_or("")
        .to_string();
    let range = headers.get("range").cloned();
    let auth = headers.get("authorization").cloned();
    let token = {
        let mut s = state.lock();
        s.seen.push(HubRequest {
            path: path.clone(),
            range: range.clone(),
            auth: auth.clone(),
        });
        s.token.clone()
    };
    if let Some(token) = token
        && auth.as_deref() != Some(&format!("Bearer {token}"))
    {
        let _ = write!(
            stream,
            "HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        return;
    }
    let found = path
        .strip_prefix(&format!("/{repo}/resolve/"))
        .and_then(|rest| rest.split_once('/'))
        .and_then(|(revision, file)| {
            let commit = HUB_REVISIONS.iter().find(|(r, _)| *r == revision)?.1;
            let full = root.join(file);
            full.is_file().then(|| (commit, file.to_string(), full))
        });
    let Some((commit, file, full)) = found else {
        let _ = write!(
            stream,
            "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        return;
    };
    let Ok(body) = std::fs::read(full) else {
        return;
    };
    let len = body.len() as u64;
    let (start, end) = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.split_once('-'))
        .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)))
        .map_or((0, len.saturating_sub(1)), |(a, b)| {
            (a, b.min(len.saturating_sub(1)))
        });
    if start > 0 {
        let mut s = state.lock();
        if let Some((f, offset)) = &s.break_once
            && *f == file
            && start >= *offset
        {
            s.break_once = None;
            // The connection breaks before the answer.
            return;
        }
    }
    let slice = body.get(start as usize..=end as usize).unwrap_or_default();
    // The etag names the content, as a hub's does.
    let etag = format!("{:016x}{len}", fnv(&body));
    let _ = write!(
        stream,
        "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {start}-{end}/{len}\r\nETag: \"{etag}\"\r\nX-Repo-Commit: {commit}\r\nConnection: close\r\n\r\n",
        slice.len()
    );
    let _ = stream.write_all(slice);
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100000001b3)
    })
}
