//! Showing untrusted text to a person: the one rule every view uses, `warren_daemon::escape`.

pub use warren_daemon::escape::*;
