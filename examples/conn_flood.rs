//! How long a new client waits for `GET /v1/health` while one local client
//! floods `wma serve` with connections that hold a slot and send no
//! request: silent ones, slowloris ones (a head dribbled a byte at a time)
//! and kept-alive ones (answered once, then quiet). Each flood row is
//! printed side by side with the reference row, taken with no flood.
//!
//! ```sh
//! cargo run --example conn_flood                      # flood = 3 × the cap (64)
//! cargo run --example conn_flood -- --flood 640 --probes 50
//! ```
//!
//! The server runs in process on loopback with its defaults, except the
//! header timeout (2 s, as in `benches/serve_soak.rs`, so that a flood
//! would be cut within the run if nothing else made room). Each probe opens
//! a fresh connection, sends the bare health check and times the status
//! line; a probe that gets no answer within 30 s counts as lost. The first
//! probe of a row comes right after the flood opened, when it holds the
//! most; the later ones show whether the server stays open to newcomers.
//! "flood closed" counts the flooding connections the server closed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use webmcp_agents::config::{Config, StartOptions};
use webmcp_agents::serve::{self, ServerOptions, TokenSource};

const CONFIG: &str = r#"
[providers.main]
kind = "scripted"
model = "main-model"
replies = ["Hello."]

[agents.main]
description = "Says hello."
provider = "main"
"#;

/// What a probe waits for at most before it counts as lost.
const LOST: Duration = Duration::from_secs(30);

/// The header timeout the server runs with (see the file's doc).
const HEADER_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Silent,
    Slowloris,
    KeptAlive,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Silent => "silent",
            Kind::Slowloris => "slowloris",
            Kind::KeptAlive => "kept-alive",
        }
    }
}

struct Args {
    flood: Option<usize>,
    probes: usize,
}

fn args() -> anyhow::Result<Args> {
    let mut args = Args {
        flood: None,
        probes: 20,
    };
    let mut given = std::env::args().skip(1);
    while let Some(arg) = given.next() {
        let mut value = || -> anyhow::Result<usize> {
            Ok(given
                .next()
                .ok_or_else(|| anyhow::anyhow!("{arg} needs a number"))?
                .parse()?)
        };
        match arg.as_str() {
            "--flood" => args.flood = Some(value()?),
            "--probes" => args.probes = value()?.max(1),
            "--help" | "-h" => {
                println!(
                    "conn_flood [--flood N (default 3 x max_connections)] [--probes N (default 20)]"
                );
                std::process::exit(0);
            }
            other => anyhow::bail!("unknown argument {other} (try --help)"),
        }
    }
    Ok(args)
}

/// Opens `count` flooding connections of `kind`; they live until `stop`.
/// Counts in `closed` the ones the server closes.
async fn flood(
    addr: SocketAddr,
    count: usize,
    kind: Kind,
    closed: Arc<AtomicUsize>,
    stop: CancellationToken,
) {
    for _ in 0..count {
        let Ok(mut stream) = TcpStream::connect(addr).await else {
            closed.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let closed = closed.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let held = async {
                let mut buffer = [0u8; 1024];
                match kind {
                    Kind::Silent => {}
                    Kind::KeptAlive => {
                        let request = format!(
                            "GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\r\n",
                            addr.port()
                        );
                        stream.write_all(request.as_bytes()).await?;
                    }
                    Kind::Slowloris => {
                        let head = b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\nX-Slow: ";
                        for byte in head.iter().cycle() {
                            stream.write_all(&[*byte]).await?;
                            tokio::select! {
                                read = stream.read(&mut buffer) => if read? == 0 { return Ok(()) },
                                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                            }
                        }
                    }
                }
                while stream.read(&mut buffer).await? > 0 {}
                Ok::<_, std::io::Error>(())
            };
            tokio::select! {
                _ = held => { closed.fetch_add(1, Ordering::Relaxed); }
                _ = stop.cancelled() => {}
            }
        });
    }
}

