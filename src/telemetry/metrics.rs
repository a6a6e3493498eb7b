//! The Prometheus registry: every family is created at start with its closed label
//! sets, and the series a request touches are resolved once, so recording takes no lock
//! and no label lookup.

use std::sync::Arc;
use std::time::Duration;

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder};

use super::shard::{self, Counters, Histograms, Registered};
use super::{
    Eviction, HeadRefusal, Intercepted, Reload, Sanitized, Shadow, StoreOp, Surface, TokenCheck,
    TokenRefusal, UpstreamName, EVICTIONS, METRIC_PREFIX, OUTCOMES, STATUS_CLASSES, SURFACES,
};
use crate::budget::Refusal;
use crate::upstream::{Fault, Observer};

/// The families, built once; see [`Metrics`].
struct Families {
    // The per-request families, kept per worker (`shard`): every series of their closed
    // label sets exists from the start, at an index computed from the labels.
    intercepted: Arc<Counters>,
    views: Arc<Counters>,
    upstream_reads: Arc<Counters>,
    request_seconds: Arc<Histograms>,
    sections: Arc<Histograms>,
    truncated: IntCounterVec,
    rate_limited: IntCounterVec,
    hosted_context_failures: IntCounter,
    hosted_context_fallbacks: IntCounter,
    passthrough: Arc<Counters>,
    passthrough_seconds: Arc<Histograms>,
    in_flight: Arc<shard::Gauge>,
    connections_rejected: IntCounter,
    head_refused: IntCounterVec,
    tokens_verified: Arc<Counters>,
    tokens_refused: IntCounterVec,
    gateway_reachable: IntGauge,
    mcp_sessions: IntGauge,
    mcp_evictions: IntCounterVec,
    admission_refused: IntCounterVec,
    buffered_bytes: IntGauge,
    lookups_throttled: IntCounter,
    store_errors: IntCounterVec,
    reloads: IntCounterVec,
    shadow: IntCounterVec,
    intercept_mode: IntGaugeVec,
    upstream_framing: IntCounterVec,
    sanitized: IntCounterVec,
}

/// The Prometheus metrics of one sidecar, in its own registry. Every label value comes
/// from a closed set ([`Surface`], [`Outcome`](super::Outcome), [`status_class`], the build version).
///
/// [`Metrics::record`] counts an intercepted request: requests by surface and outcome,
/// the canister read's status class, latency, sections and truncation. Rate limiting and
/// hosted-context failures are counted only by [`Metrics::rate_limited`] and
/// [`Metrics::hosted_context_failure`], called where they happen, so nothing is counted
/// twice.
pub struct Metrics {
    registry: Registry,
    families: Option<Families>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

fn name(suffix: &str) -> String {
    format!("{METRIC_PREFIX}{suffix}")
}

/// The values of the `mode` label of `intercept_mode` (`intercept.mode`).
pub const INTERCEPT_MODES: [&str; 2] = ["enforce", "shadow"];

/// Latency buckets in seconds: sub-millisecond answers up to the 30 s gateway timeout.
const SECONDS_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Section-count buckets (the builder caps headings well below the top one).
const SECTION_BUCKETS: &[f64] = &[
    0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 5000.0,
];

fn surface_index(surface: Surface) -> usize {
    SURFACES.iter().position(|s| *s == surface).unwrap_or(0)
}

/// The index of a status class in `STATUS_CLASSES`: 1xx to 5xx, then "other".
fn class_index(status: u16) -> usize {
    match status {
        100..=599 => usize::from(status / 100 - 1),
        _ => STATUS_CLASSES.len() - 1,
    }
}

/// Every pair of `a` and `b`, `a` major: the label values of a two-label family.
fn pairs<'a>(a: &[&'a str], b: &[&'a str]) -> Vec<Vec<&'a str>> {
    a.iter()
        .flat_map(|x| b.iter().map(move |y| vec![*x, *y]))
        .collect()
}

fn surface_labels() -> Vec<&'static str> {
    SURFACES.iter().map(|s| s.as_str()).collect()
}

