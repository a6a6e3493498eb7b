//! Validation of a loaded configuration, all of it before any port is bound, and the
//! surfaces a valid configuration still leaves inert.

use std::net::IpAddr;

use ipnet::IpNet;

use super::{
    Config, ConfigError, Forwarded, Secret, SecretOrigin, Tracing, ENV_PREFIX, MAX_POOL_IDLE,
    MAX_RUNTIME_THREADS, MAX_TOKEN_CACHE_ENTRIES, MAX_TRUSTED_HOPS, MAX_TRUSTED_PROXIES,
    MIN_JWT_SECRET_BYTES, REDACTED_PLACEHOLDER,
};

/// Refuses `value` over `max` for `key`, naming the bound.
fn at_most(key: &'static str, value: usize, max: usize) -> Result<(), ConfigError> {
    if value > max {
        return Err(ConfigError::new(key, format!("must be at most {max}")));
    }
    Ok(())
}

/// Even with `auth.allow_extra_secrets`, every token check tries each secret in turn.
const MAX_JWT_SECRETS: usize = 16;

/// hyper refuses an HTTP/1 read buffer below this.
const MIN_HEADER_BYTES: usize = 8192;

/// Checks a configuration built by [`load`](super::load()) or by hand; `crate::proxy::start` runs it
/// too, so a bad config never binds a port.
pub fn validate(config: &Config) -> Result<(), ConfigError> {
    let up = &config.upstream;
    if up.gateway_url.trim().is_empty() {
        return Err(ConfigError::new(
            "upstream.gateway_url",
            "required (the gateway everything else passes through to)",
        ));
    }
    base_url("upstream.gateway_url", &up.gateway_url)?;
    if let Some(url) = &up.canister_url {
        base_url("upstream.canister_url", url)?;
    }
    if let Some(url) = &up.bridge_url {
        base_url("upstream.bridge_url", url)?;
    }
    if let Some(secret) = &up.gateway_secret {
        let key = secret_key("upstream.gateway_secret", secret);
        if is_placeholder(secret) {
            return Err(ConfigError::new(
                key,
                format!(
                    "the secret {} {}",
                    found_in("upstream", "gateway_secret", secret),
                    PLACEHOLDER_MESSAGE
                ),
            ));
        }
        if secret.expose().is_empty() {
            return Err(ConfigError::new(
                key,
                "must not be empty (omit it to send none)",
            ));
        }
    }
    // Files (the CA bundle, TLS certificate and key, the MCP policy) are read where they
    // are used, when the runtime objects are built: `crate::proxy::check` and
    // `crate::proxy::start` do that before any port is bound.
    let listen = &config.listen;
    match (&listen.tls_cert_file, &listen.tls_key_file) {
        (Some(_), Some(_)) | (None, None) => {}
        (Some(_), None) => {
            return Err(ConfigError::new(
                "listen.tls_key_file",
                "required when listen.tls_cert_file is set",
            ))
        }
        (None, Some(_)) => {
            return Err(ConfigError::new(
                "listen.tls_cert_file",
                "required when listen.tls_key_file is set",
            ))
        }
    }
    if listen.max_header_bytes < MIN_HEADER_BYTES {
        return Err(ConfigError::new(
            "listen.max_header_bytes",
            format!("must be at least {MIN_HEADER_BYTES}"),
        ));
    }
    if u32::try_from(listen.max_header_bytes).is_err() {
        return Err(ConfigError::new(
            "listen.max_header_bytes",
            "must fit in 32 bits",
        ));
    }
    at_most("listen.max_connections", listen.max_connections, 1_000_000)?;
    at_most(
        "upstream.pool_max_idle",
        config.upstream.pool_max_idle,
        MAX_POOL_IDLE,
    )?;
    at_most(
        "upstream.pool_max_idle_per_principal",
        config.upstream.pool_max_idle_per_principal,
        MAX_POOL_IDLE,
    )?;
    if !(1..=3_600_000).contains(&config.upstream.pool_idle_timeout_ms) {
        return Err(ConfigError::new(
            "upstream.pool_idle_timeout_ms",
            "must be between 1 and 3600000",
        ));
    }
    at_most("listen.max_in_flight", listen.max_in_flight, 1_000_000)?;
    at_most(
        "listen.max_forwarded_in_flight",
        listen.max_forwarded_in_flight,
        1_000_000,
    )?;
    at_most(
        "listen.max_forwarded_in_flight_per_user",
        listen.max_forwarded_in_flight_per_user,
        1_000_000,
    )?;
    at_most(
        "listen.max_forwarded_in_flight_anonymous",
        listen.max_forwarded_in_flight_anonymous,
        1_000_000,
    )?;
    at_most(
        "listen.max_event_streams",
        listen.max_event_streams,
        1_000_000,
    )?;
    if config.admin.address == listen.address && listen.address.port() != 0 {
        return Err(ConfigError::new(
            "admin.address",
            "must differ from listen.address",
        ));
    }

    let bounds: [(&str, u64); 33] = [
        ("mcp.max_body_bytes", config.mcp.max_body_bytes as u64),
        ("mcp.max_sessions", config.mcp.max_sessions as u64),
        (
            "mcp.calls_per_minute",
            u64::from(config.mcp.calls_per_minute),
        ),
        (
            "listen.header_read_timeout_ms",
            listen.header_read_timeout_ms,
        ),
        ("listen.max_header_bytes", listen.max_header_bytes as u64),
        ("listen.max_headers", listen.max_headers as u64),
        ("listen.max_in_flight", listen.max_in_flight as u64),
        (
            "listen.max_forwarded_in_flight",
            listen.max_forwarded_in_flight as u64,
        ),
        (
            "listen.max_forwarded_in_flight_per_user",
            listen.max_forwarded_in_flight_per_user as u64,
        ),
        (
            "listen.max_forwarded_in_flight_anonymous",
            listen.max_forwarded_in_flight_anonymous as u64,
        ),
        ("listen.max_event_streams", listen.max_event_streams as u64),
        (
            "listen.max_in_flight_per_user",
            listen.max_in_flight_per_user as u64,
        ),
        ("listen.body_read_timeout_ms", listen.body_read_timeout_ms),
        (
            "listen.write_stall_timeout_ms",
            listen.write_stall_timeout_ms,
        ),
        (
            "listen.max_buffered_bytes",
            listen.max_buffered_bytes as u64,
        ),
        (
            "listen.max_buffered_bytes_per_user",
            listen.max_buffered_bytes_per_user as u64,
        ),
        (
            "listen.http2_max_concurrent_streams",
            u64::from(listen.http2_max_concurrent_streams),
        ),
        (
            "listen.http2_max_pending_accept_reset_streams",
            listen.http2_max_pending_accept_reset_streams as u64,
        ),
        (
            "listen.http2_max_local_error_reset_streams",
            listen.http2_max_local_error_reset_streams as u64,
        ),
        ("listen.idle_timeout_seconds", listen.idle_timeout_seconds),
        ("listen.max_connections", listen.max_connections as u64),
        ("listen.accept_backlog", u64::from(listen.accept_backlog)),
        ("upstream.connect_timeout_ms", up.connect_timeout_ms),
        ("upstream.gateway_timeout_ms", up.gateway_timeout_ms),
        (
            "upstream.gateway_idle_timeout_ms",
            up.gateway_idle_timeout_ms,
        ),
        ("upstream.canister_timeout_ms", up.canister_timeout_ms),
        ("upstream.note_max_bytes", up.note_max_bytes as u64),
        (
            "hosted_context.max_lookups_per_user_per_minute",
            u64::from(config.hosted_context.max_lookups_per_user_per_minute),
        ),
        (
            "hosted_context.cache_ttl_seconds",
            config.hosted_context.cache_ttl_seconds,
        ),
        (
            "hosted_context.cache_max_entries",
            config.hosted_context.cache_max_entries as u64,
        ),
        ("rate_limit.burst", u64::from(config.rate_limit.burst)),
        ("rate_limit.max_keys", config.rate_limit.max_keys as u64),
        ("shutdown.drain_seconds", config.shutdown.drain_seconds),
    ];
    for (key, value) in bounds {
        if value == 0 {
            return Err(ConfigError::new(key, "must be greater than 0"));
        }
    }
    // Durations beyond a day are mistakes (and would overflow deadline arithmetic).
    let day_ms = 86_400_000;
    for (key, ms) in [
        (
            "listen.header_read_timeout_ms",
            listen.header_read_timeout_ms,
        ),
        (
            "listen.idle_timeout_seconds",
            listen.idle_timeout_seconds.saturating_mul(1000),
        ),
        ("listen.body_read_timeout_ms", listen.body_read_timeout_ms),
        (
            "listen.write_stall_timeout_ms",
            listen.write_stall_timeout_ms,
        ),
        ("upstream.connect_timeout_ms", up.connect_timeout_ms),
        ("upstream.gateway_timeout_ms", up.gateway_timeout_ms),
        (
            "upstream.gateway_idle_timeout_ms",
            up.gateway_idle_timeout_ms,
        ),
        ("upstream.canister_timeout_ms", up.canister_timeout_ms),
        (
            "hosted_context.failure_cache_ttl_seconds",
            config
                .hosted_context
                .failure_cache_ttl_seconds
                .saturating_mul(1000),
        ),
        (
            "hosted_context.cache_ttl_seconds",
            config.hosted_context.cache_ttl_seconds.saturating_mul(1000),
        ),
        (
            "shutdown.drain_seconds",
            config.shutdown.drain_seconds.saturating_mul(1000),
        ),
        (
            "shutdown.grace_seconds",
            config.shutdown.grace_seconds.saturating_mul(1000),
        ),
    ] {
        if ms > day_ms {
            return Err(ConfigError::new(key, "must be at most one day"));
        }
    }

    let timeout = config.hosted_context.timeout_ms;
    if !(250..=10_000).contains(&timeout) {
        return Err(ConfigError::new(
            "hosted_context.timeout_ms",
            format!("must be between 250 and 10000 (as the gateway clamps it), got {timeout}"),
        ));
    }

    let auth = &config.auth;
    if auth.jwt_secrets.len() > 2 && !auth.allow_extra_secrets {
        return Err(ConfigError::new(
            "auth.jwt_secrets",
            format!(
                "{} secrets given; the gateway accepts a current and a previous one \
                 (wire contract §1); set auth.allow_extra_secrets = true to allow more",
                auth.jwt_secrets.len()
            ),
        ));
    }
    at_most(
        "auth.token_cache_entries",
        auth.token_cache_entries,
        MAX_TOKEN_CACHE_ENTRIES,
    )?;
    if auth.jwt_secrets.len() > MAX_JWT_SECRETS {
        return Err(ConfigError::new(
            "auth.jwt_secrets",
            format!("at most {MAX_JWT_SECRETS} secrets"),
        ));
    }
    jwt_secrets(&auth.jwt_secrets)?;

    for (n, origin) in config.cors.allowed_origins.iter().enumerate() {
        let n = n + 1;
        if origin.trim().is_empty() {
            return Err(ConfigError::new(
                "cors.allowed_origins",
                format!("origin #{n} is empty"),
            ));
        }
        // A browser's Origin is scheme://host[:port] and nothing else: an entry with a
        // path, a trailing slash or no scheme would never match one.
        if crate::mcp::origin::normalize(origin).is_none() {
            let hint = if origin.trim() == "*" {
                "; leave the list empty to allow any origin (`*`)"
            } else {
                ""
            };
            return Err(ConfigError::new(
                "cors.allowed_origins",
                format!(
                    "origin #{n} {origin:?} is not an origin: expected scheme://host[:port], \
                     such as \"https://hub.example\", with no path or trailing slash, which \
                     a browser's Origin never has{hint}"
                ),
            ));
        }
    }

    if let Some(origins) = &config.mcp.allowed_origins {
        if origins.len() > crate::mcp::origin::MAX_ALLOWED_ORIGINS {
            return Err(ConfigError::new(
                "mcp.allowed_origins",
                format!(
                    "at most {} origins",
                    crate::mcp::origin::MAX_ALLOWED_ORIGINS
                ),
            ));
        }
        if let Some(i) = origins
            .iter()
            .position(|o| crate::mcp::origin::normalize(o).is_none())
        {
            return Err(crate::mcp::origin::not_an_origin(i));
        }
    }

    at_most("mcp.max_sessions", config.mcp.max_sessions, 10_000_000)?;
    if config.mcp.max_body_bytes > 64 * 1024 * 1024 {
        return Err(ConfigError::new(
            "mcp.max_body_bytes",
            "must be at most 64 MiB",
        ));
    }
    if listen.max_buffered_bytes_per_user > listen.max_buffered_bytes {
        return Err(ConfigError::new(
            "listen.max_buffered_bytes_per_user",
            "must be at most listen.max_buffered_bytes",
        ));
    }
    if config.mcp.max_body_bytes > listen.max_buffered_bytes_per_user {
        return Err(ConfigError::new(
            "mcp.max_body_bytes",
            "must be at most listen.max_buffered_bytes_per_user (one body must fit a user's share)",
        ));
    }

    if config.sanitize.max_message_bytes == 0 {
        return Err(ConfigError::new(
            "sanitize.max_message_bytes",
            "must be at least 1",
        ));
    }
    validate_forwarded(&config.forwarded)?;
    validate_log_level(&config.log.level)?;
    validate_tracing(&config.tracing)?;
    if config.runtime.threads > MAX_RUNTIME_THREADS {
        return Err(ConfigError::new(
            "runtime.threads",
            format!("at most {MAX_RUNTIME_THREADS} (0: one per available CPU)"),
        ));
    }
    if config
        .state
        .directory
        .as_ref()
        .is_some_and(|d| d.as_os_str().is_empty())
    {
        return Err(ConfigError::new(
            "state.directory",
            "must not be empty (omit it to keep sessions in memory only)",
        ));
    }
    Ok(())
}

