//! warren-receipt-append SOCKET [REQUEST...]: appends each request (JSON; one per stdin line when
//! none are given) through `/receipts/append` and prints each reply. A small client for operators,
//! scripts and tests; exit 0 when every append was acknowledged, 3 on the first refusal, 2 usage.

use std::io::BufRead;
use std::path::PathBuf;
use std::process::ExitCode;

use warren_proto::receipts::Appender;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(socket) = args.next().map(PathBuf::from) else {
        eprintln!("usage: warren-receipt-append SOCKET [REQUEST...]");
        return ExitCode::from(2);
    };
    let mut requests: Vec<String> = args.collect();
    if requests.is_empty() {
        requests = std::io::stdin()
            .lock()
            .lines()
            .map_while(Result::ok)
            .filter(|l| !l.trim().is_empty())
            .collect();
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let appender = match Appender::connect(&socket).await {
            Ok(a) => a,
            Err(e) => {
                eprintln!("warren-receipt-append: {}: {e}", socket.display());
                return ExitCode::from(1);
            }
        };
        for req in requests {
            match appender.append(req.as_bytes()).await {
                Ok(r) => println!("{{\"hash\":\"{}\",\"seq\":{}}}", r.hash, r.seq),
                Err(refusal) => {
                    println!("{}", refusal.message);
                    eprintln!("warren-receipt-append: {refusal}");
                    return ExitCode::from(3);
                }
            }
        }
        ExitCode::SUCCESS
    })
}
