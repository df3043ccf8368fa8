//! The analysis commands: `top`, `timeline`, `flamegraph`, `export` and `diff`, each an
//! [`analyze`] of the inputs read into a report, printed as text or JSON, or written to a file.

use crate::render;
use memtrace_merge::analysis::{analyze, Analysis, AnalysisOptions, By, Filter, Mode, TimeSpec};
use memtrace_merge::{AllocSource, Error};
use std::path::PathBuf;

/// The inputs and which of their allocations count: what every analysis command takes.
#[derive(clap::Args, Clone)]
pub struct Inputs {
    /// Traces: files, directories of .ctf files, pipes (several are merged on the fly)
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    #[command(flatten)]
    pub filters: Filters,
}

/// Which allocations count.
#[derive(clap::Args, Clone)]
pub struct Filters {
    /// Only this process (repeatable; times stay since the earliest start of all inputs)
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u64>,
    /// Allocations from this time: seconds since the earliest start (`2.5`), or since the
    /// epoch (`@1700000000.25`)
    #[arg(long, value_parser = time_spec)]
    pub from: Option<TimeSpec>,
    /// Allocations up to this time (as --from)
    #[arg(long, value_parser = time_spec)]
    pub to: Option<TimeSpec>,
    /// Only the allocations of this domain (OCaml 5); their collects count in whichever
    /// domain wrote them
    #[arg(long)]
    pub domain: Option<u16>,
    /// Only allocations of this kind
    #[arg(long, value_enum)]
    pub source: Option<SourceArg>,
    /// Only blocks of at least this many bytes
    #[arg(long, value_name = "BYTES")]
    pub min_size: Option<u64>,
    /// Only blocks of at most this many bytes
    #[arg(long, value_name = "BYTES")]
    pub max_size: Option<u64>,
    /// Do not print warnings (a damaged input, a trace given twice, ...)
    #[arg(long)]
    pub no_warnings: bool,
}

/// `--source`.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum SourceArg {
    Minor,
    Major,
    External,
}

/// `--by`.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum ByArg {
    Function,
    Location,
    Backtrace,
}

impl From<ByArg> for By {
    fn from(b: ByArg) -> By {
        match b {
            ByArg::Function => By::Function,
            ByArg::Location => By::Location,
            ByArg::Backtrace => By::Backtrace,
        }
    }
}

/// `--mode`: `alloc`, `peak`, `end` or `at=T`.
#[derive(Clone, Copy, Debug)]
pub struct ModeArg {
    pub mode: Mode,
    pub at: Option<TimeSpec>,
}

pub fn mode_arg(s: &str) -> Result<ModeArg, String> {
    let plain = |mode| Ok(ModeArg { mode, at: None });
    match s {
        "alloc" => plain(Mode::Alloc),
        "peak" => plain(Mode::Peak),
        "end" => plain(Mode::End),
        _ => match s.strip_prefix("at=").and_then(TimeSpec::parse) {
            Some(t) => Ok(ModeArg {
                mode: Mode::At,
                at: Some(t),
            }),
            None => Err(format!(
                "`{s}`: expected alloc, peak, end or at=T (T seconds since the start, or \
                 @seconds since the epoch)"
            )),
        },
    }
}

/// `export --mode`: when "in use" is taken, `peak`, `end` or `at=T` (a profile holds what
/// was allocated whatever the mode).
pub fn in_use_mode_arg(s: &str) -> Result<ModeArg, String> {
    match mode_arg(s)? {
        ModeArg {
            mode: Mode::Alloc, ..
        } => Err(format!(
            "`{s}`: a profile always holds what was allocated; --mode says when in use is \
             taken: peak, end or at=T"
        )),
        m => Ok(m),
    }
}

fn time_spec(s: &str) -> Result<TimeSpec, String> {
    TimeSpec::parse(s).ok_or_else(|| {
        format!("`{s}`: expected seconds since the start (2.5) or since the epoch (@1700000000)")
    })
}

/// Analyse the inputs (`at`: the time of `--mode at=T`; `step_us`: the timeline's),
/// warnings on stderr. The analysis lives as long as the process: it is one command's
/// answer, and the process ends when it is given (its memory goes with the process,
/// sooner than when freed a table at a time).
pub fn run_analysis(
    i: &Inputs,
    at: Option<TimeSpec>,
    step_us: Option<u64>,
) -> Result<&'static Analysis, Error> {
    analyse_with(&i.inputs, &i.filters, at, step_us).map(|a| &*Box::leak(Box::new(a)))
}

