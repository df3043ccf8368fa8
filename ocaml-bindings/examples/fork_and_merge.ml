(* A program that forks workers, each traced by memtrace to a file of its own, and merges
   the traces in-process once they have exited. memtrace comes from opam (`opam install
   memtrace`); dune: (libraries memtrace memtrace_merge unix). *)

(* Some work for worker [i]: lists and strings, some kept until the end. *)
let work i =
  let kept = ref [] in
  for round = 1 to 2_000 do
    let l = List.init (50 + (i * 10)) (fun k -> string_of_int (k * round)) in
    if round mod 100 = 0 then kept := l :: !kept
  done;
  ignore (Sys.opaque_identity !kept)

let () =
  let parent_trace = "run.ctf" in
  let tracer = Memtrace.start_tracing ~context:None ~sampling_rate:1e-4 ~filename:parent_trace in
  let children =
    List.init 3 (fun i ->
        match Unix.fork () with
        | 0 ->
            (* The child inherited the parent's tracer: stop it first (otherwise
               start_tracing fails: only one Memtrace instance may be active), then trace
               to the child's own file. *)
            Memtrace.stop_tracing tracer;
            let mine = Printf.sprintf "%s.%d.ctf" parent_trace (Unix.getpid ()) in
            let t = Memtrace.start_tracing ~context:None ~sampling_rate:1e-4 ~filename:mine in
            work i;
            Memtrace.stop_tracing t;
            exit 0
        | pid -> pid)
  in
  work 3;
  List.iter (fun pid -> ignore (Unix.waitpid [] pid)) children;
  Memtrace.stop_tracing tracer;
  let inputs = parent_trace :: List.map (Printf.sprintf "%s.%d.ctf" parent_trace) children in
  let report = Memtrace_merge.merge ~output:"merged.ctf" inputs in
  print_string (Memtrace_merge.summary report)
