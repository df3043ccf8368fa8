(* Tests of the OCaml bindings: test_memtrace_merge.exe DATA_DIR RUST_PATHS
   DATA_DIR is tests/data; RUST_PATHS the file written by ../cargo_build.sh (crate root, cargo
   target directory), used to find the memtrace-merge binary. Ends with "N passed, M failed". *)

module M = Memtrace_merge

let data = Sys.argv.(1)
let rust_paths = Sys.argv.(2)
let path parts = List.fold_left Filename.concat data parts
let fork_names = [ "parent"; "child-1"; "child-2"; "child-3"; "child-4" ]
let fork = List.map (fun n -> path [ "fork"; n ^ ".ctf" ]) fork_names

(* Allocations, promotions and collections of each fork trace (its .validate file). *)
let fork_counts =
  [
    ("parent", (88445, 22353, 81958));
    ("child-1", (8336, 85, 8201));
    ("child-2", (17914, 125, 17650));
    ("child-3", (100716, 152, 99917));
    ("child-4", (16499, 7748, 15283));
  ]

let fast = path [ "rates"; "fast.ctf" ]
let slow = path [ "rates"; "slow.ctf" ]
let readme = path [ "README.md" ]

(* ---- helpers ---- *)

exception Skip of string

let fail fmt = Printf.ksprintf failwith fmt
let check cond fmt = Printf.ksprintf (fun s -> if not cond then failwith s) fmt

let check_int what got want =
  check (got = want) "%s: got %d, expected %d" what got want

let read_file p =
  let ic = open_in_bin p in
  Fun.protect ~finally:(fun () -> close_in ic) (fun () -> really_input_string ic (in_channel_length ic))

let write_file p s =
  let oc = open_out_bin p in
  Fun.protect ~finally:(fun () -> close_out oc) (fun () -> output_string oc s)

let exists p = Sys.file_exists p
let size p = (Unix.stat p).Unix.st_size

let contains ~sub s =
  let n = String.length sub and m = String.length s in
  let rec go i = i + n <= m && (String.sub s i n = sub || go (i + 1)) in
  go 0

let rec remove_tree p =
  match (Unix.lstat p).Unix.st_kind with
  | Unix.S_DIR ->
      Array.iter (fun e -> remove_tree (Filename.concat p e)) (Sys.readdir p);
      Unix.rmdir p
  | _ -> Sys.remove p
  | exception Unix.Unix_error _ -> ()

let scratch =
  let base = Filename.temp_file "memtrace_merge_test" "" in
  Sys.remove base;
  Unix.mkdir base 0o700;
  base

(* A new empty directory for one test. *)
let fresh =
  let n = ref 0 in
  fun name ->
    incr n;
    let d = Filename.concat scratch (Printf.sprintf "%02d-%s" !n name) in
    Unix.mkdir d 0o700;
    d

let listing dir = List.sort compare (Array.to_list (Sys.readdir dir))

(* Run f, which must raise Error with the given status; return the message. *)
let expect_error ?(statuses = []) status f =
  let ok = status :: statuses in
  match f () with
  | (_ : M.report) -> fail "expected Error (%s), but the merge succeeded" (M.string_of_status status)
  | exception M.Error { status = s; message } ->
      check (List.mem s ok) "expected %s, got %s: %s" (M.string_of_status status)
        (M.string_of_status s) message;
      check (message <> "") "empty error message";
      message

let find_input (r : M.report) name =
  match List.filter (fun (i : M.input_report) -> Filename.basename i.input = name ^ ".ctf") r.inputs with
  | [ i ] -> i
  | l -> fail "%d input reports for %s" (List.length l) name

