//! `memtrace-merge report`: the analysis of the inputs as one self-contained HTML page
//! (the library's `export::report` draws it), written to a file.

use crate::analyze::{run_analysis, Inputs};
use memtrace_merge::export::report::{write_html, ReportOptions};
use memtrace_merge::Error;
use std::path::PathBuf;

/// `memtrace-merge report`.
#[derive(clap::Args)]
pub struct ReportArgs {
    #[command(flatten)]
    pub inputs: Inputs,
    /// The HTML page to write; `-` for stdout
    #[arg(short, long)]
    pub output: PathBuf,
    /// Rows of each sites table
    #[arg(long, default_value_t = ReportOptions::default().sites)]
    pub sites: usize,
    /// Processes (the largest at their peak) with flame graphs and tables of their own
    #[arg(long, default_value_t = ReportOptions::default().processes)]
    pub processes: usize,
    /// Processes drawn apart in the chart (the others summed as one)
    #[arg(long, default_value_t = ReportOptions::default().series)]
    pub series: usize,
}

pub fn report(a: ReportArgs) -> Result<(), Error> {
    memtrace_merge::check_output(&a.output, &a.inputs.inputs)?;
    let an = run_analysis(&a.inputs, None, None)?;
    let opts = ReportOptions {
        sites: a.sites,
        processes: a.processes,
        series: a.series,
        ..ReportOptions::default()
    };
    memtrace_merge::write_output(&a.output, &a.inputs.inputs, |w| write_html(an, &opts, w))
}
