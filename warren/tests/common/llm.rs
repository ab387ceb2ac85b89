//! The scripted model (`warren-llm-script`, built with the workspace) for the agent's tests: a
//! real OpenAI-compatible HTTP server replaying a script, logging every request it got.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

pub struct Script {
    child: Child,
    pub port: u16,
    pub log: PathBuf,
}

impl Script {
    /// Starts the scripted backend with `turns` (files in `dir`).
    pub fn start(dir: &Path, turns: &Value) -> Script {
        let bin = PathBuf::from(env!("CARGO_BIN_EXE_warren")).with_file_name("warren-llm-script");
        assert!(
            bin.exists(),
            "{} missing: build the workspace first",
            bin.display()
        );
        let script = dir.join("script.json");
        std::fs::write(&script, turns.to_string()).unwrap();
        let log = dir.join("requests.jsonl");
        let mut child = Command::new(bin)
            .arg("--script")
            .arg(&script)
            .arg("--log")
            .arg(&log)
            .args(["--api", "openai"])
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