fn analyse_with(
    inputs: &[PathBuf],
    i: &Filters,
    at: Option<TimeSpec>,
    step_us: Option<u64>,
) -> Result<Analysis, Error> {
    let opts = AnalysisOptions {
        filter: Filter {
            pids: i.pids.clone(),
            from: i.from,
            to: i.to,
            domain: i.domain,
            source: i.source.map(|s| match s {
                SourceArg::Minor => AllocSource::Minor,
                SourceArg::Major => AllocSource::Major,
                SourceArg::External => AllocSource::External,
            }),
            min_size: i.min_size,
            max_size: i.max_size,
        },
        at,
        step_us,
        ..AnalysisOptions::default()
    };
    memtrace_merge::cli::cancel_on_interrupt(&opts.cancel);
    let a = analyze(inputs, &opts)?;
    if !i.no_warnings {
        for w in a.warnings() {
            crate::say(format_args!("warning: {w}"));
        }
        for p in a.processes() {
            for w in &p.warnings {
                let w = memtrace_merge::analysis::named_warning(&p.file, w);
                crate::say(format_args!("warning: {w}"));
            }
        }
    }
    Ok(a)
}

/// `memtrace-merge top`.
#[derive(clap::Args)]
pub struct TopArgs {
    #[command(flatten)]
    pub inputs: Inputs,
    /// Rank sites by bytes allocated, live at the run's peak, live at the end (leaks), or
    /// live at a time (at=T)
    #[arg(long, value_parser = mode_arg, default_value = "peak")]
    pub mode: ModeArg,
    /// What a site is: the allocating function, its source location, or the whole backtrace
    #[arg(long, value_enum, default_value_t = ByArg::Function)]
    pub by: ByArg,
    /// Also each process's own table (at its own peak, for --mode peak)
    #[arg(long)]
    pub per_process: bool,
    /// How many sites in each table
    #[arg(short = 'n', default_value_t = 20)]
    pub n: usize,
    /// One JSON object (its schema is in the README)
    #[arg(long)]
    pub json: bool,
}

pub fn top(a: TopArgs) -> Result<(), Error> {
    let an = run_analysis(&a.inputs, a.mode.at, None)?;
    let top = an.top(a.mode.mode, a.by.into(), a.per_process || a.json);
    crate::print_out(&if a.json {
        render::top_json(&top, a.n)
    } else {
        render::top_text(&top, a.n)
    })
}

/// `memtrace-merge timeline`.
#[derive(clap::Args)]
pub struct TimelineArgs {
    #[command(flatten)]
    pub inputs: Inputs,
    /// Comma-separated values: a row per step, a column per process
    #[arg(long, conflicts_with = "json")]
    pub csv: bool,
    /// One JSON object
    #[arg(long)]
    pub json: bool,
    /// The step in milliseconds (default: 1 ms doubled until there are at most 1,024 steps,
    /// fewer past 1,024 processes; the text table is coarser, at most 40 rows). A step
    /// given may make at most 1,048,576 steps (2^24 values in all)
    #[arg(long, value_name = "MS")]
    pub step: Option<f64>,
}

pub fn timeline(a: TimelineArgs) -> Result<(), Error> {
    let step_us = match a.step {
        // (times are whole microseconds: a shorter step would be one of them, and named so)
        Some(ms) if ms.is_finite() && ms * 1000.0 >= 0.5 => Some((ms * 1000.0).round() as u64),
        Some(ms) if ms.is_finite() && ms > 0.0 => {
            return Err(Error::Usage(format!(
                "--step {ms}: shorter than a microsecond, the traces' resolution (0.001 ms)"
            )))
        }
        Some(ms) => return Err(Error::Usage(format!("--step {ms}: not a positive time"))),
        None => None,
    };
    let an = run_analysis(&a.inputs, None, step_us)?;
    let t = an.timeline();
    crate::print_out(&if a.json {
        render::timeline_json(&t)
    } else if a.csv {
        render::timeline_csv(&t)
    } else {
        render::timeline_text(&t, step_us.is_none())
    })
}

/// `--weight`.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum WeightArg {
    Bytes,
    Samples,
    Objects,
}

/// `memtrace-merge flamegraph`.
#[derive(clap::Args)]
pub struct FlameArgs {
    #[command(flatten)]
    pub inputs: Inputs,
    /// The SVG (or with --folded the folded stacks) to write; `-` for stdout
    #[arg(short, long)]
    pub output: PathBuf,
    /// What the widths show: bytes allocated, live at the run's peak, live at the end, or
    /// live at a time (at=T)
    #[arg(long, value_parser = mode_arg, default_value = "peak")]
    pub mode: ModeArg,
    /// A root frame for each process
    #[arg(long)]
    pub by_process: bool,
    /// Write the folded stacks (`a;b;c weight`) rather than an SVG
    #[arg(long)]
    pub folded: bool,
    /// What the widths count
    #[arg(long, value_enum, default_value_t = WeightArg::Bytes)]
    pub weight: WeightArg,
}

