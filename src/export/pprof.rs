//! pprof profiles (`profile.proto`, gzipped) of an analysis: prost messages of our own,
//! written so that `go tool pprof` reads them.

use std::collections::HashMap;
use std::io::Write;

use prost::Message;

use crate::analysis::Frame;

/// A pprof profile being built: sample types, then samples.
///
/// Strings, functions and locations are interned as samples come, so a profile of many
/// samples over few program places stays small.
pub struct ProfileBuilder {
    profile: Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<(String, String), u64>,
    locations: HashMap<Vec<Frame>, u64>,
    /// Samples by (leaf-first location ids, labels), so that repeated ones add up in one.
    samples: HashMap<(Vec<u64>, Vec<LabelKey>), usize>,
}

/// A label's key, text, number and unit, as string-table indices and number (a `Label` is not
/// `Hash`).
type LabelKey = (i64, i64, i64, i64);

/// A label's value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LabelValue {
    /// A text, e.g. an executable's name (pprof drops an empty one).
    Str(String),
    /// A number, e.g. a process id. Written with the label's key as its unit (`pid:[101
    /// pid]` in `go tool pprof -raw`): pprof drops a number without a unit when it is 0, as
    /// domain 0 is.
    Num(i64),
}

/// The one mapping every location belongs to: pprof wants one, and its `has_*` flags tell it
/// the locations carry their own symbols (nothing to look up in a binary).
const MAPPING_ID: u64 = 1;

impl ProfileBuilder {
    /// A profile whose samples carry one value per `sample_types` entry, (type, unit) pairs
    /// e.g. `[("alloc_objects", "count"), ("alloc_space", "bytes"), ("inuse_objects",
    /// "count"), ("inuse_space", "bytes")]`. `default_sample_type` names one of them: the one
    /// pprof shows when not told (it takes the last one if the name matches none).
    pub fn new(sample_types: &[(&str, &str)], default_sample_type: &str) -> ProfileBuilder {
        let mut b = ProfileBuilder {
            profile: Profile::default(),
            strings: HashMap::new(),
            functions: HashMap::new(),
            locations: HashMap::new(),
            samples: HashMap::new(),
        };
        // pprof requires string_table[0] == "": index 0 means "no string".
        b.string("");
        b.profile.mapping.push(Mapping {
            id: MAPPING_ID,
            // (memory_limit grows with the locations, whose fake addresses are their ids)
            memory_limit: 1,
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            has_inline_frames: true,
            ..Mapping::default()
        });
        for (ty, unit) in sample_types {
            let vt = ValueType {
                r#type: b.string(ty),
                unit: b.string(unit),
            };
            b.profile.sample_type.push(vt);
        }
        if sample_types
            .iter()
            .any(|(ty, _)| *ty == default_sample_type)
        {
            b.profile.default_sample_type = b.string(default_sample_type);
        }
        b
    }

    /// When the profiled run started (nanoseconds since the Unix epoch) and how long it
    /// lasted.
    pub fn set_time(&mut self, start_unix_ns: i64, duration_ns: i64) {
        self.profile.time_nanos = start_unix_ns;
        self.profile.duration_nanos = duration_ns;
    }

    /// A free text line that `go tool pprof -comments` shows (the inputs, the command).
    pub fn add_comment(&mut self, c: &str) {
        let i = self.string(c);
        self.profile.comment.push(i);
    }

    /// One sample: `stack` caller first (outermost frame first), each stack element one
    /// program location whose `Vec<Frame>` holds its inlined frames outermost first (as a
    /// memtrace location code stands for several OCaml locations when calls were inlined).
    /// Values in sample_types' order. Identical locations (same frames) share one pprof
    /// Location, identical (function name, file) one Function. Samples with the same stack
    /// and labels (in the same order) are merged: their values add up, as pprof would add
    /// them.
    ///
    /// # Panics
    /// If `values` has not one value per sample type: pprof rejects such a profile.
    pub fn add_sample(
        &mut self,
        stack: &[&[Frame]],
        values: &[i64],
        labels: &[(&str, LabelValue)],
    ) {
        assert_eq!(
            values.len(),
            self.profile.sample_type.len(),
            "a pprof sample needs one value per sample type"
        );
        // pprof lists a sample's locations leaf first.
        let ids: Vec<u64> = stack.iter().rev().map(|l| self.location(l)).collect();
        let keys: Vec<LabelKey> = (labels.iter())
            .map(|(k, v)| match v {
                LabelValue::Str(s) => (self.string(k), self.string(s), 0, 0),
                LabelValue::Num(n) => (self.string(k), 0, *n, self.string(k)),
            })
            .collect();
        let n = self.profile.sample.len();
        let i = *self.samples.entry((ids.clone(), keys.clone())).or_insert(n);
        if i < n {
            let old = &mut self.profile.sample[i].value;
            old.iter_mut().zip(values).for_each(|(o, v)| *o += v);
            return;
        }
        let label = (keys.into_iter())
            .map(|(key, str, num, num_unit)| Label {
                key,
                str,
                num,
                num_unit,
            })
            .collect();
        self.profile.sample.push(Sample {
            location_id: ids,
            value: values.to_vec(),
            label,
        });
    }

