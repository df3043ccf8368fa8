//! Flame graphs: folded stacks (`a;b;c weight`) drawn as one interactive SVG (zoom by click,
//! search with Ctrl-F) by inferno, whose types stay inside this module.

use std::io::Write;

/// How a flame graph is titled and what its widths count.
#[derive(Clone, Debug)]
pub struct FlameOptions {
    /// The title at the top of the picture.
    pub title: String,
    /// A line under the title (the inputs, the mode).
    pub subtitle: Option<String>,
    /// What a width counts: `bytes`, `samples`, `objects`.
    pub count_name: String,
    /// Frames narrower than this many pixels (of a 1,200-pixel-wide graph) are left out
    /// (None: inferno's default, 0.01).
    pub min_width: Option<f64>,
}

/// Draw `stacks` (frames caller first, `;` between them, as [`crate::analysis::Analysis::folded`]
/// gives them) as an SVG into `out`. No stack is an error: inferno draws nothing then.
pub fn write_svg(
    stacks: &[(String, u64)],
    opts: &FlameOptions,
    out: impl Write,
) -> std::io::Result<()> {
    let lines: Vec<String> = (stacks.iter())
        .filter(|(_, w)| *w > 0)
        .map(|(s, w)| format!("{s} {w}"))
        .collect();
    if lines.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "no stack to draw: every weight is zero",
        ));
    }
    let mut o = inferno::flamegraph::Options::default();
    o.title = opts.title.clone();
    o.subtitle = opts.subtitle.clone();
    o.count_name = opts.count_name.clone();
    o.name_type = "Function:".into();
    if let Some(w) = opts.min_width {
        o.min_width = w;
    }
    o.colors =
        inferno::flamegraph::color::Palette::Basic(inferno::flamegraph::color::BasicPalette::Mem);
    // (the same input draws the same picture: colours from names, not a random generator)
    o.hash = true;
    o.deterministic = true;
    inferno::flamegraph::from_lines(&mut o, lines.iter().map(String::as_str), out)
}

/// Folded stacks as text, one `stack weight` line each (flamegraph.pl's and speedscope's
/// input).
pub fn write_folded(stacks: &[(String, u64)], mut out: impl Write) -> std::io::Result<()> {
    for (s, w) in stacks {
        if *w > 0 {
            writeln!(out, "{s} {w}")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_every_frame_with_its_weight() {
        let stacks = vec![
            ("main;Worker.run;Array.make".to_string(), 3000),
            ("main;Worker.run;List.map".to_string(), 1000),
            ("main;idle".to_string(), 0),
        ];
        let opts = FlameOptions {
            title: "peak".into(),
            subtitle: None,
            count_name: "bytes".into(),
            min_width: None,
        };
        let mut svg = Vec::new();
        write_svg(&stacks, &opts, &mut svg).unwrap();
        let svg = String::from_utf8(svg).unwrap();
        assert!(svg.starts_with("<?xml"));
        assert!(svg.contains("Array.make (3,000 bytes, 75.00%)"), "{svg}");
        assert!(svg.contains("Worker.run (4,000 bytes, 100.00%)"));
        assert!(!svg.contains("idle"));
        let empty = [("a".to_string(), 0)];
        assert!(write_svg(&empty, &opts, &mut Vec::new()).is_err());
    }
}
