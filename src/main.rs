//! The `memtrace-merge` command line: merge, dump, info, check and compare memtrace traces.
//! A thin layer over the library; every error is one line on stderr and a non-zero exit.

use clap::{Parser, Subcommand};
use memtrace_merge::{dump, Reader};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "memtrace-merge",
    version,
    about = "Merge, dump and check memtrace traces (.ctf) of OCaml programs"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print every event as the reference dump tool does
    Dump { file: PathBuf },
    /// Print a trace's header fields and statistics
    Info {
        file: PathBuf,
        /// Machine-readable output (one JSON object)
        #[arg(long)]
        json: bool,
    },
    /// Validate traces: exit 0 if all are valid (warnings allowed), 1 if any is invalid, 2 if one cannot be read
    Check {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Print nothing on success, only the problems on failure
        #[arg(long, short)]
        quiet: bool,
    },
    /// Merge traces (files or directories of .ctf files) into one trace
    Merge {
        /// The merged trace to write (never one of the inputs); `-` for stdout; a device or
        /// FIFO is written through, a symbolic link's target replaced
        #[arg(short, long)]
        output: PathBuf,
        /// Output format: 2 (memtrace <= 0.2, today's viewer) or 3 (OCaml 5 domains);
        /// default: 2 when every input is format 1-2, else 3
        #[arg(long, value_parser = clap::value_parser!(u16).range(2..=3))]
        format: Option<u16>,
        /// Inputs sampled faster than the slowest: thin them (default) or fail
        #[arg(long, value_enum, default_value_t = RateArg::Thin)]
        rate_mismatch: RateArg,
        /// Seed of the random thinning
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Give every backtrace a root frame naming its process
        #[arg(long)]
        tag_processes: bool,
        /// Leave out unreadable inputs (with a warning) instead of failing
        #[arg(long)]
        skip_bad_inputs: bool,
        /// pid recorded in the merged trace (default: the first input's)
        #[arg(long)]
        pid: Option<u64>,
        /// context string of the merged trace
        #[arg(long)]
        context: Option<String>,
        /// No progress line and no summary (warnings are still printed)
        #[arg(short, long)]
        quiet: bool,
        /// Do not print warnings (a truncated input, thinning, a trace given twice, ...)
        #[arg(long)]
        no_warnings: bool,
        /// Flush the output to disk before renaming it into place (survives a power loss)
        #[arg(long)]
        fsync: bool,
        /// Replace an existing output even if it is read-only
        #[arg(long)]
        force: bool,
        /// Merge a trace that another input already holds (a copy, the same earlier merge)
        /// as many times as it is given, rather than once
        #[arg(long)]
        keep_duplicates: bool,
        /// Traces: files, or directories whose *.ctf files are taken in name order (but the
        /// output when it is an earlier merge); a file named twice is merged once
        #[arg(required = true)]
        inputs: Vec<PathBuf>,
    },
    /// Check that a merged trace holds exactly the sources' allocations (time, kind,
    /// samples, length, resolved backtrace, promote and collect times)
    Compare {
        /// The merged trace
        merged: PathBuf,
        /// The source traces
        #[arg(required = true)]
        sources: Vec<PathBuf>,
        /// Sources faster than the slowest were thinned (the merge's default): their merged
        /// allocations may have fewer samples, or be dropped
        #[arg(long)]
        thinned: bool,
        /// The merge was made with --tag-processes: each backtrace starts with its source's frame
        #[arg(long)]
        tagged: bool,
        /// Read each source as the merge does, as far as it reads: one that ends in an error
        /// counts up to it, a format-3 source is read a domain at a time
        #[arg(long)]
        readable_part: bool,
    },
    /// Re-encode a trace in file order (byte-identical when the format is kept; several
    /// format-3 domains to format 2: in time order)
    Copy {
        input: PathBuf,
        output: PathBuf,
        /// Output format version (default: the input's; 1 becomes 2)
        #[arg(long)]
        format: Option<u16>,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum RateArg {
    Thin,
    Fail,
}

fn main() -> ExitCode {
    // A closed stdout or stderr (`info f | head -1`) ends the process quietly, as it does
    // `cat`; other write errors are one line and exit 2, never a panic.
    memtrace_merge::cli::default_broken_pipe_signal();
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            say(format_args!("memtrace-merge: {e}"));
            ExitCode::from(2)
        }
    }
}

