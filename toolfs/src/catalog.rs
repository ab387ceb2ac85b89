//! Every tool toolfs knows: its name, tier, description, doc, schema (compiled once) and where it
//! runs. A connection's tree shows the subset its grant names.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use crate::echo;

/// Where a tool's calls run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runner {
    /// Inside toolfs (only `echo`).
    Echo,
    /// In a worker process holding the tool's authority.
    Worker,
}

pub struct ToolDef {
    pub name: String,
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
    fn new(
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
        Ok(ToolDef {
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
            if def.name.contains(['/', '\t', '\n']) || def.name.is_empty() || def.name == "tools" {
                return Err(format!(
                    "tool name {:?} cannot be a file name here",
                    def.name
                ));
            }
            if tools.insert(def.name.clone(), Arc::new(def)).is_some() {
                return Err(format!("tool {} is defined twice", spec.name));
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