impl Families {
    fn build(registry: &Registry, workers: usize) -> Result<Families, prometheus::Error> {
        fn reg<M: prometheus::core::Collector + Clone + 'static>(
            registry: &Registry,
            m: M,
        ) -> Result<M, prometheus::Error> {
            registry.register(Box::new(m.clone()))?;
            Ok(m)
        }
        fn sharded<M: prometheus::core::Collector + 'static>(
            registry: &Registry,
            m: M,
        ) -> Result<Arc<M>, prometheus::Error> {
            let m = Arc::new(m);
            registry.register(Box::new(Registered(Arc::clone(&m))))?;
            Ok(m)
        }
        let surfaces = surface_labels();
        let outcomes: Vec<&str> = OUTCOMES.iter().map(|o| o.as_str()).collect();
        let views: Vec<&str> = crate::extract::View::ALL
            .iter()
            .map(|v| v.as_str())
            .collect();
        let checks: Vec<&str> = TokenCheck::ALL.iter().map(|c| c.as_str()).collect();
        let one = [Vec::new()];
        let by_surface: Vec<Vec<&str>> = surfaces.iter().map(|s| vec![*s]).collect();
        let by_class: Vec<Vec<&str>> = STATUS_CLASSES.iter().map(|c| vec![*c]).collect();
        let f = Families {
            intercepted: sharded(
                registry,
                Counters::new(
                    &name("intercepted_requests_total"),
                    "Requests the sidecar answered itself, by surface and outcome.",
                    &["surface", "outcome"],
                    &pairs(&surfaces, &outcomes),
                    workers,
                )?,
            )?,
            views: sharded(
                registry,
                Counters::new(
                    &name("view_requests_total"),
                    "Requests the sidecar answered itself for a body-free view, by surface and view.",
                    &["surface", "view"],
                    &pairs(&surfaces, &views),
                    workers,
                )?,
            )?,
            upstream_reads: sharded(
                registry,
                Counters::new(
                    &name("upstream_reads_total"),
                    "Canister note reads, by surface and status class.",
                    &["surface", "status_class"],
                    &pairs(&surfaces, STATUS_CLASSES),
                    workers,
                )?,
            )?,
            request_seconds: sharded(
                registry,
                Histograms::new(
                    &name("request_duration_seconds"),
                    "Intercepted requests: time from request head to response head.",
                    SECONDS_BUCKETS,
                    &["surface"],
                    &by_surface,
                    workers,
                )?,
            )?,
            sections: sharded(
                registry,
                Histograms::new(
                    &name("sections"),
                    "Sections, outline entries or tree nodes per served view.",
                    SECTION_BUCKETS,
                    &[],
                    &one,
                    workers,
                )?,
            )?,
            truncated: reg(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        name("truncated_total"),
                        "Served views that were truncated, by surface.",
                    ),
                    &["surface"],
                )?,
            )?,
            rate_limited: reg(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        name("rate_limited_total"),
                        "Intercepted requests refused by a rate limit, by surface.",
                    ),
                    &["surface"],
                )?,
            )?,
            hosted_context_failures: reg(
                registry,
                IntCounter::new(
                    name("hosted_context_failures_total"),
                    "Failed hosted-context lookups (timeout, non-2xx, malformed).",
                )?,
            )?,
            hosted_context_fallbacks: reg(
                registry,
                IntCounter::new(
                    name("hosted_context_fallbacks_total"),
                    "Failed lookups answered with the gateway-compatible fallback to the token's sub.",
                )?,
            )?,
            passthrough: sharded(
                registry,
                Counters::new(
                    &name("passthrough_requests_total"),
                    "Requests passed through to the gateway, by response status class.",
                    &["status_class"],
                    &by_class,
                    workers,
                )?,
            )?,
            passthrough_seconds: sharded(
                registry,
                Histograms::new(
                    &name("passthrough_duration_seconds"),
                    "Passed-through requests: time from request head to response head.",
                    SECONDS_BUCKETS,
                    &[],
                    &one,
                    workers,
                )?,
            )?,
            in_flight: sharded(
                registry,
                shard::Gauge::new(
                    &name("in_flight_requests"),
                    "Intercepted requests being answered now.",
                    workers,
                )?,
            )?,
            connections_rejected: reg(
                registry,
                IntCounter::new(
                    name("connections_rejected_total"),
                    "Client connections closed at once because listen.max_connections were open.",
                )?,
            )?,
            head_refused: reg(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        name("head_refused_total"),
                        "HTTP/1 request heads the HTTP layer refused before the sidecar saw a request, by reason.",
                    ),
                    &["reason"],
                )?,
            )?,
            tokens_verified: sharded(
                registry,
                Counters::new(
                    &name("tokens_verified_total"),
                    "Tokens that passed verification, by surface and whether the signature was computed or remembered.",
                    &["surface", "check"],
                    &pairs(&surfaces, &checks),
                    workers,
                )?,
            )?,
            tokens_refused: reg(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        name("tokens_refused_total"),
                        "Requests to an intercepted surface refused with 401, by surface and why the token was refused.",
                    ),
                    &["surface", "reason"],
                )?,
            )?,
            gateway_reachable: reg(
                registry,
                IntGauge::new(
                    name("gateway_reachable"),
                    "1 when the last gateway probe got an HTTP answer, else 0.",
                )?,
            )?,
            mcp_sessions: reg(
                registry,
                IntGauge::new(
                    name("mcp_sessions"),
                    "MCP sessions the sidecar knows (learned from initialize exchanges).",
                )?,
            )?,
            mcp_evictions: reg(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        name("mcp_session_evictions_total"),
                        "MCP sessions dropped before a DELETE, by reason.",
                    ),
                    &["reason"],
                )?,
            )?,
            admission_refused: reg(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        name("admission_refused_total"),
                        "Requests refused with 503 for lack of a slot, buffer room or room at the gateway, by reason.",
                    ),
                    &["reason"],
                )?,
            )?,
            buffered_bytes: reg(
                registry,
                IntGauge::new(
                    name("buffered_body_bytes"),
                    "Bytes held now for callers: POST /mcp bodies being read or forwarded, what parsing them and the notes read for them may take, and rewritten list answers not yet taken by the client.",
                )?,
            )?,
            lookups_throttled: reg(
                registry,
                IntCounter::new(
                    name("hosted_context_lookups_throttled_total"),
                    "Hosted-context lookups refused because the user's bridge-call budget was spent.",
                )?,
            )?,
            store_errors: reg(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        name("session_store_errors_total"),
                        "MCP session-store operations that failed, by operation.",
                    ),
                    &["op"],
                )?,
            )?,
            reloads: reg(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        name("config_reloads_total"),
                        "Configuration reloads (SIGHUP), by result.",
                    ),
                    &["result"],
                )?,
            )?,
            shadow: reg(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        name("shadow_comparisons_total"),
                        "Shadow mode: the gateway's answers to intercepted requests compared \
                         with the sidecar's own, by surface and result.",
                    ),
                    &["surface", "result"],
                )?,
            )?,
            intercept_mode: reg(
                registry,
                IntGaugeVec::new(
                    Opts::new(
                        name("intercept_mode"),
                        "1 for the intercept.mode in effect (enforce: the sidecar answers the section-source surface; shadow: the gateway does), 0 for the other.",
                    ),
                    &["mode"],
                )?,
            )?,
            upstream_framing: reg(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        name("upstream_framing_errors_total"),
                        "Upstream answers refused for their framing, and upstream connections closed for bytes after an answer, by upstream and kind.",
                    ),
                    &["upstream", "kind"],
                )?,
            )?,
            sanitized: reg(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        name("sanitized_total"),
                        "Places the sidecar cut out of answers it passed through, by kind.",
                    ),
                    &["kind"],
                )?,
            )?,
        };
        for surface in SURFACES {
            for r in Shadow::ALL {
                f.shadow.with_label_values(&[surface.as_str(), r.as_str()]);
            }
        }
        for op in StoreOp::ALL {
            f.store_errors.with_label_values(&[op.as_str()]);
        }
        for upstream in UpstreamName::ALL {
            for fault in Fault::ALL {
                f.upstream_framing
                    .with_label_values(&[upstream.as_str(), fault.as_str()]);
            }
        }
        for r in Reload::ALL {
            f.reloads.with_label_values(&[r.as_str()]);
        }
        for mode in INTERCEPT_MODES {
            f.intercept_mode.with_label_values(&[mode]);
        }
        for r in Refusal::ALL {
            f.admission_refused.with_label_values(&[r.as_str()]);
        }
        for e in EVICTIONS {
            f.mcp_evictions.with_label_values(&[e.as_str()]);
        }
        let build_info = reg(
            registry,
            IntGaugeVec::new(
                Opts::new(
                    name("build_info"),
                    "Always 1; the version, the commit and the compiler of the build are labels.",
                ),
                &["version", "commit", "rustc"],
            )?,
        )?;
        build_info
            .with_label_values(&[
                env!("CARGO_PKG_VERSION"),
                env!("KNOWTATION_SIDECAR_COMMIT"),
                env!("KNOWTATION_SIDECAR_RUSTC"),
            ])
            .set(1);
        // The process_* families every Prometheus client exports (CPU seconds, resident
        // and virtual memory, open and most descriptors, threads, start time), read from
        // /proc at each scrape.
        #[cfg(target_os = "linux")]
        registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        // Every series of a closed label set exists from the start, at zero, so a
        // dashboard sees a rate of 0 rather than no data (the per-worker families create
        // all of theirs).
        for k in Sanitized::ALL {
            f.sanitized.with_label_values(&[k.as_str()]);
        }
        for s in SURFACES {
            f.truncated.with_label_values(&[s.as_str()]);
            f.rate_limited.with_label_values(&[s.as_str()]);
        }
        for r in HeadRefusal::ALL {
            f.head_refused.with_label_values(&[r.as_str()]);
        }
        for s in SURFACES {
            for r in TokenRefusal::ALL {
                f.tokens_refused
                    .with_label_values(&[s.as_str(), r.as_str()]);
            }
        }
        Ok(f)
    }
}

