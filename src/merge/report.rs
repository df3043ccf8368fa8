//! A merge's report for people: a line per input and the totals, and the warnings.

use super::MergeReport;

/// A person-readable summary of a merge: one line per input, then the totals (warnings
/// apart: [`format_warnings`]).
pub fn format_report(r: &MergeReport) -> String {
    let mut s = String::new();
    for i in &r.inputs {
        if i.skipped {
            s.push_str(&format!("{}: skipped\n", i.path.display()));
            continue;
        }
        s.push_str(&format!(
            "{}: pid {}, format {}, rate {}: {} events ({} allocs, {} promotes, {} collects); {} allocs written{}{}{}{}\n",
            i.path.display(),
            i.pid,
            i.format,
            i.sample_rate,
            i.events,
            i.allocs,
            i.promotes,
            i.collects,
            i.allocs_written,
            if i.skipped_packets > 0 { format!(", {} packets skipped", i.skipped_packets) } else { String::new() },
            if i.remapped_codes > 0 { format!(", {} location codes renumbered", i.remapped_codes) } else { String::new() },
            if i.keep_fraction < 1.0 { format!(", thinned to {:.2}% of its samples", 100.0 * i.keep_fraction) } else { String::new() },
            if i.copied { ", its packets copied" } else { "" },
        ));
    }
    s.push_str(&format!(
        "{}: format {}, {} allocs, {} promotes, {} collects{}\n",
        r.output.display(),
        r.format,
        r.allocs,
        r.promotes,
        r.collects,
        if r.remapped_codes > 0 {
            format!(", {} location codes renumbered", r.remapped_codes)
        } else {
            String::new()
        },
    ));
    s
}

/// Every warning of a merge, a line each, naming its input (the reader's name it already).
pub fn format_warnings(r: &MergeReport) -> String {
    let mut s = String::new();
    for w in &r.argument_warnings {
        s.push_str(&format!("warning: {w}\n"));
    }
    for i in &r.inputs {
        let path = i.path.display().to_string();
        for w in &i.warnings {
            if w.starts_with(&format!("{path}: ")) {
                s.push_str(&format!("warning: {w}\n"));
            } else {
                s.push_str(&format!("warning: {path}: {w}\n"));
            }
        }
    }
    s
}
