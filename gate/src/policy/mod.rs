//! The decision engine: pure functions from what the store knows about a call to a verdict and
//! its basis. Nothing here touches the database, the network or a clock.

pub mod context;
pub mod engine;
pub mod risk;
pub mod rules;
pub mod tier;
pub mod verdict;

pub use context::{ContextState, Requirement};
pub use engine::{Candidates, Evaluation, evaluate};
pub use rules::{Rule, Selector};
pub use tier::{Tier, ToolClass};
pub use verdict::{Basis, Verdict};
