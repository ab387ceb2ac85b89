//! The decision hook: asked once per session for each listed `host:port` before its first use.
//!
//! The policy says what may ever be reached; a [`Decide`] says whether this session may reach
//! it now. The default, [`AllowListed`], allows every listed destination. The gate plugs in
//! here later (a `net:<host>:<port>` request at the network tier); a [`crate::Session`] caches
//! each allow, so the hook runs once per destination and session, and asks again after a deny.

use async_trait::async_trait;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Refused, with a one-line reason the client is shown.
    Deny(String),
}

#[async_trait]
pub trait Decide: Send + Sync {
    /// `host` is the name (or IP literal) as the client gave it, lowercased; only destinations
    /// the policy lists are asked about.
    async fn decide(&self, host: &str, port: u16) -> Decision;
}

/// Allows every destination the policy lists.
#[derive(Debug, Clone, Copy, Default)]
pub struct AllowListed;

#[async_trait]
impl Decide for AllowListed {
    async fn decide(&self, _host: &str, _port: u16) -> Decision {
        Decision::Allow
    }
}
