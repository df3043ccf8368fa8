(* Binding of the Rust library's C function memtrace_merge() (see memtrace_merge_stubs.c). *)

type status = Bad_arguments | Input_error | Output_error | Internal_error | Cancelled

type error = { status : status; message : string }

exception Error of error

let string_of_status = function
  | Bad_arguments -> "bad arguments"
  | Input_error -> "input error"
  | Output_error -> "output error"
  | Internal_error -> "internal error"
  | Cancelled -> "cancelled"

let error_to_string e = string_of_status e.status ^ ": " ^ e.message

(* The stubs raise Error through this name. *)
let () =
  Callback.register_exception "Memtrace_merge.Error"
    (Error { status = Internal_error; message = "" });
  Printexc.register_printer (function
    | Error e -> Some ("Memtrace_merge.Error: " ^ error_to_string e)
    | _ -> None)

type input_report = {
  input : string;
  file : string;
  pid : int;
  format : int;
  sample_rate : float;
  events : int;
  allocs : int;
  promotes : int;
  collects : int;
  allocs_written : int;
  samples_read : int;
  samples_written : int;
  keep_fraction : float;
  skipped_packets : int;
  remapped_codes : int;
  skipped : bool;
  warnings : int;
}

type report = {
  output : string;
  format : int;
  allocs : int;
  promotes : int;
  collects : int;
  remapped_codes : int;
  warnings : int;
  first_warning : string option;
  inputs : input_report list;
  skipped_inputs : int;
  thinned_inputs : int;
  input_events : int;
  input_allocs : int;
  samples_read : int;
  samples_written : int;
  skipped_packets : int;
}

(* Passed to the stub; field order matters (OPT_* in memtrace_merge_stubs.c). *)
type c_options = {
  c_format : int;  (* 0 auto, 2, 3 *)
  c_rate : int;  (* 0 thin, 1 fail *)
  c_seed : int;
  c_tag : bool;
  c_skip : bool;
  c_pid : int;  (* 0: the first input's *)
  c_context : string option;
  c_capacity : int;  (* room for this many per-input reports *)
  c_cancel : (int32, Bigarray.int32_elt, Bigarray.c_layout) Bigarray.Array1.t option;
}

module Cancel = struct
  (* One int32, out of the OCaml heap: the C side polls it while the runtime lock is
     released. *)
  type t = (int32, Bigarray.int32_elt, Bigarray.c_layout) Bigarray.Array1.t

  let create () =
    let t = Bigarray.Array1.create Bigarray.int32 Bigarray.c_layout 1 in
    t.{0} <- 0l;
    t

  let cancel (t : t) = t.{0} <- 1l
  let is_cancelled (t : t) = t.{0} <> 0l
end

(* (first warning or "", totals, per input: (arg index :: integer fields, (rate, keep), file
   name in its directory argument or "")) *)
type raw_report = string * int array * (int array * (float * float) * string) array

external merge_raw : string array -> string -> c_options -> raw_report
  = "memtrace_merge_ml"

external version : unit -> string = "memtrace_merge_version_ml"

(* Room for the per-input reports: one per file argument, one per entry of a directory. *)
let capacity inputs =
  Array.fold_left
    (fun n path ->
      n
      +
      match Sys.is_directory path with
      | true -> ( try max 1 (Array.length (Sys.readdir path)) with Sys_error _ -> 1)
      | false -> 1
      | exception Sys_error _ -> 1)
    0 inputs

let merge ?format ?(on_rate_mismatch = `Thin) ?(seed = 0) ?(tag_processes = false)
    ?(skip_bad_inputs = false) ?pid ?context ?cancel ~output inputs =
  let bad message = raise (Error { status = Bad_arguments; message }) in
  let c_pid =
    match pid with
    | None -> 0
    | Some p when p > 0 -> p
    | Some p -> bad (Printf.sprintf "Memtrace_merge.merge: ~pid:%d is not positive" p)
  in
  let inputs = Array.of_list inputs in
  let options =
    {
      c_format = (match format with None -> 0 | Some `V2 -> 2 | Some `V3 -> 3);
      c_rate = (match on_rate_mismatch with `Thin -> 0 | `Fail -> 1);
      c_seed = seed;
      c_tag = tag_processes;
      c_skip = skip_bad_inputs;
      c_pid;
      c_context = context;
      c_capacity = capacity inputs;
      c_cancel = cancel;
    }
  in
  let warning, t, per = merge_raw inputs output options in
  let input_report (ints, (sample_rate, keep_fraction), name) : input_report =
    let i k = ints.(k) in
    let input = if i 0 >= 0 && i 0 < Array.length inputs then inputs.(i 0) else "" in
    {
      input;
      file = (if name = "" then input else Filename.concat input name);
      pid = i 1;
      format = i 2;
      skipped = i 3 <> 0;
      events = i 4;
      allocs = i 5;
      promotes = i 6;
      collects = i 7;
      allocs_written = i 8;
      samples_read = i 9;
      samples_written = i 10;
      skipped_packets = i 11;
      remapped_codes = i 12;
      warnings = i 13;
      sample_rate;
      keep_fraction;
    }
  in
  {
    output;
    inputs = Array.to_list (Array.map input_report per);
    skipped_inputs = t.(1);
    thinned_inputs = t.(2);
    format = t.(3);
    allocs = t.(4);
    promotes = t.(5);
    collects = t.(6);
    remapped_codes = t.(7);
    warnings = t.(8);
    input_events = t.(9);
    input_allocs = t.(10);
    samples_read = t.(11);
    samples_written = t.(12);
    skipped_packets = t.(13);
    first_warning = (if warning = "" then None else Some warning);
  }

let summary (r : report) =
  let b = Buffer.create 256 in
  Printf.bprintf b "%s: format %d, %d allocations, %d promotions, %d collections\n" r.output
    r.format r.allocs r.promotes r.collects;
  Printf.bprintf b
    "%d inputs (%d skipped, %d thinned), %d location codes remapped, %d warnings\n"
    (List.length r.inputs) r.skipped_inputs r.thinned_inputs r.remapped_codes r.warnings;
  List.iter
    (fun (i : input_report) ->
      Printf.bprintf b "  %s: pid %d, format %d, rate %g, %d/%d allocations kept%s\n"
        i.file i.pid i.format i.sample_rate i.allocs_written i.allocs
        (if i.skipped then " (skipped)" else ""))
    r.inputs;
  Option.iter (fun w -> Printf.bprintf b "first warning: %s\n" w) r.first_warning;
  Buffer.contents b
