//! How long a new client waits for `GET /v1/health` while one local client
//! floods `wma serve` with connections, and what the per-client connection
//! cap (`[server] max_connections_per_client`) does about it. Each flood
//! row is printed side by side with the reference row, taken with no flood.
//!
//! ```sh
//! cargo run --example conn_flood                      # idle floods of 3 × the cap (64)
//! cargo run --example conn_flood -- --flood 640 --probes 50
//! ```
//!
//! The floods come from `127.0.0.1`:
//!
//! - silent, slowloris (a head dribbled a byte at a time) and kept-alive
//!   (answered once, then quiet) connections, which hold a slot and send no
//!   request: the probes come from the flooder's own address, whose new
//!   connections take the place of its own oldest idle ones;
//! - busy connections, as many as the connection cap, each with a request
//!   in progress (a run's body sent a byte every half second): none can be
//!   closed to make room. The probes come from another address
//!   (`127.0.0.2`), once with the per-client cap at its default and once,
//!   on a second server, with it lifted to `max_connections`: the row that
//!   shows what the cap is for. (All of 127/8 is loopback on Linux; where
//!   `127.0.0.2` cannot be bound, these rows are skipped with the reason.)
//!
//! The servers run in process on loopback with their defaults, except the
//! header timeout (2 s, as in `benches/serve_soak.rs`, so that an idle
//! flood would be cut within the run if nothing else made room) and the
//! body timeout (120 s, so that a busy flood stays busy through its row).
//! Each probe opens a fresh connection, sends the bare health check and
//! times the status line; a probe that gets no answer within 30 s counts as
//! lost, and one answered with anything but 200 (a `503` when no connection
//! made room) as non-200. The first probe of a row comes right after the
//! flood opened, when it holds the most; the later ones show whether the
//! server stays open to newcomers. "flood closed" counts the flooding
//! connections the server closed (or answered `503`).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
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

/// The header timeout the servers run with (see the file's doc).
const HEADER_TIMEOUT: Duration = Duration::from_secs(2);

/// The body timeout the servers run with (see the file's doc).
const BODY_TIMEOUT: Duration = Duration::from_secs(120);

/// How often a busy flooding connection sends one more byte of its body.
const BODY_BYTE_EVERY: Duration = Duration::from_millis(500);

/// The servers' token: the busy flood's requests carry it, so that the
/// server reads their bodies instead of refusing them at once.
const TOKEN: &str = "conn-flood-token-0123456789abcdef0123456789";

/// The flooding client's address (the one `connect` picks on loopback).
const FLOODER: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// Another client's address, for the probes of the busy rows.
const NEWCOMER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Silent,
    Slowloris,
    KeptAlive,
    /// A request in progress: a run's head, then its body a byte at a time.
    Busy,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Silent => "silent",
            Kind::Slowloris => "slowloris",
            Kind::KeptAlive => "kept-alive",
            Kind::Busy => "busy",
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
        if kind == Kind::Busy {
            // The head goes out before the next connection opens, so the
            // whole flood has its requests in progress when the probes start.
            let head = format!(
                "POST /v1/agents/main/runs HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\
                 Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n\
                 Content-Length: 100000\r\n\r\n",
                addr.port()
            );
            if stream.write_all(head.as_bytes()).await.is_err() {
                closed.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        }
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
                    Kind::Busy => loop {
                        stream.write_all(b" ").await?;
                        tokio::select! {
                            read = stream.read(&mut buffer) => if read? == 0 { return Ok(()) },
                            _ = tokio::time::sleep(BODY_BYTE_EVERY) => {}
                        }
                    },
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

/// A socket whose connections come from `from`.
fn socket_from(from: IpAddr) -> std::io::Result<TcpSocket> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    Ok(socket)
}

