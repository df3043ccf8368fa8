(* check_totals.exe DIR OUT ALLOCS PROMOTES COLLECTS: merge the traces of DIR into OUT and
   check the merged totals (exit 0), else say what differs (exit 1). The program that CI builds
   each way an OCaml user gets the library: in this workspace, vendored, installed. *)

let () =
  match Sys.argv with
  | [| _; dir; out; allocs; promotes; collects |] ->
      let r = Memtrace_merge.merge ~output:out [ dir ] in
      let got = (r.allocs, r.promotes, r.collects)
      and want = (int_of_string allocs, int_of_string promotes, int_of_string collects) in
      if got = want then Printf.printf "ok: %d allocations from %d files\n" r.allocs (List.length r.inputs)
      else (
        let a, p, c = got in
        Printf.printf "merged %d allocs, %d promotes, %d collects; expected %s %s %s\n" a p c allocs
          promotes collects;
        exit 1)
  | _ ->
      prerr_endline "usage: check_totals.exe DIR OUT ALLOCS PROMOTES COLLECTS";
      exit 2
