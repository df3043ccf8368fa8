(* The reference re-encode: read a trace and write every event back with the writer. *)
open Memtrace.Trace
let () =
  let r = Reader.open_ ~filename:Sys.argv.(1) in
  let info = Reader.info r in
  let fd = Unix.openfile Sys.argv.(2) [ O_CREAT; O_WRONLY; O_TRUNC ] 0o644 in
  let w = Writer.create fd ~getpid:(fun () -> info.pid) info in
  Reader.iter r (fun dt ev ->
      Writer.put_event w ~decode_callstack_entry:(Reader.lookup_location_code r)
        (Timedelta.offset info.start_time dt) ev);
  Writer.flush w;
  Unix.close fd;
  Reader.close r
