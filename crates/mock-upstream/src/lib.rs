//! Loopback stand-ins for the upstreams of a Knowtation hub, each a real hyper 1 HTTP/1.1
//! server bound to `127.0.0.1:0` (the OS picks the port; [`MockCanister::addr`] and
//! friends report it). The sidecar's `demo` command runs in front of them, and its tests
//! drive them through the test kit. Every request that reaches a mock is recorded exactly
//! as received (method, request-target, version, headers, body bytes) so a test can count
//! and inspect what got past the sidecar. Dropping a mock stops its server and every
//! connection it holds.
//!
//! - [`MockCanister`]: the note store: `GET /api/v1/notes/{encoded path}` answers
//!   `{"path","frontmatter":"<JSON text>","body"}`, 404 for an unknown note or vault, 403
//!   for a wrong `X-Gateway-Auth`; per-path overrides of status, raw body bytes and delay.
//! - [`MockBridge`]: the hosted-context service.
//! - [`MockGateway`]: the passthrough target: echoes requests as JSON, streams SSE, serves
//!   large, chunked and bodiless answers, and a minimal `/mcp` with the gateway's sessions.
//! - [`sign_token`] and friends: HS256 caller tokens.
//!
//! It uses no other crate of the workspace: a stand-in that shared the sidecar's code
//! would agree with the sidecar by construction.
#![forbid(unsafe_code)]

/// The accessors every mock shares, delegating to its `server` field.
macro_rules! journal_accessors {
    ($mock:ty) => {
        impl $mock {
            /// The bound address.
            pub fn addr(&self) -> std::net::SocketAddr {
                self.server.addr()
            }

            /// `http://127.0.0.1:<port>`, no trailing slash.
            pub fn url(&self) -> String {
                self.server.url()
            }

            /// Every request received so far (see [`super::MAX_RECORDED_REQUESTS`]).
            pub fn requests(&self) -> Vec<super::Recorded> {
                self.server.journal().requests()
            }

            /// How many requests were received.
            pub fn count(&self) -> usize {
                self.server.journal().count()
            }

            /// How many TCP connections were accepted (to observe connection reuse).
            pub fn connections(&self) -> usize {
                self.server.journal().connections()
            }

            /// Forgets the recorded requests and resets the count.
            pub fn clear_requests(&self) {
                self.server.journal().clear();
            }
        }
    };
}

pub mod body;
mod bridge;
mod canister;
mod frontmatter;
mod gateway;
mod server;
mod token;

pub use bridge::{MockBridge, Reply};
pub use canister::{CanisterOverride, MockCanister, VaultError, MAX_VAULT_FILES};
pub use frontmatter::{split_markdown, FrontmatterError};
pub use gateway::{
    big_body, MockGateway, SectionSourceSurface, SseStyle, MAX_BIG_BYTES, MAX_SSE_EVENTS,
    PRIMING_RETRY_MS, SDK_PROTOCOL_VERSIONS,
};
pub use server::{lock, Recorded, MAX_RECORDED_BODY_BYTES, MAX_RECORDED_REQUESTS};
pub use token::{session_claims, sign_token, sign_token_alg, try_sign_token, unix_now};
