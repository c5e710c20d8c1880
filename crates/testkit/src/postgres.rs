//! A real, throwaway PostgreSQL server for tests of the store: `initdb`
//! into a temporary folder, `postgres` on a free loopback port with its
//! unix socket in that folder, stopped (and the folder removed) on drop.
//!
//! The server binaries come from Debian's `postgresql` package, which
//! `scripts/install-peers.sh` installs (the test command runs it). As root
//! the server runs as the `postgres` user, since PostgreSQL refuses to run
//! as root.

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

/// How often a start is tried on a fresh port when another process took
/// the free one first.
const START_TRIES: usize = 3;

/// Settings for a test server: no fsync (a test's data need not survive a
/// power loss, and fsync per commit makes a suite slow on a shared disk).
pub const TEST_SETTINGS: &[(&str, &str)] = &[
    ("fsync", "off"),
    ("synchronous_commit", "off"),
    ("full_page_writes", "off"),
    ("max_connections", "200"),
];

/// The folder with `initdb`, `pg_ctl` and `postgres`: Debian's newest
/// `/usr/lib/postgresql/<version>/bin`, else the one on `PATH`.
pub fn postgres_bin_dir() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Some(bin);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .find(|dir| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file())
}

/// The message a test fails with when the server binaries are missing.
pub fn missing_message() -> String {
    "PostgreSQL's server binaries (initdb, pg_ctl, postgres) are not installed: run \
     scripts/install-peers.sh (part of the test command, scripts/test.sh), which installs \
     Debian's `postgresql` package"
        .to_string()
}

/// A running PostgreSQL server; stopped when dropped.
pub struct PostgresServer {
    /// The cluster, the socket and the log; removed on drop.
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    /// Set when running as root: the server runs as this user.
    run_as: Option<&'static str>,
    settings: Vec<(String, String)>,
    /// Kept open: the watchdog stops the server when this closes, so a
    /// test process that is killed takes its server with it.
    watchdog: Option<(Child, ChildStdin)>,
    databases: AtomicUsize,
}

