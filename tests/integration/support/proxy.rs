//! A TCP forwarder on 127.0.0.1 that breaks connections on command, to put between a sink and
//! a real emulator: reset every connection now or every period, stall (stop forwarding in both
//! directions, keeping the connections open) for a while, or close the next connection after
//! the server has sent a number of bytes on it.
//!
//! Every accepted connection gets SO_LINGER 0, so dropping its sockets sends a TCP reset (RST)
//! rather than an orderly close: what a client sees when a middlebox or a server dies.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the connections are told to do; shared by the proxy's tasks.
struct Control {
    /// Bumped to reset every open connection.
    reset: watch::Sender<u64>,
    /// `true` while nothing is forwarded.
    stalled: watch::Sender<bool>,
    /// Server bytes the next connection may still forward before it is closed (`None`: off).
    close_after: Mutex<Option<u64>>,
    connections: AtomicU64,
    resets: AtomicU64,
    closes: AtomicU64,
}

/// A running proxy; dropping it stops it (its open connections are reset).
pub struct Proxy {
    address: SocketAddr,
    control: Arc<Control>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.control.reset.send_modify(|g| *g += 1);
        for task in self.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
    }
}

impl Proxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`
    /// (`host:port`).
    pub async fn start(upstream: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let address = listener.local_addr().expect("proxy address");
        let control = Arc::new(Control {
            reset: watch::channel(0).0,
            stalled: watch::channel(false).0,
            close_after: Mutex::new(None),
            connections: AtomicU64::new(0),
            resets: AtomicU64::new(0),
            closes: AtomicU64::new(0),
        });
        let upstream = upstream.trim_start_matches("http://").to_string();
        let accept = {
            let control = control.clone();
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let (control, upstream) = (control.clone(), upstream.clone());
                    tokio::spawn(async move {
                        if let Ok(server) = TcpStream::connect(&upstream).await {
                            control.connections.fetch_add(1, Ordering::Relaxed);
                            connection(client, server, control).await;
                        }
                    });
                }
            })
        };
        Proxy {
            address,
            control,
            tasks: Mutex::new(vec![accept]),
        }
    }

    /// The proxy's `127.0.0.1:port`, for `emulator_host`.
    pub fn host(&self) -> String {
        self.address.to_string()
    }

    /// Resets every open connection now.
    pub fn reset_all(&self) {
        self.control.reset.send_modify(|g| *g += 1);
    }

    /// Resets every open connection every `period` from now on, until the proxy is dropped.
    pub fn reset_every(&self, period: Duration) {
        let control = self.control.clone();
        self.tasks.lock().unwrap().push(tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            loop {
                tick.tick().await;
                control.reset.send_modify(|g| *g += 1);
            }
        }));
    }

    /// Stops forwarding in both directions for `duration` (connections stay open; new ones are
    /// accepted and stall too), then forwards again what was held.
    pub fn stall_for(&self, duration: Duration) {
        self.control.stalled.send_replace(true);
        let control = self.control.clone();
        self.tasks.lock().unwrap().push(tokio::spawn(async move {
            tokio::time::sleep(duration).await;
            control.stalled.send_replace(false);
        }));
    }

    /// Lets the next `bytes` bytes the server sends through, then closes (resets) the
    /// connection that carried the last of them; once.
    pub fn close_after_server_bytes(&self, bytes: u64) {
        *self.control.close_after.lock().unwrap() = Some(bytes);
    }

    /// Connections accepted and connected upstream so far.
    pub fn connections(&self) -> u64 {
        self.control.connections.load(Ordering::Relaxed)
    }

    /// Connections ended by a reset (`reset_all`, `reset_every`).
    pub fn resets(&self) -> u64 {
        self.control.resets.load(Ordering::Relaxed)
    }

    /// Connections ended by `close_after_server_bytes`.
    pub fn closes(&self) -> u64 {
        self.control.closes.load(Ordering::Relaxed)
    }
}

/// Why a connection ended.
enum End {
    /// A side closed or failed.
    Closed,
    /// Told to reset.
    Reset,
    /// `close_after_server_bytes` ran out.
    CloseAfter,
}

/// Forwards one connection until a side closes, a reset is ordered, or a close-after runs out;
/// then drops both sockets (a reset, with SO_LINGER 0).
async fn connection(client: TcpStream, server: TcpStream, control: Arc<Control>) {
    for s in [&client, &server] {
        let _ = s.set_nodelay(true);
        let _ = s.set_zero_linger();
    }
    let mut reset = control.reset.subscribe();
    reset.borrow_and_update();
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upstream = pump(&mut client_read, &mut server_write, &control, false);
    let downstream = pump(&mut server_read, &mut client_write, &control, true);
    let end = tokio::select! {
        end = upstream => end,
        end = downstream => end,
        _ = reset.changed() => End::Reset,
    };
    match end {
        End::Reset => control.resets.fetch_add(1, Ordering::Relaxed),
        End::CloseAfter => control.closes.fetch_add(1, Ordering::Relaxed),
        End::Closed => 0,
    };
}

/// Copies `from` to `to`, holding each chunk while the proxy is stalled; `from_server` chunks
/// count against a close-after.
async fn pump(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    control: &Control,
    from_server: bool,
) -> End {
    let mut stalled = control.stalled.subscribe();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return End::Closed,
            Ok(n) => n,
        };
        while *stalled.borrow_and_update() {
            if stalled.changed().await.is_err() {
                return End::Closed;
            }
        }
        let mut n = n;
        let mut close = false;
        if from_server {
            let mut left = control.close_after.lock().unwrap();
            if let Some(k) = *left {
                if (n as u64) >= k {
                    n = k as usize;
                    close = true;
                    *left = None;
                } else {
                    *left = Some(k - n as u64);
                }
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return End::Closed;
        }
        if close {
            let _ = to.flush().await;
            return End::CloseAfter;
        }
    }
}