/// Why a value holding [`REDACTED_PLACEHOLDER`] is refused.
const PLACEHOLDER_MESSAGE: &str = "holds `<redacted>`, the placeholder check-config printed \
     in place of a secret: it is not a secret; set the real value";

/// Whether `secret` holds the placeholder `check-config` once printed in place of
/// secrets (in any case): a config copied from that output must not start with a
/// secret anyone can read in the documentation.
fn is_placeholder(secret: &Secret) -> bool {
    secret
        .expose()
        .to_ascii_lowercase()
        .contains(REDACTED_PLACEHOLDER)
}

/// The key an error about `secret` names: `key`, or `key_file` when it was read from
/// that file.
fn secret_key(key: &str, secret: &Secret) -> String {
    match secret.origin() {
        SecretOrigin::SecretFile => format!("{key}_file"),
        SecretOrigin::ConfigFile | SecretOrigin::Environment => key.to_owned(),
    }
}

/// Where `secret`, a value of `section.key`, was found, for an error message.
fn found_in(section: &str, key: &str, secret: &Secret) -> String {
    match secret.origin() {
        SecretOrigin::ConfigFile => "in the config file".to_owned(),
        SecretOrigin::Environment => format!(
            "in {ENV_PREFIX}{}__{}",
            section.to_ascii_uppercase(),
            key.to_ascii_uppercase()
        ),
        SecretOrigin::SecretFile => format!("in {section}.{key}_file"),
    }
}

