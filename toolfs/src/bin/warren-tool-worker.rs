//! One tool's worker process, started by toolfs (never by hand): see specs/worker-protocol.md.

fn main() -> std::process::ExitCode {
    warren_toolfs::worker::serve::main()
}
