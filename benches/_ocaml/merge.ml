(* The "corrected OCaml merge" (backtraces kept callee-first, as the writer takes them): every input read whole with backtraces copied out of the
   reader's reused buffer, events sorted by absolute time, written with the reference
   writer. Ids renumbered through a table per input. *)
open Memtrace.Trace

type kind =
  | A of { len : int; ns : int; source : Allocation_source.t; bt : Location_code.t array; id : Obj_id.t }
  | P of Obj_id.t
  | C of Obj_id.t

type ev = { time : int64; src : int; seq : int; kind : kind }

let () =
  let out = Sys.argv.(1) in
  let inputs = Array.sub Sys.argv 2 (Array.length Sys.argv - 2) in
  let readers = Array.map (fun f -> Reader.open_ ~filename:f) inputs in
  let evs = ref [] in
  let seq = ref 0 in
  Array.iteri
    (fun i r ->
      let info = Reader.info r in
      Reader.iter r (fun dt ev ->
          let time = Timestamp.to_int64 (Timedelta.offset info.start_time dt) in
          let kind =
            match ev with
            | Event.Alloc a ->
              A { len = a.length; ns = a.nsamples; source = a.source;
                  bt = (let n = a.backtrace_length in Array.init n (fun i -> a.backtrace_buffer.(n - 1 - i))); id = a.obj_id }
            | Promote id -> P id
            | Collect id -> C id
          in
          incr seq;
          evs := { time; src = i; seq = !seq; kind } :: !evs))
    readers;
  let evs =
    List.sort
      (fun a b ->
        match Int64.compare a.time b.time with
        | 0 -> ( match compare a.src b.src with 0 -> compare a.seq b.seq | c -> c)
        | c -> c)
      !evs
  in
  let info0 = Reader.info readers.(0) in
  let start =
    Array.fold_left
      (fun m r -> min m (Timestamp.to_int64 (Reader.info r).start_time))
      Int64.max_int readers
  in
  let info = { info0 with start_time = Timestamp.of_int64 start } in
  let fd = Unix.openfile out [ O_CREAT; O_WRONLY; O_TRUNC ] 0o644 in
  let w = Writer.create fd ~getpid:(fun () -> info.pid) info in
  let remap = Array.map (fun _ -> Hashtbl.create 1024) readers in
  List.iter
    (fun e ->
      let t = Timestamp.of_int64 e.time in
      match e.kind with
      | A a ->
        let id =
          Writer.put_alloc w t ~length:a.len ~nsamples:a.ns ~source:a.source ~callstack:a.bt
            ~decode_callstack_entry:(Reader.lookup_location_code readers.(e.src))
        in
        Hashtbl.replace remap.(e.src) a.id id
      | P id -> (
        match Hashtbl.find_opt remap.(e.src) id with
        | Some id' -> Writer.put_promote w t id'
        | None -> ())
      | C id -> (
        match Hashtbl.find_opt remap.(e.src) id with
        | Some id' ->
          Hashtbl.remove remap.(e.src) id;
          Writer.put_collect w t id'
        | None -> ()))
    evs;
  Writer.flush w;
  Unix.close fd;
  Array.iter Reader.close readers