/// Checks each JWT secret: not the placeholder, not empty, at least
/// [`MIN_JWT_SECRET_BYTES`]. Errors name the secret by its place among those of the
/// same origin, never by its value.
fn jwt_secrets(secrets: &[Secret]) -> Result<(), ConfigError> {
    let mut counts = [0usize; 3];
    for secret in secrets {
        let slot = match secret.origin() {
            SecretOrigin::ConfigFile => 0,
            SecretOrigin::Environment => 1,
            SecretOrigin::SecretFile => 2,
        };
        counts[slot] += 1;
        let which = format!(
            "secret #{} {}",
            counts[slot],
            found_in("auth", "jwt_secrets", secret)
        );
        let key = secret_key("auth.jwt_secrets", secret);
        if is_placeholder(secret) {
            return Err(ConfigError::new(
                key,
                format!("{which} {PLACEHOLDER_MESSAGE}"),
            ));
        }
        if secret.expose().is_empty() {
            return Err(ConfigError::new(key, format!("{which} is empty")));
        }
        if secret.expose().len() < MIN_JWT_SECRET_BYTES {
            return Err(ConfigError::new(
                key,
                format!(
                    "{which} is shorter than {MIN_JWT_SECRET_BYTES} bytes: an HMAC key for \
                     HS256 must be at least as long as its 256-bit hash (RFC 7518 §3.2); give \
                     the gateway and the sidecar a longer one (e.g. `openssl rand -hex 32`)"
                ),
            ));
        }
    }
    Ok(())
}

