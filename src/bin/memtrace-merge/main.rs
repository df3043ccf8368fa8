//! The `memtrace-merge` command line: merge, dump, info, check and compare memtrace traces,
//! and analyse them (top, timeline, flamegraph, export, diff, report). A thin layer over the
//! library; every error is one line on stderr and a non-zero exit.

mod analyze;
mod render;
mod report;

use clap::{Parser, Subcommand};
use memtrace_merge::tools::dump;
use memtrace_merge::Reader;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "memtrace-merge",
    version,
    about = "Merge, dump, check and analyse memtrace traces (.ctf) of OCaml programs"
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
    Merge(MergeArgs),
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
    /// Where the memory goes: the sites that allocate, or hold memory at the run's peak,
    /// at the end or at a time; per process and in all
    Top(analyze::TopArgs),
    /// The live heap of each process and of the whole run over time, the peaks marked
    Timeline(analyze::TimelineArgs),
    /// An interactive SVG flame graph (or folded stacks) of what is allocated or live
    Flamegraph(analyze::FlameArgs),
    /// Another tool's format: a pprof profile (allocated and in-use objects and bytes,
    /// labelled by pid, executable, domain and source)
    Export(analyze::ExportArgs),
    /// What changed between two runs (traces or directories): per site, the change of
    /// bytes allocated and live at the peak, largest first
    Diff(analyze::DiffArgs),
    /// One self-contained HTML page of the run: its processes, the live heap over time,
    /// flame graphs and sites tables (opens offline in any browser)
    Report(report::ReportArgs),
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

/// `memtrace-merge merge`'s arguments.
#[derive(clap::Args)]
struct MergeArgs {
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
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // (help, the version, and the help a bare command prints, as the parser gives them)
        Err(e)
            if !e.use_stderr()
                || e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand =>
        {
            e.exit()
        }
        Err(e) => {
            say(format_args!(
                "memtrace-merge: {}",
                one_line(&e.render().to_string())
            ));
            return ExitCode::from(2);
        }
    };
    match run(cli) {
        Ok(code) => code,
        Err(memtrace_merge::Error::Cancelled) => {
            if memtrace_merge::cli::first_to_report_interrupt() {
                say(format_args!(
                    "memtrace-merge: interrupted; no output written"
                ));
            }
            ExitCode::from(130)
        }
        Err(e @ memtrace_merge::Error::NothingToAnalyse(_)) => {
            say(format_args!("memtrace-merge: {e}"));
            ExitCode::from(1)
        }
        Err(e) => {
            say(format_args!("memtrace-merge: {e}"));
            ExitCode::from(2)
        }
    }
}

/// A usage error of the parser as one line, as every refusal is: its first paragraph (the
/// error and what it lists), without the usage and advice after it.
fn one_line(text: &str) -> String {
    let words: Vec<&str> = (text.lines())
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect();
    let line = words.join(" ");
    line.strip_prefix("error: ").unwrap_or(&line).to_string()
}

