//! The client the gateway is told about (wire contract §7), through the real binary over
//! loopback: the `X-Forwarded-For`, `X-Forwarded-Proto` and `X-Forwarded-Host` the
//! gateway receives, with clients straight at the sidecar and with the sidecar behind a
//! load balancer (`[forwarded]`). The gateway trusts exactly one hop, the sidecar, so it
//! reads the last `X-Forwarded-For` entry: each must be exactly the client. Clients
//! connect from distinct loopback addresses (`127.0.0.2`, `127.0.0.3`, …) so that the
//! sidecar's peer tells them apart.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use knowtation_testkit::{MockGateway, Recorded};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

#[path = "support/sidecar.rs"]
mod support;

use support::Sidecar;

/// A sidecar in front of `gw` with `[forwarded]` set from `env`, ready.
async fn sidecar(gw: &MockGateway, env: &[(&str, &str)]) -> Sidecar {
    let mut all = vec![("UPSTREAM__GATEWAY_URL", gw.url())];
    all.extend(env.iter().map(|(k, v)| (*k, (*v).to_owned())));
    let sc = Sidecar::spawn(&all);
    sc.wait_ready().await;
    sc
}

/// Sends `GET /echo/<tag>` from the loopback address `from`, with `headers` (raw
/// lines), and returns what the gateway received for it.
async fn from(sc: &Sidecar, gw: &MockGateway, from: &str, tag: &str, headers: &[&str]) -> Recorded {
    let socket = TcpSocket::new_v4().unwrap();
    socket
        .bind(format!("{from}:0").parse::<SocketAddr>().unwrap())
        .unwrap();
    let mut stream = socket.connect(sc.addr).await.unwrap();
    let mut request = format!("GET /echo/{tag} HTTP/1.1\r\n");
    for h in headers {
        request.push_str(h);
        request.push_str("\r\n");
    }
    request.push_str("Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    received(gw, tag)
}

/// The request the gateway received for `tag`.
fn received(gw: &MockGateway, tag: &str) -> Recorded {
    let path = format!("/echo/{tag}");
    let mut seen: Vec<Recorded> = gw
        .requests()
        .into_iter()
        .filter(|r| r.path() == path)
        .collect();
    assert_eq!(
        seen.len(),
        1,
        "{tag} reached the gateway {} times",
        seen.len()
    );
    seen.remove(0)
}

/// The three headers as the gateway got them, every value.
fn told(r: &Recorded) -> [Vec<String>; 3] {
    [
        r.header_all("x-forwarded-for"),
        r.header_all("x-forwarded-proto"),
        r.header_all("x-forwarded-host"),
    ]
}

fn one(v: &str) -> Vec<String> {
    vec![v.to_owned()]
}

/// Everything a client could claim about itself.
const CLAIMS: [&str; 4] = [
    "X-Forwarded-For: 6.6.6.6",
    "X-Forwarded-Proto: https",
    "X-Forwarded-Host: forged.example",
    "Forwarded: for=6.6.6.6;proto=https;host=forged.example",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_straight_at_the_sidecar_choose_nothing() {
    let gw = MockGateway::start().await;
    let sc = sidecar(&gw, &[]).await;
    let mut headers = vec!["Host: hub.example"];
    headers.extend(CLAIMS);
    let a = from(&sc, &gw, "127.0.0.2", "a", &headers).await;
    assert_eq!(
        told(&a),
        [one("127.0.0.2"), one("http"), one("hub.example")]
    );
    assert!(a.header("forwarded").is_none());
    // Each client is its own address, and one that claims nothing is told the same way.
    let b = from(&sc, &gw, "127.0.0.3", "b", &["Host: hub.example"]).await;
    assert_eq!(
        told(&b),
        [one("127.0.0.3"), one("http"), one("hub.example")]
    );
    // A claim split over several field lines changes nothing either.
    let c = from(
        &sc,
        &gw,
        "127.0.0.3",
        "c",
        &[
            "Host: hub.example",
            "X-Forwarded-For: 6.6.6.6",
            "X-Forwarded-For: 7.7.7.7, 8.8.8.8",
            "X-Forwarded-Proto: https, https",
        ],
    )
    .await;
    assert_eq!(
        told(&c),
        [one("127.0.0.3"), one("http"), one("hub.example")]
    );
    sc.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_client_is_told_by_its_authority() {
    let gw = MockGateway::start().await;
    let sc = sidecar(&gw, &[]).await;
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let req = Request::get(format!("http://{}/echo/h2", sc.addr))
        .header("x-forwarded-for", "6.6.6.6")
        .header("x-forwarded-host", "forged.example")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.version(), Version::HTTP_2);
    assert_eq!(resp.status(), 200);
    resp.into_body().collect().await.unwrap();
    let r = received(&gw, "h2");
    assert_eq!(
        told(&r),
        [one("127.0.0.1"), one("http"), one(&sc.addr.to_string())]
    );
    sc.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_one_trusted_hop_the_balancers_entry_is_the_client() {
    let gw = MockGateway::start().await;
    let sc = sidecar(&gw, &[("FORWARDED__TRUSTED_HOPS", "1")]).await;
    // The balancer appended the address it saw after whatever the client claimed, and
    // set the scheme and host the client used.
    let a = from(
        &sc,
        &gw,
        "127.0.0.2",
        "a",
        &[
            "Host: sidecar.internal",
            "X-Forwarded-For: 6.6.6.6, 198.51.100.7",
            "X-Forwarded-Proto: https",
            "X-Forwarded-Host: hub.example",
        ],
    )
    .await;
    assert_eq!(
        told(&a),
        [one("198.51.100.7"), one("https"), one("hub.example")]
    );
    // Another client through the same balancer is another address.
    let b = from(
        &sc,
        &gw,
        "127.0.0.2",
        "b",
        &[
            "Host: hub.example",
            "X-Forwarded-For: 203.0.113.9",
            "X-Forwarded-Proto: http",
        ],
    )
    .await;
    assert_eq!(
        told(&b),
        [one("203.0.113.9"), one("http"), one("hub.example")]
    );
    // A balancer that said nothing: its own address, the listener's scheme.
    let c = from(&sc, &gw, "127.0.0.2", "c", &["Host: hub.example"]).await;
    assert_eq!(
        told(&c),
        [one("127.0.0.2"), one("http"), one("hub.example")]
    );
    sc.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_listed_proxies_are_trusted() {
    let gw = MockGateway::start().await;
    let sc = sidecar(
        &gw,
        &[
            ("FORWARDED__TRUSTED_HOPS", "1"),
            ("FORWARDED__TRUSTED_PROXIES", "127.0.0.2"),
        ],
    )
    .await;
    let via_balancer = from(
        &sc,
        &gw,
        "127.0.0.2",
        "lb",
        &[
            "Host: hub.example",
            "X-Forwarded-For: 198.51.100.7",
            "X-Forwarded-Proto: https",
        ],
    )
    .await;
    assert_eq!(
        told(&via_balancer),
        [one("198.51.100.7"), one("https"), one("hub.example")]
    );
    // A client that goes around the balancer sends the same headers and is told as
    // itself.
    let mut headers = vec!["Host: hub.example"];
    headers.extend(CLAIMS);
    let around = from(&sc, &gw, "127.0.0.3", "around", &headers).await;
    assert_eq!(
        told(&around),
        [one("127.0.0.3"), one("http"), one("hub.example")]
    );
    assert!(around.header("forwarded").is_none());
    sc.stop();
}