/// A surface the configuration leaves inert: the key to set and what happens without it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inert {
    /// The key that is unset.
    pub key: &'static str,
    /// What the sidecar does without it.
    pub effect: &'static str,
}

/// The surfaces `config` leaves inert, for a warning at start and on reload: a config
/// with only `upstream.gateway_url` is valid, and answers every intercepted request
/// with a refusal.
pub fn inert(config: &Config) -> Vec<Inert> {
    let mut out = Vec::new();
    if config.auth.jwt_secrets.is_empty() {
        out.push(Inert {
            key: "auth.jwt_secrets",
            effect: "no JWT secret: every token is refused with 401, on the REST route and on /mcp",
        });
    }
    if config.upstream.canister_url.is_none() {
        out.push(Inert {
            key: "upstream.canister_url",
            effect:
                "no canister: the REST route answers 503 and the MCP tool get_section_source fails",
        });
    } else if config.upstream.gateway_secret.is_none() {
        out.push(Inert {
            key: "upstream.gateway_secret",
            effect:
                "canister reads carry no X-Gateway-Auth; a canister that requires it refuses them",
        });
    }
    if config.upstream.bridge_url.is_none() {
        out.push(Inert {
            key: "upstream.bridge_url",
            effect: "no bridge: every MCP initialize is refused, and the REST route reads each \
                     token's own notes with no vault check",
        });
    }
    out
}