    /// The profile, gzipped, as `go tool pprof` reads it.
    pub fn write_gz(&self, out: impl Write) -> std::io::Result<()> {
        let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
        gz.write_all(&self.profile.encode_to_vec())?;
        gz.finish()?.flush()
    }

    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.profile.string_table.len() as i64;
        self.profile.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    fn function(&mut self, f: &Frame) -> u64 {
        let key = (f.function.clone(), f.file.clone());
        if let Some(&id) = self.functions.get(&key) {
            return id;
        }
        let id = self.profile.function.len() as u64 + 1;
        let name = self.string(&f.function);
        let filename = self.string(&f.file);
        self.profile.function.push(Function {
            id,
            name,
            system_name: name,
            filename,
            start_line: 0,
        });
        self.functions.insert(key, id);
        id
    }

    fn location(&mut self, frames: &[Frame]) -> u64 {
        if let Some(&id) = self.locations.get(frames) {
            return id;
        }
        let id = self.profile.location.len() as u64 + 1;
        // pprof lists a location's inlined frames innermost first, the caller last.
        let line = (frames.iter().rev())
            .map(|f| Line {
                function_id: self.function(f),
                line: f.line.into(),
                column: f.columns.0.into(),
            })
            .collect();
        self.profile.location.push(Location {
            id,
            mapping_id: MAPPING_ID,
            // A distinct address each, so that tools keying locations by address keep them
            // apart.
            address: id,
            line,
            is_folded: false,
        });
        self.profile.mapping[0].memory_limit = id + 1;
        self.locations.insert(frames.to_vec(), id);
        id
    }
}

// The messages of pprof's `profile.proto` (github.com/google/pprof/proto/profile.proto) this
// writer uses, with their field numbers; the fields it leaves out (breakdowns, label sets)
// are optional there.

#[derive(Clone, PartialEq, Message)]
struct Profile {
    #[prost(message, repeated, tag = "1")]
    sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    string_table: Vec<String>,
    #[prost(int64, tag = "7")]
    drop_frames: i64,
    #[prost(int64, tag = "8")]
    keep_frames: i64,
    #[prost(int64, tag = "9")]
    time_nanos: i64,
    #[prost(int64, tag = "10")]
    duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    period: i64,
    #[prost(int64, repeated, tag = "13")]
    comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    default_sample_type: i64,
}

#[derive(Clone, PartialEq, Message)]
struct ValueType {
    #[prost(int64, tag = "1")]
    r#type: i64,
    #[prost(int64, tag = "2")]
    unit: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Sample {
    #[prost(uint64, repeated, packed = "true", tag = "1")]
    location_id: Vec<u64>,
    #[prost(int64, repeated, packed = "true", tag = "2")]
    value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    label: Vec<Label>,
}

#[derive(Clone, PartialEq, Message)]
struct Label {
    #[prost(int64, tag = "1")]
    key: i64,
    #[prost(int64, tag = "2")]
    str: i64,
    #[prost(int64, tag = "3")]
    num: i64,
    #[prost(int64, tag = "4")]
    num_unit: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Mapping {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(uint64, tag = "2")]
    memory_start: u64,
    #[prost(uint64, tag = "3")]
    memory_limit: u64,
    #[prost(uint64, tag = "4")]
    file_offset: u64,
    #[prost(int64, tag = "5")]
    filename: i64,
    #[prost(int64, tag = "6")]
    build_id: i64,
    #[prost(bool, tag = "7")]
    has_functions: bool,
    #[prost(bool, tag = "8")]
    has_filenames: bool,
    #[prost(bool, tag = "9")]
    has_line_numbers: bool,
    #[prost(bool, tag = "10")]
    has_inline_frames: bool,
}

#[derive(Clone, PartialEq, Message)]
struct Location {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(uint64, tag = "2")]
    mapping_id: u64,
    #[prost(uint64, tag = "3")]
    address: u64,
    #[prost(message, repeated, tag = "4")]
    line: Vec<Line>,
    #[prost(bool, tag = "5")]
    is_folded: bool,
}

