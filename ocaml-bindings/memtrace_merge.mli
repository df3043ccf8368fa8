(** Merge {{:https://github.com/janestreet/memtrace}memtrace} traces ([.ctf] files) of
    OCaml programs into one trace.

    A typical use: a program that forks writes one trace per process; merging them gives one
    trace of the whole run, which the memtrace viewer opens like any other.

    {[
      let report =
        Memtrace_merge.merge ~output:"run.ctf"
          [ "run.parent.ctf"; "run.child-1.ctf"; "run.child-2.ctf" ]
      in
      Printf.printf "%d allocations\n" report.allocs
    ]}

    This library binds the Rust library [memtrace_merge] through its C interface
    ([include/memtrace_merge.h]); it is linked into your program, nothing is run as a
    separate process. {!merge} releases the OCaml runtime lock while it works, so other
    threads keep running; it may be called from several threads at once (with different
    outputs) and in a forked child. *)

(** {1 Errors} *)

(** Why a merge failed. *)
type status =
  | Bad_arguments
      (** The call was wrong: no inputs, an empty path or one holding a NUL byte, a pid that
          is not positive, the output being one of the inputs, ... *)
  | Input_error
      (** An input is missing, unreadable, not a memtrace trace, malformed, or cannot be
          merged with the others (e.g. different sampling rates with
          [~on_rate_mismatch:`Fail]). The message names the file and, for a malformed
          trace, the byte offset. *)
  | Output_error
      (** The output could not be written (missing or read-only directory, full disk, ...). *)
  | Internal_error
      (** A fault of the library: a bug (please report it with the message), or a thread
          that could not start (out of resources). *)
  | Cancelled  (** The merge was cancelled ([?cancel]); nothing was written. *)

type error = { status : status; message : string  (** One line, naming the file. *) }

exception Error of error
(** Raised by {!merge} when no output was written. When it is raised no output file (and no
    temporary file) is left behind, and an existing file at the output path is untouched. *)

val string_of_status : status -> string
(** ["bad arguments"], ["input error"], ["output error"], ["internal error"] or
    ["cancelled"]. *)

val error_to_string : error -> string
(** ["input error: parent.ctf: byte 1024: ..."]. *)

(** {1 Reports} *)

(** What happened to one input file. *)
type input_report = {
  input : string;
      (** The argument of {!merge} this file came from: the file itself, or the directory
          holding it. [""] in the unlikely case it could not be told. *)
  file : string;
      (** The file this report is about: [input] itself, or a file of that directory. *)
  pid : int;  (** The traced process's pid. *)
  format : int;  (** The input's format version (1, 2 or 3). *)
  sample_rate : float;  (** The input's sampling rate. *)
  events : int;  (** Events read: [allocs + promotes + collects]. *)
  allocs : int;  (** Allocations read. *)
  promotes : int;  (** Promotions read. *)
  collects : int;  (** Collections read. *)
  allocs_written : int;  (** Allocations written: fewer than [allocs] when thinned. *)
  samples_read : int;  (** Samples read (the allocations' sample counts added up). *)
  samples_written : int;  (** Samples written. *)
  keep_fraction : float;
      (** Fraction of samples kept when thinning to a slower input's rate; [1.0] if not
          thinned. *)
  skipped_packets : int;  (** Unreadable packets left out. *)
  remapped_codes : int;
      (** Location codes renumbered because another input used them differently. *)
  skipped : bool;  (** Left out entirely (unreadable, with [~skip_bad_inputs:true]). *)
  warnings : int;  (** Number of warnings about this input. *)
}

(** What a merge did. *)
type report = {
  output : string;  (** The file written. *)
  format : int;  (** Its format version (2 or 3). *)
  allocs : int;  (** Allocations written. *)
  promotes : int;  (** Promotions written. *)
  collects : int;  (** Collections written. *)
  remapped_codes : int;  (** Location codes renumbered, all inputs together. *)
  warnings : int;  (** Warnings, all inputs together. *)
  first_warning : string option;  (** The first warning's text, if any. *)
  inputs : input_report list;
      (** One per input file, in merge order (a directory gives one per [*.ctf] file). *)
  skipped_inputs : int;  (** Inputs left out ([~skip_bad_inputs:true]). *)
  thinned_inputs : int;  (** Inputs thinned to a slower sampling rate. *)
  input_events : int;  (** Events read, all inputs together. *)
  input_allocs : int;  (** Allocations read, all inputs together. *)
  samples_read : int;  (** Samples read, all inputs together. *)
  samples_written : int;  (** Samples written. *)
  skipped_packets : int;  (** Unreadable packets left out, all inputs together. *)
}

val summary : report -> string
(** A few lines for people: output, totals, then one line per input. *)

(** {1 Merging} *)

(** A handle that cancels the merges given it ([?cancel]), from another thread or a signal
    handler: such a merge stops within milliseconds and raises
    [Error {status = Cancelled; _}], leaving no output. Each merge polls its own handle. *)
module Cancel : sig
  type t

  val create : unit -> t
  val cancel : t -> unit
  val is_cancelled : t -> bool
end

val merge :
  ?format:[ `V2 | `V3 ] ->
  ?on_rate_mismatch:[ `Thin | `Fail ] ->
  ?seed:int ->
  ?tag_processes:bool ->
  ?skip_bad_inputs:bool ->
  ?pid:int ->
  ?context:string ->
  ?cancel:Cancel.t ->
  output:string ->
  string list ->
  report
(** [merge ~output inputs] merges the traces [inputs] into one trace written to [output].
    Events are interleaved by time, object ids renumbered, location codes kept or remapped
    so that every backtrace means what it meant in its input. The output is written to a
    temporary file beside [output] (of no name, where the file system has them, so that
    even a killed process leaves none) and put in its place when complete.

    @param inputs trace files, or directories whose [*.ctf] files are taken in name order
    ([output] left out when it is an earlier merge, known by the context a merge gives it:
    a directory can be merged into a file of its own again and again).
    A file named twice (a directory and a file in it, a link) is merged once, with a
    warning; so is a trace that another input holds (a copy of it: the same pid, start time
    and first packet, of which the longer is kept; an earlier merge of the same traces, or
    one that records it). A pipe
    or FIFO ([/dev/fd/N]) is read once, before the merge. Paths are byte strings: they need
    not be UTF-8.
    @param output the trace to write; replaced if it exists (a symbolic link's target; a
    device or FIFO is written through), unless it is read-only; must not be one of
    [inputs].
    @param format output format version: [`V2] (memtrace up to 0.2, OCaml 4) or [`V3]
    (OCaml 5, with domains). Default: [`V2] when every input is format 1 or 2, else [`V3].
    @param on_rate_mismatch what to do when inputs were sampled at different rates:
    [`Thin] (default) keeps each sample of a faster input with probability
    [slowest rate /. its rate], so the result is as if every input had been sampled at the
    slowest rate; [`Fail] raises [Error {status = Input_error; _}].
    @param seed seed of the thinning's random numbers (default [0]): the same inputs,
    options and seed always give the same output bytes. Any [int] is accepted.
    @param tag_processes if [true], every backtrace gets a synthetic outermost frame naming
    its input, so that the viewer can tell the processes apart. Default [false].
    @param skip_bad_inputs if [true], inputs that cannot be read at all are left out with a
    warning (see {!report}) instead of failing the merge. Default [false].
    @param pid the pid recorded in the merged trace (positive); default: the first input's.
    @param context the context string of the merged trace (no NUL byte); default: the first
    input's, or a description of the merge.
    @param cancel a handle that cancels this merge when set (see {!Cancel}).
    @raise Error when no output was written (see {!status}). *)

val version : unit -> string
(** The version of the Rust library linked in, e.g. ["0.1.0"]. *)