/// Something a valid configuration does that the operator should hear of: logged at start
/// and on every reload (`warn`, with `key` and `effect`), and printed by `check-config`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// The key that causes it.
    pub key: &'static str,
    /// The log message.
    pub message: &'static str,
    /// What the sidecar does because of it.
    pub effect: &'static str,
}

/// Every warning `config` earns: one per surface it leaves inert ([`inert`]), and one
/// for shadow mode, in which the sidecar is not a choke point.
pub fn warnings(config: &Config) -> Vec<Warning> {
    let mut out: Vec<Warning> = inert(config)
        .into_iter()
        .map(|i| Warning {
            key: i.key,
            message: "surface left inert",
            effect: i.effect,
        })
        .collect();
    if config.intercept.mode == super::Mode::Shadow {
        out.push(Warning {
            key: "intercept.mode",
            message: "shadow mode: the gateway answers the section-source surface",
            effect: "the sidecar only compares the gateway's answers with its own: it is not a \
                     choke point, and whatever the gateway sends, the client gets; set \
                     intercept.mode = \"enforce\" once the comparisons agree",
        });
    }
    out
}

/// Checks `[forwarded]`: the hop count within its bound, every proxy entry an address or
/// a CIDR range, and proxies only with a hop count that reads them.
fn validate_forwarded(forwarded: &Forwarded) -> Result<(), ConfigError> {
    if forwarded.trusted_hops > MAX_TRUSTED_HOPS {
        return Err(ConfigError::new(
            "forwarded.trusted_hops",
            format!("must be at most {MAX_TRUSTED_HOPS}"),
        ));
    }
    trusted_proxies(forwarded)?;
    if !forwarded.trusted_proxies.is_empty() && forwarded.trusted_hops == 0 {
        return Err(ConfigError::new(
            "forwarded.trusted_hops",
            "must be at least 1 when forwarded.trusted_proxies is set: it is the number of \
             proxies in front of the sidecar whose X-Forwarded-For entries count",
        ));
    }
    Ok(())
}

/// The ranges of `forwarded.trusted_proxies`: each entry an IP address (one host) or a
/// CIDR range with no bits set past its prefix (`10.0.0.1/8` is refused as a likely
/// typo rather than read as `10.0.0.0/8`).
pub fn trusted_proxies(forwarded: &Forwarded) -> Result<Vec<IpNet>, ConfigError> {
    const KEY: &str = "forwarded.trusted_proxies";
    if forwarded.trusted_proxies.len() > MAX_TRUSTED_PROXIES {
        return Err(ConfigError::new(
            KEY,
            format!("at most {MAX_TRUSTED_PROXIES} entries"),
        ));
    }
    let mut out = Vec::with_capacity(forwarded.trusted_proxies.len());
    for (n, entry) in forwarded.trusted_proxies.iter().enumerate() {
        let text = entry.trim();
        let bad = |why: &str| ConfigError::new(KEY, format!("entry #{} {text:?}: {why}", n + 1));
        let net = if text.contains('/') {
            let net: IpNet = text
                .parse()
                .map_err(|_| bad("not an IP address or CIDR range"))?;
            if net.trunc() != net {
                return Err(bad(&format!(
                    "has bits set past its prefix length; the range is {}",
                    net.trunc()
                )));
            }
            net
        } else {
            let ip: IpAddr = text
                .parse()
                .map_err(|_| bad("not an IP address or CIDR range"))?;
            IpNet::from(ip)
        };
        out.push(canonical(net));
    }
    Ok(out)
}