impl Metrics {
    /// A fresh registry with every family registered, for one worker.
    pub fn new() -> Metrics {
        Metrics::for_workers(1)
    }

    /// A fresh registry with every family registered, the per-request families kept
    /// per worker for `workers` workers.
    pub fn for_workers(workers: usize) -> Metrics {
        let registry = Registry::new();
        let families = match Families::build(&registry, workers) {
            Ok(f) => Some(f),
            Err(e) => {
                // Only a programming error (a bad name) gets here; serve without metrics
                // rather than refuse to start.
                tracing::error!(error = %e, "metrics unavailable");
                None
            }
        };
        Metrics { registry, families }
    }

    /// Counts one intercepted request (see the type's doc for what is counted here).
    pub fn record(&self, i: &Intercepted) {
        let Some(f) = &self.families else { return };
        let surface = i.surface.as_str();
        let si = surface_index(i.surface);
        let oi = OUTCOMES.iter().position(|o| *o == i.outcome).unwrap_or(0);
        f.intercepted.add(si * OUTCOMES.len() + oi, 1);
        if let Some(status) = i.upstream_status {
            f.upstream_reads
                .add(si * STATUS_CLASSES.len() + class_index(status), 1);
        }
        f.request_seconds.observe(si, i.elapsed.as_secs_f64());
        if let Some(view) = i.view {
            let vi = crate::extract::View::ALL
                .iter()
                .position(|v| *v == view)
                .unwrap_or(0);
            f.views.add(si * crate::extract::View::ALL.len() + vi, 1);
        }
        if let Some(n) = i.sections {
            f.sections.observe(0, n as f64);
        }
        if i.truncated {
            f.truncated.with_label_values(&[surface]).inc();
        }
        if let Some(why) = i.auth_refusal {
            f.tokens_refused
                .with_label_values(&[surface, why.as_str()])
                .inc();
        }
    }