pub fn flamegraph(a: FlameArgs) -> Result<(), Error> {
    use memtrace_merge::analysis::Weight;
    use memtrace_merge::export::flamegraph::{write_folded, write_svg, FlameOptions};
    memtrace_merge::check_output(&a.output, &a.inputs.inputs)?;
    let an = run_analysis(&a.inputs, a.mode.at, None)?;
    let (weight, count_name) = match a.weight {
        WeightArg::Bytes => (Weight::Bytes, "bytes"),
        WeightArg::Samples => (Weight::Samples, "samples"),
        WeightArg::Objects => (Weight::Objects, "objects"),
    };
    let stacks = an.folded(a.mode.mode, weight, a.by_process);
    if stacks.iter().all(|(_, w)| *w == 0) {
        return Err(Error::NothingToAnalyse(format!(
            "no {count_name} {}: the flame graph would be empty",
            render::mode_phrase(an, a.mode.mode)
        )));
    }
    let opts = FlameOptions {
        title: format!("{} {}", count_name, render::mode_phrase(an, a.mode.mode)),
        subtitle: Some(render::inputs_phrase(an)),
        count_name: count_name.into(),
        min_width: None,
    };
    memtrace_merge::write_output(&a.output, &a.inputs.inputs, |w| {
        if a.folded {
            write_folded(&stacks, w)
        } else {
            write_svg(&stacks, &opts, w)
        }
    })
}

/// `export --format` (not `--to`, which ends the time window).
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum ExportFormat {
    /// A pprof profile (gzipped protocol buffer) for `go tool pprof`
    Pprof,
}

/// `memtrace-merge export`.
#[derive(clap::Args)]
pub struct ExportArgs {
    #[command(flatten)]
    pub inputs: Inputs,
    /// The format
    #[arg(long, value_enum, default_value = "pprof")]
    pub format: ExportFormat,
    /// The file to write; `-` for stdout
    #[arg(short, long)]
    pub output: PathBuf,
    /// When "in use" is taken: at the run's peak, at the end, or at a time (at=T)
    #[arg(long, value_parser = in_use_mode_arg, default_value = "peak")]
    pub mode: ModeArg,
}

pub fn export(a: ExportArgs) -> Result<(), Error> {
    memtrace_merge::check_output(&a.output, &a.inputs.inputs)?;
    let an = run_analysis(&a.inputs, a.mode.at, None)?;
    match a.format {
        ExportFormat::Pprof => {
            let p = memtrace_merge::export::pprof_profile(an, a.mode.mode);
            memtrace_merge::write_output(&a.output, &a.inputs.inputs, |w| p.write_gz(w))
        }
    }
}

/// `memtrace-merge diff`.
#[derive(clap::Args)]
pub struct DiffArgs {
    /// The traces before: a file or a directory of them
    pub base: PathBuf,
    /// The traces after
    pub new: PathBuf,
    #[command(flatten)]
    pub filters: Filters,
    /// Rank sites by the change of bytes allocated, live at each run's peak, or live at the
    /// end
    #[arg(long, value_enum, default_value_t = DiffMode::Peak)]
    pub mode: DiffMode,
    /// What a site is
    #[arg(long, value_enum, default_value_t = ByArg::Function)]
    pub by: ByArg,
    /// How many sites
    #[arg(short = 'n', default_value_t = 20)]
    pub n: usize,
    /// One JSON object
    #[arg(long)]
    pub json: bool,
}

/// `diff --mode`.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum DiffMode {
    Alloc,
    Peak,
    End,
}

pub fn diff(a: DiffArgs) -> Result<(), Error> {
    // (a run that holds nothing the filters keep is a run of nothing: what appeared or
    // went away is what a diff is for)
    let side = |what: &str, p: &PathBuf| -> Result<Option<Analysis>, Error> {
        match analyse_with(std::slice::from_ref(p), &a.filters, None, None) {
            Ok(an) => Ok(Some(an)),
            Err(Error::NothingToAnalyse(why)) => {
                if !a.filters.no_warnings {
                    crate::say(format_args!(
                        "warning: {what} {}: {why}; taken as nothing",
                        p.display()
                    ));
                }
                Ok(None)
            }
            Err(e) => Err(e),
        }
    };
    let (base, new) = (side("base", &a.base)?, side("new", &a.new)?);
    if base.is_none() && new.is_none() {
        return Err(Error::NothingToAnalyse(format!(
            "neither {} nor {} holds an allocation the filters keep: nothing to compare",
            a.base.display(),
            a.new.display()
        )));
    }
    let mode = match a.mode {
        DiffMode::Alloc => Mode::Alloc,
        DiffMode::Peak => Mode::Peak,
        DiffMode::End => Mode::End,
    };
    let d = memtrace_merge::analysis::diff(base.as_ref(), new.as_ref(), mode, a.by.into());
    crate::print_out(&if a.json {
        render::diff_json(&d, a.n)
    } else {
        render::diff_text(&d, a.n)
    })
}