/// An IPv4-mapped IPv6 range as the IPv4 range it maps: peers and forwarded addresses
/// are compared in their canonical form (`::ffff:10.0.0.1` is `10.0.0.1`).
fn canonical(net: IpNet) -> IpNet {
    if let IpNet::V6(v6) = net {
        if let (Some(v4), Some(len)) = (
            v6.network().to_ipv4_mapped(),
            v6.prefix_len().checked_sub(96),
        ) {
            if let Ok(v4) = ipnet::Ipv4Net::new(v4, len) {
                return IpNet::V4(v4);
            }
        }
    }
    net
}

/// The level names `log.level` accepts.
pub const LOG_LEVELS: &[&str] = &["trace", "debug", "info", "warn", "error", "off"];

/// Checks `log.level`: a level name, or comma-separated directives each of which is a
/// level name or `target=level`. The filter syntax alone would take a typo such as
/// `warning` for a target name and silence every line.
fn validate_log_level(level: &str) -> Result<(), ConfigError> {
    const KEY: &str = "log.level";
    let is_level = |s: &str| LOG_LEVELS.iter().any(|l| l.eq_ignore_ascii_case(s.trim()));
    if level.trim().is_empty() {
        return Err(ConfigError::new(KEY, "must not be empty"));
    }
    for directive in level.split(',') {
        let level_part = match directive.rsplit_once('=') {
            Some((target, lvl)) if !target.trim().is_empty() => lvl,
            Some(_) => directive,
            None => directive,
        };
        if !is_level(level_part) {
            return Err(ConfigError::new(
                KEY,
                format!(
                    "must be one of {}, or comma-separated target=level directives (found {:?})",
                    LOG_LEVELS
                        .iter()
                        .map(|l| format!("{l:?}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    directive.trim(),
                ),
            ));
        }
    }
    tracing_subscriber::EnvFilter::try_new(level)
        .map_err(|e| ConfigError::new(KEY, format!("not a valid filter: {e}")))?;
    Ok(())
}

/// Checks `[tracing]`: an `http://` collector URL (the exporter has no TLS), a ratio, a
/// service name and a timeout that can work. Checked when tracing is off too, so turning
/// it on cannot find an old mistake.
fn validate_tracing(t: &Tracing) -> Result<(), ConfigError> {
    let uri: http::Uri = t.endpoint.parse().map_err(|e| {
        ConfigError::new(
            "tracing.endpoint",
            format!("not a valid URL: {e} (expected the form http://HOST:4318/v1/traces)"),
        )
    })?;
    if uri.scheme_str() != Some("http") || uri.host().is_none_or(str::is_empty) {
        return Err(ConfigError::new(
            "tracing.endpoint",
            "must be an http:// URL with a host, such as http://127.0.0.1:4318/v1/traces \
             (for TLS, send to a collector beside the sidecar)",
        ));
    }
    if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
        return Err(ConfigError::new(
            "tracing.endpoint",
            "must not contain credentials",
        ));
    }
    if !(0.0..=1.0).contains(&t.sample_ratio) {
        return Err(ConfigError::new(
            "tracing.sample_ratio",
            "must be between 0.0 and 1.0",
        ));
    }
    if t.service_name.trim().is_empty() || t.service_name.len() > 255 {
        return Err(ConfigError::new(
            "tracing.service_name",
            "must be 1 to 255 characters",
        ));
    }
    if !(1..=60_000).contains(&t.export_timeout_ms) {
        return Err(ConfigError::new(
            "tracing.export_timeout_ms",
            "must be 1 to 60000",
        ));
    }
    Ok(())
}

/// Checks an upstream base URL: http or https, a host, no credentials, query or fragment.
fn base_url(key: &str, url: &str) -> Result<http::Uri, ConfigError> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| ConfigError::new(key, format!("not a valid URL: {e}")))?;
    match uri.scheme_str() {
        Some("http") | Some("https") => {}
        _ => return Err(ConfigError::new(key, "must be an http:// or https:// URL")),
    }
    let Some(authority) = uri.authority() else {
        return Err(ConfigError::new(key, "must name a host"));
    };
    // Credentials in a URL would be printed by check-config and sent in the clear.
    if authority.as_str().contains('@') {
        return Err(ConfigError::new(key, "must not contain credentials"));
    }
    if authority.host().is_empty() {
        return Err(ConfigError::new(key, "must name a host"));
    }
    if uri.query().is_some() || url.contains('#') {
        return Err(ConfigError::new(key, "must not have a query or fragment"));
    }
    Ok(uri)
}