impl std::fmt::Debug for PostgresServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresServer")
            .field("dir", &self.dir.path())
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl PostgresServer {
    /// Starts a server with [`TEST_SETTINGS`].
    pub fn start() -> Result<Self, String> {
        Self::start_with(TEST_SETTINGS)
    }

    /// Starts a server with these `postgresql.conf` settings (pass `&[]`
    /// for PostgreSQL's defaults, fsync on: what a benchmark should see).
    pub fn start_with(settings: &[(&str, &str)]) -> Result<Self, String> {
        let bin = postgres_bin_dir().ok_or_else(missing_message)?;
        let run_as = is_root().then_some("postgres");
        let dir = tempfile::Builder::new()
            .prefix("wma-postgres-")
            .tempdir()
            .map_err(|e| format!("could not make a folder for PostgreSQL: {e}"))?;
        if let Some(user) = run_as {
            let (uid, gid) = user_ids(user)?;
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .map_err(|e| format!("could not give {} to {user}: {e}", dir.path().display()))?;
        }
        let mut server = Self {
            dir,
            bin,
            port: 0,
            run_as,
            settings: settings
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            watchdog: None,
            databases: AtomicUsize::new(0),
        };
        let initdb = server
            .command("initdb")
            .arg("-D")
            .arg(server.data_dir())
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"])
            .output()
            .map_err(|e| format!("could not run initdb: {e}"))?;
        if !initdb.status.success() {
            return Err(format!(
                "initdb failed: {}{}",
                String::from_utf8_lossy(&initdb.stdout),
                String::from_utf8_lossy(&initdb.stderr)
            ));
        }
        // The watchdog first: a test killed while the server starts still
        // takes the server with it.
        server.watchdog = Some(server.start_watchdog()?);
        let mut last = String::new();
        for _ in 0..START_TRIES {
            server.port = free_port()?;
            match server.start_server() {
                Ok(()) => return Ok(server),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// A URL of the `postgres` database, over TCP on loopback.
    pub fn url(&self) -> String {
        self.url_of("postgres")
    }

    /// A URL of the database `name`.
    pub fn url_of(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The folder of its unix socket.
    pub fn socket_dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// Makes a fresh, empty database and returns its URL: tests sharing one
    /// server each get their own.
    pub fn create_database(&self) -> Result<String, String> {
        let n = self.databases.fetch_add(1, Ordering::Relaxed);
        let name = format!("test_{}_{n}", std::process::id());
        let output = Command::new(self.bin.join("psql"))
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(self.dir.path())
            .args([
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-c",
            ])
            .arg(format!("CREATE DATABASE {name}"))
            .output()
            .map_err(|e| format!("could not run psql: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "CREATE DATABASE {name} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        Ok(self.url_of(&name))
    }

    /// Stops the server (fast shutdown: sessions are disconnected), for a
    /// test of a database that went away. [`PostgresServer::restart`]
    /// brings it back on the same port with the same data.
    pub fn stop(&mut self) -> Result<(), String> {
        self.pg_ctl_stop("fast")
    }

    /// Starts the server again after [`PostgresServer::stop`].
    pub fn restart(&mut self) -> Result<(), String> {
        self.start_server()
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_file()).unwrap_or_default()
    }

    /// One server shared by the tests of a process while any of them holds
    /// it: started by the first, stopped when the last lets go.
    pub fn shared() -> Result<Arc<Self>, String> {
        static SHARED: Mutex<Weak<PostgresServer>> = Mutex::new(Weak::new());
        let mut shared = SHARED.lock();
        if let Some(server) = shared.upgrade() {
            return Ok(server);
        }
        let server = Arc::new(Self::start()?);
        *shared = Arc::downgrade(&server);
        Ok(server)
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log_file(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// `program` from the server's folder, run as the server's user.
    fn command(&self, program: &str) -> Command {
        let program = self.bin.join(program);
        match self.run_as {
            Some(user) => {
                let mut command = Command::new(runuser());
                command.args(["-u", user, "--"]).arg(program);
                command
            }
            None => Command::new(program),
        }
    }

    fn start_server(&self) -> Result<(), String> {
        let mut options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1",
            self.port,
            self.dir.path().display()
        );
        for (key, value) in &self.settings {
            options.push_str(&format!(" -c {key}={value}"));
        }
        let output = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data_dir())
            .arg("-l")
            .arg(self.log_file())
            .args(["-w", "-t", "60", "-o", &options, "start"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("could not run pg_ctl: {e}"))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "PostgreSQL did not start on port {}: {}\n{}",
                self.port,
                String::from_utf8_lossy(&output.stderr),
                self.log()
            ))
        }
    }

    /// A shell that waits for its stdin to close (this process ending, by
    /// drop or by a kill) and then stops the server and removes its folder.
    fn start_watchdog(&self) -> Result<(Child, ChildStdin), String> {
        let pg_ctl = self.bin.join("pg_ctl");
        let stop = match self.run_as {
            Some(user) => format!(
                "{} -u {user} -- {} -D '{}' stop -m immediate",
                runuser().display(),
                pg_ctl.display(),
                self.data_dir().display()
            ),
            None => format!(
                "{} -D '{}' stop -m immediate",
                pg_ctl.display(),
                self.data_dir().display()
            ),
        };
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "cat >/dev/null; {stop} >/dev/null 2>&1; rm -rf '{}'",
                self.dir.path().display()
            ))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("could not start the watchdog: {e}"))?;
        let stdin = child.stdin.take().ok_or("the watchdog has no stdin")?;
        Ok((child, stdin))
    }

    fn pg_ctl_stop(&self, mode: &str) -> Result<(), String> {
        let output = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-w", "-t", "60", "-m", mode, "stop"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("could not run pg_ctl: {e}"))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "PostgreSQL did not stop: {}",
                String::from_utf8_lossy(&output.stderr)
            ))
        }
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        // Immediate: the data is thrown away with the folder.
        let _ = self.pg_ctl_stop("immediate");
        if let Some((mut child, mut stdin)) = self.watchdog.take() {
            let _ = stdin.flush();
            drop(stdin);
            let _ = child.wait();
        }
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn user_ids(user: &str) -> Result<(u32, u32), String> {
    let id = |flag: &str| -> Result<u32, String> {
        let output = Command::new("id")
            .args([flag, user])
            .output()
            .map_err(|e| format!("could not run id: {e}"))?;
        String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .map_err(|_| {
                format!(
                    "there is no `{user}` user to run PostgreSQL as (it cannot run as root); {}",
                    missing_message()
                )
            })
    };
    Ok((id("-u")?, id("-g")?))
}

fn runuser() -> PathBuf {
    ["/usr/sbin/runuser", "/sbin/runuser", "/usr/bin/runuser"]
        .iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .map_or_else(|| PathBuf::from("runuser"), Path::to_path_buf)
}

fn free_port() -> Result<u16, String> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free loopback port: {e}"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("no free loopback port: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_starts_takes_databases_and_stops_on_drop() {
        let server = PostgresServer::start().unwrap_or_else(|e| panic!("{e}"));
        let data = server.data_dir();
        let url = server.create_database().unwrap();
        assert!(url.starts_with(&format!(
            "postgres://postgres@127.0.0.1:{}/test_",
            server.port()
        )));
        assert!(data.join("postmaster.pid").is_file(), "{}", server.log());
        let port = server.port();
        drop(server);
        assert!(!data.exists(), "the cluster's folder outlived the server");
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
            "something still listens on the server's port"
        );
    }
}