/// A line on stderr; if stderr cannot be written, there is nobody to tell.
fn say(line: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Write `text` to stdout, an error naming stdout if that fails.
fn print_out(text: &str) -> Result<(), memtrace_merge::Error> {
    let mut out = std::io::stdout().lock();
    (out.write_all(text.as_bytes()))
        .and_then(|_| out.flush())
        .map_err(stdout_error)
}

fn stdout_error(e: std::io::Error) -> memtrace_merge::Error {
    memtrace_merge::Error::output("<stdout>", "write", e)
}

fn run(cli: Cli) -> Result<ExitCode, memtrace_merge::Error> {
    match cli.cmd {
        Cmd::Info { file, json } => {
            let s = memtrace_merge::summary::summarize_file(&file)?;
            if json {
                print_out(&s.to_json())?;
            } else {
                print_out(&s.to_string())?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Check { files, quiet } => {
            let mut out = std::io::stdout().lock();
            let code = memtrace_merge::check::run_check(&files, quiet, &mut out)
                .and_then(|c| out.flush().map(|_| c))
                .map_err(stdout_error)?;
            Ok(ExitCode::from(code))
        }
        Cmd::Dump { file } => {
            let mut r = Reader::open(&file)?;
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
            let res = dump::dump(&mut r, &mut out, |w| say(format_args!("warning: {w}")));
            let flushed = out.flush().map_err(stdout_error);
            res?;
            flushed?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Merge {
            output,
            format,
            rate_mismatch,
            seed,
            tag_processes,
            skip_bad_inputs,
            pid,
            context,
            quiet,
            no_warnings,
            fsync,
            force,
            keep_duplicates,
            inputs,
        } => {
            let opts = memtrace_merge::merge::MergeOptions {
                format,
                rate_mismatch: match rate_mismatch {
                    RateArg::Thin => memtrace_merge::merge::RateMismatch::Thin,
                    RateArg::Fail => memtrace_merge::merge::RateMismatch::Fail,
                },
                seed,
                tag_processes,
                skip_bad_inputs,
                pid,
                context: context.map(String::into_bytes),
                progress: !quiet,
                fsync,
                force,
                keep_duplicates,
                cancel: memtrace_merge::Cancel::new(),
                decode_threads: None,
                encode_ahead: None,
            };
            memtrace_merge::cli::cancel_on_interrupt(&opts.cancel);
            memtrace_merge::cli::ignore_file_size_signal();
            let report = memtrace_merge::merge::merge(&inputs, &output, &opts);
            if let Err(memtrace_merge::Error::Cancelled) = report {
                if memtrace_merge::cli::first_to_report_interrupt() {
                    say(format_args!(
                        "memtrace-merge: interrupted; no output written"
                    ));
                }
                return Ok(ExitCode::from(130));
            }
            let report = report?;
            if !no_warnings {
                let w = memtrace_merge::merge::format_warnings(&report);
                let _ = std::io::stderr().lock().write_all(w.as_bytes());
            }
            if !quiet {
                let s = memtrace_merge::merge::format_report(&report);
                let _ = std::io::stderr().lock().write_all(s.as_bytes());
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Compare {
            merged,
            sources,
            thinned,
            tagged,
            readable_part,
        } => {
            let sources = memtrace_merge::merge::expand_inputs(&sources, &merged)?;
            let opts = memtrace_merge::compare::CompareOptions {
                thinned,
                tagged,
                readable_part,
            };
            let r = memtrace_merge::compare::compare(&sources, &merged, opts)?;
            print_out(&format!(
                "sources: {} allocs, {} samples{}; merged: {} allocs, {} samples; missing {}, extra {}, dropped by thinning {}, impossible events {}, warnings {}: {}\n",
                r.source_allocs,
                r.source_samples,
                if r.sources_cut > 0 {
                    format!(" ({} taken as far as they read)", r.sources_cut)
                } else {
                    String::new()
                },
                r.merged_allocs,
                r.merged_samples,
                r.missing,
                r.extra,
                r.dropped,
                r.merged_bad_events,
                r.merged_warnings,
                if r.equal() { "equal" } else { "DIFFERENT" }
            ))?;
            Ok(if r.equal() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Cmd::Copy {
            input,
            output,
            format,
        } => {
            memtrace_merge::cli::cancel_on_interrupt(&memtrace_merge::Cancel::new());
            memtrace_merge::cli::ignore_file_size_signal();
            let warnings = memtrace_merge::copy::copy_file(&input, &output, format)?;
            for w in warnings {
                say(format_args!("warning: {w}"));
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