    /// Counts `n` rewrites of `kind` in answers passed through.
    pub fn sanitized(&self, kind: Sanitized, n: u64) {
        let Some(f) = &self.families else { return };
        if n > 0 {
            f.sanitized.with_label_values(&[kind.as_str()]).inc_by(n);
        }
    }

    /// Counts one passed-through request by its response status class.
    pub fn record_passthrough(&self, status: u16, elapsed: Duration) {
        let Some(f) = &self.families else { return };
        f.passthrough.add(class_index(status), 1);
        f.passthrough_seconds.observe(0, elapsed.as_secs_f64());
    }

    /// Marks which `intercept.mode` is in effect: `shadow` or enforce.
    pub fn set_intercept_mode(&self, shadow: bool) {
        if let Some(f) = &self.families {
            let current = if shadow { "shadow" } else { "enforce" };
            for mode in INTERCEPT_MODES {
                f.intercept_mode
                    .with_label_values(&[mode])
                    .set(i64::from(mode == current));
            }
        }
    }

    /// Counts one shadow-mode comparison.
    pub fn shadow(&self, surface: Surface, result: Shadow) {
        if let Some(f) = &self.families {
            f.shadow
                .with_label_values(&[surface.as_str(), result.as_str()])
                .inc();
        }
    }

    /// Counts one request refused by a rate limit.
    pub fn rate_limited(&self, surface: Surface) {
        if let Some(f) = &self.families {
            f.rate_limited.with_label_values(&[surface.as_str()]).inc();
        }
    }

