//! The `memtrace-merge` command line: merge, dump, info, check and compare memtrace traces.
//! A thin layer over the library; every error is one line on stderr and a non-zero exit.

use clap::{Parser, Subcommand};
use memtrace_merge::{dump, Reader};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "memtrace-merge", version, about = "Merge, dump and check memtrace traces (.ctf) of OCaml programs")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print every event as the reference dump tool does
    Dump {
        file: PathBuf,
    },
    /// Re-encode a trace in file order (byte-identical when the format is kept)
    Copy {
        input: PathBuf,
        output: PathBuf,
        /// Output format version (default: the input's; 1 becomes 2)
        #[arg(long)]
        format: Option<u16>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("memtrace-merge: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode, memtrace_merge::Error> {
    match cli.cmd {
        Cmd::Dump { file } => {
            let mut r = Reader::open(&file)?;
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
            let res = dump::dump(&mut r, &mut out, |w| eprintln!("warning: {w}"));
            let _ = out.flush();
            res?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Copy { input, output, format } => {
            let mut r = Reader::open(&input)?;
            let version = format.unwrap_or(r.info().version.max(2));
            let f = std::fs::File::create(&output).map_err(|e| memtrace_merge::Error::io(&output, "create", e))?;
            let out = std::io::BufWriter::with_capacity(1 << 20, f);
            let (_, _, warnings) = memtrace_merge::copy::copy(&mut r, out, memtrace_merge::WriterOptions { version, lossless: false })?;
            for w in warnings {
                eprintln!("warning: {w}");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