#[derive(Clone, PartialEq, Message)]
struct Line {
    #[prost(uint64, tag = "1")]
    function_id: u64,
    #[prost(int64, tag = "2")]
    line: i64,
    #[prost(int64, tag = "3")]
    column: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Function {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(int64, tag = "2")]
    name: i64,
    #[prost(int64, tag = "3")]
    system_name: i64,
    #[prost(int64, tag = "4")]
    filename: i64,
    #[prost(int64, tag = "5")]
    start_line: i64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    const TYPES: [(&str, &str); 4] = [
        ("alloc_objects", "count"),
        ("alloc_space", "bytes"),
        ("inuse_objects", "count"),
        ("inuse_space", "bytes"),
    ];

    fn frame(function: &str, file: &str, line: u32, col: u32) -> Frame {
        Frame {
            function: function.into(),
            file: file.into(),
            line,
            columns: (col, col + 7),
        }
    }

    fn labels(pid: i64, exe: &str) -> Vec<(&'static str, LabelValue)> {
        vec![
            ("pid", LabelValue::Num(pid)),
            ("executable", LabelValue::Str(exe.into())),
            ("domain", LabelValue::Num(0)),
            ("source", LabelValue::Str(format!("{exe}.ctf"))),
        ]
    }

    fn decode(b: &ProfileBuilder) -> Profile {
        let mut gz = Vec::new();
        b.write_gz(&mut gz).unwrap();
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_end(&mut raw)
            .unwrap();
        Profile::decode(&raw[..]).unwrap()
    }

    /// A sample's stack read back caller first, each location's frames outermost first, as
    /// (function, file, line, first column): what a Frame keeps through pprof.
    type Resolved = Vec<Vec<(String, String, i64, i64)>>;

    fn resolve(p: &Profile, s: &Sample) -> Resolved {
        let str = |i: i64| p.string_table[i as usize].clone();
        let loc = |id: u64| p.location.iter().find(|l| l.id == id).unwrap();
        let fun = |id: u64| p.function.iter().find(|f| f.id == id).unwrap();
        (s.location_id.iter().rev())
            .map(|&id| {
                (loc(id).line.iter().rev())
                    .map(|l| {
                        let f = fun(l.function_id);
                        (str(f.name), str(f.filename), l.line, l.column)
                    })
                    .collect()
            })
            .collect()
    }

