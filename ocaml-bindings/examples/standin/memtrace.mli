(* The part of memtrace's interface that fork_and_merge.ml uses, for building it where
   memtrace is not installed (its functions fail if called: nothing is traced). *)

type tracer

val start_tracing : context:string option -> sampling_rate:float -> filename:string -> tracer
val stop_tracing : tracer -> unit
