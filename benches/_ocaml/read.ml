(* The reference reader with backtraces decoded: count events and frames. *)
open Memtrace.Trace
let () =
  let r = Reader.open_ ~filename:Sys.argv.(1) in
  let n = ref 0 and f = ref 0 in
  Reader.iter r (fun _ ev ->
      incr n;
      match ev with Event.Alloc a -> f := !f + a.backtrace_length | _ -> ());
  Reader.close r;
  Printf.printf "%d %d\n" !n !f