    /// Counts one failed hosted-context lookup; `fallback` when it was answered with the
    /// operator-enabled fallback to the token's `sub` (wire contract §2).
    pub fn hosted_context_failure(&self, fallback: bool) {
        if let Some(f) = &self.families {
            f.hosted_context_failures.inc();
            if fallback {
                f.hosted_context_fallbacks.inc();
            }
        }
    }

    /// Marks one more intercepted request in flight until the guard drops.
    pub fn in_flight(self: &Arc<Self>) -> InFlightGuard {
        if let Some(f) = &self.families {
            f.in_flight.add(1);
        }
        InFlightGuard {
            metrics: Arc::clone(self),
        }
    }

    /// Counts a client connection closed because the connection limit was reached.
    pub fn connection_rejected(&self) {
        if let Some(f) = &self.families {
            f.connections_rejected.inc();
        }
    }

    /// Counts a token that passed verification on `surface`, and how it was checked.
    pub fn token_verified(&self, surface: Surface, remembered: bool) {
        if let Some(f) = &self.families {
            let check = if remembered {
                TokenCheck::Remembered
            } else {
                TokenCheck::Signature
            };
            let c = TokenCheck::ALL
                .iter()
                .position(|k| *k == check)
                .unwrap_or(0);
            f.tokens_verified
                .add(surface_index(surface) * TokenCheck::ALL.len() + c, 1);
        }
    }

    /// Counts a request head the HTTP layer refused on its own.
    pub fn head_refused(&self, reason: HeadRefusal) {
        if let Some(f) = &self.families {
            f.head_refused.with_label_values(&[reason.as_str()]).inc();
        }
    }

