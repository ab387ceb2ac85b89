//! One tool's worker process, exec'd inside the worker namespace nsd built for toolfs (or, with
//! no confinement, by toolfs's own tests); never run by hand. The contract is
//! `specs/worker-protocol.md`.

fn main() -> std::process::ExitCode {
    warren_toolfs::worker::serve::main()
}
