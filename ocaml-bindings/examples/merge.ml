(* merge.exe [OPTIONS] OUT IN...: merge memtrace traces with the OCaml bindings and print
   what was done. Exit status: 0 merged, 1 merge failed, 2 bad command line. *)

let usage =
  "usage: merge.exe [OPTIONS] OUT IN...\n\
   Merge the memtrace traces IN... (files, or directories of .ctf files) into OUT.\n\
   Options:"

let () =
  let format = ref None
  and fail = ref false
  and seed = ref 0
  and tag = ref false
  and skip = ref false
  and pid = ref None
  and context = ref None
  and quiet = ref false
  and args = ref [] in
  let spec =
    Arg.align
      [
        ( "--format",
          Arg.Symbol
            ( [ "2"; "3" ],
              fun s -> format := Some (if s = "2" then `V2 else `V3) ),
          " output format version (default: 2 if every input is, else 3)" );
        ("--fail-on-rate-mismatch", Arg.Set fail, " refuse inputs sampled at different rates");
        ("--seed", Arg.Set_int seed, "N seed of the thinning (default 0)");
        ("--tag-processes", Arg.Set tag, " give every backtrace a root frame naming its input");
        ("--skip-bad-inputs", Arg.Set skip, " leave out unreadable inputs");
        ("--pid", Arg.Int (fun p -> pid := Some p), "N pid of the merged trace");
        ("--context", Arg.String (fun c -> context := Some c), "S context of the merged trace");
        ("--quiet", Arg.Set quiet, " print nothing on success");
      ]
  in
  Arg.parse spec (fun a -> args := a :: !args) usage;
  match List.rev !args with
  | output :: (_ :: _ as inputs) -> (
      match
        Memtrace_merge.merge ?format:!format
          ~on_rate_mismatch:(if !fail then `Fail else `Thin)
          ~seed:!seed ~tag_processes:!tag ~skip_bad_inputs:!skip ?pid:!pid ?context:!context
          ~output inputs
      with
      | report -> if not !quiet then print_string (Memtrace_merge.summary report)
      | exception Memtrace_merge.Error e ->
          prerr_endline ("merge.exe: " ^ Memtrace_merge.error_to_string e);
          exit 1)
  | _ ->
      prerr_string (Arg.usage_string spec usage);
      exit 2