    /// Sets the MCP session-table size.
    pub fn set_mcp_sessions(&self, n: usize) {
        if let Some(f) = &self.families {
            f.mcp_sessions.set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Counts one MCP session dropped for `reason`.
    pub fn mcp_session_evicted(&self, reason: Eviction) {
        if let Some(f) = &self.families {
            f.mcp_evictions.with_label_values(&[reason.as_str()]).inc();
        }
    }

    /// Counts one failed session-store operation.
    pub fn session_store_error(&self, op: StoreOp) {
        if let Some(f) = &self.families {
            f.store_errors.with_label_values(&[op.as_str()]).inc();
        }
    }

    /// Counts one configuration reload.
    pub fn config_reload(&self, result: Reload) {
        if let Some(f) = &self.families {
            f.reloads.with_label_values(&[result.as_str()]).inc();
        }
    }

    /// Counts one request refused for lack of a slot or buffer room.
    pub fn admission_refused(&self, reason: Refusal) {
        if let Some(f) = &self.families {
            f.admission_refused
                .with_label_values(&[reason.as_str()])
                .inc();
        }
    }

    /// The buffered-body gauge, for the budget to keep current.
    pub fn buffered_bytes_gauge(&self) -> Option<IntGauge> {
        self.families.as_ref().map(|f| f.buffered_bytes.clone())
    }

    /// Counts one hosted-context lookup refused by the per-user bridge-call budget.
    pub fn lookup_throttled(&self) {
        if let Some(f) = &self.families {
            f.lookups_throttled.inc();
        }
    }

    /// What counts the framing faults of `upstream`'s answers (see
    /// [`crate::upstream::Fault`]); every series exists from the start.
    pub fn fault_observer(&self, upstream: UpstreamName) -> Observer {
        let Some(f) = &self.families else {
            return crate::upstream::unobserved();
        };
        let counters: Vec<IntCounter> = Fault::ALL
            .iter()
            .map(|fault| {
                f.upstream_framing
                    .with_label_values(&[upstream.as_str(), fault.as_str()])
            })
            .collect();
        Arc::new(move |fault| {
            if let Some(i) = Fault::ALL.iter().position(|f| *f == fault) {
                counters[i].inc();
            }
        })
    }

    /// Records the last gateway probe.
    pub fn set_gateway_reachable(&self, reachable: bool) {
        if let Some(f) = &self.families {
            f.gateway_reachable.set(i64::from(reachable));
        }
    }

    /// The Prometheus text exposition of every family.
    pub fn encode(&self) -> String {
        TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_default()
    }

    /// Every registered family as `(name, type, help, label names)`, sorted by name,
    /// including a labelled family none of whose series exists yet (which
    /// [`Metrics::encode`] leaves out): what `docs/metrics.md` is checked against. A field
    /// added to `Families` and not named here does not compile.
    pub fn families(&self) -> Vec<(String, &'static str, String, Vec<String>)> {
        use prometheus::core::Collector;
        use prometheus::proto::MetricType;
        let kind = |t: MetricType| match t {
            MetricType::COUNTER => "counter",
            MetricType::GAUGE => "gauge",
            MetricType::HISTOGRAM => "histogram",
            MetricType::SUMMARY => "summary",
            MetricType::UNTYPED => "untyped",
        };
        let mut out = std::collections::BTreeMap::new();
        // Families with a series, `build_info` (registered outside `Families`) included.
        for mf in self.registry.gather() {
            let labels = mf.get_metric().first().map_or_else(Vec::new, |m| {
                m.get_label().iter().map(|l| l.name().to_owned()).collect()
            });
            let entry = (kind(mf.get_field_type()), mf.help().to_owned(), labels);
            out.insert(mf.name().to_owned(), entry);
        }
        if let Some(f) = &self.families {
            let Families {
                intercepted,
                views,
                upstream_reads,
                request_seconds,
                sections,
                truncated,
                rate_limited,
                hosted_context_failures,
                hosted_context_fallbacks,
                passthrough,
                passthrough_seconds,
                in_flight,
                connections_rejected,
                head_refused,
                tokens_verified,
                tokens_refused,
                gateway_reachable,
                mcp_sessions,
                mcp_evictions,
                admission_refused,
                buffered_bytes,
                lookups_throttled,
                store_errors,
                reloads,
                shadow,
                intercept_mode,
                upstream_framing,
                sanitized,
            } = f;
            let all: [&dyn Collector; 28] = [
                &**intercepted,
                &**views,
                &**upstream_reads,
                &**request_seconds,
                &**sections,
                truncated,
                rate_limited,
                hosted_context_failures,
                hosted_context_fallbacks,
                &**passthrough,
                &**passthrough_seconds,
                &**in_flight,
                connections_rejected,
                head_refused,
                &**tokens_verified,
                tokens_refused,
                gateway_reachable,
                mcp_sessions,
                mcp_evictions,
                admission_refused,
                buffered_bytes,
                lookups_throttled,
                store_errors,
                reloads,
                shadow,
                intercept_mode,
                upstream_framing,
                sanitized,
            ];
            for c in all {
                for (desc, mf) in c.desc().into_iter().zip(c.collect()) {
                    let entry = (
                        kind(mf.get_field_type()),
                        desc.help.clone(),
                        desc.variable_labels.clone(),
                    );
                    out.insert(desc.fq_name.clone(), entry);
                }
            }
        }
        out.into_iter().map(|(n, (t, h, l))| (n, t, h, l)).collect()
    }
}

/// Holds one intercepted request in the in-flight gauge; see [`Metrics::in_flight`].
#[derive(Debug)]
pub struct InFlightGuard {
    metrics: Arc<Metrics>,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if let Some(f) = &self.metrics.families {
            f.in_flight.add(-1);
        }
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;
    use crate::telemetry::{HostedContextEvent, Outcome};

    /// The value of the series `name{labels}` in the exposition, 0 when absent.
    fn value(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or(0.0)
    }

    #[test]
    fn pre_resolved_series_count_in_the_labelled_ones() {
        let m = Metrics::new();
        m.record_passthrough(204, Duration::from_millis(1));
        m.record_passthrough(502, Duration::from_millis(1));
        m.record_passthrough(999, Duration::from_millis(1));
        for (surface, outcome, upstream) in [
            (Surface::Rest, Outcome::Ok, Some(200)),
            (Surface::Mcp, Outcome::Ok, Some(200)),
            (Surface::Mcp, Outcome::Ok, Some(404)),
            (Surface::Rest, Outcome::Ok, Some(700)),
        ] {
            m.record(&Intercepted {
                surface,
                view: Some(crate::extract::View::NoteOutline),
                outcome,
                status: 200,
                upstream_status: upstream,
                sections: Some(1),
                truncated: false,
                hosted_context: HostedContextEvent::None,
                auth_refusal: None,
                elapsed: Duration::from_millis(2),
            });
        }
        let text = m.encode();
        let p = "knowtation_sidecar_passthrough_requests_total";
        assert_eq!(value(&text, &format!("{p}{{status_class=\"2xx\"}}")), 1.0);
        assert_eq!(value(&text, &format!("{p}{{status_class=\"5xx\"}}")), 1.0);
        assert_eq!(value(&text, &format!("{p}{{status_class=\"other\"}}")), 1.0);
        let i = "knowtation_sidecar_intercepted_requests_total";
        assert_eq!(
            value(&text, &format!("{i}{{outcome=\"ok\",surface=\"rest\"}}")),
            2.0
        );
        assert_eq!(
            value(&text, &format!("{i}{{outcome=\"ok\",surface=\"mcp\"}}")),
            2.0
        );
        let u = "knowtation_sidecar_upstream_reads_total";
        assert_eq!(
            value(
                &text,
                &format!("{u}{{status_class=\"4xx\",surface=\"mcp\"}}")
            ),
            1.0
        );
        assert_eq!(
            value(
                &text,
                &format!("{u}{{status_class=\"other\",surface=\"rest\"}}")
            ),
            1.0
        );
        let d = "knowtation_sidecar_request_duration_seconds_count";
        assert_eq!(value(&text, &format!("{d}{{surface=\"mcp\"}}")), 2.0);
        assert_eq!(value(&text, &format!("{d}{{surface=\"rest\"}}")), 2.0);
    }
}
