//! A namespace's model calls cross the gate, as its tool calls do: before a session of a
//! connection nsd handed over (`llmfs.ctl`) asks the model, llmfs asks the gate to decide the
//! call as the core tool `llm` (read tier: allowed by default; an operator's rule asks or denies
//! it), with the namespace's lineage from nsd's record, so the decision is charged to the
//! subtree's receipt budgets and counts its asks. The call's `query` receipt names the decision
//! and is charged to the same budgets. The arguments decided on are the model's name and the
//! digest of the request — never its text.
//!
//! Fail closed: with no gate connection (`WARREN_GATE_FD` unset or dead) every such call is
//! denied. The operator's own socket (`llm.sock`) is not a namespace's: its asks are not decided.

use std::sync::Arc;

use serde_json::{Value, json};
use tokio::time::Instant;
use warren_gate::Verdict;
use warren_proto::gate::GateClient;
use warren_proto::lineage::Lineage;
use warren_proto::receipts::Ack;

/// The tool name a model call is decided as (the gate's tier table has it).
use warren_gate::request::LLM_TOOL;

/// One namespace's connection's way through the gate.
pub struct ModelGate {
    link: Arc<GateClient>,
    /// nsd's lineage of the namespace, as the gate takes it with a decide.
    lineage: Box<serde_json::value::RawValue>,
    /// The subtree's budget keys, for the `query` receipt.
    budgets: Value,
}

/// What an admitted call carries into its receipt.
pub struct Admitted {
    pub decision: Option<Ack>,
    pub budgets: Option<Value>,
}

impl ModelGate {
    /// The gate for the connection of the namespace `lineage` names (checked by the grant).
    /// A grant without a lineage gets no gate (`crate::control` refuses it): a call decided
    /// without one would be charged to no subtree's budgets and counted in no subtree's asks.
    pub fn new(link: Arc<GateClient>, lineage: &Lineage) -> Result<ModelGate, String> {
        Ok(ModelGate {
            link,
            lineage: serde_json::value::to_raw_value(lineage).map_err(|e| e.to_string())?,
            budgets: serde_json::to_value(lineage.budget_keys()).map_err(|e| e.to_string())?,
        })
    }

    /// The subtree's budget keys, as the `query` receipt carries them.
    pub fn budgets(&self) -> Option<Value> {
        Some(self.budgets.clone())
    }

    /// Decides the call of `model` with the request digested as `request_digest` (`sha256:HEX`)
    /// in the namespace's session `scope`; an ask waits for its answer until `deadline` (the
    /// ask's timeout), then is withdrawn.
    /// Err: why the call must not be made, for the reply's error line.
    pub async fn admit(
        &self,
        scope: &str,
        model: &str,
        request_digest: &str,
        deadline: Instant,
    ) -> Result<Admitted, String> {
        let args = json!({"model": model, "request": request_digest});
        let canonical = warren_jcs::value_to_vec(&args).map_err(|e| e.to_string())?;
        let answer = self
            .link
            .decide(scope, LLM_TOOL, &canonical, &[], Some(&*self.lineage))
            .await;
        let answer = match (answer.decision, answer.pending) {
            (Verdict::Ask, Some(id)) => {
                match tokio::time::timeout_at(deadline, self.link.wait(id)).await {
                    Ok(waited) => waited,
                    Err(_) => {
                        self.link.withdraw(id).await;
                        return Err(format!(
                            "the gate asked the operator about this model call (ask {id}) and no answer came before the ask's timeout"
                        ));
                    }
                }
            }
            _ => answer,
        };
        match answer.decision {
            Verdict::Allow => Ok(Admitted {
                decision: answer.receipt,
                budgets: self.budgets(),
            }),
            _ => Err(format!("the gate denied this model call: {}", answer.basis)),
        }
    }
}
