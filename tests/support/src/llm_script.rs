//! The scripted model (`warren-llm-script`): a real HTTP server (OpenAI- or
//! Anthropic-compatible) replaying a script, logging every request it got.

use std::borrow::Borrow;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

/// A running `warren-llm-script`, killed when dropped.
pub struct Script {
    child: Child,
    pub port: u16,
    pub log: PathBuf,
}

impl Script {
    /// Starts the scripted backend with `turns` (written to `dir/script.json`; its request log
    /// is `dir/requests.jsonl`), speaking `api` (`openai` or `anthropic`).
    pub fn start(dir: &Path, api: &str, turns: impl Borrow<Value>) -> Script {
        let script = dir.join("script.json");
        std::fs::write(&script, turns.borrow().to_string()).unwrap();
        let log = dir.join("requests.jsonl");
        let mut child = Command::new(crate::bins::bin("warren-llm-script"))
            .arg("--script")
            .arg(&script)
            .arg("--log")
            .arg(&log)
            .args(["--api", api])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn warren-llm-script");
        let mut first = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        let port = first
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("warren-llm-script printed {first:?}, not its port"));
        Script { child, port, log }
    }

    /// [`Script::start`] speaking OpenAI's API.
    pub fn openai(dir: &Path, turns: &Value) -> Script {
        Script::start(dir, "openai", turns)
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The requests it received, in order (`{"n", "authorization", …, "body"}`).
    pub fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

impl Drop for Script {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
