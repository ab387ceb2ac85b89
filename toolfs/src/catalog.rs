//! Every tool toolfs knows: its name, tier, description, doc, schema (compiled once) and where it
//! runs. A connection's tree shows the subset its grant names.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use crate::echo;

/// Where a tool's calls run.
#[derive(Clone)]
pub enum Runner {
    /// Inside toolfs (only `echo`).
    Echo,
    /// In a worker process holding the tool's authority.
    Worker,
    /// Elsewhere, through a client the serving daemon holds (mcpfs: an MCP server's session).
    /// The call has been parsed, schema-checked, decided by the gate and given its effect
    /// receipt's place before it gets here, exactly as for the other runners.
    External(Arc<dyn ExternalTool>),
}

impl Runner {
    pub fn is_worker(&self) -> bool {
        matches!(self, Runner::Worker)
    }
    pub fn is_echo(&self) -> bool {
        matches!(self, Runner::Echo)
    }
}

/// A tool whose calls a client outside toolfs's own runners makes (an MCP server's tool).
#[async_trait::async_trait]
pub trait ExternalTool: Send + Sync {
    /// Runs one allowed call with its canonical arguments (`value` is the same, parsed) and
    /// returns what the call file answers: status, content in words, always untrusted when it
    /// came from the tool.
    async fn call(&self, canonical: &[u8], value: &Value) -> crate::envelope::Envelope;
}

pub struct ToolDef {
    /// The tool's file name in the tree.
    pub name: String,
    /// The name the gate decides and receipts name it by: `name` for warren's own tools,
    /// `mcp:<server>:<tool>` for an MCP server's (never a core tool's name).
    pub gate_name: String,
    /// The tier the gate is told with each call: none for warren's own tools (the gate's table
    /// has theirs), an MCP tool's from its operator's definition.
    pub gate_tier: Option<warren_gate::policy::tier::Tier>,
    pub tier: String,
    pub description: String,
    pub doc: String,
    pub schema: Value,
    /// `schema` as served in `<name>/schema`: pretty JSON and a newline.
    pub schema_text: Vec<u8>,
    pub validator: jsonschema::Validator,
    pub runner: Runner,
}

impl ToolDef {
    pub fn new(
        name: String,
        tier: String,
        description: String,
        doc: String,
        schema: Value,
        runner: Runner,
    ) -> Result<ToolDef, String> {
        let validator = jsonschema::validator_for(&schema)
            .map_err(|e| format!("tool {name}: invalid schema: {e}"))?;
        let mut schema_text = serde_json::to_vec_pretty(&schema).map_err(|e| e.to_string())?;
        schema_text.push(b'\n');
        let mut doc = doc;
        if !doc.ends_with('\n') {
            doc.push('\n');
        }
        check_file_name(&name)?;
        Ok(ToolDef {
            gate_name: name.clone(),
            gate_tier: None,
            name,
            tier,
            description,
            doc,
            schema,
            schema_text,
            validator,
            runner,
        })
    }
}

/// A tool's name is a file name in its tree, beside the names the tree serves itself
/// ([`crate::tree::RESERVED_NAMES`]).
fn check_file_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > 128
        || crate::tree::RESERVED_NAMES.contains(&name)
        || name == "."
        || name == ".."
        || name.chars().any(|c| c == '/' || c.is_control())
    {
        return Err(format!("tool name {name:?} cannot be a file name here"));
    }
    Ok(())
}

impl ToolDef {
    /// Names the tool to the gate and the receipts as `gate_name` (see the field).
    pub fn gated_as(mut self, gate_name: String) -> ToolDef {
        self.gate_name = gate_name;
        self
    }

    /// Tells the gate `tier` with each call (see the field).
    pub fn at_tier(mut self, tier: warren_gate::policy::tier::Tier) -> ToolDef {
        self.gate_tier = Some(tier);
        self
    }
}

/// The tools, by name.
pub struct Catalog {
    tools: BTreeMap<String, Arc<ToolDef>>,
}

impl Catalog {
    /// `echo` plus every tool of [`crate::tools::tool_specs`].
    pub fn builtin() -> Result<Catalog, String> {
        let mut tools = BTreeMap::new();
        let echo = ToolDef::new(
            echo::NAME.into(),
            echo::TIER.into(),
            echo::DESCRIPTION.into(),
            echo::DOC.into(),
            echo::schema(),
            Runner::Echo,
        )?;
        tools.insert(echo.name.clone(), Arc::new(echo));
        for spec in crate::tools::tool_specs() {
            let def = ToolDef::new(
                spec.name.to_string(),
                spec.tier.to_string(),
                spec.description.to_string(),
                spec.doc.to_string(),
                spec.schema.clone(),
                Runner::Worker,
            )?;
            if tools.insert(def.name.clone(), Arc::new(def)).is_some() {
                return Err(format!("tool {} is defined twice", spec.name));
            }
        }
        Ok(Catalog { tools })
    }

    /// A catalog of other tools (an MCP server's), each named once.
    pub fn from_defs(defs: Vec<ToolDef>) -> Result<Catalog, String> {
        let mut tools = BTreeMap::new();
        for def in defs {
            let name = def.name.clone();
            if tools.insert(name.clone(), Arc::new(def)).is_some() {
                return Err(format!("tool {name} is defined twice"));
            }
        }
        Ok(Catalog { tools })
    }

    pub fn get(&self, name: &str) -> Option<&Arc<ToolDef>> {
        self.tools.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }
}