    fn expected(stack: &[&[Frame]]) -> Resolved {
        (stack.iter())
            .map(|l| {
                (l.iter())
                    .map(|f| {
                        (
                            f.function.clone(),
                            f.file.clone(),
                            f.line.into(),
                            f.columns.0.into(),
                        )
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn round_trip_keeps_stacks_values_labels_and_shares_locations() {
        let main = [frame("Main.main", "main.ml", 10, 2)];
        let run = [frame("Worker.run", "worker.ml", 5, 4)];
        let run6 = [frame("Worker.run", "worker.ml", 6, 4)];
        // List.map's call to f inlined into it: one memtrace location, two frames.
        let inlined = [
            frame("List.map", "list.ml", 3, 9),
            frame("Worker.f", "worker.ml", 7, 1),
        ];
        let unknown = [frame("Array.make", "array.ml", 0, 0)];
        let s1: [&[Frame]; 3] = [&main, &run, &inlined];
        let s2: [&[Frame]; 3] = [&main, &run, &unknown];
        let s3: [&[Frame]; 4] = [&main, &run6, &run, &unknown];
        let mut b = ProfileBuilder::new(&TYPES, "inuse_space");
        b.set_time(1_700_000_000_000_000_000, 2_500_000_000);
        b.add_comment("memtrace-merge a.ctf");
        b.add_sample(&s1, &[1, 32, 1, 32], &labels(42, "a.exe"));
        b.add_sample(&s2, &[2, 800, 0, 0], &labels(43, "b.exe"));
        b.add_sample(&s3, &[5, 40, 5, 40], &labels(42, "a.exe"));
        // Same stack and labels as the first: added to it.
        b.add_sample(&s1, &[3, 96, 0, 0], &labels(42, "a.exe"));
        // Same stack, another pid: a sample of its own.
        b.add_sample(&s1, &[7, 7, 7, 7], &labels(44, "a.exe"));
        let p = decode(&b);

        assert_eq!(p.string_table[0], "");
        let str = |i: i64| p.string_table[i as usize].as_str();
        let types: Vec<(&str, &str)> = (p.sample_type.iter())
            .map(|t| (str(t.r#type), str(t.unit)))
            .collect();
        assert_eq!(types, TYPES);
        assert_eq!(str(p.default_sample_type), "inuse_space");
        assert_eq!(
            (p.time_nanos, p.duration_nanos),
            (1_700_000_000_000_000_000, 2_500_000_000)
        );
        assert_eq!(
            p.comment.iter().map(|&c| str(c)).collect::<Vec<_>>(),
            ["memtrace-merge a.ctf"]
        );

        let got: Vec<(Resolved, Vec<i64>)> = (p.sample.iter())
            .map(|s| (resolve(&p, s), s.value.clone()))
            .collect();
        let want = vec![
            (expected(&s1), vec![4, 128, 1, 32]),
            (expected(&s2), vec![2, 800, 0, 0]),
            (expected(&s3), vec![5, 40, 5, 40]),
            (expected(&s1), vec![7, 7, 7, 7]),
        ];
        assert_eq!(got, want);
        // main, run, run6, inlined, unknown; Worker.run at two lines is one function.
        assert_eq!(p.location.len(), 5);
        assert_eq!(p.function.len(), 5);
        let inl = p.location.iter().find(|l| l.line.len() == 2).unwrap();
        assert_eq!(
            str(p.function[inl.line[0].function_id as usize - 1].name),
            "Worker.f"
        );

        let label_text = |s: &Sample| -> Vec<String> {
            (s.label.iter())
                .map(|l| match l.str {
                    0 => format!("{}={} {}", str(l.key), l.num, str(l.num_unit)),
                    v => format!("{}={}", str(l.key), str(v)),
                })
                .collect()
        };
        assert_eq!(
            label_text(&p.sample[1]),
            [
                "pid=43 pid",
                "executable=b.exe",
                "domain=0 domain",
                "source=b.exe.ctf"
            ]
        );
        assert_eq!(label_text(&p.sample[3])[0], "pid=44 pid");
    }

    #[test]
    fn one_mapping_with_symbols_and_a_distinct_address_per_location() {
        let mut b = ProfileBuilder::new(&TYPES[..2], "alloc_space");
        let (x, y) = ([frame("X.x", "x.ml", 1, 0)], [frame("Y.y", "y.ml", 2, 0)]);
        b.add_sample(&[&x, &y], &[1, 8], &[]);
        b.add_sample(&[&y, &x], &[1, 8], &[]);
        let p = decode(&b);
        assert_eq!(p.mapping.len(), 1);
        let m = &p.mapping[0];
        assert!(m.has_functions && m.has_filenames && m.has_line_numbers && m.has_inline_frames);
        let mut addrs: Vec<u64> = p.location.iter().map(|l| l.address).collect();
        addrs.sort();
        addrs.dedup();
        assert_eq!(addrs.len(), 2);
        for l in &p.location {
            assert_eq!(l.mapping_id, m.id);
            assert!(m.memory_start <= l.address && l.address < m.memory_limit);
        }
        // Leaf first: the second sample's leaf is x.
        assert_eq!(
            p.sample[1].location_id,
            [p.sample[0].location_id[1], p.sample[0].location_id[0]]
        );
    }

    #[test]
    fn an_unknown_default_sample_type_is_left_unset() {
        let p = decode(&ProfileBuilder::new(&TYPES, "cpu"));
        assert_eq!(p.default_sample_type, 0);
        assert!(p.sample.is_empty());
    }

    #[test]
    #[should_panic(expected = "one value per sample type")]
    fn a_sample_with_too_few_values_panics() {
        let mut b = ProfileBuilder::new(&TYPES, "alloc_space");
        b.add_sample(&[], &[1, 2], &[]);
    }
}
