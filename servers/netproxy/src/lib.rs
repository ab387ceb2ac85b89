//! warren-netproxy: the network grant's egress proxy.
//!
//! It runs outside every namespace and is a namespace's only way out: a client speaks HTTP
//! CONNECT, plain HTTP with an absolute URI, or SOCKS5 CONNECT; the proxy checks the destination
//! against the session's [`Policy`], asks the session's [`Decide`] hook once per destination,
//! resolves the name itself, refuses addresses the rules forbid, connects to exactly the address
//! it checked, and writes one [`Record`] per connection. The model and the rules are
//! `docs/network.md`.

pub mod decide;
pub mod grant;
/// The destination patterns a grant lists (the record's language, shared with nsd).
pub use warren_proto::net::policy;
pub mod record;
pub mod resolve;
pub mod session;

pub use decide::{AllowListed, Decide, Decision};
pub use policy::{Pattern, Policy};
pub use record::{FinishRecord, Outcome, Record, RecordSlot, Records, ReserveHook};
pub use resolve::Resolver;
pub use session::{Limits, Session, serve_connection};