(* The fork traces' totals and per-input counts. *)
let check_fork_report (r : M.report) =
  check_int "allocs" r.allocs 231910;
  check_int "promotes" r.promotes 30463;
  check_int "collects" r.collects 223009;
  check_int "input_allocs" r.input_allocs 231910;
  check_int "input_events" r.input_events (231910 + 30463 + 223009);
  check_int "inputs" (List.length r.inputs) 5;
  check_int "skipped inputs" r.skipped_inputs 0;
  check_int "thinned inputs" r.thinned_inputs 0;
  let sum f = List.fold_left (fun a i -> a + f i) 0 r.inputs in
  check_int "sum of the inputs' allocs" (sum (fun (i : M.input_report) -> i.allocs)) 231910;
  check_int "sum of the inputs' promotes" (sum (fun (i : M.input_report) -> i.promotes)) 30463;
  check_int "sum of the inputs' collects" (sum (fun (i : M.input_report) -> i.collects)) 223009

(* Little-endian bytes of a 64-bit integer, as the trace-info event stores the pid. *)
let le64 n = String.init 8 (fun k -> Char.chr ((n lsr (8 * k)) land 0xff))

(* ---- the tests ---- *)

let test_fork_totals () =
  let out = Filename.concat (fresh "fork") "merged.ctf" in
  let r = M.merge ~output:out fork in
  check_fork_report r;
  check_int "format" r.format 2;
  check (r.output = out) "report.output %S" r.output;
  List.iter
    (fun (name, (a, p, c)) ->
      let i = find_input r name in
      check (i.input = path [ "fork"; name ^ ".ctf" ]) "input %S" i.input;
      check_int (name ^ " allocs") i.allocs a;
      check_int (name ^ " promotes") i.promotes p;
      check_int (name ^ " collects") i.collects c;
      check_int (name ^ " events") i.events (a + p + c);
      check_int (name ^ " allocs written") i.allocs_written a;
      check_int (name ^ " format") i.format 2;
      check (i.keep_fraction = 1.0) "%s keep_fraction %g" name i.keep_fraction;
      check (i.sample_rate = 0.0003) "%s sample_rate %g" name i.sample_rate;
      check (i.pid > 0 && not i.skipped) "%s pid %d skipped %b" name i.pid i.skipped)
    fork_counts;
  check (size out > 0) "empty output";
  check (contains ~sub:"231910 allocations" (M.summary r)) "summary %S" (M.summary r)

let test_directory () =
  let out = Filename.concat (fresh "dir") "merged.ctf" in
  let dir = path [ "fork" ] in
  let r = M.merge ~output:out [ dir ] in
  check_fork_report r;
  List.iter (fun (i : M.input_report) -> check (i.input = dir) "input %S, expected %S" i.input dir) r.inputs;
  (* a file in a directory given before it (which does not list it: not .ctf) is named as
     its own argument *)
  let d = fresh "dir-then-file" in
  List.iter
    (fun n -> write_file (Filename.concat d (n ^ ".ctf")) (read_file (path [ "fork"; n ^ ".ctf" ])))
    [ "child-1"; "child-2" ];
  let extra = Filename.concat d "parent.trace" in
  write_file extra (read_file (path [ "fork"; "parent.ctf" ]));
  let r = M.merge ~output:(Filename.concat (fresh "dir-then-file-out") "m.ctf") [ d; extra ] in
  let got = List.map (fun (i : M.input_report) -> (i.input, i.allocs)) r.inputs in
  check
    (got = [ (d, 8336); (d, 17914); (extra, 88445) ])
    "inputs: %s"
    (String.concat "; " (List.map (fun (s, a) -> Printf.sprintf "%s %d" s a) got));
  (* a file of the directory named again is merged once, with a warning *)
  let again = Filename.concat d "child-2.ctf" in
  let r = M.merge ~output:(Filename.concat (fresh "dir-and-its-file-out") "m.ctf") [ d; again ] in
  let got = List.map (fun (i : M.input_report) -> (i.input, i.allocs, i.warnings)) r.inputs in
  check
    (got = [ (d, 8336, 0); (d, 17914, 1) ] && r.allocs = 8336 + 17914)
    "inputs: %s; allocs %d"
    (String.concat "; " (List.map (fun (s, a, w) -> Printf.sprintf "%s %d %d" s a w) got))
    r.allocs;
  check
    (match r.first_warning with Some w -> contains ~sub:"given again" w | None -> false)
    "first warning %s"
    (Option.value r.first_warning ~default:"none");
  (* a directory merged into a file of its own, twice: the earlier merge is no input *)
  let inside = Filename.concat d "merged.ctf" in
  let first = M.merge ~output:inside [ d ] in
  let again = M.merge ~output:inside [ d ] in
  check
    (List.length first.inputs = 2 && List.length again.inputs = 2 && again.allocs = 8336 + 17914)
    "inputs %d then %d, allocs %d" (List.length first.inputs) (List.length again.inputs) again.allocs

let test_forked_child () =
  let out = Filename.concat (fresh "forked") "merged.ctf" in
  flush_all ();
  match Unix.fork () with
  | 0 ->
      let code = try ignore (M.merge ~output:out fork); 0 with _ -> 1 in
      Unix._exit code
  | child -> (
      match Unix.waitpid [] child with
      | _, Unix.WEXITED 0 -> check (exists out && size out > 0) "no output from the child"
      | _, Unix.WEXITED n -> fail "the child's merge failed (exit %d)" n
      | _, (Unix.WSIGNALED n | Unix.WSTOPPED n) -> fail "the child died (signal %d)" n)

let test_thread_releases_lock () =
  let out = Filename.concat (fresh "thread") "merged.ctf" in
  let counter = ref 0 and stop = ref false in
  let spinner =
    Thread.create
      (fun () ->
        while not !stop do
          incr counter;
          Thread.yield ()
        done)
      ()
  in
  let result = ref (Error "not run") and during = ref 0 and seconds = ref 0. in
  let merger =
    Thread.create
      (fun () ->
        let before = !counter and t0 = Unix.gettimeofday () in
        (result := try Ok (M.merge ~output:out fork) with e -> Error (Printexc.to_string e));
        during := !counter - before;
        seconds := Unix.gettimeofday () -. t0)
      ()
  in
  Thread.join merger;
  stop := true;
  Thread.join spinner;
  (match !result with Ok r -> check_fork_report r | Error e -> fail "merge in a thread: %s" e);
  Printf.printf "    (the other thread counted to %d during the %.3fs merge)\n" !during !seconds;
  check (!during > 1000)
    "the counter advanced by only %d during the merge: the runtime lock was not released" !during

let test_concurrent_merges () =
  let d = fresh "concurrent" in
  let outs = List.init 3 (fun k -> Filename.concat d (Printf.sprintf "m%d.ctf" k)) in
  let results = Array.make 3 None in
  let threads =
    List.mapi
      (fun k out ->
        Thread.create (fun () -> results.(k) <- Some (try Ok (M.merge ~output:out fork) with e -> Error e)) ())
      outs
  in
  List.iter Thread.join threads;
  Array.iter
    (function
      | Some (Ok r) -> check_fork_report r
      | Some (Error e) -> raise e
      | None -> fail "a thread did not finish")
    results;
  let bytes = List.map read_file outs in
  check (List.for_all (( = ) (List.hd bytes)) bytes) "concurrent merges wrote different bytes"

let test_format_v3 () =
  let d = fresh "v3" in
  let v2 = Filename.concat d "v2.ctf" and v3 = Filename.concat d "v3.ctf" and def = Filename.concat d "default.ctf" in
  let r3 = M.merge ~format:`V3 ~output:v3 fork in
  check_int "format" r3.format 3;
  check_fork_report r3;
  let r2 = M.merge ~format:`V2 ~output:v2 fork in
  check_int "format" r2.format 2;
  ignore (M.merge ~output:def fork);
  check (read_file v2 = read_file def) "~format:`V2 differs from the default on v2 inputs";
  check (read_file v2 <> read_file v3) "v2 and v3 outputs are identical"

let test_default_thins () =
  let out = Filename.concat (fresh "thin") "merged.ctf" in
  let r = M.merge ~output:out [ fast; slow ] in
  check_int "thinned inputs" r.thinned_inputs 1;
  check (r.allocs < r.input_allocs) "allocs %d not fewer than read %d" r.allocs r.input_allocs;
  let f = find_input r "fast" and s = find_input r "slow" in
  check (f.keep_fraction < 0.5 && f.allocs_written < f.allocs) "fast kept %g" f.keep_fraction;
  check (s.keep_fraction = 1.0 && s.allocs_written = s.allocs) "slow kept %g" s.keep_fraction;
  check_int "allocs = sum written" r.allocs (f.allocs_written + s.allocs_written)

let test_rate_mismatch_fail () =
  let d = fresh "fail" in
  let out = Filename.concat d "merged.ctf" in
  let msg = expect_error M.Input_error (fun () -> M.merge ~on_rate_mismatch:`Fail ~output:out [ fast; slow ]) in
  Printf.printf "    (%s)\n" msg;
  check (listing d = []) "files left: %s" (String.concat " " (listing d))

let test_seed () =
  let d = fresh "seed" in
  let run seed name =
    let out = Filename.concat d name in
    ignore (M.merge ~seed ~output:out [ fast; slow ]);
    read_file out
  in
  let a = run 1 "a.ctf" and b = run 1 "b.ctf" and c = run 2 "c.ctf" and e = run (-5) "e.ctf" in
  check (a = b) "the same seed gave different outputs";
  check (a <> c) "seeds 1 and 2 gave the same output";
  check (e <> a && String.length e > 0) "negative seed"

let test_tag_processes () =
  let d = fresh "tag" in
  let tagged = Filename.concat d "tagged.ctf" and plain = Filename.concat d "plain.ctf" in
  let r = M.merge ~tag_processes:true ~output:tagged fork in
  check_fork_report r;
  ignore (M.merge ~output:plain fork);
  check (read_file tagged <> read_file plain) "~tag_processes:true changed nothing"

let test_pid_and_context () =
  let d = fresh "pid" in
  let pid = 0x3a5c7e91 and context = "merged by test_memtrace_merge.ml \xe2\x9c\x93" in
  let out = Filename.concat d "merged.ctf" and def = Filename.concat d "default.ctf" in
  let r = M.merge ~pid ~context ~output:out fork in
  check_fork_report r;
  ignore (M.merge ~output:def fork);
  let head f = let s = read_file f in String.sub s 0 (min 4096 (String.length s)) in
  check (contains ~sub:(le64 pid) (head out)) "pid %d not in the trace-info packet" pid;
  check (not (contains ~sub:(le64 pid) (head def))) "pid %d found in the default output" pid;
  check (contains ~sub:(context ^ "\000") (head out)) "context not in the trace-info packet";
  let m = expect_error M.Bad_arguments (fun () -> M.merge ~pid:0 ~output:out fork) in
  check (contains ~sub:"pid" m) "message %S" m;
  ignore (expect_error M.Bad_arguments (fun () -> M.merge ~pid:(-3) ~output:out fork))

let test_skip_bad_inputs () =
  let d = fresh "skip" in
  let out = Filename.concat d "merged.ctf" in
  let child1 = path [ "fork"; "child-1.ctf" ] in
  let r = M.merge ~skip_bad_inputs:true ~output:out [ child1; readme ] in
  check_int "skipped inputs" r.skipped_inputs 1;
  check_int "allocs" r.allocs 8336;
  check (r.first_warning <> None) "no warning about the skipped input";
  let i = List.find (fun (i : M.input_report) -> i.input = readme) r.inputs in
  check i.skipped "README.md not marked skipped";
  ignore (expect_error M.Input_error (fun () -> M.merge ~output:out [ child1; readme ]));
  (* with every input skipped, the error is the first one's *)
  let none = Filename.concat d "none.ctf" in
  let m = expect_error M.Input_error (fun () -> M.merge ~skip_bad_inputs:true ~output:none [ readme ]) in
  check (contains ~sub:"README.md: byte 0" m) "message does not name the input: %S" m;
  check (not (exists none)) "output written"

let test_missing_file () =
  let d = fresh "missing" in
  let missing = Filename.concat d "no-such-trace.ctf" and out = Filename.concat d "merged.ctf" in
  let m = expect_error M.Input_error (fun () -> M.merge ~output:out [ List.hd fork; missing ]) in
  check (contains ~sub:"no-such-trace.ctf" m) "message does not name the file: %S" m;
  check (listing d = []) "files left: %s" (String.concat " " (listing d))

let test_not_a_trace () =
  let d = fresh "readme" in
  let out = Filename.concat d "merged.ctf" in
  let m = expect_error M.Input_error (fun () -> M.merge ~output:out [ List.hd fork; readme ]) in
  check (contains ~sub:"README.md" m) "message does not name the file: %S" m;
  check (listing d = []) "files left: %s" (String.concat " " (listing d))

let test_empty_list () =
  let d = fresh "empty" in
  ignore (expect_error M.Bad_arguments (fun () -> M.merge ~output:(Filename.concat d "m.ctf") []));
  ignore (expect_error M.Bad_arguments (fun () -> M.merge ~output:"" fork));
  ignore (expect_error M.Bad_arguments (fun () -> M.merge ~output:(Filename.concat d "m.ctf") [ "" ]));
  ignore (expect_error M.Bad_arguments (fun () -> M.merge ~output:(Filename.concat d "m\000.ctf") fork));
  ignore (expect_error M.Bad_arguments (fun () -> M.merge ~context:"a\000b" ~output:(Filename.concat d "m.ctf") fork));
  check (listing d = []) "files left: %s" (String.concat " " (listing d))

let test_output_is_input () =
  let d = fresh "same" in
  let victim = Filename.concat d "victim.ctf" in
  let original = read_file (path [ "fork"; "child-1.ctf" ]) in
  write_file victim original;
  let m =
    expect_error M.Bad_arguments ~statuses:[ M.Input_error ] (fun () ->
        M.merge ~output:victim [ path [ "fork"; "child-2.ctf" ]; victim ])
  in
  Printf.printf "    (%s)\n" m;
  check (read_file victim = original) "the input was changed";
  check (listing d = [ "victim.ctf" ]) "files left: %s" (String.concat " " (listing d))

let test_unwritable_output () =
  let m = expect_error M.Output_error (fun () -> M.merge ~output:"/proc/nonexistent/out.ctf" fork) in
  check (contains ~sub:"/proc/nonexistent" m) "message %S" m;
  let d = fresh "unwritable" in
  let file = Filename.concat d "a-file" in
  write_file file "";
  ignore (expect_error M.Output_error (fun () -> M.merge ~output:(Filename.concat file "out.ctf") fork));
  check (listing d = [ "a-file" ]) "files left: %s" (String.concat " " (listing d))

let test_failure_keeps_existing_output () =
  let d = fresh "keep" in
  let out = Filename.concat d "merged.ctf" in
  write_file out "precious";
  ignore (expect_error M.Input_error (fun () -> M.merge ~output:out [ List.hd fork; Filename.concat d "missing.ctf" ]));
  check (read_file out = "precious") "a failed merge changed the existing output";
  check (listing d = [ "merged.ctf" ]) "files left: %s" (String.concat " " (listing d))

let test_version () =
  let v = M.version () in
  check (String.length v > 0 && String.contains v '.') "version %S" v

(* The command line and the bindings run the same code: same inputs and options, same bytes. *)
let cli () =
  match String.split_on_char '\n' (read_file rust_paths) with
  | _root :: target :: _ ->
      let exe = Filename.concat target (Filename.concat "release" "memtrace-merge") in
      if Sys.file_exists exe then exe
      else raise (Skip (Printf.sprintf "no memtrace-merge binary at %s (run cargo build --release first)" exe))
  | _ -> fail "%s: unexpected contents" rust_paths

(* Run the command line; its output is shown only when it fails. *)
let run_cli exe args =
  let log = Filename.temp_file "memtrace_merge_cli" ".log" in
  let fd = Unix.openfile log [ Unix.O_WRONLY; Unix.O_TRUNC ] 0 in
  let pid = Unix.create_process exe (Array.of_list (exe :: args)) Unix.stdin fd fd in
  Unix.close fd;
  let status = snd (Unix.waitpid [] pid) in
  let output = read_file log in
  Sys.remove log;
  match status with
  | Unix.WEXITED 0 -> ()
  | _ -> fail "%s %s failed:\n%s" exe (String.concat " " args) output

let test_round_trip_cli () =
  let exe = cli () in
  let d = fresh "cli" in
  let same name cli_args ocaml_merge inputs =
    let a = Filename.concat d (name ^ "-cli.ctf") and b = Filename.concat d (name ^ "-ocaml.ctf") in
    run_cli exe ([ "merge"; "-o"; a ] @ cli_args @ inputs);
    ignore (ocaml_merge ~output:b inputs);
    check (read_file a = read_file b) "%s: the CLI's and the bindings' outputs differ (%d and %d bytes)" name
      (size a) (size b)
  in
  same "default" [] (fun ~output i -> M.merge ~output i) fork;
  same "options"
    [ "--format"; "3"; "--seed"; "5"; "--tag-processes"; "--pid"; "4242"; "--context"; "ctx" ]
    (fun ~output i -> M.merge ~format:`V3 ~seed:5 ~tag_processes:true ~pid:4242 ~context:"ctx" ~output i)
    fork;
  same "thinned" [ "--seed"; "3" ] (fun ~output i -> M.merge ~seed:3 ~output i) [ fast; slow ]

(* Each input report names its file, also when a directory gave several. *)
let test_report_names_each_file () =
  let dir = path [ "fork" ] in
  let r = M.merge ~output:(Filename.concat (fresh "names") "merged.ctf") [ dir ] in
  let files = List.map (fun (i : M.input_report) -> i.file) r.inputs in
  let want = List.map (fun n -> Filename.concat dir (n ^ ".ctf")) (List.sort compare fork_names) in
  check (files = want) "files: %s" (String.concat ", " files);
  let s = M.summary r in
  List.iter (fun f -> check (contains ~sub:(f ^ ":") s) "summary names %s: %s" f s) want

(* A pipe is read once, and merged whole (not an empty trace). *)
let test_pipe_input () =
  let rd, wr = Unix.pipe () in
  let bytes = read_file (path [ "fork"; "child-1.ctf" ]) in
  let writer =
    Thread.create
      (fun () ->
        let oc = Unix.out_channel_of_descr wr in
        output_string oc bytes;
        close_out oc)
      ()
  in
  (* (a file_descr is its number on Unix) *)
  let fd : int = Obj.magic rd in
  let pipe = Printf.sprintf "/dev/fd/%d" fd in
  let out = Filename.concat (fresh "pipe") "merged.ctf" in
  let r = M.merge ~output:out [ pipe; path [ "fork"; "child-2.ctf" ] ] in
  Thread.join writer;
  Unix.close rd;
  check_int "allocs" r.allocs (8336 + 17914);
  check_int "allocs of the pipe" (List.hd r.inputs).allocs 8336

(* A copy of a trace (the same process) is merged once, with a warning. *)
let test_duplicate_trace () =
  let d = fresh "duplicate" in
  let copy = Filename.concat d "copy-of-child-1.ctf" in
  write_file copy (read_file (path [ "fork"; "child-1.ctf" ]));
  let out = Filename.concat d "merged.ctf" in
  let r = M.merge ~output:out [ path [ "fork"; "child-1.ctf" ]; copy ] in
  check_int "allocs" r.allocs 8336;
  check_int "inputs" (List.length r.inputs) 1;
  check
    (match r.first_warning with Some w -> contains ~sub:"same process" w | None -> false)
    "first warning %s"
    (Option.value r.first_warning ~default:"none")

(* Two merges in one process cancel apart: one given a handle set is cancelled (no output),
   the other, in another thread at the same time, completes. *)
let test_cancel () =
  let d = fresh "cancel" in
  let out_a = Filename.concat d "a.ctf" and out_b = Filename.concat d "b.ctf" in
  let ca = M.Cancel.create () and cb = M.Cancel.create () in
  M.Cancel.cancel ca;
  let result = ref None in
  let other = Thread.create (fun () -> result := Some (M.merge ~cancel:cb ~output:out_b fork)) () in
  let _ = expect_error M.Cancelled (fun () -> M.merge ~cancel:ca ~output:out_a fork) in
  Thread.join other;
  check (not (exists out_a)) "no output after a cancelled merge";
  match !result with
  | Some r -> check_int "the other merge's allocs" r.allocs 231910
  | None -> fail "the other merge did not return"

let tests =
  [
    ("two merges cancel apart", test_cancel);
    ("input reports name their files", test_report_names_each_file);
    ("a pipe as an input", test_pipe_input);
    ("a copy of a trace is merged once", test_duplicate_trace);
    ("fork traces: totals equal the inputs' sums", test_fork_totals);
    ("a directory argument", test_directory);
    ("merge in a forked child", test_forked_child);
    ("merge in a thread releases the runtime lock", test_thread_releases_lock);
    ("three concurrent merges", test_concurrent_merges);
    ("~format:`V3 and `V2", test_format_v3);
    ("different rates are thinned by default", test_default_thins);
    ("~on_rate_mismatch:`Fail raises", test_rate_mismatch_fail);
    ("~seed", test_seed);
    ("~tag_processes:true", test_tag_processes);
    ("~pid and ~context", test_pid_and_context);
    ("~skip_bad_inputs:true", test_skip_bad_inputs);
    ("error: missing file", test_missing_file);
    ("error: not a trace", test_not_a_trace);
    ("error: empty list, empty paths, NUL bytes", test_empty_list);
    ("error: output is an input", test_output_is_input);
    ("error: unwritable output", test_unwritable_output);
    ("error: an existing output survives a failure", test_failure_keeps_existing_output);
    ("version", test_version);
    ("round trip: same bytes as the memtrace-merge command line", test_round_trip_cli);
  ]

let () =
  let passed = ref 0 and failed = ref 0 and skipped = ref 0 in
  List.iter
    (fun (name, f) ->
      let t0 = Unix.gettimeofday () in
      match f () with
      | () ->
          incr passed;
          Printf.printf "ok: %s (%.2fs)\n%!" name (Unix.gettimeofday () -. t0)
      | exception Skip why ->
          incr skipped;
          Printf.printf "skipped: %s: %s\n%!" name why
      | exception e ->
          incr failed;
          Printf.printf "FAILED: %s: %s\n%!" name (Printexc.to_string e))
    tests;
  remove_tree scratch;
  Printf.printf "%d passed, %d failed%s\n%!" !passed !failed
    (if !skipped > 0 then Printf.sprintf ", %d skipped" !skipped else "");
  exit (if !failed > 0 then 1 else 0)