/// One probe from `from`: a fresh connection, the bare health check, the
/// time to its status line and whether that said 200.
async fn probe(addr: SocketAddr, from: IpAddr) -> Option<(Duration, bool)> {
    let started = Instant::now();
    let answered = tokio::time::timeout(LOST, async {
        let mut stream = socket_from(from).ok()?.connect(addr).await.ok()?;
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
    /// Where its probes came from.
    probes_from: IpAddr,
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
    probes_from: IpAddr,
    settle: Duration,
) -> Row {
    let closed = Arc::new(AtomicUsize::new(0));
    let stop = CancellationToken::new();
    if let Some((count, kind)) = flood_with {
        flood(addr, count, kind, closed.clone(), stop.clone()).await;
        if kind == Kind::Busy {
            // Lets the server read the last heads, and answer the
            // connections it has no slot for once their wait is over, so
            // that the probes meet the flood as it stays.
            tokio::time::sleep(settle).await;
        }
    }
    let mut row = Row {
        name,
        probes_from,
        first: None,
        times: Vec::new(),
        not_ok: 0,
        lost: 0,
        flood_closed: 0,
    };
    for i in 0..probes {
        match probe(addr, probes_from).await {
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

/// A server on loopback over `api`, with `options`.
async fn server(
    api: &Arc<serve::Api>,
    options: &ServerOptions,
    shutdown: &CancellationToken,
) -> anyhow::Result<serve::Started> {
    Ok(serve::start_with(
        "127.0.0.1:0".parse()?,
        api.clone(),
        options.clone(),
        shutdown.clone(),
    )
    .await?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = args()?;
    let config = Config::parse(CONFIG, "conn-flood.toml")?;
    let hosted = config.start(StartOptions::default()).await?;
    let api = serve::Api::hosted(config, &hosted)?;
    let options = ServerOptions {
        token: TokenSource::Given(TOKEN.to_string()),
        header_timeout: HEADER_TIMEOUT,
        body_timeout: BODY_TIMEOUT,
        ..ServerOptions::default()
    };
    let cap = options.max_connections;
    let per_client = options.max_connections_per_client;
    // The same server but for the per-client cap, lifted to the overall
    // one: what the busy flood meets without it.
    let uncapped_options = ServerOptions {
        max_connections_per_client: cap,
        ..options.clone()
    };
    let flood_size = args.flood.unwrap_or(3 * cap);
    // A busy flood's connections beyond a cap wait this long for a slot,
    // then are answered 503 (and linger for up to a second more).
    let settle = options.connection_wait + Duration::from_millis(300);
    let shutdown = CancellationToken::new();
    let capped = server(&api, &options, &shutdown).await?;
    let uncapped = server(&api, &uncapped_options, &shutdown).await?;
    println!(
        "wma serve on {}: max_connections {cap}, max_connections_per_client {per_client}, \
         header timeout {} s, body timeout {} s; {} probes per row; floods from {FLOODER}: \
         idle ones of {flood_size} connections, busy ones of {cap}",
        capped.addr,
        HEADER_TIMEOUT.as_secs(),
        BODY_TIMEOUT.as_secs(),
        args.probes
    );
    let mut rows = vec![
        phase(
            capped.addr,
            "reference".to_string(),
            None,
            args.probes,
            FLOODER,
            settle,
        )
        .await,
    ];
    for kind in [Kind::Silent, Kind::Slowloris, Kind::KeptAlive] {
        rows.push(
            phase(
                capped.addr,
                format!("{} x{flood_size}", kind.name()),
                Some((flood_size, kind)),
                args.probes,
                FLOODER,
                settle,
            )
            .await,
        );
    }
    let busy = Kind::Busy.name();
    let mut skipped = None;
    match socket_from(NEWCOMER) {
        Err(error) => skipped = Some(error),
        Ok(_) => {
            for (addr, name) in [
                (
                    capped.addr,
                    format!("{busy} x{cap}, per-client {per_client}"),
                ),
                (uncapped.addr, format!("{busy} x{cap}, per-client {cap}")),
            ] {
                rows.push(
                    phase(
                        addr,
                        name,
                        Some((cap, Kind::Busy)),
                        args.probes,
                        NEWCOMER,
                        settle,
                    )
                    .await,
                );
            }
        }
    }
    let reference = quantile(&rows[0].times, 0.5);
    println!(
        "\n{:<24} {:>11} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>6} {:>13}",
        "phase",
        "probes from",
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
            "{:<24} {:>11} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>6} {:>13}",
            row.name,
            row.probes_from.to_string(),
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
    match skipped {
        Some(error) => println!(
            "\nthe busy rows were skipped: no connection can come from {NEWCOMER} here ({error})"
        ),
        None => println!(
            "\nbusy: {cap} connections from {FLOODER}, each with a request in progress; \
             \"per-client {cap}\" is a second server with max_connections_per_client lifted \
             to max_connections"
        ),
    }
    shutdown.cancel();
    let _ = capped.task.await;
    let _ = uncapped.task.await;
    hosted.shutdown().await;
    Ok(())
}
