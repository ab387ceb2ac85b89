//! Models of warren's protocols, checked exhaustively with stateright (`tests/`). Each model
//! names the code and the tests it abstracts; each planted bug must be found, so that no
//! property holds vacuously. See `formal/README.md`.

pub mod flush;
pub mod gate_flow;
pub mod narrowing;
