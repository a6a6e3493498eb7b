//! OpenTelemetry tracing through the real binary: a loopback OTLP/HTTP receiver decodes
//! the protobuf the sidecar exports and checks that every request phase has its span,
//! that the caller's trace context is continued and passed to the gateway, and that no
//! path, query, heading, token or user id is in anything exported.
#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "support/sidecar.rs"]
mod support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use knowtation_testkit::{MockBridge, MockCanister, MockGateway};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message as _;
use serde_json::json;
use support::{eventually, exchange, get_request, token, Sidecar};

/// One span as received.
#[derive(Debug, Clone)]
struct Span {
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    attributes: Vec<(String, String)>,
}

/// A loopback OTLP/HTTP traces receiver: every request body it got, and the spans in
/// them.
#[derive(Clone, Default)]
struct Receiver {
    bodies: Arc<Mutex<Vec<Bytes>>>,
    paths: Arc<Mutex<Vec<String>>>,
}

impl Receiver {
    async fn start() -> (Receiver, SocketAddr) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let receiver = Receiver::default();
        let r = receiver.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let r = r.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let r = r.clone();
                        async move {
                            r.paths.lock().unwrap().push(req.uri().path().to_owned());
                            let body = req.into_body().collect().await?.to_bytes();
                            r.bodies.lock().unwrap().push(body);
                            Ok::<_, hyper::Error>(
                                Response::builder()
                                    .header("content-type", "application/x-protobuf")
                                    .body(Full::new(Bytes::new()))
                                    .unwrap(),
                            )
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        (receiver, addr)
    }

    fn spans(&self) -> Vec<Span> {
        let mut out = Vec::new();
        for body in self.bodies.lock().unwrap().iter() {
            let request = ExportTraceServiceRequest::decode(body.clone()).expect("OTLP protobuf");
            for resource in request.resource_spans {
                for scope in resource.scope_spans {
                    for s in scope.spans {
                        out.push(Span {
                            name: s.name,
                            trace_id: hex(&s.trace_id),
                            span_id: hex(&s.span_id),
                            parent_span_id: hex(&s.parent_span_id),
                            attributes: s
                                .attributes
                                .into_iter()
                                .map(|kv| (kv.key, text(kv.value.and_then(|v| v.value))))
                                .collect(),
                        });
                    }
                }
            }
        }
        out
    }