/// One probe: a fresh connection, the bare health check, the time to its
/// status line and whether that said 200.
async fn probe(addr: SocketAddr) -> Option<(Duration, bool)> {
    let started = Instant::now();
    let answered = tokio::time::timeout(LOST, async {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        stream
            .write_all(
                format!(
                    "GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\r\n",
                    addr.port()
                )
                .as_bytes(),
            )
            .await
            .ok()?;
        let mut answer = Vec::new();
        let mut buffer = [0u8; 256];
        while !answer.windows(2).any(|w| w == b"\r\n") {
            let n = stream.read(&mut buffer).await.ok()?;
            if n == 0 {
                return None;
            }
            answer.extend_from_slice(&buffer[..n]);
        }
        Some(answer.starts_with(b"HTTP/1.1 200"))
    })
    .await
    .ok()
    .flatten()?;
    Some((started.elapsed(), answered))
}

struct Row {
    name: String,
    /// The first probe's time, right after the flood opened (`None`: lost).
    first: Option<Duration>,
    times: Vec<Duration>,
    not_ok: usize,
    lost: usize,
    flood_closed: usize,
}

fn quantile(sorted: &[Duration], q: f64) -> String {
    if sorted.is_empty() {
        return "-".to_string();
    }
    let index = ((sorted.len() - 1) as f64 * q).round() as usize;
    format!("{:.1}", sorted[index].as_secs_f64() * 1000.0)
}

async fn phase(
    addr: SocketAddr,
    name: String,
    flood_with: Option<(usize, Kind)>,
    probes: usize,
) -> Row {
    let closed = Arc::new(AtomicUsize::new(0));
    let stop = CancellationToken::new();
    if let Some((count, kind)) = flood_with {
        flood(addr, count, kind, closed.clone(), stop.clone()).await;
    }
    let mut row = Row {
        name,
        first: None,
        times: Vec::new(),
        not_ok: 0,
        lost: 0,
        flood_closed: 0,
    };
    for i in 0..probes {
        match probe(addr).await {
            Some((took, ok)) => {
                if i == 0 {
                    row.first = Some(took);
                }
                row.times.push(took);
                if !ok {
                    row.not_ok += 1;
                }
            }
            None => row.lost += 1,
        }
    }
    row.flood_closed = closed.load(Ordering::Relaxed);
    stop.cancel();
    // Let the server see the flood go before the next phase.
    tokio::time::sleep(HEADER_TIMEOUT).await;
    row.times.sort_unstable();
    row
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = args()?;
    let config = Config::parse(CONFIG, "conn-flood.toml")?;
    let hosted = config.start(StartOptions::default()).await?;
    let api = serve::Api::hosted(config, &hosted)?;
    let options = ServerOptions {
        token: TokenSource::Given("conn-flood-token-0123456789abcdef0123456789".to_string()),
        header_timeout: HEADER_TIMEOUT,
        ..ServerOptions::default()
    };
    let cap = options.max_connections;
    let flood_size = args.flood.unwrap_or(3 * cap);
    let shutdown = CancellationToken::new();
    let started = serve::start_with(
        "127.0.0.1:0".parse()?,
        api,
        options.clone(),
        shutdown.clone(),
    )
    .await?;
    let addr = started.addr;
    println!(
        "wma serve on {addr}: max_connections {cap}, max_connections_per_client {}, header timeout {} s; {} probes per row, flood of {flood_size} connections from 127.0.0.1",
        options.max_connections_per_client,
        HEADER_TIMEOUT.as_secs(),
        args.probes
    );
    let mut rows = vec![phase(addr, "reference".to_string(), None, args.probes).await];
    for kind in [Kind::Silent, Kind::Slowloris, Kind::KeptAlive] {
        rows.push(
            phase(
                addr,
                format!("{} x{flood_size}", kind.name()),
                Some((flood_size, kind)),
                args.probes,
            )
            .await,
        );
    }
    let reference = quantile(&rows[0].times, 0.5);
    println!(
        "\n{:<18} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>6} {:>13}",
        "phase",
        "first ms",
        "p50 ms",
        "ref p50",
        "p90 ms",
        "max ms",
        "answered",
        "non-200",
        "lost",
        "flood closed"
    );
    for row in &rows {
        println!(
            "{:<18} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>6} {:>13}",
            row.name,
            row.first.map_or("lost".to_string(), |t| format!(
                "{:.1}",
                t.as_secs_f64() * 1000.0
            )),
            quantile(&row.times, 0.5),
            reference,
            quantile(&row.times, 0.9),
            quantile(&row.times, 1.0),
            row.times.len(),
            row.not_ok,
            row.lost,
            row.flood_closed
        );
    }
    shutdown.cancel();
    let _ = started.task.await;
    hosted.shutdown().await;
    Ok(())
}
