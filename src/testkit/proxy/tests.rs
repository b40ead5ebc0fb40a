use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if s.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    addr
}

async fn round_trip(s: &mut TcpStream, msg: &[u8]) -> Duration {
    let started = Instant::now();
    s.write_all(msg).await.unwrap();
    let mut got = vec![0u8; msg.len()];
    s.read_exact(&mut got).await.unwrap();
    assert_eq!(got, msg);
    started.elapsed()
}

/// On a paused clock: the round trips' times are the latency the proxy
/// adds, whatever the machine's speed.
#[tokio::test(start_paused = true)]
async fn forwards_and_adds_latency_each_way() {
    let proxy = FaultProxy::start(echo_server().await).await.unwrap();
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    let fast = round_trip(&mut s, b"hello").await;
    assert_eq!(fast, Duration::ZERO, "no latency by default");
    proxy.set_latency(Duration::from_millis(100));
    let slow = round_trip(&mut s, b"world").await;
    assert_eq!(slow, Duration::from_millis(200), "100 ms each way");
    assert_eq!(proxy.connections_accepted(), 1);
}

#[tokio::test]
async fn blackhole_holds_bytes_until_healed() {
    let proxy = FaultProxy::start(echo_server().await).await.unwrap();
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    round_trip(&mut s, b"before").await;
    proxy.blackhole();
    s.write_all(b"held").await.unwrap();
    let mut got = [0u8; 4];
    let silent = tokio::time::timeout(Duration::from_millis(300), s.read_exact(&mut got)).await;
    assert!(silent.is_err(), "no byte crosses a blackholed link");
    proxy.heal();
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut got))
        .await
        .expect("delivered after the heal")
        .unwrap();
    assert_eq!(&got, b"held");
}

#[tokio::test]
async fn reset_aborts_open_connections() {
    let proxy = FaultProxy::start(echo_server().await).await.unwrap();
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    round_trip(&mut s, b"x").await;
    assert_eq!(proxy.reset(), 1);
    let mut buf = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("the reset is noticed at once");
    match read {
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
        Ok(n) => panic!("read {n} bytes from a reset connection"),
    }
    // A new connection works.
    let mut s2 = TcpStream::connect(proxy.addr()).await.unwrap();
    round_trip(&mut s2, b"again").await;
}