    /// Every exported byte, for the leak check.
    fn all_bytes(&self) -> Vec<u8> {
        self.bodies.lock().unwrap().concat()
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(v: Option<Value>) -> String {
    match v {
        Some(Value::StringValue(s)) => s,
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

/// The attribute keys a span may carry: the closed vocabulary of the metrics.
const VOCABULARY: &[&str] = &[
    "route",
    "surface",
    "outcome",
    "status_class",
    "upstream_status_class",
    "auth_reason",
    "source",
    "step",
];

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
const PASS_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_phase_is_a_span_exported_over_otlp_with_no_content() {
    let (receiver, otlp) = Receiver::start().await;
    let gateway = MockGateway::start().await;
    let canister = MockCanister::start().await;
    canister.insert_note(
        "default",
        "LEAKPATH/a.md",
        &json!({"title": "LEAKTITLE"}),
        "# LEAKHEADING\n\nLEAKBODY text\n",
    );
    let bridge = MockBridge::start().await;
    let sidecar = Sidecar::spawn(&[
        ("UPSTREAM__GATEWAY_URL", gateway.url()),
        ("UPSTREAM__CANISTER_URL", canister.url()),
        ("UPSTREAM__BRIDGE_URL", bridge.url()),
        ("TRACING__ENABLED", "true".to_owned()),
        ("TRACING__ENDPOINT", format!("http://{otlp}/v1/traces")),
    ]);
    sidecar.wait_ready().await;
    let hung = Duration::from_secs(10);

    // The REST route, in the caller's trace: authenticate, hosted context, canister
    // read, extract.
    let jwt = token("LEAKUSER-1");
    let bearer = format!("Bearer {jwt}");
    let traceparent = format!("00-{TRACE}-{CALLER_SPAN}-01");
    let rest = exchange(
        sidecar.addr,
        &get_request(
            "/api/v1/section-source?path=LEAKPATH/a.md",
            &[("Authorization", &bearer), ("traceparent", &traceparent)],
        ),
        hung,
    )
    .await;
    assert_eq!(rest.status, 200, "{}", rest.all_text());
    assert!(rest.text().contains("LEAKHEADING"), "the note was served");

    // A passthrough request in another caller trace: the gateway gets the forward span
    // as its parent.
    let pass_parent = format!("00-{PASS_TRACE}-{CALLER_SPAN}-01");
    let pass = exchange(
        sidecar.addr,
        &get_request(
            "/LEAKPATH/pass?q=LEAKQUERY",
            &[("traceparent", &pass_parent), ("Authorization", &bearer)],
        ),
        hung,
    )
    .await;
    assert_eq!(pass.status, 200, "{}", pass.all_text());
    // No id and no trace context from the caller: the new trace's id is the request id.
    let plain = exchange(sidecar.addr, &get_request("/plain", &[]), hung).await;
    assert_eq!(plain.status, 200, "{}", plain.all_text());

    let received = gateway.requests();
    let at_gateway = |path: &str, name: &str| -> Vec<String> {
        received
            .iter()
            .find(|r| r.uri.path() == path)
            .unwrap_or_else(|| panic!("{path} did not reach the gateway"))
            .header_all(name)
    };
    let sent = at_gateway("/LEAKPATH/pass", "traceparent");
    assert_eq!(sent.len(), 1, "{sent:?}");
    let parts: Vec<&str> = sent[0].split('-').collect();
    assert_eq!(parts.len(), 4, "{sent:?}");
    assert_eq!(parts[1], PASS_TRACE, "the caller's trace continues");
    assert_ne!(
        parts[2], CALLER_SPAN,
        "the gateway's parent is the sidecar's span"
    );
    let forward_id = parts[2].to_owned();
    let plain_id = at_gateway("/plain", "x-request-id");
    let plain_trace = at_gateway("/plain", "traceparent");
    assert_eq!(plain_trace.len(), 1, "{plain_trace:?}");
    assert_eq!(
        plain_trace[0].split('-').nth(1),
        Some(plain_id[0].as_str()),
        "the request id is the trace id"
    );

    // SIGTERM: the spans still buffered are sent before the process exits.
    let log = sidecar.stop();
    assert!(
        eventually(Duration::from_secs(10), || !receiver.spans().is_empty()).await,
        "nothing exported:\n{log}"
    );
    let spans = receiver.spans();
    let summary = format!("{spans:#?}");
    assert!(
        receiver
            .paths
            .lock()
            .unwrap()
            .iter()
            .all(|p| p == "/v1/traces"),
        "{:?}",
        receiver.paths.lock().unwrap()
    );

    // Every phase of the REST request, in the caller's trace, under one request span
    // whose parent is the caller's span.
    let rest_spans: Vec<&Span> = spans.iter().filter(|s| s.trace_id == TRACE).collect();
    let request = rest_spans
        .iter()
        .find(|s| s.name == "request")
        .unwrap_or_else(|| panic!("no request span: {summary}"));
    assert_eq!(request.parent_span_id, CALLER_SPAN, "{summary}");
    let names: BTreeSet<&str> = rest_spans.iter().map(|s| s.name.as_str()).collect();
    for phase in [
        "request",
        "classify",
        "authenticate",
        "hosted_context",
        "canister_read",
        "extract",
    ] {
        assert!(names.contains(phase), "{phase} missing: {summary}");
    }
    for s in &rest_spans {
        if s.name != "request" {
            assert_eq!(s.parent_span_id, request.span_id, "{}: {summary}", s.name);
        }
    }
    let attr = |s: &Span, k: &str| {
        s.attributes
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(attr(request, "route").as_deref(), Some("section_source"));
    assert_eq!(attr(request, "surface").as_deref(), Some("rest"));
    assert_eq!(attr(request, "outcome").as_deref(), Some("ok"));
    assert_eq!(attr(request, "status_class").as_deref(), Some("2xx"));

    // The passthrough request: its forward span is the parent the gateway was given.
    let forward = spans
        .iter()
        .find(|s| s.name == "forward" && s.trace_id == PASS_TRACE)
        .unwrap_or_else(|| panic!("no forward span: {summary}"));
    assert_eq!(forward.span_id, forward_id, "{summary}");
    assert_eq!(
        attr(forward, "upstream_status_class").as_deref(),
        Some("2xx")
    );

    // Only the closed vocabulary, and nothing of the request's content anywhere.
    for s in &spans {
        for (key, _) in &s.attributes {
            assert!(
                VOCABULARY.contains(&key.as_str()),
                "{}: attribute {key} is outside the vocabulary",
                s.name
            );
        }
    }
    let exported = String::from_utf8_lossy(&receiver.all_bytes()).into_owned();
    for secret in ["LEAK", jwt.as_str(), "a.md", "default"] {
        assert!(
            !exported.contains(secret),
            "{secret:?} was exported: {exported:?}"
        );
    }
}