/// A line on stderr; if stderr cannot be written, there is nobody to tell.
fn say(line: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// `info --json`: the summary as one object, keys in a fixed order; strings are the
/// trace's bytes as UTF-8 (invalid bytes replaced), a time or rate not known is null.
fn summary_json(s: &memtrace_merge::tools::summary::Summary) -> String {
    let i = &s.info;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let finite = |v: f64| v.is_finite().then_some(v);
    let v = serde_json::json!({
        "file": s.file,
        "file_size": s.file_size,
        "format_version": i.version,
        "sample_rate": finite(i.sample_rate),
        "word_size": i.word_size,
        "executable_name": text(&i.executable_name),
        "host_name": text(&i.host_name),
        "ocaml_runtime_params": text(&i.ocaml_runtime_params),
        "pid": i.pid,
        "start_time_us": i.start_time.0,
        "context": i.context.as_deref().map(text),
        "initial_domain": i.initial_domain.0,
        "events": s.events,
        "allocs": s.allocs(),
        "minor_allocs": s.minor_allocs,
        "major_allocs": s.major_allocs,
        "external_allocs": s.external_allocs,
        "promotes": s.promotes,
        "collects": s.collects,
        "samples": s.samples,
        "first_event_us": s.first_event_us,
        "last_event_us": s.last_event_us,
        "duration_s": finite(s.duration_s()),
        "max_backtrace_length": s.max_backtrace_length,
        "distinct_location_codes": s.distinct_location_codes,
        "defined_location_codes": s.defined_location_codes,
        "packets": s.packets,
        "skipped_packets": s.skipped_packets,
        "domains": s.domains,
        "warnings_dropped": s.warnings_dropped,
        "warnings": s.warnings,
    });
    let mut out = serde_json::to_string_pretty(&v).unwrap_or_default();
    out.push('\n');
    out
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
            let s = memtrace_merge::tools::summary::summarize_file(&file)?;
            print_out(&if json {
                summary_json(&s)
            } else {
                s.to_string()
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Check { files, quiet } => {
            let mut out = std::io::stdout().lock();
            let code = check_files(&files, quiet, &mut out)
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
        Cmd::Merge(args) => merge(args),
        Cmd::Top(a) => analyze::top(a).map(|_| ExitCode::SUCCESS),
        Cmd::Timeline(a) => analyze::timeline(a).map(|_| ExitCode::SUCCESS),
        Cmd::Flamegraph(a) => analyze::flamegraph(a).map(|_| ExitCode::SUCCESS),
        Cmd::Export(a) => analyze::export(a).map(|_| ExitCode::SUCCESS),
        Cmd::Diff(a) => analyze::diff(a).map(|_| ExitCode::SUCCESS),
        Cmd::Report(a) => report::report(a).map(|_| ExitCode::SUCCESS),
        Cmd::Compare {
            merged,
            sources,
            thinned,
            tagged,
            readable_part,
        } => {
            let sources = memtrace_merge::expand_inputs(&sources, &merged)?;
            let opts = memtrace_merge::tools::compare::CompareOptions {
                thinned,
                tagged,
                readable_part,
            };
            let r = memtrace_merge::tools::compare::compare(&sources, &merged, opts)?;
            print_out(&format!("{r}\n"))?;
            Ok(ExitCode::from(if r.equal() { 0 } else { 1 }))
        }
        Cmd::Copy {
            input,
            output,
            format,
        } => {
            memtrace_merge::cli::cancel_on_interrupt(&memtrace_merge::Cancel::new());
            memtrace_merge::cli::ignore_file_size_signal();
            let warnings = memtrace_merge::tools::copy::copy_file(&input, &output, format)?;
            for w in warnings {
                say(format_args!("warning: {w}"));
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `memtrace-merge merge`: SIGINT and SIGTERM cancel it (exit 130); warnings, then the
/// report, on stderr.
fn merge(a: MergeArgs) -> Result<ExitCode, memtrace_merge::Error> {
    let opts = memtrace_merge::MergeOptions {
        format: a.format,
        rate_mismatch: match a.rate_mismatch {
            RateArg::Thin => memtrace_merge::RateMismatch::Thin,
            RateArg::Fail => memtrace_merge::RateMismatch::Fail,
        },
        seed: a.seed,
        tag_processes: a.tag_processes,
        skip_bad_inputs: a.skip_bad_inputs,
        pid: a.pid,
        context: a.context.map(String::into_bytes),
        progress: !a.quiet,
        fsync: a.fsync,
        force: a.force,
        keep_duplicates: a.keep_duplicates,
        ..Default::default()
    };
    memtrace_merge::cli::cancel_on_interrupt(&opts.cancel);
    memtrace_merge::cli::ignore_file_size_signal();
    let report = match memtrace_merge::merge(&a.inputs, &a.output, &opts) {
        Err(memtrace_merge::Error::Cancelled) => {
            if memtrace_merge::cli::first_to_report_interrupt() {
                say(format_args!(
                    "memtrace-merge: interrupted; no output written"
                ));
            }
            return Ok(ExitCode::from(130));
        }
        r => r?,
    };
    let mut err = std::io::stderr().lock();
    if !a.no_warnings {
        let _ = err.write_all(memtrace_merge::format_warnings(&report).as_bytes());
    }
    if !a.quiet {
        let _ = err.write_all(memtrace_merge::format_report(&report).as_bytes());
    }
    Ok(ExitCode::SUCCESS)
}

/// The `check` command: check every file, print per file `FILE: ok allocs=.. ..` plus its
/// warnings, or its problems; with `quiet`, print only problems. Returns the exit status:
/// 0 all valid (warnings allowed), 1 some file invalid, 2 some file could not be read at all
/// (I/O error: not found, permission...).
fn check_files(
    files: &[impl AsRef<std::path::Path>],
    quiet: bool,
    out: &mut impl Write,
) -> std::io::Result<u8> {
    let opts = memtrace_merge::tools::check::CheckOptions::default();
    let mut status = 0u8;
    for f in files {
        let name = f.as_ref().display().to_string();
        match memtrace_merge::tools::check::check_file(f, &opts) {
            Err(e) => {
                match e {
                    memtrace_merge::Error::Io { op, source, .. } => {
                        writeln!(out, "{name}: error: {op}: {source}")?
                    }
                    e => writeln!(out, "{name}: error: {e}")?,
                }
                status = 2;
            }
            Ok(rep) => {
                if rep.is_valid() {
                    if !quiet {
                        writeln!(out, "{name}: ok {}", rep.counts())?;
                        for w in &rep.warnings {
                            writeln!(out, "{}: warning: {}", w.at, w.what)?;
                        }
                        if rep.warnings_dropped > 0 {
                            writeln!(
                                out,
                                "{name}: warning: {} more warnings",
                                rep.warnings_dropped
                            )?;
                        }
                    }
                } else {
                    status = status.max(1);
                    if !quiet {
                        let n = rep.problems.len() as u64 + rep.problems_dropped;
                        let s = if n == 1 { "" } else { "s" };
                        let when = if rep.reader_error {
                            ", read before the error"
                        } else {
                            ""
                        };
                        writeln!(
                            out,
                            "{name}: INVALID ({n} problem{s}) {}{when}",
                            rep.counts()
                        )?;
                    }
                    for p in &rep.problems {
                        writeln!(out, "{}: error: {}", p.at, p.message)?;
                    }
                    if rep.problems_dropped > 0 {
                        writeln!(out, "{name}: error: {} more problems", rep.problems_dropped)?;
                    }
                    if !quiet {
                        for w in &rep.warnings {
                            writeln!(out, "{}: warning: {}", w.at, w.what)?;
                        }
                    }
                }
            }
        }
    }
    Ok(status)
}
